"""Google's Gemini API under /gemini: Veo's `predictLongRunning`, the
long-running operation it answers, and the Files API download of its videos.

Held to googleapis' `google/ai/generativelanguage/v1beta/prediction_service.proto`
(PredictLongRunningRequest: `instances`, `parameters`; PredictLongRunningResponse
→ GenerateVideoResponse: `generatedSamples[].video`, `raiMediaFilteredCount`,
`raiMediaFilteredReasons`), `generativelanguage_v1beta.yaml` (GET
`/v1beta/{name=models/*/operations/*}`; CancelOperation only for `batches/*`:
no cancel route here), and google-genai (`_GenerateVideosOperation_from_mldev`,
`_Video_from_mldev`: `uri`, `encodedVideo`, `encoding`; `files.py` `download`:
`GET files/{id}:download?alt=media` with `x-goog-api-key`; `t_file_name`
takes the id out of a uri as `[a-z0-9]+`, so file ids here are lowercase
letters and digits).

Routes (every one needs an API key, `x-goog-api-key` or Google's `key`
query parameter; any non-empty key will do):
- `POST /gemini/v1beta/models/{model}:predictLongRunning` → `{"name": "models/{model}/operations/{id}"}`.
- `GET /gemini/v1beta/models/{model}/operations/{id}` → the operation: only
  `name` while it runs (proto3 JSON leaves `done: false` out), then
  `done: true` with `response` (`@type` PredictLongRunningResponse and its
  `generateVideoResponse`) or `error` (a google.rpc.Status: `code`, `message`).
- `GET /gemini/v1beta/files/{id}:download?alt=media` → the video's bytes,
  while they last.

Errors are Google's JSON error answer `{"error": {"code", "message",
"status"}}` with the statuses of the Gemini API troubleshooting page: 400
INVALID_ARGUMENT (a bad body or control), 403 PERMISSION_DENIED (no API key:
Google's answer to an unregistered caller), 404 NOT_FOUND, 429
RESOURCE_EXHAUSTED (the `throttle` fault: `retry-after: 1` and a
google.rpc.RetryInfo `retryDelay` of "1s" in `details`), 500 INTERNAL (the
`submit_error`, `status_error` and `download_error` faults).

Simulator conventions, where the documents are silent:
- the controls ride in `parameters` (CONTRACT.md), beside Veo's own
  parameters, which are accepted and not checked except `sampleCount`: the
  number of videos, a whole number from 1 to 4 (Vertex's Veo reference), and
  when it is given the `outputs` control may only say the same (0 videos,
  `outputs: 0`, is a done operation with no sample and no error, as a fully
  filtered one answers, without a filter count: the simulator filters nothing);
- a top-level field other than `instances` and `parameters` is refused the
  way Google refuses an unknown field (`webhookConfig` included: the
  simulator sends no Gemini webhooks);
- `output_text` is refused: Veo answers no text;
- videos are `video/mp4` unless `content_type` says otherwise (with
  `output_duration_s`, real MP4s of that many seconds), and are kept
  2 days (the Veo page) unless `output_ttl_s` says otherwise: then their
  download answers 404 NOT_FOUND (the operation still names them);
- a failed operation's error is code 13 (INTERNAL) with the simulator's
  failure reason;
- `:download` without `alt=media` is a 400: the SDK always sends it, and what
  Google answers then is not documented.
"""
from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.simulator.controls import ControlError, Controls, parse_controls, with_default_type
from app.simulator.engine import Simulator
from app.simulator.outputs import aiter_chunks, file_chunks, file_size
from app.simulator.state import FAILURE_REASON, Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import THROTTLE_RETRY_AFTER_S, BadBody, HoldThenDrop, read_json, server_base

PROTOCOL = "gemini"
PREFIX = "/gemini"
API = f"{PREFIX}/v1beta"

OUTPUT_TTL_S = 2 * 24 * 3600.0
VIDEO_TYPE = "video/mp4"
MAX_SAMPLES = 4
# Operation ids are this many lowercase hex characters; a file id is its
# operation's id followed by the output's index in decimal.
OP_ID_LEN = 20
RESPONSE_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse"
RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"
BODY_FIELDS = ("instances", "parameters")
# google.rpc.Code INTERNAL, for a failed operation's `error.code`.
INTERNAL_CODE = 13

UNREGISTERED = ("Method doesn't allow unregistered callers (callers without established identity). "
                "Please use API Key or other form of API consumer identity to call this API.")
NOT_FOUND = "Requested entity was not found."
EXHAUSTED = "Resource has been exhausted (e.g. check quota)."
INTERNAL = "Internal error encountered."


def rpc_error(http_status: int, status: str, message: str, details: list[dict[str, Any]] | None = None,
              headers: dict[str, str] | None = None) -> JSONResponse:
    """Google's JSON error answer."""
    error: dict[str, Any] = {"code": http_status, "message": message, "status": status}
    if details:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=http_status, headers=headers)


def _invalid(message: str) -> JSONResponse:
    return rpc_error(400, "INVALID_ARGUMENT", message)


def _not_found() -> JSONResponse:
    return rpc_error(404, "NOT_FOUND", NOT_FOUND)


def _throttled() -> JSONResponse:
    return rpc_error(429, "RESOURCE_EXHAUSTED", EXHAUSTED,
                     details=[{"@type": RETRY_INFO_TYPE, "retryDelay": f"{THROTTLE_RETRY_AFTER_S}s"}],
                     headers={"retry-after": str(THROTTLE_RETRY_AFTER_S)})


def _internal() -> JSONResponse:
    return rpc_error(500, "INTERNAL", INTERNAL)


def api_key(request: Request) -> str | None:
    key = request.headers.get("x-goog-api-key") or request.query_params.get("key") or ""
    return key.strip() or None


def operation_name(task: Task) -> str:
    return f"models/{task.model}/operations/{task.id}"


def file_id(task: Task, index: int) -> str:
    return f"{task.id}{index}"


def file_uri(task: Task, index: int) -> str:
    return f"{task.base_url}{API}/files/{file_id(task, index)}:download?alt=media"


def parse_file_id(value: str) -> tuple[str, int] | None:
    """(operation id, output index) of a file id, or None (pure)."""
    op_id, index = value[:OP_ID_LEN], value[OP_ID_LEN:]
    if len(op_id) != OP_ID_LEN or not index.isdigit() or not index.isascii() or len(index) > 3:
        return None
    return op_id, int(index)


def operation_view(task: Task, now: float) -> dict[str, Any]:
    """The operation as the API answers it (pure): empty fields left out,
    as proto3 JSON does."""
    view: dict[str, Any] = {"name": operation_name(task)}
    phase = task.phase(now)
    if not phase.terminal:
        return view
    view["done"] = True
    if phase is Phase.SUCCEEDED:
        samples = [{"video": {"uri": file_uri(task, i)}} for i in range(task.controls.outputs)]
        video_response = {"generatedSamples": samples} if samples else {}
        view["response"] = {"@type": RESPONSE_TYPE, "generateVideoResponse": video_response}
    else:
        view["error"] = {"code": INTERNAL_CODE, "message": task.error(now) or FAILURE_REASON}
    return view


def controls_of(body: dict[str, Any]) -> Controls:
    """The controls of a predictLongRunning body, or ControlError (pure):
    see the module's conventions."""
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ControlError("parameters", "must be an object")
    if "output_text" in parameters:
        raise ControlError("output_text", "is not supported: Veo answers videos")
    controls = with_default_type(parse_controls(parameters), parameters, VIDEO_TYPE)
    values: dict[str, Any] = {}
    if "output_ttl_s" not in parameters:
        values["output_ttl_s"] = OUTPUT_TTL_S
    if "sampleCount" in parameters:
        count = parameters["sampleCount"]
        if isinstance(count, float) and count.is_integer():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SAMPLES:
            raise ControlError("sampleCount", f"must be a whole number from 1 to {MAX_SAMPLES}")
        if "outputs" in parameters and controls.outputs != count:
            raise ControlError("outputs", "must equal sampleCount when both are given")
        values["outputs"] = count
    return dataclasses.replace(controls, **values)


def body_problem(body: Any) -> str | None:
    """Why a predictLongRunning body is refused, or None (pure)."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received. The body must be a JSON object."
    unknown = [key for key in body if key not in BODY_FIELDS]
    if unknown:
        return f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.'
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances or not all(isinstance(i, dict) for i in instances):
        return "instances is required: a list of at least one object."
    return None


async def predict_long_running(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if api_key(request) is None:
        return rpc_error(403, "PERMISSION_DENIED", UNREGISTERED)
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _internal()
    try:
        body = await read_json(request)
    except BadBody as exc:
        return _invalid(f"Invalid JSON payload received. {exc}.")
    problem = body_problem(body)
    if problem:
        return _invalid(problem)
    try:
        controls = controls_of(body)
    except ControlError as exc:
        # The controls' own words, named where they are in this body.
        return _invalid(f"parameters.{exc.field}{str(exc)[len('input.' + exc.field):]}")
    if sim.busy(PREFIX):
        return _throttled()
    task = sim.create_task(
        task_id=secrets.token_hex(OP_ID_LEN // 2),
        protocol=PROTOCOL,
        model=request.path_params["model"],
        input=body,
        controls=controls,
        base_url=server_base(request),
    )
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return JSONResponse({"name": operation_name(task)})


async def get_operation(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if api_key(request) is None:
        return rpc_error(403, "PERMISSION_DENIED", UNREGISTERED)
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _internal()
    task = sim.store.get(request.path_params["op"], PROTOCOL)
    if task is None or task.model != request.path_params["model"]:
        return _not_found()
    return JSONResponse(operation_view(task, time.time()))


async def download_file(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if api_key(request) is None:
        return rpc_error(403, "PERMISSION_DENIED", UNREGISTERED)
    if request.query_params.get("alt") != "media":
        return _invalid("alt=media is required to download a file's bytes.")
    if sim.fault("download_error"):
        return _internal()
    parsed = parse_file_id(request.path_params["file"])
    task = sim.store.get(parsed[0], PROTOCOL) if parsed else None
    now = time.time()
    if (
        parsed is None
        or task is None
        or not parsed[1] < task.controls.outputs
        or task.phase(now) is not Phase.SUCCEEDED
        or now >= task.outputs_expire_at
    ):
        return _not_found()
    return StreamingResponse(aiter_chunks(file_chunks(task.id, parsed[1], task.controls)),
                             headers={"content-length": str(file_size(task.controls)), "cache-control": "no-store"},
                             media_type=task.controls.content_type)


async def no_such_route(request: Request) -> Response:
    return _not_found()


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    return None  # no Gemini webhook is registered: its jobs are polled


routes = [
    Route(f"{API}/models/{{model}}:predictLongRunning", predict_long_running, methods=["POST"]),
    Route(f"{API}/models/{{model}}/operations/{{op}}", get_operation, methods=["GET"]),
    Route(f"{API}/files/{{file}}:download", download_file, methods=["GET"]),
    Route(f"{API}/{{path:path}}", no_such_route, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
]
