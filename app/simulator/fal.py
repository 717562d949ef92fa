"""fal's queue API under /fal (https://docs.fal.ai/model-endpoints/queue).

Submit to /fal/{model_id} (the model id may carry a sub-path, e.g.
fal-ai/flux/dev); status, result and cancel live under the owner/app only:
/fal/{owner}/{app}/requests/{request_id}[/status|/cancel]. Status is
IN_QUEUE | IN_PROGRESS (HTTP 202) then COMPLETED (HTTP 200); a failed
request is COMPLETED with `error`, and its result answers the model's error.
Webhooks are signed with Ed25519; the keys are at /fal/.well-known/jwks.json.
fal reports no cost.
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
from app.simulator.state import CANCEL_REASON, Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import BadBody, HoldThenDrop, auth_token, dumps, is_http_url, read_json, server_base

PROTOCOL = "fal"
PREFIX = "/fal"
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._~-]*"
_MODEL_RE = re.compile(rf"{_SEGMENT}(/{_SEGMENT})+")
_REQUEST_RE = re.compile(rf"(?P<app>{_SEGMENT}/{_SEGMENT})/requests/(?P<id>[^/]+)(?P<tail>/status|/cancel)?")


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


def _unauthorized() -> JSONResponse:
    return _error(401, "Authentication is required to access this application.")


def _urls(task: Task) -> dict[str, str]:
    base = f"{task.base_url}{PREFIX}/{task.extra['app']}/requests/{task.id}"
    return {"response_url": base, "status_url": f"{base}/status", "cancel_url": f"{base}/cancel"}


def _extension(content_type: str) -> str:
    return re.sub(r"[^a-z0-9]", "", content_type.split("/", 1)[1].split("+", 1)[0]) or "bin"


def result_payload(task: Task) -> dict[str, Any]:
    controls = task.controls
    ext = _extension(controls.content_type)
    return {
        "images": [
            {
                "url": url,
                "content_type": controls.content_type,
                "file_name": f"output_{i}.{ext}",
                "file_size": controls.output_bytes,
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


async def _submit(request: Request, model_id: str) -> Response:
    sim: Simulator = request.app.state.sim
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
    app_path = "/".join(model_id.split("/")[:2])
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
    return JSONResponse({
        "status": "IN_QUEUE",
        "request_id": task.id,
        "gateway_request_id": task.id,
        **_urls(task),
        "queue_position": 0,
    })


def _find(sim: Simulator, app_path: str, request_id: str) -> Task | None:
    task = sim.store.get(request_id, PROTOCOL)
    # Status/result/cancel URLs name the owner/app only, never the sub-path:
    # a URL built from the full model id is wrong on real fal, so here too.
    if task is None or task.extra["app"] != app_path:
        return None
    return task


async def _status(request: Request, task_ref: re.Match) -> Response:
    sim: Simulator = request.app.state.sim
    sim.store.stats.status_calls += 1
    if sim.fault("status_error"):
        return _error(500, "simulated status error", "internal_error")
    task = _find(sim, task_ref["app"], task_ref["id"])
    if task is None:
        return _error(404, "Request not found")
    with_logs = request.query_params.get("logs") in ("1", "true")
    body, status = status_view(task, time.time(), with_logs)
    return JSONResponse(body, status_code=status)


async def _result(request: Request, task_ref: re.Match) -> Response:
    sim: Simulator = request.app.state.sim
    if sim.fault("status_error"):
        return _error(500, "simulated status error", "internal_error")
    task = _find(sim, task_ref["app"], task_ref["id"])
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


async def _cancel(request: Request, task_ref: re.Match) -> Response:
    sim: Simulator = request.app.state.sim
    task = _find(sim, task_ref["app"], task_ref["id"])
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
    task_ref = _REQUEST_RE.fullmatch(path)
    method = request.method
    if task_ref is not None:
        tail = task_ref["tail"]
        if method in ("GET", "HEAD") and tail == "/status":
            return await _status(request, task_ref)
        if method in ("GET", "HEAD") and tail is None:
            return await _result(request, task_ref)
        if method == "PUT" and tail == "/cancel":
            return await _cancel(request, task_ref)
        return _error(405, "Method Not Allowed")
    if method == "POST" and _MODEL_RE.fullmatch(path) and "/requests/" not in f"/{path}/":
        return await _submit(request, path)
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
