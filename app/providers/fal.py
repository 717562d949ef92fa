"""fal's queue API (https://docs.fal.ai/model-endpoints/queue).

Submit answers with the request id and the URLs to ask about it later; we
keep those (only when they point at the configured base URL, since our key
goes with them) in `Submitted.operation`. A COMPLETED request's outcome is
read from its response URL. Webhooks are Ed25519-signed with keys from
fal's JWKS.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import httpx

from app.download_errors import DownloadError, OutputTooLarge
from app.providers.base import (
    Observation,
    OutputFile,
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
    json_value,
)
from app.providers.http import (
    Clients,
    Secrets,
    collect_urls,
    ended,
    host_of,
    json_body,
    json_object,
    read_call,
    same_origin,
    submit_call,
)
from app.providers.inline import InlineOutput, SpooledJson, write_inline
from app.providers.keycache import RefetchingCache
from app.signing.webhooks import jwks_public_keys, verify_fal
from app.vocabulary import ProviderName

NAME = ProviderName.FAL

_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# fal-client's AppId.from_endpoint_id: an endpoint id in one of these
# namespaces names its queue with three segments (namespace/owner/alias),
# any other with two (owner/alias); the rest is the sub-path.
NAMESPACES = ("workflows", "comfy")
# ...and an id without a slash is a numeric app id, `123-myapp` → 123/myapp.
_NUMERIC_APP_RE = re.compile(r"([0-9]+)-([a-zA-Z0-9-]+)")
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_OPERATION_KEYS = ("status_url", "response_url", "cancel_url")
# JWKS: refetched on a verification failure at most this often, and at
# least this often anyway (fal asks clients to cache for up to a day).
JWKS_REFRESH_S = 60.0
JWKS_MAX_AGE_S = 24 * 3600.0
_RUNNING = {"IN_QUEUE", "IN_PROGRESS"}
_CANCELLED_TYPES = {"client_cancelled"}
# fal's request error types that end a request (after its own retries).
_REQUEST_FAILURE_TYPES = {
    "request_timeout", "startup_timeout", "runner_scheduling_failure", "runner_connection_timeout",
    "runner_disconnected", "runner_connection_refused", "runner_connection_error",
    "runner_incomplete_response", "runner_server_error",
}


def queue_root(model: str) -> str:
    """The part of an endpoint id that addresses its requests (pure), as
    fal-client builds it: `fal-ai/flux/dev` → `fal-ai/flux`,
    `workflows/me/wf/sub` → `workflows/me/wf`, `123-myapp` → `123/myapp`.
    The whole id is what a request is submitted to; this, not the sub-path,
    is where its status, result and cancel live."""
    problem = f"{NAME}: model must be a fal endpoint id like fal-ai/flux/dev or workflows/owner/name"
    if not isinstance(model, str):
        raise Rejected(problem)
    parts = model.split("/")
    if len(parts) == 1:
        numeric = _NUMERIC_APP_RE.fullmatch(model)
        if numeric is None:
            raise Rejected(problem)
        return f"{numeric[1]}/{numeric[2]}"
    keep = 3 if parts[0] in NAMESPACES else 2
    if len(parts) < keep or ".." in model or not all(_SEGMENT_RE.fullmatch(part) for part in parts):
        raise Rejected(problem)
    return "/".join(parts[:keep])


def documented_urls(base_url: str, model: str, request_id: str) -> dict[str, str]:
    """The status / response / cancel URLs fal documents for a request: the
    fallback when fal's own answer did not give them (or gave them elsewhere)."""
    root = f"{base_url}/{queue_root(model)}/requests/{quote(request_id, safe='')}"
    return {"status_url": f"{root}/status", "response_url": root, "cancel_url": f"{root}/cancel"}


def operation_urls(base_url: str, model: str, request_id: str, answer: Mapping[str, Any]) -> dict[str, str]:
    """The URLs to keep for a request: the ones fal gave when they are on
    our base URL's origin, else the documented pattern (pure)."""
    urls = documented_urls(base_url, model, request_id)
    for key in _OPERATION_KEYS:
        given = answer.get(key)
        if isinstance(given, str) and same_origin(given, base_url):
            urls[key] = given
    return urls


def nothing_queued(response: httpx.Response) -> bool:
    """Whether a submit's error answer means fal queued nothing (pure), as
    its own client judges it (fal_client `_should_retry_response`, which
    sends the submit again on these): a 409, or an ingress error — a 502,
    503 or 504 that fal's app never answered (no `x-fal-request-id`, an
    nginx page). Any other 5xx may have queued the request."""
    if response.status_code == 409:
        return True
    return response.status_code in (502, 503, 504) and "x-fal-request-id" not in response.headers \
        and "nginx" in response.text


def is_request_outcome(status_code: int, body: Any) -> bool:
    """Whether an error answer from a COMPLETED request's response URL is
    that request's own outcome (pure). A model's 4xx (`detail`) and the
    request errors fal documents (`error_type` request_timeout,
    runner_*, ...) are; a bare 5xx or `internal_error` may be a hiccup of
    the result endpoint itself, so it is asked again rather than trusted."""
    if not isinstance(body, Mapping):
        return False
    error_type = body.get("error_type")
    if status_code == 499 or error_type in _CANCELLED_TYPES:
        return True
    if status_code >= 500:
        return isinstance(error_type, str) and error_type in _REQUEST_FAILURE_TYPES
    # Not 401/403/429: those say something about our key or rate, not the request.
    return status_code in (400, 422) and "detail" in body


# A file sent inline: `data:<type>[;param=value...];base64,<bytes>`. A model
# run with `sync_mode` answers its files so ("the media will be returned as
# a data URI", fal's model schemas; some models default to it).
_DATA_URI = re.compile(r"data:(?P<type>[A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+)?(?:;[A-Za-z0-9.+-]+=[^;,]*)*;base64,",
                       re.ASCII)


def data_uri_outputs(body: Any) -> tuple[InlineOutput, ...]:
    """The files an answer carries as base64 data URIs under a `url` key,
    in order, with their declared types (pure)."""
    found: list[InlineOutput] = []

    def walk(node: Any, key: str | None, depth: int) -> None:
        if depth > 32 or len(found) >= 100:
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, k if isinstance(k, str) else None, depth + 1)
        elif isinstance(node, list):
            for item in node:
                walk(item, key, depth + 1)
        elif key == "url" and isinstance(node, str) and (match := _DATA_URI.match(node)):
            found.append(InlineOutput(node[match.end():], match.group("type")))

    walk(body, None, 0)
    return tuple(found)


def result_observation(status_code: int, body: Any, secrets: Secrets) -> Observation:
    """The outcome of a COMPLETED request from its response URL (pure):
    2xx → the files it made (URLs to download; those sent inline as data
    URIs the adapter writes out, `data_uri_outputs`) or, with no file in it
    (a text model's `{"output": "..."}`), the whole answer as one JSON
    output; an error answer → FAILED with fal's reason (a cancelled
    request counts as CANCELLED)."""
    if 200 <= status_code < 300:
        urls = collect_urls(body, only_url_keys=True)
        if urls or data_uri_outputs(body):
            return Observation(state=TaskState.SUCCEEDED, output_urls=urls)
        return Observation(state=TaskState.SUCCEEDED, values=(json_value(body),))
    error_type = body.get("error_type") if isinstance(body, Mapping) else None
    if status_code == 499 or error_type in _CANCELLED_TYPES:
        return ended(TaskState.CANCELLED, secrets, fallback="the request was cancelled")
    reason = body.get("detail") if isinstance(body, Mapping) else body
    return ended(TaskState.FAILED, secrets, reason, fallback=f"the request failed (HTTP {status_code})")


class FalProvider(Provider):
    def __init__(
        self,
        base_url: str,
        key: str | None,
        *,
        jwks_url: str,
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
        stale_after_s: float = 60.0,
        jwks_refresh_s: float = JWKS_REFRESH_S,
        max_output_bytes: int = 2 * 1024**3,
        spool_dir: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._max_output_bytes = max_output_bytes
        self._spool_dir = spool_dir
        self.jwks_url = jwks_url
        self._key = key
        self._http = Clients(timeout_s, client)
        self._public_keys = RefetchingCache(self._fetch_keys, max_age_s=JWKS_MAX_AGE_S, min_refetch_s=jwks_refresh_s)
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="ed25519-jwks",
            idempotent_submit=False,
            can_find=False,
            stale_after_s=stale_after_s,
            output_hosts=("fal.media", ".fal.media", ".fal.run", host_of(self.base_url)),
            output_ttl_s=3600.0,
        )

    def __repr__(self) -> str:
        return f"FalProvider({self.base_url!r})"

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._key)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Key {self._key}"} if self._key else {}

    def _urls(self, task: Task) -> dict[str, str]:
        """Where to ask about a task: the stored URLs when they are still on
        our origin (the base URL may have changed since), else rebuilt."""
        stored = task.operation if isinstance(task.operation, Mapping) else {}
        if all(same_origin(stored.get(k), self.base_url) for k in _OPERATION_KEYS):
            return {k: stored[k] for k in _OPERATION_KEYS}
        model = stored.get("model") or task.model
        if not isinstance(model, str) or not _REQUEST_ID_RE.fullmatch(task.task_id):
            raise Rejected(f"{NAME}: the task lacks the model needed to address it")
        return documented_urls(self.base_url, model, task.task_id)

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        queue_root(request.model)  # validates before anything is sent
        params = {"fal_webhook": request.callback_url} if request.callback_url else None
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}/{request.model}",
            params=params, json=dict(request.input), headers=self._headers(),
            secrets=self._secrets.plus_callback(request.callback_url), ask_again=nothing_queued,
        )
        data = json_object(response, NAME, Uncertain)
        request_id = data.get("request_id")
        if not isinstance(request_id, str) or not _REQUEST_ID_RE.fullmatch(request_id):
            raise Uncertain(f"{NAME}: submit answer has no usable request id")
        operation = {"model": request.model, **operation_urls(self.base_url, request.model, request_id, data)}
        return Submitted(task_id=request_id, operation=operation)

    async def status(self, task: Task) -> Observation:
        urls = self._urls(task)
        response = await read_call(
            self._http.reads, NAME, "GET", urls["status_url"],
            headers=self._headers(), secrets=self._secrets,
        )
        body = json_object(response, NAME, Transient)
        status = body.get("status")
        if status in _RUNNING:
            return Observation(state=TaskState.RUNNING)
        if status != "COMPLETED":
            raise Transient(f"{NAME}: unknown request status {self._secrets.mask(str(status), 40)!r}")
        if body.get("error"):
            # Newer queue answers carry the failure on the status itself.
            if body.get("error_type") in _CANCELLED_TYPES:
                return ended(TaskState.CANCELLED, self._secrets, fallback="the request was cancelled")
            return ended(TaskState.FAILED, self._secrets, body.get("error"), fallback="the request failed")
        return await self._result(urls["response_url"])

    async def _result(self, response_url: str) -> Observation:
        response = await read_call(
            self._http.reads, NAME, "GET", response_url, headers=self._headers(), secrets=self._secrets,
            not_found=None, pass_statuses=(400, 422, 499, 500, 502, 503, 504),
        )
        status_code = response.status_code
        if 200 <= status_code < 300:
            body = json_body(response, NAME, Transient)
            seen = result_observation(status_code, body, self._secrets)
            inline = data_uri_outputs(body)
            if not inline:
                return seen
            try:
                return replace(seen, files=await self._write(inline))
            except OutputTooLarge:
                raise
            except DownloadError as exc:  # not base64: asking again cannot help
                return Observation(state=TaskState.FAILED, error=f"a data URI in the result: {exc}")
        try:
            body = response.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        if not is_request_outcome(status_code, body):
            # Not the request's stored outcome (a gateway hiccup, say): ask again later.
            detail = self._secrets.detail(response)
            raise Transient(f"{NAME}: result fetch answered HTTP {status_code}" + (f": {detail}" if detail else ""))
        return result_observation(status_code, body, self._secrets)

    async def _write(self, inline: tuple[InlineOutput, ...]) -> tuple[OutputFile, ...]:
        """Data URIs decoded into files of their own, capped (over the cap:
        OutputTooLarge, the job fails output_too_large in the settle step;
        not base64: DownloadError)."""
        with SpooledJson(value=None) as doc:
            try:
                return await asyncio.to_thread(write_inline, inline, doc, directory=self._spool_dir,
                                               max_bytes=self._max_output_bytes)
            except OSError as exc:  # our disk: full, gone, read-only
                raise Transient(f"{NAME}: could not write a data URI's file ({exc.strerror})") from None

    async def cancel(self, task: Task) -> None:
        try:
            urls = self._urls(task)
            await read_call(
                self._http.reads, NAME, "PUT", urls["cancel_url"],
                headers=self._headers(), secrets=self._secrets,
                pass_statuses=(400, 409),  # ALREADY_COMPLETED: nothing to cancel
            )
        except Rejected:
            return None

    async def find(self, request: SubmitRequest) -> Submitted | None:
        return None  # fal cannot look a request up by our reference

    async def _fetch_keys(self) -> list[bytes]:
        # No credential goes to the JWKS host: the keys are public.
        response = await read_call(self._http.reads, NAME, "GET", self.jwks_url, secrets=self._secrets, not_found=None)
        return jwks_public_keys(json_body(response, NAME, Transient))

    async def verify(self, webhook: WebhookRequest) -> bool:
        try:
            keys = await self._public_keys.get()
            if keys and verify_fal(webhook.headers, webhook.raw_body, keys, time.time()):
                return True
            # Perhaps signed with a key published since we last looked.
            fresh = await self._public_keys.get(refresh=True)
            if not fresh or fresh == keys:
                return False
            return verify_fal(webhook.headers, webhook.raw_body, fresh, time.time())
        except Exception:
            return False

    def webhook_task_id(self, webhook: WebhookRequest) -> str | None:
        # The request id fal signs (x-fal-webhook-request-id is part of the
        # signed content; the body's `request_id` is not what we rely on).
        request_id = webhook.headers.get("x-fal-webhook-request-id")
        return request_id if isinstance(request_id, str) and _REQUEST_ID_RE.fullmatch(request_id) else None

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """The request's status under the job's own endpoint, with our key:
        fal answers 404 for a request it does not know there (another app's,
        another account's). Saved as submit would have saved it."""
        if not _REQUEST_ID_RE.fullmatch(task_id):
            return None
        try:
            urls = documented_urls(self.base_url, request.model, task_id)
            await read_call(self._http.reads, NAME, "GET", urls["status_url"],
                            headers=self._headers(), secrets=self._secrets)
        except Rejected:
            return None
        return Submitted(task_id=task_id, operation={"model": request.model, **urls})

    async def aclose(self) -> None:
        await self._http.aclose()
