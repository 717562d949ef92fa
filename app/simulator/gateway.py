"""The Vercel AI Gateway's asynchronous video API under /gateway: `POST
/gateway/v4/ai/video-model/start` and `POST /gateway/v4/ai/video-model/status`.

Held to `@ai-sdk/gateway` (4.0.146; `src/gateway-video-model.ts` `doStart`,
`doStatus` and their zod schemas, `src/gateway-provider.ts` for the headers,
`src/errors/create-gateway-error.ts` for the error shape, `docs/00-ai-gateway.mdx`
for the webhook signature) and its test fixtures: every field answered here is
one those schemas or fixtures name.

- Every call carries `Authorization: Bearer <key>` (else 401
  `authentication_error`) and the SDK's headers `ai-gateway-protocol-version:
  0.0.1`, `ai-gateway-auth-method: api-key|oidc`,
  `ai-video-model-specification-version: 4` and `ai-model-id: <creator/model>`
  (else 400 `invalid_request_error`: what the Gateway answers without them is
  not documented). Errors are `{"error": {"message", "type"}}`.
- The start body is the video call body (`prompt`, `n`, `duration`, ...) plus
  `callbackUrl`; the simulator's `input` controls ride at its top level
  (CONTRACT.md). The number of videos is the `outputs` control when given,
  else `n`, else 1. Their media type is `video/mp4` unless `content_type` says
  otherwise; with `output_duration_s` each is a real MP4 of that many seconds
  (app/simulator/media.py), by URL or inline alike. `output_text` is
  ignored: the API answers videos only.
- The answer is `{"operation": {"gatewayJobId": ...}, "providerMetadata":
  {"gateway": {"asyncJob": {"jobId", "status"[, "webhookSigningSecret"]}}}}`
  (the SDK test's fixture). The secret is there only when `callbackUrl` was
  given. `idempotency-key` dedupes starts: a replay answers the same operation
  and, the conservative reading (the docs do not say), WITHOUT the secret
  ("returned only in the start response"). A replay with another body still
  answers the first job (undocumented too).
- Status answers `pending` (asyncJob `queued` / `running`), `completed` with
  `videos`, `error` with `error` (the fixture has no providerMetadata there),
  or `cancelled`. An unknown operation is 404 `not_found`. asyncJob's status
  for a failed job, seen only on a replayed start, is `failed` (the batch
  webhook's word). `result.expiresAt` is not sent: its unit is not documented.
- The simulator's convention for the two documented video forms: a model whose
  creator is `google/` answers `{"type": "base64", "data", "mediaType"}` (the
  bytes of the deterministic outputs, streamed: a 50 MiB video is never held
  here), any other `{"type": "url", "url", "mediaType"}` at `/outputs/{task}/{i}`.
  `{"type": "uploaded"}` (no bytes, no URL) is never answered.
- The terminal webhook goes to `callbackUrl` with body `{"type":
  "video.generation.completed" | "video.generation.failed" |
  "video.generation.cancelled"}` (the `completed` body is the SDK test's;
  the other two are second-hand, from a research note quoting vercel.com) and
  header `x-ai-gateway-signature: t=<unix>,v1=<hex HMAC-SHA256 keyed with the
  job's webhookSigningSecret over "<t>.<raw body>">` (the batch section of
  the SDK docs; the same header in the video test). The batch docs'
  `x-ai-gateway-idempotency-key` is not sent: it is not documented for video.
- There is no cancel route (none in the SDK), and no cost in status answers
  (documented only for blocking results).
"""
from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.signing.webhooks import sign_tv1
from app.simulator.controls import MAX_OUTPUTS, ControlError, parse_controls, with_default_type
from app.simulator.engine import Simulator
from app.simulator.outputs import aiter_chunks, file_chunks
from app.simulator.state import Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import (
    MAX_IDEMPOTENCY_KEY,
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    HoldThenDrop,
    auth_token,
    dumps,
    is_http_url,
    read_json,
    server_base,
)

PROTOCOL = "gateway"
PREFIX = "/gateway"
BASE = f"{PREFIX}/v4/ai"
VIDEO_CONTENT_TYPE = "video/mp4"
# Models of this creator answer their videos inline (base64): the simulator's convention.
INLINE_CREATOR = "google/"

# The headers @ai-sdk/gateway sends on every video call, with the values it sends.
PROTOCOL_VERSION = ("ai-gateway-protocol-version", "0.0.1")
SPEC_VERSION = ("ai-video-model-specification-version", "4")
AUTH_METHOD = "ai-gateway-auth-method"
AUTH_METHODS = ("api-key", "oidc")
MODEL_ID = "ai-model-id"

# The error `type` values of create-gateway-error.ts, with the HTTP status each error class defaults to.
AUTHENTICATION = ("authentication_error", 401)
INVALID_REQUEST = ("invalid_request_error", 400)
RATE_LIMITED = ("rate_limit_exceeded", 429)
NOT_FOUND = ("not_found", 404)
INTERNAL = ("internal_server_error", 500)

_JOB_STATUS = {
    Phase.QUEUED: "queued",
    Phase.RUNNING: "running",
    Phase.SUCCEEDED: "completed",
    Phase.FAILED: "failed",
    Phase.CANCELLED: "cancelled",
}
_WEBHOOK_TYPE = {
    Phase.SUCCEEDED: "video.generation.completed",
    Phase.FAILED: "video.generation.failed",
    Phase.CANCELLED: "video.generation.cancelled",
}


def _error(kind: tuple[str, int], message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    error_type, status = kind
    return JSONResponse({"error": {"message": message, "type": error_type}}, status_code=status, headers=headers)


def _throttled() -> JSONResponse:
    return _error(RATE_LIMITED, "Rate limit exceeded", {"retry-after": str(THROTTLE_RETRY_AFTER_S)})


def refused(request: Request) -> JSONResponse | None:
    """The error answer for a call without the bearer or the SDK's headers; None when all is there."""
    if auth_token(request, "Bearer") is None:
        return _error(AUTHENTICATION, "Missing or invalid API key")
    for name, value in (PROTOCOL_VERSION, SPEC_VERSION):
        if request.headers.get(name) != value:
            return _error(INVALID_REQUEST, f"header {name} must be {value}")
    if request.headers.get(AUTH_METHOD) not in AUTH_METHODS:
        return _error(INVALID_REQUEST, f"header {AUTH_METHOD} must be one of {', '.join(AUTH_METHODS)}")
    if not request.headers.get(MODEL_ID, "").strip():
        return _error(INVALID_REQUEST, f"header {MODEL_ID} is required")
    return None


def operation_of(task: Task) -> dict[str, Any]:
    return {"gatewayJobId": task.id}


def async_job(task: Task, now: float, *, secret: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {"jobId": task.id, "status": _JOB_STATUS[task.phase(now)]}
    if secret is not None:
        job["webhookSigningSecret"] = secret
    return {"gateway": {"asyncJob": job}}


def start_view(task: Task, now: float, *, with_secret: bool) -> dict[str, Any]:
    """The start answer; the signing secret only on the start that made the job."""
    secret = task.webhook_secret if with_secret else None
    return {"operation": operation_of(task), "providerMetadata": async_job(task, now, secret=secret)}


def inline_videos(model: str) -> bool:
    return model.startswith(INLINE_CREATOR)


def base64_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The base64 text of `chunks` joined, chunk by chunk (pure): each piece
    but the last encodes a multiple of 3 bytes, so the pieces concatenate
    into the base64 of the whole."""
    carry = b""
    for chunk in chunks:
        data = carry + chunk
        cut = len(data) - len(data) % 3
        carry = data[cut:]
        if cut:
            yield base64.b64encode(data[:cut])
    if carry:
        yield base64.b64encode(carry)


def completed_body(task: Task, now: float) -> Iterator[bytes]:
    """The `completed` status answer, in pieces: a base64 video is streamed
    from the deterministic outputs, never built whole."""
    media_type = dumps(task.controls.content_type)
    yield b'{"status":"completed","videos":['
    for index, url in enumerate(task.output_urls()):
        if index:
            yield b","
        if inline_videos(task.model):
            yield b'{"type":"base64","mediaType":' + media_type + b',"data":"'
            yield from base64_chunks(file_chunks(task.id, index, task.controls))
            yield b'"}'
        else:
            yield dumps({"type": "url", "url": url, "mediaType": task.controls.content_type})
    yield b'],"providerMetadata":' + dumps(async_job(task, now)) + b"}"


def status_answer(task: Task, now: float) -> Response:
    phase = task.phase(now)
    if phase is Phase.SUCCEEDED:
        return StreamingResponse(aiter_chunks(completed_body(task, now)), media_type="application/json")
    if phase is Phase.FAILED:
        return JSONResponse({"status": "error", "error": task.error(now)})
    if phase is Phase.CANCELLED:
        return JSONResponse({"status": "cancelled", "providerMetadata": async_job(task, now)})
    return JSONResponse({"status": "pending", "providerMetadata": async_job(task, now)})


def _video_count(body: dict[str, Any], outputs: int) -> int:
    """`outputs` when the control is given, else the call's `n` (ValueError when it is not a count)."""
    if "outputs" in body:
        return outputs
    n = body.get("n", 1)
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_OUTPUTS:
        raise ValueError(f"n must be a whole number from 1 to {MAX_OUTPUTS}")
    return n


async def start(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    denied = refused(request)
    if denied is not None:
        return denied
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _error(INTERNAL, "simulated server error")
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _error(INVALID_REQUEST, str(exc))
    if not isinstance(body, dict):
        return _error(INVALID_REQUEST, "body must be a JSON object")
    callback_url = body.get("callbackUrl")
    if callback_url is not None and not is_http_url(callback_url):
        return _error(INVALID_REQUEST, "callbackUrl must be an http(s) URL")
    try:
        controls = parse_controls(body)
        count = _video_count(body, controls.outputs)
    except (ControlError, ValueError) as exc:
        return _error(INVALID_REQUEST, str(exc))
    controls = replace(with_default_type(controls, body, VIDEO_CONTENT_TYPE), outputs=count)
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        return _error(INVALID_REQUEST, f"idempotency-key must be 1 to {MAX_IDEMPOTENCY_KEY} characters")

    existing = sim.store.by_key(PROTOCOL, key)
    if existing is not None:
        return JSONResponse(start_view(existing, time.time(), with_secret=False))
    if sim.busy(PREFIX):
        return _throttled()
    task = sim.create_task(
        task_id="gwjob_" + secrets.token_hex(12),
        protocol=PROTOCOL,
        model=request.headers[MODEL_ID].strip(),
        input=body,
        controls=controls,
        base_url=server_base(request),
        callback_url=callback_url,
        webhook_secret=secrets.token_urlsafe(32) if callback_url is not None else None,
        idempotency_key=key,
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return JSONResponse(start_view(task, time.time(), with_secret=True))


async def status(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    denied = refused(request)
    if denied is not None:
        return denied
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _error(INTERNAL, "simulated server error")
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _error(INVALID_REQUEST, str(exc))
    if not isinstance(body, dict) or "operation" not in body:
        return _error(INVALID_REQUEST, 'body must be {"operation": <the start answer\'s operation>}')
    operation = body["operation"]
    job_id = operation.get("gatewayJobId") if isinstance(operation, dict) else None
    task = sim.store.get(job_id, PROTOCOL) if isinstance(job_id, str) else None
    if task is None:
        return _error(NOT_FOUND, "video generation job not found")
    return status_answer(task, time.time())


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if event != "completed" or task.callback_url is None or task.webhook_secret is None:
        return None
    event_type = _WEBHOOK_TYPE.get(task.phase(now))
    if event_type is None:
        return None
    secret = task.webhook_secret
    return OutgoingWebhook(
        url=task.callback_url,
        body=dumps({"type": event_type}),
        sign=lambda body, t: {"x-ai-gateway-signature": sign_tv1(secret, body, t)},
    )


routes = [
    Route(f"{BASE}/video-model/start", start, methods=["POST"]),
    Route(f"{BASE}/video-model/status", status, methods=["POST"]),
]
