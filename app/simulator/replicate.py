"""Replicate's HTTP API under /replicate (https://replicate.com/docs/reference/http).

Predictions go starting -> processing -> succeeded | failed | canceled, or
`aborted` when a `Cancel-After` deadline passes before they start (and
`canceled` when it passes while they run: the changelog of 2025-10-16).
Create has no idempotency key (an Idempotency-Key header is ignored, as
Replicate ignores it); `Prefer: wait[=n]` holds the answer until the
prediction ends or n seconds (60 at most) pass. Webhooks are Standard Webhooks signed with the one
account secret served at /v1/webhooks/default/secret. A prediction carries
the fields of the OpenAPI document's prediction response, and no others: not
the `webhook` it was created with, which the document does not return.

Trainings (`POST /v1/models/{owner}/{name}/versions/{version_id}/trainings`
with `{destination, input, webhook?, webhook_events_filter?}`; `GET
/v1/trainings[/{id}]`, `POST /v1/trainings/{id}/cancel`) are tasks of this
protocol too, with the same controls in `input`, the same faults and
webhooks. A training carries the fields of the training response schema and
`urls.web` (every OpenAPI example has it), and no others: not
`data_removed` nor `deadline` (the schema has neither). The create answer
is the documented one: `id, model, version, input, logs, error, status,
created_at, urls`, its `urls` pointing at /v1/predictions/{id} as the
OpenAPI example and replicate-python's recorded trainings-create.yaml do;
later answers point at /v1/trainings/{id}. Where the documents are silent:
- the predictions routes do not serve trainings, nor list them (the API's
  /v1/predictions/{training id} is nowhere documented): following the
  create answer's `urls` finds nothing here;
- a malformed `destination` is the recorded 404 "The specified training
  destination does not exist"; any `owner/name` exists here;
- the list takes no filter (none is documented), pages like predictions;
- `Cancel-After` and `Prefer` are ignored (documented for predictions only);
- a succeeded training's `output` is `{"version": "<destination>:<new
  version id>", "weights": <output 0's URL>}` (the form every recorded
  answer has, and the one replicate 1.0.7 parses); `outputs: 0` makes it
  null (a trainer that pushed nothing). After the output lifetime the
  weights URL answers 404 and the output stays as it was.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.signing.webhooks import sign_standard_webhooks
from app.simulator.controls import ControlError, parse_controls
from app.simulator.engine import Simulator
from app.simulator.state import Phase, Task
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
    sleep_until,
)

PROTOCOL = "replicate"
PREFIX = "/replicate"
WEBHOOK_EVENTS = ("start", "output", "logs", "completed")
_STATUS = {
    Phase.QUEUED: "starting",
    Phase.RUNNING: "processing",
    Phase.SUCCEEDED: "succeeded",
    Phase.FAILED: "failed",
    Phase.CANCELLED: "canceled",
}


def _problem(status: int, title: str, detail: str) -> JSONResponse:
    # Replicate answers errors as RFC 7807 problem details.
    return JSONResponse({"title": title, "detail": detail, "status": status}, status_code=status)


def _throttled() -> JSONResponse:
    # The body of docs/topics/predictions/rate-limits: `detail` alone. The
    # page names no Retry-After; the simulator's contract sends one.
    return JSONResponse({"detail": "Request was throttled. Expected available in 1 second."}, status_code=429,
                        headers={"retry-after": str(THROTTLE_RETRY_AFTER_S)})


_DURATION_RE = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
MIN_CANCEL_AFTER_S = 5
_PREFER_WAIT_RE = re.compile(r"wait(?:=([1-9]|[1-9][0-9]|60))?")
MAX_WAIT_S = 60


def parse_cancel_after(value: str) -> int:
    """A `Cancel-After` duration in seconds (pure): `30` (seconds), `30s`,
    `5m`, `1h30m45s`; at least 5 s. ValueError otherwise (what the API
    answers then is not documented)."""
    text = value.strip()
    if text.isdigit():
        seconds = int(text)
    else:
        match = _DURATION_RE.fullmatch(text)
        if not text or match is None:
            raise ValueError("Cancel-After must be a duration such as 30s, 5m or 1h30m")
        hours, minutes, secs = (int(part or 0) for part in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds < MIN_CANCEL_AFTER_S:
        raise ValueError(f"Cancel-After must be at least {MIN_CANCEL_AFTER_S} seconds")
    return seconds


def parse_prefer_wait(value: str | None) -> int | None:
    """The seconds `Prefer: wait[=n]` asks the create to wait (pure); None
    without the header; ValueError outside the documented pattern
    `^wait(=([1-9]|[1-9][0-9]|60))?$`. The pattern lets 61..99 through; the
    prose says the request waits "up to 60 seconds": at most 60."""
    if value is None:
        return None
    match = _PREFER_WAIT_RE.fullmatch(value.strip())
    if match is None:
        raise ValueError("Prefer must be wait or wait=1 to wait=60")
    return min(int(match.group(1)), MAX_WAIT_S) if match.group(1) else MAX_WAIT_S


def _unauthenticated() -> JSONResponse:
    return _problem(401, "Unauthenticated", "You did not pass a valid authentication token")


def _not_found() -> JSONResponse:
    return _problem(404, "Not found", "The requested resource could not be found.")


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _prediction_id() -> str:
    # Replicate ids: 26 lowercase base32 characters.
    return base64.b32encode(os.urandom(20)).decode("ascii").lower()[:26]


def _fake_version(model: str) -> str:
    return hashlib.sha256(f"replicate-sim|{model}".encode()).hexdigest()


def status_of(task: Task, now: float) -> str:
    """The prediction's status word (pure): a deadline that passed before
    the prediction started aborted it."""
    phase = task.phase(now)
    if phase is Phase.CANCELLED and task.stopped_by_deadline and task.finished_at < task.started_at:
        return "aborted"
    return _STATUS[phase]


def prediction_view(task: Task, now: float) -> dict[str, Any]:
    phase = task.phase(now)
    terminal = phase.terminal
    started = _started(task, phase)
    completed = task.finished_at if terminal else None
    metrics: dict[str, Any] = {}
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        metrics = {
            "predict_time": round(task.done_at - task.started_at, 6),
            "total_time": round(task.done_at - task.created_at, 6),
        }
    # The API removes "all input parameters, output values, output files,
    # and logs" of a prediction an hour after it ends (docs: Data retention;
    # the output's lifetime here): `input` is left empty, `output` null and
    # a success's `data_removed` true.
    aged = phase in (Phase.SUCCEEDED, Phase.FAILED) and now >= task.outputs_expire_at
    removed = phase is Phase.SUCCEEDED and aged
    base = f"{task.base_url}{PREFIX}/v1/predictions/{task.id}"
    # `web`, `get` and `cancel` are required; `web` is the prediction's page
    # on the website (replicate.com/p/<id>), here on the simulator's host
    # (not served: nothing reads it).
    view: dict[str, Any] = {
        "id": task.id,
        "model": task.model,
        "version": task.extra["version"],
        "input": {} if aged else task.input,
        "logs": "",
        "output": _output(task) if phase is Phase.SUCCEEDED and not removed else None,
        "data_removed": removed,
        "error": task.error(now) if phase is Phase.FAILED else None,
        "source": "api",
        "status": status_of(task, now),
        "created_at": _iso(task.created_at),
        "started_at": _iso(started),
        "completed_at": _iso(completed),
        "urls": {"web": f"{task.base_url}{PREFIX}/p/{task.id}", "get": base, "cancel": f"{base}/cancel"},
        "metrics": metrics,
    }
    if task.deadline_at is not None:
        view["deadline"] = _iso(task.deadline_at)  # optional: only with a Cancel-After
    return view


def _output(task: Task) -> str | list[str]:
    # A language model answers its text; others a list of file URLs.
    if task.controls.output_text is not None:
        return task.controls.output_text
    return task.output_urls()


TRAINING = "training"  # task.extra["kind"] of a training


def is_training(task: Task) -> bool:
    return task.extra.get("kind") == TRAINING


def new_version_id(task: Task) -> str:
    """The id of the version a training pushes to its destination (pure):
    64 hex characters, as Replicate's version ids are, fixed per training."""
    return hashlib.sha256(f"replicate-sim-training|{task.id}".encode()).hexdigest()


def _started(task: Task, phase: Phase) -> float | None:
    # A task stopped before its start never started.
    if phase is Phase.QUEUED or (phase is Phase.CANCELLED and task.finished_at < task.started_at):
        return None
    return task.started_at


def training_view(task: Task, now: float, *, created: bool = False) -> dict[str, Any]:
    """A training as the API shows it; `created`: the create's answer, with
    the fields the documented one has and its `urls` at /v1/predictions."""
    phase = task.phase(now)
    resource = "predictions" if created else "trainings"
    base = f"{task.base_url}{PREFIX}/v1/{resource}/{task.id}"
    view: dict[str, Any] = {
        "id": task.id,
        "model": task.model,
        "version": task.extra["version"],
        "input": task.input,
        "logs": "",
        "error": task.error(now) if phase is Phase.FAILED else None,
        "status": status_of(task, now),
        "created_at": _iso(task.created_at),
        "urls": {"web": f"{task.base_url}{PREFIX}/p/{task.id}", "get": base, "cancel": f"{base}/cancel"},
    }
    if created:
        return view
    started = _started(task, phase)
    metrics: dict[str, Any] = {}
    if phase.terminal:  # "Terminated trainings ... will include a metrics object" (trainings.get)
        metrics = {
            "predict_time": round(task.finished_at - started, 6) if started is not None else 0.0,
            "total_time": round(task.finished_at - task.created_at, 6),
        }
    output = None
    if phase is Phase.SUCCEEDED and task.controls.outputs > 0:
        output = {"version": f"{task.extra['destination']}:{new_version_id(task)}",
                  "weights": task.output_urls()[0]}
    view.update({
        "output": output,
        "source": "api",
        "started_at": _iso(started),
        "completed_at": _iso(task.finished_at if phase.terminal else None),
        "metrics": metrics,
    })
    return view


def _refused_create(sim: Simulator, request: Request) -> Response | None:
    """The answer to a create that is not served (no token, a fault), or None."""
    if auth_token(request, "Bearer", "Token") is None:
        return _unauthenticated()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _problem(500, "Internal server error", "simulated submit error")
    return None


async def _body_object(request: Request) -> dict[str, Any] | Response:
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _problem(400, "Bad request", str(exc))
    if not isinstance(body, dict):
        return _problem(400, "Bad request", "body must be a JSON object")
    return body


def _webhook_of(body: dict[str, Any]) -> tuple[str | None, tuple[str, ...]] | Response:
    """The create body's `webhook` and the events it is sent for (of those
    the simulator sends: start, completed), or the 422 for a bad one."""
    webhook = body.get("webhook")
    if webhook is not None and not is_http_url(webhook):
        return _problem(422, "Input validation failed", "- webhook: must be an http(s) URL")
    events = body.get("webhook_events_filter")
    if events is None:
        events = list(WEBHOOK_EVENTS)
    elif not isinstance(events, list) or not events or any(e not in WEBHOOK_EVENTS for e in events):
        return _problem(
            422,
            "Input validation failed",
            "- webhook_events_filter: a non-empty list of start, output, logs, completed",
        )
    return webhook, tuple(e for e in ("start", "completed") if e in events)


async def _create(request: Request, model: str | None) -> Response:
    """Shared by create-by-version (`model` None) and create-by-model."""
    sim: Simulator = request.app.state.sim
    if (refused := _refused_create(sim, request)) is not None:
        return refused
    try:
        cancel_after = request.headers.get("cancel-after")
        lifetime_s = parse_cancel_after(cancel_after) if cancel_after is not None else None
        wait_s = parse_prefer_wait(request.headers.get("prefer"))
    except ValueError as exc:
        return _problem(422, "Input validation failed", f"- {exc}")
    body = await _body_object(request)
    if isinstance(body, Response):
        return body
    if model is None:
        version = body.get("version")
        if not isinstance(version, str) or not version.strip():
            return _problem(422, "Input validation failed", "- version: version is required")
        # "owner/name:hash", "owner/name" or a bare version hash
        name, _, hash_ = version.partition(":")
        if "/" in name:
            model, version = name, hash_ or _fake_version(name)
        else:
            model = "replicate-sim/unknown"
    else:
        version = _fake_version(model)
    task_input = body.get("input")
    if not isinstance(task_input, dict):
        return _problem(422, "Input validation failed", "- input: input is required (an object)")
    hook = _webhook_of(body)
    if isinstance(hook, Response):
        return hook
    webhook, events = hook
    try:
        controls = parse_controls(task_input)
    except ControlError as exc:
        return _problem(422, "Input validation failed", f"- {exc}")
    if sim.busy(PREFIX):
        return _throttled()
    task = sim.create_task(
        task_id=_prediction_id(),
        protocol=PROTOCOL,
        model=model,
        input=task_input,
        controls=controls,
        base_url=server_base(request),
        callback_url=webhook,
        webhook_events=events,
        extra={"version": version},
        lifetime_s=lifetime_s,
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    if wait_s is None:
        return JSONResponse(prediction_view(task, time.time()), status_code=201)
    # Wait for the end or the limit, whichever comes first (a cancel in the
    # meantime shows at the limit).
    await sleep_until(min(task.created_at + wait_s, task.finished_at), time.time)
    return JSONResponse(prediction_view(task, time.time()), status_code=201,
                        headers={"preference-applied": f"wait={wait_s}"})


async def create_by_version(request: Request) -> Response:
    return await _create(request, None)


async def create_by_model(request: Request) -> Response:
    owner, name = request.path_params["owner"], request.path_params["name"]
    return await _create(request, f"{owner}/{name}")


async def _read(request: Request, find: Callable[[Simulator, str], Task | None], view: Callable[[Task, float], Any],
                param: str) -> Response:
    """GET of one prediction or training (`find` tells them apart)."""
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer", "Token") is None:
        return _unauthenticated()
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _problem(500, "Internal server error", "simulated status error")
    task = find(sim, request.path_params[param])
    if task is None:
        return _not_found()
    return JSONResponse(view(task, time.time()))


async def _cancel(request: Request, find: Callable[[Simulator, str], Task | None],
                  view: Callable[[Task, float], Any], param: str) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer", "Token") is None:
        return _unauthenticated()
    task = find(sim, request.path_params[param])
    if task is None:
        return _not_found()
    sim.cancel_task(task)  # a finished one is returned as it is
    return JSONResponse(view(task, time.time()))


async def get_prediction(request: Request) -> Response:
    return await _read(request, _prediction, prediction_view, "prediction_id")


async def cancel_prediction(request: Request) -> Response:
    return await _cancel(request, _prediction, prediction_view, "prediction_id")


def _prediction(sim: Simulator, task_id: str) -> Task | None:
    task = sim.store.get(task_id, PROTOCOL)
    return task if task is not None and not is_training(task) else None


def _encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode("ascii")).decode("ascii").rstrip("=")


def _decode_cursor(cursor: str) -> int | None:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        return None
    prefix, _, number = raw.partition(":")
    if prefix != "seq" or not number.isdigit():
        return None
    return int(number)


def _parse_time(value: str | None) -> datetime | None:
    """A `created_after`/`created_before` date-time (one without an offset
    is UTC); ValueError when it is not one."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _created(task: Task) -> datetime:
    # As `created_at` shows it (whole microseconds): a prediction's own
    # `created_at` given as `created_after` lists it.
    return datetime.fromtimestamp(task.created_at, UTC)


async def list_predictions(request: Request) -> Response:
    """Newest first, `page_size` per page, `next` is the URL of the next page
    (with the same filters). `created_after` is inclusive, `created_before`
    exclusive, as the OpenAPI document says."""
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer", "Token") is None:
        return _unauthenticated()
    query = request.query_params
    try:
        after, before = _parse_time(query.get("created_after")), _parse_time(query.get("created_before"))
    except ValueError:
        # Not documented: what the API answers to a malformed date-time.
        return _problem(400, "Bad request", "created_after and created_before must be ISO 8601 date-times")
    predictions = [
        task for task in sim.store.by_protocol.get(PROTOCOL, [])
        if not is_training(task)
        and (after is None or _created(task) >= after) and (before is None or _created(task) < before)
    ]
    filters = {k: query[k] for k in ("created_after", "created_before") if k in query}
    return _page(sim, request, predictions, "predictions", filters, prediction_view)


def _page(sim: Simulator, request: Request, tasks: list[Task], resource: str, filters: dict[str, str],
          view: Callable[[Task, float], dict[str, Any]]) -> Response:
    """One page of `tasks` (in creation order) newest first, from the
    request's `cursor` on; `next` is the URL of the next page, with the
    same `filters`."""
    end = len(tasks)
    cursor = request.query_params.get("cursor")
    if cursor is not None:
        before_seq = _decode_cursor(cursor)
        if before_seq is None:
            return _problem(400, "Bad request", "invalid cursor")
        # by_protocol lists are in creation order, so seq is ascending
        end = bisect.bisect_left(tasks, before_seq, key=lambda t: t.seq)
    start = max(0, end - sim.replicate_page_size)
    page = tasks[start:end][::-1]
    now = time.time()
    next_url = None
    if start > 0 and page:
        next_query = urlencode({**filters, "cursor": _encode_cursor(page[-1].seq)})
        next_url = f"{server_base(request)}{PREFIX}/v1/{resource}?{next_query}"
    return JSONResponse({
        "previous": None,
        "next": next_url,
        "results": [view(task, now) for task in page],
    })


# ------------------------------------------------------------------ trainings

_DESTINATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


async def create_training(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if (refused := _refused_create(sim, request)) is not None:
        return refused
    body = await _body_object(request)
    if isinstance(body, Response):
        return body
    destination = body.get("destination")
    if destination is None:
        return _problem(422, "Input validation failed", "- destination: destination is required")
    if not isinstance(destination, str) or not _DESTINATION_RE.fullmatch(destination):
        # replicate-python's trainings-create__invalid-destination.yaml: 404,
        # `detail` and `status` only.
        return JSONResponse({"detail": "The specified training destination does not exist", "status": 404},
                            status_code=404)
    task_input = body.get("input")
    if not isinstance(task_input, dict):
        return _problem(422, "Input validation failed", "- input: input is required (an object)")
    hook = _webhook_of(body)
    if isinstance(hook, Response):
        return hook
    webhook, events = hook
    try:
        controls = parse_controls(task_input)
    except ControlError as exc:
        return _problem(422, "Input validation failed", f"- {exc}")
    if sim.busy(PREFIX):
        return _throttled()
    owner, name = request.path_params["owner"], request.path_params["name"]
    task = sim.create_task(
        task_id=_prediction_id(),
        protocol=PROTOCOL,
        model=f"{owner}/{name}",
        input=task_input,
        controls=controls,
        base_url=server_base(request),
        callback_url=webhook,
        webhook_events=events,
        extra={"kind": TRAINING, "version": request.path_params["version_id"], "destination": destination},
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return JSONResponse(training_view(task, time.time(), created=True), status_code=201)


def _training(sim: Simulator, task_id: str) -> Task | None:
    task = sim.store.get(task_id, PROTOCOL)
    return task if task is not None and is_training(task) else None


async def get_training(request: Request) -> Response:
    return await _read(request, _training, training_view, "training_id")


async def cancel_training(request: Request) -> Response:
    return await _cancel(request, _training, training_view, "training_id")


async def list_trainings(request: Request) -> Response:
    """Newest first, `page_size` per page (100, as trainings.list says),
    paged like predictions; no filters (none is documented)."""
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer", "Token") is None:
        return _unauthenticated()
    trainings = [task for task in sim.store.by_protocol.get(PROTOCOL, []) if is_training(task)]
    return _page(sim, request, trainings, "trainings", {}, training_view)


async def default_webhook_secret(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer", "Token") is None:
        return _unauthenticated()
    return JSONResponse({"key": sim.replicate_webhook_secret})


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if task.callback_url is None:
        return None
    # One message id per (prediction, event): retries and duplicates of the
    # same event carry the same id, as Standard Webhooks redeliveries do.
    msg_id = f"msg_{task.id}_{event}"
    secret = sim.replicate_webhook_secret

    def sign(body: bytes, t: int) -> dict[str, str]:
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(t),
            "webhook-signature": sign_standard_webhooks(secret, msg_id, t, body),
        }

    # The body is what a read of it answers (the `webhook` field's description).
    view = training_view(task, now) if is_training(task) else prediction_view(task, now)
    return OutgoingWebhook(url=task.callback_url, body=dumps(view), sign=sign)


routes = [
    Route(f"{PREFIX}/v1/predictions", create_by_version, methods=["POST"]),
    Route(f"{PREFIX}/v1/predictions", list_predictions, methods=["GET"]),
    Route(f"{PREFIX}/v1/models/{{owner}}/{{name}}/predictions", create_by_model, methods=["POST"]),
    Route(f"{PREFIX}/v1/predictions/{{prediction_id}}", get_prediction, methods=["GET"]),
    Route(f"{PREFIX}/v1/predictions/{{prediction_id}}/cancel", cancel_prediction, methods=["POST"]),
    Route(f"{PREFIX}/v1/webhooks/default/secret", default_webhook_secret, methods=["GET"]),
    Route(f"{PREFIX}/v1/models/{{owner}}/{{name}}/versions/{{version_id}}/trainings", create_training,
          methods=["POST"]),
    Route(f"{PREFIX}/v1/trainings", list_trainings, methods=["GET"]),
    Route(f"{PREFIX}/v1/trainings/{{training_id}}", get_training, methods=["GET"]),
    Route(f"{PREFIX}/v1/trainings/{{training_id}}/cancel", cancel_training, methods=["POST"]),
]
