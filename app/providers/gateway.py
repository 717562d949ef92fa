"""The Vercel AI Gateway's asynchronous video API
(https://vercel.com/changelog/ai-gateway-now-supports-asynchronous-video-generation).

There is no Python client: this speaks what `@ai-sdk/gateway` (4.0.146,
`src/gateway-video-model.ts` `doStart`/`doStatus`, `src/gateway-provider.ts`)
sends and parses. `POST {base}/video-model/start` with the video call body
(the job's input) and `callbackUrl`, our job id as `idempotency-key`; the
answer's opaque `operation` is stored verbatim and sent back as
`POST {base}/video-model/status` `{"operation": ...}`.

Choices where the sources are silent:
- task id: `providerMetadata.gateway.asyncJob.jobId` when the start answer has
  one (the Gateway's own name for the job; its batch docs build webhook
  delivery ids from it), else the operation as compact JSON with sorted keys
  (stable: the same operation always gives the same id). A job whose
  operation was not stored (an operator resolved it by a task id alone) is
  asked about by the operation its id names: the id itself when it is that
  JSON, else `{"gatewayJobId": <id>}`, the one shape the SDK's fixtures show
  (an inference; a wrong guess is the Gateway's 404, "no such job").
- a lost start answer: the start is sent again with the same key, and the
  Gateway answers the same operation (its documented replay contract). Whether
  the replay repeats the per-job `webhookSigningSecret` is not documented; if it
  does not, the job's webhooks cannot verify and it closes by its timers.
- videos `{type: "uploaded"}` carry neither bytes nor a URL: nothing to copy,
  so the job fails. Base64 videos are read from the streamed answer into
  files (app/providers/inline.py), capped at `max_output_bytes` each; a video
  over the cap fails the job (asking again cannot make it smaller). URL videos
  are on whichever upstream served the job: any public https host.
- `providerMetadata.gateway.cost` (a USD string; documented for blocking
  results, not said for status answers) is recorded as usage when present.
- The webhook (`x-ai-gateway-signature: t=..,v1=..`, our t/v1 scheme, keyed
  with the job's secret) only says "ask now": its body carries terminal facts
  only, and names no job we could adopt. There is no cancel route.
- Output lifetime: not documented (`asyncJob.result.expiresAt` has no stated
  unit); we assume an hour.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    Usage,
    UsageUnit,
    WebhookRequest,
    claimed_id,
)
from app.providers.http import (
    Clients,
    Secrets,
    ended,
    host_of,
    json_object,
    streamed_read,
    submit_call,
)
from app.providers.inline import InlineOutput, Spilled, spool_answer, write_inline
from app.signing.webhooks import verify_tv1
from app.vocabulary import ProviderName

NAME = ProviderName.GATEWAY

# What @ai-sdk/gateway sends on every video call (gateway-provider.ts, gateway-video-model.ts).
PROTOCOL_VERSION = "0.0.1"
AUTH_METHOD = "api-key"
SPEC_VERSION = "4"
SIGNATURE_HEADER = "x-ai-gateway-signature"
# `providerMetadata.gateway`: the AI SDK keys provider metadata by the SDK provider's id (a wire word).
METADATA_KEY = "gateway"

UPLOADED = "the Gateway uploaded the video elsewhere: nothing to copy"
NO_VIDEO = "the Gateway reported the generation completed with no video"
_MODEL_RE = re.compile(r"[!-~]+/[!-~]+")  # creator/model: printable ASCII, no spaces


def is_conflict(response: httpx.Response) -> bool:
    return response.status_code == 409


def video_model(model: str) -> str:
    """The job's model as the `ai-model-id` header (pure): a Gateway model id
    is `creator/model`; anything else (a space, a newline) is Rejected before
    it could break the request."""
    if not isinstance(model, str) or not _MODEL_RE.fullmatch(model):
        raise Rejected(f"{NAME}: model must be a Gateway model id, creator/model")
    return model


def start_body(job_input: Mapping[str, Any], callback_url: str | None) -> dict[str, Any]:
    """The start request's body (pure): the video call body as the job gave
    it, plus our `callbackUrl`. The callback is ours to set: an input that
    names one is Rejected (its deliveries would be signed with a secret only
    we hold, and ours would go nowhere)."""
    if "callbackUrl" in job_input:
        raise Rejected(f"{NAME}: input must not set callbackUrl: longcall registers its own")
    body = dict(job_input)
    if callback_url:
        body["callbackUrl"] = callback_url
    return body


def _gateway_metadata(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = answer.get("providerMetadata")
    gateway = metadata.get(METADATA_KEY) if isinstance(metadata, Mapping) else None
    return gateway if isinstance(gateway, Mapping) else {}


def operation_id(operation: Any) -> str:
    """A stable string for an operation (pure): compact JSON, keys sorted."""
    return json.dumps(operation, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def operation_for(task: Task) -> Any:
    """The operation a status call sends for `task` (pure): the one stored
    at start; without one, the one its task id names (see the module's
    docstring)."""
    stored = task.operation
    if isinstance(stored, Mapping) and stored.get("operation") is not None:
        return stored["operation"]
    if task.task_id.startswith(("{", "[", '"')):
        try:
            return json.loads(task.task_id)
        except ValueError:
            pass
    return {"gatewayJobId": task.task_id}


def submitted_from_start(answer: Mapping[str, Any]) -> Submitted:
    """A start answer as what we store (pure): the operation verbatim, the
    task id (asyncJob.jobId, else the operation's stable string), the
    per-job signing secret when the answer has one. No operation: Uncertain
    (the job may exist; the start is sent again with the same key)."""
    operation = answer.get("operation")
    if operation is None:
        raise Uncertain(f"{NAME}: start answer has no operation")
    job = _gateway_metadata(answer).get("asyncJob")
    job = job if isinstance(job, Mapping) else {}
    task_id = claimed_id(job.get("jobId")) or operation_id(operation)
    secret = job.get("webhookSigningSecret")
    return Submitted(task_id=task_id, operation={"operation": operation},
                     webhook_secret=secret if isinstance(secret, str) and secret else None)


@dataclass(frozen=True)
class Video:
    """One entry of a completed answer's `videos` that we can store."""

    media_type: str | None
    url: str | None = None  # {type: "url"}
    data: Spilled | str | None = None  # {type: "base64"}: spilled when long, else in the skeleton


@dataclass(frozen=True)
class Completed:
    """A completed answer whose videos are still to be written (base64) or
    downloaded (url)."""

    videos: tuple[Video, ...]
    usage: tuple[Usage, ...] = ()


def usage_of(answer: Mapping[str, Any]) -> tuple[Usage, ...]:
    """`providerMetadata.gateway.cost`, a USD string ("0.15"), as usage (pure)."""
    cost = _gateway_metadata(answer).get("cost")
    if isinstance(cost, bool) or not isinstance(cost, (str, int, float)):
        return ()
    try:
        amount = float(cost)
    except ValueError:
        return ()
    return (Usage(UsageUnit.USD, amount),) if math.isfinite(amount) and amount >= 0 else ()


def _video(entry: Any, secrets: Secrets) -> Video | Observation:
    """One `videos` entry, or the failure it makes of the job."""
    if not isinstance(entry, Mapping):
        return ended(TaskState.FAILED, secrets, fallback="the Gateway answered a video that is not an object")
    kind, media_type = entry.get("type"), entry.get("mediaType")
    media_type = media_type if isinstance(media_type, str) and media_type else None
    if kind == "url":
        url = entry.get("url")
        if isinstance(url, str) and url.startswith(("https://", "http://")):
            return Video(media_type, url=url)
        return ended(TaskState.FAILED, secrets, fallback="the Gateway answered a video URL that is not http(s)")
    if kind == "base64":
        data = entry.get("data")
        if isinstance(data, (Spilled, str)):
            return Video(media_type, data=data)
        return ended(TaskState.FAILED, secrets, fallback="the Gateway answered a base64 video without data")
    if kind == "uploaded":
        return Observation(state=TaskState.FAILED, error=UPLOADED)
    return ended(TaskState.FAILED, secrets, fallback=f"the Gateway answered a video of unknown type "
                                                     f"{secrets.mask(str(kind), 40)!r}")


def read_status(answer: Any, secrets: Secrets) -> Observation | Completed:
    """A status answer (spooled: long strings are `Spilled`) as an
    Observation, or, for `completed`, the videos to store (pure). Every video
    must be storable, or the job fails: an `uploaded` one has nothing to copy."""
    if not isinstance(answer, Mapping):
        raise Transient(f"{NAME}: status answer was not a JSON object")
    state = answer.get("status")
    if state == "pending":
        return Observation(state=TaskState.RUNNING)
    if state == "error":
        error = answer.get("error")  # a message over 64 KiB was spilled to a file: not worth reading back
        return ended(TaskState.FAILED, secrets, error if isinstance(error, str) else None,
                     fallback="the video generation failed")
    if state == "cancelled":
        return ended(TaskState.CANCELLED, secrets, fallback="the Gateway reports the video generation cancelled")
    if state != "completed":
        raise Transient(f"{NAME}: unknown status {secrets.mask(str(state), 40)!r}")
    entries = answer.get("videos")
    if not isinstance(entries, list) or not entries:
        return Observation(state=TaskState.FAILED, error=NO_VIDEO)
    videos = []
    for entry in entries:
        video = _video(entry, secrets)
        if isinstance(video, Observation):
            return video
        videos.append(video)
    return Completed(tuple(videos), usage_of(answer))


class GatewayProvider(Provider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, stale_after_s: float = 300.0,
                 max_output_bytes: int = 2 * 1024**3, spool_dir: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        # The start is idempotent (the same key answers the same operation):
        # a submit on a pooled connection that turns out stale costs a retry only.
        self._http = Clients(timeout_s, client, idempotent_submit=True)
        self._max_output_bytes = max_output_bytes
        self._spool_dir = spool_dir
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="t/v1",
            idempotent_submit=True,
            can_find=False,
            # Video generations take minutes: the lost-webhook check after
            # five, polls (without a webhook) every 10 to 30 s.
            stale_after_s=stale_after_s,
            poll_delays_s=(10.0, 10.0, 15.0, 20.0, 30.0),
            output_hosts=(host_of(self.base_url),),
            outputs_from_any_host=True,
            output_ttl_s=3600.0,  # not documented: assumed an hour
            can_cancel=False,
        )

    def __repr__(self) -> str:
        return f"GatewayProvider({self.base_url!r})"

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._key)

    def _headers(self, model: str | None) -> dict[str, str]:
        headers = {
            "ai-gateway-protocol-version": PROTOCOL_VERSION,
            "ai-gateway-auth-method": AUTH_METHOD,
            "ai-video-model-specification-version": SPEC_VERSION,
        }
        if model:
            headers["ai-model-id"] = model
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        model = video_model(request.model)
        body = start_body(request.input, request.callback_url)
        # A 409 is asked again (with the same key), as Vercel's own client
        # does (`@ai-sdk/gateway` GatewayError: 408, 409, 429 and 5xx are
        # retryable): the usual answer to a key whose first start is still
        # being made, which failing would refund while that start runs.
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}/video-model/start",
            json=body, headers={**self._headers(model), "idempotency-key": idempotency_key},
            secrets=self._secrets.plus_callback(request.callback_url), ask_again=is_conflict,
        )
        return submitted_from_start(json_object(response, NAME, Uncertain))

    async def status(self, task: Task) -> Observation:
        # Identity, as downloads ask: the answer is read as it arrives (one
        # sent encoded anyway is decoded piece by piece, under the same caps).
        headers = {**self._headers(task.model), "Accept-Encoding": "identity"}
        async with streamed_read(self._http.reads, NAME, "POST", f"{self.base_url}/video-model/status",
                                 json={"operation": operation_for(task)}, headers=headers,
                                 secrets=self._secrets, not_found="no such video job") as response:
            # A base64 video can be tens of MB: never held whole. One over the
            # cap is OutputTooLarge: the settle step fails the job output_too_large.
            doc = await spool_answer(response, NAME, directory=self._spool_dir,
                                     max_inline_bytes=self._max_output_bytes)
        with doc:
            seen = read_status(doc.value, self._secrets)
            if isinstance(seen, Observation):
                return seen
            inline = tuple(InlineOutput(video.data, video.media_type) for video in seen.videos
                           if video.data is not None)
            try:
                files = await asyncio.to_thread(write_inline, inline, doc, directory=self._spool_dir,
                                                max_bytes=self._max_output_bytes)
            except OutputTooLarge:
                raise
            except DownloadError as e:  # not base64: asking again cannot help
                return Observation(state=TaskState.FAILED, error=f"a video in the Gateway's answer: {e}")
        urls = tuple(video.url for video in seen.videos if video.url is not None)
        return Observation(state=TaskState.SUCCEEDED, output_urls=urls, files=files, usage=seen.usage)

    async def cancel(self, task: Task) -> None:
        return None  # no cancel route: the generation runs out on its own

    async def verify(self, webhook: WebhookRequest) -> bool:
        # Keyed with the job's own secret; a job without one (a replayed
        # start that did not repeat it) verifies nothing and is closed by
        # its timers.
        if not webhook.job_secret:
            return False
        try:
            return verify_tv1(webhook.headers.get(SIGNATURE_HEADER), webhook.raw_body, webhook.job_secret,
                              time.time())
        except Exception:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()


