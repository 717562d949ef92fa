"""fal's queue API under /fal (https://docs.fal.ai/model-endpoints/queue).

Submit to /fal/{endpoint_id} (the id may carry a sub-path, e.g.
fal-ai/flux/dev); status, result and cancel live under the queue root only,
as fal-client addresses them: /fal/{owner}/{alias}/requests/{id}[/status|/cancel],
with three segments in the workflows/ and comfy/ namespaces
(/fal/workflows/{owner}/{alias}/requests/...), and `123-myapp` read as
123/myapp. Status is
IN_QUEUE | IN_PROGRESS (HTTP 202) then COMPLETED (HTTP 200); a failed
request is COMPLETED with `error`, and its result answers the model's error.
Webhooks are signed with Ed25519; the keys are at /fal/.well-known/jwks.json.
fal reports no cost. A result's `file_size` is its file's length in bytes
(`output_bytes`, or the media file `output_duration_s` makes).
`output_text` makes the result a text model's `{"output": <text>}` (the
field fal's any-llm endpoints answer), with no files.
"""
from __future__ import annotations

import hashlib
import re
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.signing.webhooks import jwk_for, sign_fal
from app.simulator.controls import ControlError, parse_controls
from app.simulator.engine import Simulator
from app.simulator.outputs import file_size
from app.simulator.state import CANCEL_REASON, Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import (
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    HoldThenDrop,
    auth_token,
    dumps,
    is_http_url,
    read_json,
    server_base,
)

PROTOCOL = "fal"
PREFIX = "/fal"
_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]*")
# fal-client (AppId.from_endpoint_id) keeps three segments of an id in these
# namespaces and two of any other; an id with no slash is `<digits>-<name>`.
_NAMESPACES = ("workflows", "comfy")
_NUMERIC_APP_RE = re.compile(r"([0-9]+)-([a-zA-Z0-9-]+)")
_REQUEST_TAILS = {None: "result", "status": "status", "cancel": "cancel"}


def queue_root(endpoint_id: str) -> str | None:
    """Where an endpoint's requests are addressed, or None for an id fal
    would not accept: `fal-ai/flux/dev` → `fal-ai/flux`,
    `workflows/me/wf/sub` → `workflows/me/wf`, `123-myapp` → `123/myapp`."""
    parts = endpoint_id.split("/")
    if len(parts) == 1:
        numeric = _NUMERIC_APP_RE.fullmatch(endpoint_id)
        return f"{numeric[1]}/{numeric[2]}" if numeric else None
    keep = 3 if parts[0] in _NAMESPACES else 2
    if len(parts) < keep or not all(_SEGMENT_RE.fullmatch(part) for part in parts):
        return None
    return "/".join(parts[:keep])


def request_ref(path: str) -> tuple[str, str, str] | None:
    """(queue root, request id, "status" | "result" | "cancel") for a path
    under the queue root's `requests/`, else None (then it is a submit)."""
    parts = path.split("/")
    keep = 3 if parts[0] in _NAMESPACES else 2
    if len(parts) not in (keep + 2, keep + 3) or parts[keep] != "requests":
        return None
    tail = parts[keep + 2] if len(parts) == keep + 3 else None
    root = queue_root("/".join(parts[:keep]))
    if root is None or not parts[keep + 1] or tail not in _REQUEST_TAILS:
        return None
    return root, parts[keep + 1], _REQUEST_TAILS[tail]


def _error(status: int, detail: Any, error_type: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"detail": detail}
    headers = {}
    if error_type is not None:
        body["error_type"] = error_type
        headers["x-fal-error-type"] = error_type
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_error(loc: list[str], message: str) -> JSONResponse:
    # fal's model validation errors: 422 with a pydantic-style detail list.
    return JSONResponse(
        {"detail": [{"loc": loc, "msg": message, "type": "value_error"}]}, status_code=422
    )


def _throttled() -> JSONResponse:
    # fal documents no 429 body; fal-client retries a 429 whatever it says.
    # The flat request-error shape, `detail` alone (docs: request-errors).
    return JSONResponse({"detail": "Too many requests"}, status_code=429,
                        headers={"retry-after": str(THROTTLE_RETRY_AFTER_S)})


def _unauthorized() -> JSONResponse:
    return _error(401, "Authentication is required to access this application.")


def _urls(task: Task) -> dict[str, str]:
    base = f"{task.base_url}{PREFIX}/{task.extra['app']}/requests/{task.id}"
    return {"response_url": base, "status_url": f"{base}/status", "cancel_url": f"{base}/cancel"}


def _extension(content_type: str) -> str:
    return re.sub(r"[^a-z0-9]", "", content_type.split("/", 1)[1].split("+", 1)[0]) or "bin"


def result_payload(task: Task) -> dict[str, Any]:
    controls = task.controls
    if controls.output_text is not None:
        # A text model's answer, as fal's LLM endpoints give it (fal-ai/any-llm: `output`).
        return {"output": controls.output_text}
    ext = _extension(controls.content_type)
    return {
        "images": [
            {
                "url": url,
                "content_type": controls.content_type,
                "file_name": f"output_{i}.{ext}",
                "file_size": file_size(controls),
                "width": 1024,
                "height": 1024,
            }
            for i, url in enumerate(task.output_urls())
        ],
        "seed": int(hashlib.sha256(task.id.encode()).hexdigest()[:12], 16),
        "timings": {"inference": round(controls.duration_s * 0.9, 6)},
    }


def _failure_detail(task: Task, now: float) -> list[dict[str, Any]]:
    return [{"loc": ["body"], "msg": task.error(now), "type": "generation_failed"}]


def status_view(task: Task, now: float, with_logs: bool) -> tuple[dict[str, Any], int]:
    phase = task.phase(now)
    body: dict[str, Any] = {"request_id": task.id, **_urls(task)}
    if phase is Phase.QUEUED:
        body.update(status="IN_QUEUE", queue_position=0)
        return body, 202
    if phase is Phase.RUNNING:
        body.update(status="IN_PROGRESS", logs=[] if with_logs else None)
        return body, 202
    body.update(status="COMPLETED", logs=[] if with_logs else None)
    if phase is Phase.SUCCEEDED or phase is Phase.FAILED:
        body["metrics"] = {"inference_time": round(task.done_at - task.started_at, 6)}
    if phase is Phase.FAILED:
        body.update(error=task.error(now), error_type="runner_server_error")
    elif phase is Phase.CANCELLED:
        body.update(error="Request was cancelled", error_type="client_cancelled")
    return body, 200


async def _submit(request: Request, model_id: str, app_path: str) -> Response:
    sim: Simulator = request.app.state.sim
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _error(500, "simulated submit error", "internal_error")
    webhook = request.query_params.get("fal_webhook")
    if webhook is not None and not is_http_url(webhook):
        return _validation_error(["query", "fal_webhook"], "must be an http(s) URL")
    try:
        body = await read_json(request, empty={})
    except BadBody as exc:
        return _validation_error(["body"], str(exc))
    if not isinstance(body, dict):
        return _validation_error(["body"], "body must be a JSON object")
    try:
        controls = parse_controls(body)
    except ControlError as exc:
        return _validation_error(["body", exc.field], str(exc))
    if sim.busy(PREFIX):
        return _throttled()
    task = sim.create_task(
        task_id=str(uuid.uuid4()),
        protocol=PROTOCOL,
        model=model_id,
        input=body,
        controls=controls,
        base_url=server_base(request),
        callback_url=webhook,
        extra={"app": app_path},
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    # fal-client reads request_id and the three URLs (and then uses those
    # URLs); fal's JS client types the answer as an IN_QUEUE status, hence
    # `status` and `queue_position`. Nothing else is documented here.
    return JSONResponse({"status": "IN_QUEUE", "request_id": task.id, **_urls(task), "queue_position": 0})


def _find(sim: Simulator, app_path: str, request_id: str) -> Task | None:
    task = sim.store.get(request_id, PROTOCOL)
    # Status/result/cancel URLs name the queue root only, never the sub-path:
    # a URL built from the full endpoint id is wrong on real fal, so here too.
    if task is None or task.extra["app"] != app_path:
        return None
    return task


async def _status(request: Request, app_path: str, request_id: str) -> Response:
    sim: Simulator = request.app.state.sim
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _error(500, "simulated status error", "internal_error")
    task = _find(sim, app_path, request_id)
    if task is None:
        return _error(404, "Request not found")
    with_logs = request.query_params.get("logs") in ("1", "true")
    body, status = status_view(task, time.time(), with_logs)
    return JSONResponse(body, status_code=status)


async def _result(request: Request, app_path: str, request_id: str) -> Response:
    sim: Simulator = request.app.state.sim
    if sim.fault("status_error"):
        return _error(500, "simulated status error", "internal_error")
    task = _find(sim, app_path, request_id)
    if task is None:
        return _error(404, "Request not found")
    now = time.time()
    phase = task.phase(now)
    if not phase.terminal:
        return _error(400, "Request is still in progress")
    if phase is Phase.FAILED:
        return JSONResponse({"detail": _failure_detail(task, now)}, status_code=422)
    if phase is Phase.CANCELLED:
        return _error(400, "Request was cancelled", "client_cancelled")
    return JSONResponse(result_payload(task))


async def _cancel(request: Request, app_path: str, request_id: str) -> Response:
    sim: Simulator = request.app.state.sim
    task = _find(sim, app_path, request_id)
    if task is None:
        return JSONResponse({"status": "NOT_FOUND"}, status_code=404)
    if not sim.cancel_task(task):
        return JSONResponse({"status": "ALREADY_COMPLETED"}, status_code=400)
    return JSONResponse({"status": "CANCELLATION_REQUESTED"}, status_code=202)


async def queue(request: Request) -> Response:
    """Every /fal/... route but the JWKS: fal's paths are model ids with
    slashes, so they are told apart here rather than by the router."""
    if auth_token(request, "Key") is None:
        return _unauthorized()
    path = request.path_params["path"].strip("/")
    method = request.method
    ref = request_ref(path)
    if ref is not None:
        app_path, request_id, action = ref
        if method in ("GET", "HEAD") and action == "status":
            return await _status(request, app_path, request_id)
        if method in ("GET", "HEAD") and action == "result":
            return await _result(request, app_path, request_id)
        if method == "PUT" and action == "cancel":
            return await _cancel(request, app_path, request_id)
        return _error(405, "Method Not Allowed")
    root = queue_root(path)
    if method == "POST" and root is not None and "/requests/" not in f"/{path}/":
        return await _submit(request, path, root)
    return _error(404, "Not Found")


async def jwks(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse({"keys": [jwk_for(sim.fal_private_key.public_key())]})


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if event != "completed" or task.callback_url is None:
        return None
    phase = task.phase(now)
    body: dict[str, Any] = {"request_id": task.id, "gateway_request_id": task.id}
    if phase is Phase.SUCCEEDED:
        body.update(status="OK", payload=result_payload(task), error=None)
    elif phase is Phase.FAILED:
        body.update(status="ERROR", error="Invalid status code: 422", payload={"detail": _failure_detail(task, now)})
    else:
        body.update(status="ERROR", error=CANCEL_REASON.capitalize(), payload=None)
    key, user_id, request_id = sim.fal_private_key, sim.fal_user_id, task.id

    def sign(raw: bytes, t: int) -> dict[str, str]:
        return {
            "x-fal-webhook-request-id": request_id,
            "x-fal-webhook-user-id": user_id,
            "x-fal-webhook-timestamp": str(t),
            "x-fal-webhook-signature": sign_fal(key, request_id, user_id, t, raw),
        }

    return OutgoingWebhook(url=task.callback_url, body=dumps(body), sign=sign)


routes = [
    Route(f"{PREFIX}/.well-known/jwks.json", jwks, methods=["GET"]),
    Route(f"{PREFIX}/{{path:path}}", queue, methods=["GET", "POST", "PUT"]),
]
