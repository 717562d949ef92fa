"""KIE's Market jobs API under /kie (https://docs.kie.ai/market/common/get-task-detail).

KIE answers HTTP 200 and puts the outcome in the body's `code` (200 ok,
401 unauthorized, 404 not found, 422 validation...); only a real server
failure (the simulated 500 faults) is a non-2xx HTTP status. States go
waiting -> queuing -> generating -> success | fail; `param` and `resultJson`
are JSON *strings*, times epoch milliseconds. KIE has no cancel endpoint and
reports no cost.

The envelope's text key differs by page in KIE's docs: createTask's examples
say `msg`, the current Get Task Details page says `message`; each route here
answers its own page's form. The Market callback has no page of its own; it
is sent as the recordInfo answer for the task at that moment.

Callbacks are unsigned unless a `webhookHmacKey` is set (KIE's account
setting; here `PUT /_sim/kie/webhook-hmac-key`): then they carry KIE's
`X-Webhook-Timestamp` and `X-Webhook-Signature`
(https://docs.kie.ai/common-api/webhook-verification), which sign only
`taskId.timestamp`, never the body.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.simulator.controls import ControlError, parse_controls
from app.simulator.engine import Simulator
from app.simulator.state import QUEUED_SHARE, Phase, Task
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

PROTOCOL = "kie"
PREFIX = "/kie"
# The failCode of a failed task: the code KIE's docs give "Generation Failed".
GENERATION_FAILED = "501"


def _create_answer(code: int, msg: str, data: Any = None, http_status: int = 200) -> JSONResponse:
    return JSONResponse({"code": code, "msg": msg, "data": data}, status_code=http_status)


def _record_envelope(code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"code": code, "message": message, "data": data}


def _record_answer(code: int, message: str, data: Any = None, http_status: int = 200) -> JSONResponse:
    return JSONResponse(_record_envelope(code, message, data), status_code=http_status)


UNAUTHORIZED = "You do not have access permissions"
# The code table's name for 429.
RATE_LIMITED = "Rate Limited"


def _throttle_headers() -> dict[str, str]:
    return {"retry-after": str(THROTTLE_RETRY_AFTER_S)}


def _ms(ts: float) -> int:
    return int(ts * 1000)


def record_view(task: Task, now: float) -> dict[str, Any]:
    """The task as Get Task Details' `data`: exactly the fields that page lists."""
    phase = task.phase(now)
    queuing_at = task.created_at + QUEUED_SHARE * task.controls.duration_s / 2
    if phase is Phase.QUEUED:
        state, updated = ("waiting", task.created_at) if now < queuing_at else ("queuing", queuing_at)
    elif phase is Phase.RUNNING:
        state, updated = "generating", task.started_at
    elif phase is Phase.SUCCEEDED:
        state, updated = "success", task.finished_at
    else:
        state, updated = "fail", task.finished_at
    failed = state == "fail"
    return {
        "taskId": task.id,
        "model": task.model,
        "state": state,
        "param": task.extra["param"],
        "resultJson": json.dumps({"resultUrls": task.output_urls()}) if state == "success" else "",
        "failCode": GENERATION_FAILED if failed else "",
        "failMsg": task.error(now) if failed else "",
        "completeTime": _ms(task.finished_at) if phase.terminal else None,
        "createTime": _ms(task.created_at),
        "updateTime": _ms(updated),
    }


def request_param(model: str, callback_url: str | None, task_input: dict[str, Any]) -> str:
    """`param`: the create request as KIE echoes it, a JSON string."""
    request: dict[str, Any] = {"model": model}
    if callback_url is not None:
        request["callBackUrl"] = callback_url
    request["input"] = task_input
    return json.dumps(request)


async def create_task(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer") is None:
        return _create_answer(401, UNAUTHORIZED)
    if sim.fault("throttle"):
        response = _create_answer(429, RATE_LIMITED, http_status=429)
        response.headers.update(_throttle_headers())
        return response
    if sim.fault("submit_error"):
        return _create_answer(500, "simulated server error", http_status=500)
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _create_answer(422, str(exc))
    if not isinstance(body, dict):
        return _create_answer(422, "body must be a JSON object")
    model, task_input, callback_url = body.get("model"), body.get("input"), body.get("callBackUrl")
    if not isinstance(model, str) or not model.strip():
        return _create_answer(422, "model is required")
    if not isinstance(task_input, dict):
        return _create_answer(422, "input is required (an object)")
    if callback_url is not None and not is_http_url(callback_url):
        return _create_answer(422, "callBackUrl must be an http(s) URL")
    try:
        controls = parse_controls(task_input)
    except ControlError as exc:
        return _create_answer(422, str(exc))
    task = sim.create_task(
        task_id="task_" + secrets.token_hex(16),  # KIE's examples: "task_12345678"
        protocol=PROTOCOL,
        model=model,
        input=task_input,
        controls=controls,
        base_url=server_base(request),
        callback_url=callback_url,
        extra={"param": request_param(model, callback_url, task_input)},
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return _create_answer(200, "success", {"taskId": task.id})


async def record_info(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer") is None:
        return _record_answer(401, UNAUTHORIZED)
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        response = _record_answer(429, RATE_LIMITED, http_status=429)
        response.headers.update(_throttle_headers())
        return response
    if sim.fault("status_error"):
        return _record_answer(500, "simulated server error", http_status=500)
    task_id = request.query_params.get("taskId")
    if not task_id:
        return _record_answer(422, "taskId is required")
    task = sim.store.get(task_id, PROTOCOL)
    if task is None:
        return _record_answer(404, "task not found")
    return _record_answer(200, "success", record_view(task, time.time()))


def webhook_signature(key: str, task_id: str, timestamp: int) -> str:
    """KIE's X-Webhook-Signature: base64(HMAC-SHA256(key, "{taskId}.{timestamp}"))."""
    digest = hmac.new(key.encode("utf-8"), f"{task_id}.{timestamp}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if event != "completed" or task.callback_url is None:
        return None
    body = dumps(_record_envelope(200, "success", record_view(task, now)))
    key = sim.kie_webhook_hmac_key

    def sign(raw: bytes, t: int) -> dict[str, str]:
        if key is None:
            return {}
        return {"X-Webhook-Timestamp": str(t), "X-Webhook-Signature": webhook_signature(key, task.id, t)}

    return OutgoingWebhook(url=task.callback_url, body=body, sign=sign)


async def get_hmac_key(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse({"key": sim.kie_webhook_hmac_key})


async def set_hmac_key(request: Request) -> Response:
    """Turn KIE's optional callback signature on for callbacks sent from now."""
    sim: Simulator = request.app.state.sim
    try:
        body = await read_json(request)
    except BadBody as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str) or not key:
        return JSONResponse({"error": 'body must be {"key": "<a non-empty string>"}'}, status_code=400)
    sim.kie_webhook_hmac_key = key
    return JSONResponse({"key": key})


async def clear_hmac_key(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    sim.kie_webhook_hmac_key = None
    return JSONResponse({"key": None})


routes = [
    Route(f"{PREFIX}/api/v1/jobs/createTask", create_task, methods=["POST"]),
    Route(f"{PREFIX}/api/v1/jobs/recordInfo", record_info, methods=["GET"]),
    Route("/_sim/kie/webhook-hmac-key", get_hmac_key, methods=["GET"]),
    Route("/_sim/kie/webhook-hmac-key", set_hmac_key, methods=["PUT"]),
    Route("/_sim/kie/webhook-hmac-key", clear_hmac_key, methods=["DELETE"]),
]
