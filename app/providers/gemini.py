"""Google's Gemini API (the Developer API, an API key): Veo video through
`predictLongRunning`.

The wire, from googleapis' `google/ai/generativelanguage/v1beta/prediction_service.proto`
and `generativelanguage_v1beta.yaml`, and the official client google-genai
(`models.py` `_GenerateVideosConfig_to_mldev` in 2.x; `_operations_converters.py`
`_GenerateVideosOperation_from_mldev` and `_Video_from_mldev`, `operations.py`,
`files.py` `download` in 3.6):

- submit: `POST {base}/v1beta/models/{model}:predictLongRunning`, header
  `x-goog-api-key`, body = the job's input as given
  (`{"instances": [{"prompt", "image", ...}], "parameters": {"sampleCount", "durationSeconds", ...}}`);
  the answer is a long-running operation `{"name": "models/<model>/operations/<id>"}`
  whose name is our task id.
- status: `GET {base}/v1beta/{operation name}` until `done: true`; then `error`
  (a google.rpc.Status: `code`, `message`) or
  `response.generateVideoResponse.generatedSamples[].video` with `uri` (a
  Files API link, `{base}/v1beta/files/<id>:download?alt=media`, that needs
  the API key: `download_credentials`) or `encodedVideo` (base64 bytes,
  `encoding` their media type: written here as an OutputFile), and
  `raiMediaFilteredCount` / `raiMediaFilteredReasons`. `done` with no video
  and no error (every sample filtered) is a failure: nothing to store, and
  "you will only be charged if your video is successfully generated" (the
  Veo page), so it is refunded.
- errors: `{"error": {"code", "message", "status", "details"}}`; a 429
  (RESOURCE_EXHAUSTED) carries its wait in `details[]` as a
  `google.rpc.RetryInfo` `retryDelay` ("37s"), read on status calls where the
  `Retry-After` header is absent.

What the API does not offer, and what follows:
- no idempotency key and no way to tell which operation a request made (the
  proto's ListOperations lists a model's operations, but an operation carries
  nothing of its request: `PredictLongRunningMetadata` is empty), so
  `idempotent_submit` and `can_find` are False: a submit whose answer is lost
  leaves the job `uncertain`.
- no cancel: the service config binds `CancelOperation` to `batches/*` only,
  so `can_cancel` is False (a cancelled job is refunded here; Google may
  still generate, and bill, the video).
- webhooks (`webhookConfig`, Google's 2026 addition) are not registered:
  their signature's header and claims are not documented, so jobs are polled.

Choices where the documents are silent: a missing `done` is `false` (proto3
JSON leaves a false boolean out); an operation name is sent as it came, each
segment percent-encoded, and one with an empty, `.` or `..` segment is no
operation of ours (Rejected without a call); a sample whose `uri` is not an
http(s) URL is not an output; uri outputs come before inline ones in the
output order; a done operation whose `response` is not the video response is
a failure, not a task to wait on. Google's file downloads are fetched on the
API's own host only: no document names another host they redirect to, so
none is allowed (a redirect elsewhere is refused by the download policy).
"""
from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from app.download_errors import DownloadError, OutputTooLarge
from app.providers.base import (
    Observation,
    Provider,
    ProviderFacts,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
)
from app.providers.http import (
    Clients,
    Secrets,
    ended,
    host_of,
    json_object,
    retry_after_seconds,
    streamed_read,
    submit_call,
)
from app.providers.inline import InlineOutput, Spilled, spool_answer, write_inline
from app.vocabulary import ProviderName

NAME = ProviderName.GEMINI

API_VERSION = "v1beta"
KEY_HEADER = "x-goog-api-key"
# "Generated videos are stored on the server for 2 days, after which they
# are removed" (the Veo page).
OUTPUT_TTL_S = 2 * 24 * 3600.0
# "Min: 11 seconds; Max: 6 minutes (during peak hours)" (the Veo page): the
# first look at 10 s, then every 10 s.
VEO_POLL_DELAYS_S = (10.0,)
# Per-model timings, the first glob that matches the model id (fnmatchcase).
MODEL_TIMINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("veo-*", {"poll_delays_s": VEO_POLL_DELAYS_S}),
)
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SEGMENT_RE = re.compile(r"[A-Za-z0-9._~-]+")
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)s")
_MAX_OPERATION_NAME = 400


# ------------------------------------------------------------------ pure decisions


def model_path(model: str) -> str:
    """The `models/{model}` path of a model id (the SDK's `t_model` accepts it
    with or without `models/`), or Rejected (pure)."""
    bare = model.removeprefix("models/") if isinstance(model, str) else ""
    if not _MODEL_RE.fullmatch(bare):
        raise Rejected(f"{NAME}: model must be a Gemini model id such as veo-3.1-generate-preview")
    return f"models/{bare}"


def check_body(body: Mapping[str, Any]) -> None:
    """The job's input is the predictLongRunning body: `instances` a list of
    objects (required by the proto), `parameters` an object when present.
    Rejected otherwise, before anything is sent (pure)."""
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances or not all(isinstance(i, Mapping) for i in instances):
        raise Rejected(f"{NAME}: input must be the predictLongRunning body: "
                       '{"instances": [{"prompt": ...}], "parameters": {...}}')
    if "parameters" in body and not isinstance(body["parameters"], Mapping):
        raise Rejected(f"{NAME}: input.parameters must be an object")


def operation_path(name: str) -> str:
    """The URL path of an operation name, each segment percent-encoded, or
    Rejected: a name with an empty, `.` or `..` segment (or none at all) is
    no operation the API gave us (pure)."""
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_OPERATION_NAME:
        raise Rejected(f"{NAME}: no such operation")
    segments = name.split("/")
    if any(s in ("", ".", "..") or not _SEGMENT_RE.fullmatch(s) for s in segments):
        raise Rejected(f"{NAME}: no such operation")
    return "/".join(quote(s, safe="") for s in segments)


def operation_name(body: Mapping[str, Any]) -> str:
    """The task id from predictLongRunning's answer, or Uncertain (the
    request was accepted, but we cannot tell which operation it made)."""
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise Uncertain(f"{NAME}: submit answer has no operation name")
    try:
        operation_path(name)
    except Rejected:
        raise Uncertain(f"{NAME}: submit answer names no usable operation") from None
    return name


def retry_delay(body: Any) -> float | None:
    """The `retryDelay` of a google.rpc.RetryInfo in an error answer's
    `details` ("37s", "1.5s"), in seconds; None when there is none (pure)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    details = error.get("details") if isinstance(error, Mapping) else None
    if not isinstance(details, list):
        return None
    for detail in details:
        if isinstance(detail, Mapping) and detail.get("@type") == _RETRY_INFO:
            match = _DURATION_RE.fullmatch(str(detail.get("retryDelay", "")).strip())
            if match:
                return retry_after_seconds(match.group(1))
    return None


def rpc_reason(error: Any, secrets: Secrets) -> str | None:
    """A google.rpc.Status (an operation's `error`, or an error answer's) as
    one masked line: its message, else its status word, else its code."""
    if not isinstance(error, Mapping):
        return secrets.reason(error)
    for key in ("message", "status"):
        text = secrets.reason(error.get(key))
        if text:
            return text
    code = error.get("code")
    return f"error code {code}" if isinstance(code, int) and not isinstance(code, bool) else None


@dataclasses.dataclass(frozen=True)
class Videos:
    """What a done operation's response holds (pure result of `read_operation`)."""

    urls: tuple[str, ...] = ()
    inline: tuple[InlineOutput, ...] = ()
    filtered_count: int = 0
    filtered_reasons: tuple[str, ...] = ()


def _is_http_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("https://", "http://")) and len(value) <= 8192


def read_videos(generate_video_response: Mapping[str, Any]) -> Videos:
    """The videos of a `generateVideoResponse` (pure): each sample's `video`
    is a `uri` to download or `encodedVideo` bytes (base64) typed by
    `encoding`; the filter count and reasons as given."""
    urls: list[str] = []
    inline: list[InlineOutput] = []
    samples = generate_video_response.get("generatedSamples")
    for sample in samples if isinstance(samples, list) else []:
        video = sample.get("video") if isinstance(sample, Mapping) else None
        if not isinstance(video, Mapping):
            continue
        encoded = video.get("encodedVideo")
        if isinstance(encoded, (Spilled, str)) and encoded:
            encoding = video.get("encoding")
            inline.append(InlineOutput(encoded, encoding if isinstance(encoding, str) and encoding else None))
        elif _is_http_url(video.get("uri")):
            urls.append(video["uri"])
    count = generate_video_response.get("raiMediaFilteredCount")
    reasons = generate_video_response.get("raiMediaFilteredReasons")
    return Videos(
        urls=tuple(urls),
        inline=tuple(inline),
        filtered_count=count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0,
        filtered_reasons=tuple(r for r in reasons if isinstance(r, str) and r) if isinstance(reasons, list) else (),
    )


def read_operation(body: Mapping[str, Any], secrets: Secrets) -> Observation | Videos:
    """An operation as what it says (pure): not done → RUNNING; done with an
    `error` → FAILED with its message; done with videos → the Videos to
    store; done without any (all filtered, or no video response at all) →
    FAILED saying why."""
    done = body.get("done")
    if done is not True:
        if done not in (None, False):
            raise Transient(f"{NAME}: operation `done` is not a boolean")
        return Observation(state=TaskState.RUNNING)
    if body.get("error") is not None:
        return ended(TaskState.FAILED, secrets, rpc_reason(body.get("error"), secrets),
                     fallback="the operation ended with an error")
    response = body.get("response")
    video_response = response.get("generateVideoResponse") if isinstance(response, Mapping) else None
    videos = read_videos(video_response) if isinstance(video_response, Mapping) else Videos()
    if videos.urls or videos.inline:
        return videos
    if videos.filtered_count or videos.filtered_reasons:
        count = f"{videos.filtered_count} " if videos.filtered_count else ""
        why = "; ".join(videos.filtered_reasons)
        return ended(TaskState.FAILED, secrets, f"every video ({count}generated) was filtered by Google's safety "
                                                f"checks" + (f": {why}" if why else ""))
    return ended(TaskState.FAILED, secrets, "the operation finished without a video")


def timings_for(model: str) -> dict[str, Any]:
    """The facts `model`'s jobs have besides the provider's defaults (pure)."""
    bare = model.removeprefix("models/") if isinstance(model, str) else ""
    for pattern, timings in MODEL_TIMINGS:
        if fnmatch.fnmatchcase(bare, pattern):
            return timings
    return {}


# ------------------------------------------------------------------ the adapter


class GeminiProvider(Provider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, stale_after_s: float = 60.0,
                 max_output_bytes: int = 2 * 1024**3, spool_dir: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._http = Clients(timeout_s, client)
        self._max_output_bytes = max_output_bytes
        self._spool_dir = spool_dir
        api_host = host_of(self.base_url)
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="none",
            idempotent_submit=False,
            can_find=False,
            can_cancel=False,
            stale_after_s=stale_after_s,
            output_hosts=(api_host,),
            output_ttl_s=OUTPUT_TTL_S,
            # The Files API link needs the key (files.py `download` sends it);
            # it goes to the API's own host, on the first hop only.
            credential_hosts=(api_host,),
        )

    def __repr__(self) -> str:
        return f"GeminiProvider({self.base_url!r})"

    def facts_for(self, model: str) -> ProviderFacts:
        timings = timings_for(model)
        return dataclasses.replace(self.facts, **timings) if timings else self.facts

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._key)

    def _headers(self) -> dict[str, str]:
        return {KEY_HEADER: self._key} if self._key else {}

    def download_credentials(self) -> dict[str, str]:
        return self._headers()

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        # No idempotency key exists (the proto's request has model, instances
        # and parameters only): `idempotency_key` cannot be sent.
        path = model_path(request.model)
        body = dict(request.input)
        check_body(body)
        # A 429 says its wait in the body's RetryInfo (as a status read's
        # does): waited out as asked, and the provider paused until then.
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}/{API_VERSION}/{path}:predictLongRunning",
            json=body, headers=self._headers(), secrets=self._secrets, retry_hint=_retry_hint,
        )
        return Submitted(task_id=operation_name(json_object(response, NAME, Uncertain)))

    async def status(self, task: Task) -> Observation:
        url = f"{self.base_url}/{API_VERSION}/{operation_path(task.task_id)}"
        secrets = self._secrets
        # 404 is "no such operation"; a 429 waits as its Retry-After, else its
        # RetryInfo, says; every other failure is a read to repeat.
        async with streamed_read(self._http.reads, NAME, "GET", url, headers=self._headers(), secrets=secrets,
                                 not_found="no such operation", retry_hint=_retry_hint) as response:
            # A long `encodedVideo` goes to a file, capped at the largest
            # output we keep (over it: OutputTooLarge, the job fails
            # output_too_large in the settle step).
            spooled = await spool_answer(response, NAME, directory=self._spool_dir,
                                         max_inline_bytes=self._max_output_bytes)
        with spooled:
            if not isinstance(spooled.value, Mapping):
                raise Transient(f"{NAME}: answer was not a JSON object (HTTP {response.status_code})")
            seen = read_operation(spooled.value, secrets)
            if isinstance(seen, Observation):
                return seen
            try:
                files = await asyncio.to_thread(write_inline, seen.inline, spooled, directory=self._spool_dir,
                                                max_bytes=self._max_output_bytes)
            except OutputTooLarge:
                raise
            except DownloadError as exc:  # not base64: asking again cannot help
                return Observation(state=TaskState.FAILED, error=f"a video in the operation's answer: {exc}")
            except OSError as exc:  # our disk: full, gone, read-only
                raise Transient(f"{NAME}: could not write an inline video ({exc.strerror})") from None
        return Observation(state=TaskState.SUCCEEDED, output_urls=seen.urls, files=files)

    async def cancel(self, task: Task) -> None:
        return None  # the Developer API cannot cancel a video operation (can_cancel is False)

    async def find(self, request: SubmitRequest) -> Submitted | None:
        return None  # no operation says which request made it (can_find is False)

    async def verify(self, webhook: WebhookRequest) -> bool:
        return False  # no webhook is ever registered: nothing can be ours

    async def aclose(self) -> None:
        await self._http.aclose()




def _retry_hint(response: httpx.Response) -> float | None:
    try:
        return retry_delay(response.json())
    except (ValueError, UnicodeDecodeError):
        return None
