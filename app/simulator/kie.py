"""KIE's jobs API under /kie (https://docs.kie.ai/market/common/get-task-detail).

KIE answers HTTP 200 and puts the outcome in the body's `code` (200 ok,
401 unauthorized, 404 not found, 422 validation...); only a real server
failure (the simulated 500 faults) is a non-2xx HTTP status. States go
waiting -> queuing -> generating -> success | fail; `param` and `resultJson`
are JSON *strings*. The callback is unsigned: the receiver authenticates it
by the token it put in its own callBackUrl. KIE has no cancel endpoint and
reports no cost.
"""
from __future__ import annotations

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
from app.simulator.wire import BadBody, HoldThenDrop, auth_token, dumps, is_http_url, read_json, server_base

PROTOCOL = "kie"
PREFIX = "/kie"


def _answer(code: int, msg: str, data: Any = None, http_status: int = 200) -> JSONResponse:
    return JSONResponse({"code": code, "msg": msg, "data": data}, status_code=http_status)


def _unauthorized() -> JSONResponse:
    return _answer(401, "You do not have access permissions")


def _ms(ts: float) -> int:
    return int(ts * 1000)


def record_view(task: Task, now: float) -> dict[str, Any]:
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
    terminal = phase.terminal
    failed = terminal and phase is not Phase.SUCCEEDED
    return {
        "taskId": task.id,
        "model": task.model,
        "state": state,
        "param": task.extra["param"],
        "resultJson": json.dumps({"resultUrls": task.output_urls()}) if phase is Phase.SUCCEEDED else "",
        "failCode": "501" if failed else "",
        "failMsg": task.error(now) if failed else "",
        "costTime": _ms(task.finished_at) - _ms(task.created_at) if terminal else None,
        "completeTime": _ms(task.finished_at) if terminal else None,
        "createTime": _ms(task.created_at),
        "updateTime": _ms(updated),
    }


async def create_task(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer") is None:
        return _unauthorized()
    if sim.fault("submit_error"):
        return _answer(500, "simulated server error", http_status=500)
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _answer(422, str(exc))
    if not isinstance(body, dict):
        return _answer(422, "body must be a JSON object")
    model, task_input, callback_url = body.get("model"), body.get("input"), body.get("callBackUrl")
    if not isinstance(model, str) or not model.strip():
        return _answer(422, "model is required")
    if not isinstance(task_input, dict):
        return _answer(422, "input is required (an object)")
    if callback_url is not None and not is_http_url(callback_url):
        return _answer(422, "callBackUrl must be an http(s) URL")
    try:
        controls = parse_controls(task_input)
    except ControlError as exc:
        return _answer(422, str(exc))
    task = sim.create_task(
        task_id=secrets.token_hex(16),
        protocol=PROTOCOL,
        model=model,
        input=task_input,
        controls=controls,
        base_url=server_base(request),
        callback_url=callback_url,
        extra={"param": json.dumps({"model": model, "callBackUrl": callback_url, "input": task_input})},
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return _answer(200, "success", {"taskId": task.id})


async def record_info(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer") is None:
        return _unauthorized()
    sim.store.stats.status_calls += 1
    if sim.fault("status_error"):
        return _answer(500, "simulated server error", http_status=500)
    task_id = request.query_params.get("taskId")
    if not task_id:
        return _answer(422, "taskId is required")
    task = sim.store.get(task_id, PROTOCOL)
    if task is None:
        return _answer(404, "task not found")
    return _answer(200, "success", record_view(task, time.time()))


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if event != "completed" or task.callback_url is None:
        return None
    record = record_view(task, now)
    if record["state"] == "success":
        body = {"code": 200, "msg": "success", "data": record}
    else:
        body = {"code": 501, "msg": record["failMsg"], "data": record}
    return OutgoingWebhook(url=task.callback_url, body=dumps(body), sign=lambda raw, t: {})


routes = [
    Route(f"{PREFIX}/api/v1/jobs/createTask", create_task, methods=["POST"]),
    Route(f"{PREFIX}/api/v1/jobs/recordInfo", record_info, methods=["GET"]),
]
