"""The simulator's own protocol (provider `sim`): /v1/tasks.

Its prefix, for `max_concurrent` and `peak_concurrent`, is "/v1" (where its
routes are mounted; the other protocols' prefixes are their mount points
too: "/replicate", "/anthropic", ...). Above `max_concurrent` a create is
the throttle's 429 (`retry-after: 1`).
"""
from __future__ import annotations

import secrets
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.signing.webhooks import sign_tv1
from app.simulator.controls import ControlError, parse_controls
from app.simulator.engine import Simulator
from app.simulator.state import Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import (
    MAX_IDEMPOTENCY_KEY,
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    HoldThenDrop,
    dumps,
    is_http_url,
    read_json,
    server_base,
)

PROTOCOL = "sim"
PREFIX = "/v1"


def task_view(task: Task, now: float) -> dict[str, Any]:
    phase = task.phase(now)
    succeeded = phase is Phase.SUCCEEDED
    return {
        "id": task.id,
        "status": phase.value,
        "outputs": outputs(task) if succeeded else [],
        # An int always (CONTRACT.md): nothing is charged before a success.
        "cost": task.controls.cost if succeeded else 0,
        "error": task.error(now),
    }


def outputs(task: Task) -> list[str]:
    """A succeeded task's outputs: its file URLs or, with `output_text`,
    that text as its one output."""
    if task.controls.output_text is not None:
        return [task.controls.output_text]
    return task.output_urls()


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _throttled() -> JSONResponse:
    return JSONResponse({"error": "rate limited"}, status_code=429,
                        headers={"retry-after": str(THROTTLE_RETRY_AFTER_S)})


def _created(task: Task, status: int) -> JSONResponse:
    return JSONResponse({"id": task.id, "webhook_secret": task.webhook_secret}, status_code=status)


async def create_task(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _error("simulated submit error", 500)
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _error(str(exc), 400)
    if not isinstance(body, dict):
        return _error("body must be a JSON object", 400)
    model, task_input, callback_url = body.get("model"), body.get("input"), body.get("callback_url")
    if not isinstance(model, str) or not model.strip():
        return _error("model is required (a non-empty string)", 400)
    if not isinstance(task_input, dict):
        return _error("input must be a JSON object", 400)
    if callback_url is not None and not is_http_url(callback_url):
        return _error("callback_url must be an http(s) URL", 400)
    try:
        controls = parse_controls(task_input)
    except ControlError as exc:
        return _error(str(exc), 400)
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        return _error(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters", 400)

    existing = sim.store.by_key(PROTOCOL, key)
    if existing is not None:
        return _created(existing, 200)
    if sim.busy(PREFIX):
        return _throttled()
    task = sim.create_task(
        task_id="sim_" + secrets.token_hex(12),
        protocol=PROTOCOL,
        model=model,
        input=task_input,
        controls=controls,
        base_url=server_base(request),
        callback_url=callback_url,
        webhook_secret=secrets.token_urlsafe(32),
        idempotency_key=key,
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return _created(task, 201)


async def get_task(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _error("simulated status error", 500)
    task = sim.store.get(request.path_params["task_id"], PROTOCOL)
    if task is None:
        return _error("task not found", 404)
    return JSONResponse(task_view(task, time.time()))


async def cancel_task(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    task = sim.store.get(request.path_params["task_id"], PROTOCOL)
    if task is None:
        return _error("task not found", 404)
    sim.cancel_task(task)
    return JSONResponse(task_view(task, time.time()))


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if event != "completed" or task.callback_url is None or task.webhook_secret is None:
        return None
    secret = task.webhook_secret
    return OutgoingWebhook(
        url=task.callback_url,
        body=dumps(task_view(task, now)),
        sign=lambda body, t: {"x-signature": sign_tv1(secret, body, t)},
    )


routes = [
    Route(f"{PREFIX}/tasks", create_task, methods=["POST"]),
    Route(f"{PREFIX}/tasks/{{task_id}}", get_task, methods=["GET"]),
    Route(f"{PREFIX}/tasks/{{task_id}}/cancel", cancel_task, methods=["POST"]),
]
