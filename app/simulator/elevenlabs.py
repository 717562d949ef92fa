"""ElevenLabs' dubbing API under /elevenlabs
(https://elevenlabs.io/docs/api-reference/dubbing/create, .../get, .../list,
.../audio/get; the official client elevenlabs-python's
`dubbing/raw_client.py`, `dubbing/audio/raw_client.py` and the types
`DoDubbingResponse`, `DubbingMetadataResponse`,
`DubbingMetadataPageResponseModel` say what each answer holds).

`POST /v1/dubbing` takes a multipart form (an urlencoded one parses too, as
the FastAPI form it is): `source_url` or `file`, `target_lang` (required),
`name`, `source_lang` and the other documented fields, each of its declared
type. The simulator's controls (`duration_s`, `outcome`, `output_bytes`,
`output_ttl_s`, `content_type`) ride as form fields too (CONTRACT.md); a form
carries only strings, so the numeric ones are read as JSON numbers. A dub
goes queued -> preparing -> dubbing -> dubbed | failed; it has one output per
target language, `GET /v1/dubbing/{id}/audio/{language_code}`, which needs
the key like every route (`xi-api-key`; an `Authorization` header is not
one). No dubbing webhook exists; there is no cancel (`DELETE` deletes a dub,
and is not served here: nothing here needs it).

Errors are the three shapes the errors page and live answers show: the
current `{"detail": {"type", "code", "message", "status", "request_id"}}`
(with `param` for a bad parameter), FastAPI's 422 `{"detail": [{"type",
"loc", "msg", "input"}]}` for fields that do not parse, and a 429
`rate_limit_error`/`rate_limit_exceeded` with `retry-after`.

Where the documents are silent, the choices here:
- auth is checked first, then the form (the real API validates some fields
  before auth);
- a dub has one output per target language whatever the `outputs` control
  says; `cost` and `output_text` do not apply (ElevenLabs reports no cost,
  and a dub is audio or video); the audio is `audio/mpeg` unless the
  `content_type` control names another type;
- with neither `file` nor `source_url`: 400 `invalid_parameters`, param
  `source_url`;
- `target_languages` is the requested language from the start, not only once
  dubbed; `source_language` appears once dubbed: `source_lang` when given and
  not `auto`, else `en` (what the simulator "detects"); `media_metadata` is
  null (the simulator knows no duration of its media); `editable` is the
  `dubbing_studio` flag; `name`, when none is given, is the source's file
  name;
- the audio of a dub not dubbed yet answers 425 (the official client maps
  425 to TooEarlyError on this route), of a failed or unknown dub or a
  language it was not dubbed into 404, and after `output_ttl_s` 404;
- the list is newest first unless `order_by`/`order_direction` say
  otherwise; `dubbing_status=dubbing` (the single-status filter has only
  dubbing, dubbed, failed) means any dub still in progress; `dubbing_models`
  is accepted and not applied (a dub here has no model generation); every
  dub here is the caller's own (`filter_by_creator=others` lists none) and
  made through the API (`creation_sources` without `dubbing_api` lists
  none). `next_cursor` is opaque and stable while dubs are created.
"""
from __future__ import annotations

import base64
import binascii
import json
import secrets
import string
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.simulator.controls import ControlError, parse_controls
from app.simulator.engine import Simulator
from app.simulator.outputs import aiter_chunks, output_bytes_iter
from app.simulator.state import QUEUED_SHARE, Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import THROTTLE_RETRY_AFTER_S, HoldThenDrop, is_http_url, server_base

PROTOCOL = "elevenlabs"
PREFIX = "/elevenlabs"
MODEL = "dubbing"
# "Returns dub as a streamed MP3 or MP4 file": MP3 unless `content_type` says.
DEFAULT_CONTENT_TYPE = "audio/mpeg"
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 100, 200
MAX_FORM_PART = 1024 * 1024

# The create form's fields by declared type (DubbingClient.create).
TEXT_FIELDS = ("name", "source_url", "source_lang", "target_lang", "target_accent")
INT_FIELDS = ("num_speakers", "start_time", "end_time")
BOOL_FIELDS = ("watermark", "highest_resolution", "drop_background_audio", "use_profanity_filter",
               "dubbing_studio", "disable_voice_cloning")
FLOAT_FIELDS = ("csv_fps",)
FILE_FIELDS = ("file", "csv_file", "foreground_audio_file", "background_audio_file")
MODES = ("automatic", "manual")
# The simulator's controls that are numbers (CONTRACT.md); the others are strings.
NUMERIC_CONTROLS = ("duration_s", "output_bytes", "outputs", "cost", "output_ttl_s")
CONTROLS = (*NUMERIC_CONTROLS, "outcome", "content_type", "output_text")

# `dubbing_statuses` (DubbingListRequestDubbingStatusesItem), `dubbing_status`
# (DubbingListRequestDubbingStatus) and the list's other enums.
STATUSES = ("queued", "preparing", "dubbing", "dubbed", "failed")
SINGLE_STATUSES = ("dubbing", "dubbed", "failed")
ORDER_BY = ("created_at", "name")
ORDER_DIRECTIONS = ("DESCENDING", "ASCENDING")
CREATORS = ("personal", "others", "all")
CREATION_SOURCES = ("flow_node", "dubbing_ui", "dubbing_api")
DUBBING_MODELS = ("dubbing_v1", "dubbing_v2")

# pydantic's lax reading of a boolean from a string.
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})
_ID_ALPHABET = string.ascii_letters + string.digits


# ------------------------------------------------------------------ answers


def _error(http_status: int, type_: str, code: str, message: str, *, status: str | None = None,
           param: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The current error shape (https://elevenlabs.io/docs/eleven-api/resources/errors);
    `status` is its legacy mirror of `code`, which may differ."""
    detail: dict[str, Any] = {"type": type_, "code": code, "message": message, "status": status or code,
                              "request_id": secrets.token_hex(16)}
    if param is not None:
        detail["param"] = param
    return JSONResponse({"detail": detail}, status_code=http_status, headers=headers)


def _invalid(errors: list[dict[str, Any]]) -> JSONResponse:
    """FastAPI's 422: one entry per field that did not parse."""
    return JSONResponse({"detail": errors}, status_code=422)


def _field_error(type_: str, where: str, name: str, msg: str, value: Any) -> dict[str, Any]:
    return {"type": type_, "loc": [where, name], "msg": msg, "input": value}


def _unauthorized() -> JSONResponse:
    # A live answer with no key (research brief 4.3).
    return _error(401, "authentication_error", "unauthorized",
                  "Neither authorization header nor xi-api-key received, please provide one.",
                  status="needs_authorization")


def _throttled() -> JSONResponse:
    return _error(429, "rate_limit_error", "rate_limit_exceeded",
                  "You have exceeded the rate limit for this endpoint.",
                  headers={"retry-after": str(THROTTLE_RETRY_AFTER_S)})


def _server_error(message: str) -> JSONResponse:
    return _error(500, "internal_error", "internal_error", message)


def _not_found(message: str) -> JSONResponse:
    return _error(404, "not_found", "dubbing_not_found", message)


def _has_key(request: Request) -> bool:
    # Any non-empty key will do: the simulator has no accounts.
    return bool(request.headers.get("xi-api-key", "").strip())


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ------------------------------------------------------------------ the create form


def _bool(value: str) -> bool | None:
    text = value.strip().lower()
    return True if text in _TRUE else False if text in _FALSE else None


def _int(value: str) -> int | None:
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    return int(text) if digits.isdigit() else None


def _float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def parse_dub_form(form: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The documented fields of a create form, each of its declared type,
    and FastAPI's 422 entries for those that do not parse (pure). Fields the
    API does not declare (our controls among them) are not here."""
    fields: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []

    def typed(names: tuple[str, ...], parse: Callable[[str], Any], type_: str, msg: str) -> None:
        for name in names:
            value = form.get(name)
            if value is None:
                continue
            parsed = parse(value) if isinstance(value, str) else None
            if parsed is None:
                errors.append(_field_error(type_, "body", name, msg, value if isinstance(value, str) else None))
            else:
                fields[name] = parsed

    typed(TEXT_FIELDS, lambda v: v, "string_type", "Input should be a valid string")
    typed(INT_FIELDS, _int, "int_parsing", "Input should be a valid integer, unable to parse string as an integer")
    typed(BOOL_FIELDS, _bool, "bool_parsing", "Input should be a valid boolean, unable to interpret input")
    typed(FLOAT_FIELDS, _float, "float_parsing", "Input should be a valid number, unable to parse string as a number")
    typed(("mode",), lambda v: v if v in MODES else None, "literal_error", "Input should be 'automatic' or 'manual'")
    for name in FILE_FIELDS:
        value = form.get(name)
        if value is None:
            continue
        if isinstance(value, UploadFile):
            fields[name] = value
        else:
            errors.append(_field_error("value_error", "body", name,
                                       f"Value error, Expected UploadFile, received: {type(value)}", value))
    if not fields.get("target_lang") and not any(e["loc"][1] == "target_lang" for e in errors):
        errors.append(_field_error("missing", "body", "target_lang", "Field required", None))
    return fields, errors


def control_values(form: Mapping[str, Any]) -> dict[str, Any]:
    """The simulator's controls among a form's fields, typed as
    `parse_controls` reads them (pure): a form carries strings, so a numeric
    control is read as a JSON number; one that is not stays a string, and
    `parse_controls` says what is wrong with it."""
    values: dict[str, Any] = {}
    for name in CONTROLS:
        value = form.get(name)
        if not isinstance(value, str):
            continue
        if name in NUMERIC_CONTROLS:
            try:
                number = json.loads(value)
            except ValueError:
                number = None
            values[name] = number if isinstance(number, int | float) and not isinstance(number, bool) else value
        else:
            values[name] = value
    return values


def _default_name(fields: Mapping[str, Any]) -> str:
    upload = fields.get("file")
    if isinstance(upload, UploadFile) and upload.filename:
        return upload.filename
    path = urlsplit(str(fields.get("source_url") or "")).path
    return path.rsplit("/", 1)[-1] or "Untitled"


def _dubbing_id() -> str:
    # The documented example id: 20 letters and digits ("21m00Tcm4TlvDq8ikWAM").
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


async def create_dub(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _server_error("simulated submit error")
    try:
        form: FormData = await request.form(max_part_size=MAX_FORM_PART)
    except HTTPException as exc:  # a malformed multipart body
        return _error(400, "invalid_request", "malformed_request", str(exc.detail))
    try:
        fields, errors = parse_dub_form(form)
        controls = None
        try:
            controls = parse_controls(control_values(form))
        except ControlError as exc:
            errors.append(_field_error("value_error", "body", exc.field, str(exc), form.get(exc.field)))
        if errors or controls is None:
            return _invalid(errors)
        has_source = bool(fields.get("source_url")) or "file" in fields
        if not has_source:
            return _error(400, "validation_error", "invalid_parameters",
                          "Either a file or a source_url must be provided.", param="source_url")
        if "source_url" in fields and not is_http_url(fields["source_url"]):
            return _error(400, "validation_error", "invalid_parameters", "source_url must be an http(s) URL.",
                          param="source_url")
        target_languages = [fields["target_lang"]]
        if "content_type" not in form:
            controls = replace(controls, content_type=DEFAULT_CONTENT_TYPE)
        # One output per target language, whatever `outputs` says.
        controls = replace(controls, outputs=len(target_languages), output_text=None)
        task = sim.create_task(
            task_id=_dubbing_id(),
            protocol=PROTOCOL,
            model=MODEL,
            input={k: v for k, v in form.items() if isinstance(v, str)},
            controls=controls,
            base_url=server_base(request),
            extra={
                "name": fields.get("name") or _default_name(fields),
                "target_languages": target_languages,
                "source_lang": fields.get("source_lang") or "auto",
                "editable": bool(fields.get("dubbing_studio", False)),
            },
        )
    finally:
        await form.close()
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return JSONResponse({"dubbing_id": task.id, "expected_duration_sec": controls.duration_s})


# ------------------------------------------------------------------ a dub


def status_of(task: Task, now: float) -> str:
    """The dub's `status` word (pure): the first half of its queued share
    `queued`, the second `preparing`."""
    phase = task.phase(now)
    if phase is Phase.QUEUED:
        return "queued" if now < task.created_at + QUEUED_SHARE * task.controls.duration_s / 2 else "preparing"
    if phase is Phase.RUNNING:
        return "dubbing"
    if phase is Phase.SUCCEEDED:
        return "dubbed"
    return "failed"  # no cancel and no deadline exist here: only a failure ends a dub otherwise


def dub_view(task: Task, now: float) -> dict[str, Any]:
    """The dub as `DubbingMetadataResponse`: exactly its fields."""
    status = status_of(task, now)
    source_lang = task.extra["source_lang"]
    return {
        "dubbing_id": task.id,
        "name": task.extra["name"],
        "status": status,
        "source_language": (source_lang if source_lang != "auto" else "en") if status == "dubbed" else None,
        "target_languages": list(task.extra["target_languages"]),
        "editable": task.extra["editable"],
        "created_at": _iso(task.created_at),
        "media_metadata": None,
        "error": task.error(now) if status == "failed" else None,
    }


async def get_dub(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    sim.store.stats.status_calls += 1
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _server_error("simulated status error")
    task = sim.store.get(request.path_params["dubbing_id"], PROTOCOL)
    if task is None:
        return _not_found("Dubbing project not found.")
    return JSONResponse(dub_view(task, time.time()))


async def get_audio(request: Request) -> Response:
    """The dub in one language: deterministic bytes (app/simulator/outputs.py),
    output index = the language's place among the dub's target languages."""
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    if sim.fault("download_error"):
        return _server_error("simulated download error")
    task = sim.store.get(request.path_params["dubbing_id"], PROTOCOL)
    language = request.path_params["language_code"]
    if task is None or language not in task.extra["target_languages"]:
        return _not_found("No dub found for this dubbing project and language.")
    now = time.time()
    status = status_of(task, now)
    if status == "failed" or (status == "dubbed" and now >= task.outputs_expire_at):
        return _not_found("No dub found for this dubbing project and language.")
    if status != "dubbed":
        return _error(425, "invalid_request", "dubbing_in_progress", "The dub is not ready yet.")
    index = task.extra["target_languages"].index(language)
    size = task.controls.output_bytes
    return StreamingResponse(aiter_chunks(output_bytes_iter(task.id, index, size)),
                             media_type=task.controls.content_type,
                             headers={"content-length": str(size), "cache-control": "no-store"})


# ------------------------------------------------------------------ the list


def _encode_cursor(key: tuple[Any, ...]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode("ascii").rstrip("=")


def _decode_cursor(cursor: str) -> tuple[Any, ...] | None:
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        return None
    return tuple(key) if isinstance(key, list) and key else None


def _enum_error(name: str, value: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    expected = " or ".join(f"'{a}'" for a in allowed)
    return {**_field_error("enum", "query", name, f"Input should be {expected}", value), "ctx": {"expected": expected}}


def _listed(task: Task, now: float, query: Mapping[str, Any]) -> bool:
    status = status_of(task, now)
    # The single-status filter knows only dubbing, dubbed, failed: dubbing is any dub in progress.
    in_progress = "dubbing" if status in ("queued", "preparing") else status
    if query["dubbing_status"] is not None and in_progress != query["dubbing_status"]:
        return False
    if query["dubbing_statuses"] and status not in query["dubbing_statuses"]:
        return False
    if query["target_language_codes"] and not set(query["target_language_codes"]) & set(
            task.extra["target_languages"]):
        return False
    if query["filter_by_creator"] == "others":
        return False
    return not query["creation_sources"] or "dubbing_api" in query["creation_sources"]


def parse_list_query(params: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The list's query (a multi-dict: repeated keys are lists), and FastAPI's
    422 entries for what does not parse (pure)."""
    errors: list[dict[str, Any]] = []
    query: dict[str, Any] = {"cursor": params.get("cursor"), "page_size": DEFAULT_PAGE_SIZE}
    raw_size = params.get("page_size")
    if raw_size is not None:
        size = _int(raw_size)
        if size is None:
            errors.append(_field_error("int_parsing", "query", "page_size",
                                       "Input should be a valid integer, unable to parse string as an integer",
                                       raw_size))
        elif not 1 <= size <= MAX_PAGE_SIZE:
            errors.append(_field_error("less_than_equal" if size > MAX_PAGE_SIZE else "greater_than_equal", "query",
                                       "page_size", f"Input should be between 1 and {MAX_PAGE_SIZE}", raw_size))
        else:
            query["page_size"] = size
    singles: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
        ("dubbing_status", SINGLE_STATUSES, None), ("order_by", ORDER_BY, "created_at"),
        ("order_direction", ORDER_DIRECTIONS, "DESCENDING"), ("filter_by_creator", CREATORS, "all"))
    for name, allowed, default in singles:
        value = params.get(name)
        if value is not None and value not in allowed:
            errors.append(_enum_error(name, value, allowed))
        query[name] = value if value in allowed else default
    lists: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("dubbing_statuses", STATUSES), ("creation_sources", CREATION_SOURCES), ("dubbing_models", DUBBING_MODELS))
    for name, allowed in lists:
        values = params.getlist(name)
        errors += [_enum_error(name, v, allowed) for v in values if v not in allowed]
        query[name] = [v for v in values if v in allowed]
    query["target_language_codes"] = params.getlist("target_language_codes")
    return query, errors


async def list_dubs(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    query, errors = parse_list_query(request.query_params)
    if errors:
        return _invalid(errors)
    by_name = query["order_by"] == "name"

    def key(task: Task) -> tuple[Any, ...]:
        return (task.extra["name"], task.seq) if by_name else (task.seq,)

    descending = query["order_direction"] == "DESCENDING"
    now = time.time()
    dubs = sorted((t for t in sim.store.by_protocol.get(PROTOCOL, []) if _listed(t, now, query)), key=key,
                  reverse=descending)
    if query["cursor"] is not None:
        after = _decode_cursor(query["cursor"])
        if after is None or len(after) != (2 if by_name else 1):
            return _error(400, "validation_error", "invalid_parameters", "Invalid cursor.", param="cursor")
        dubs = [t for t in dubs if (key(t) < after if descending else key(t) > after)]
    page, more = dubs[:query["page_size"]], len(dubs) > query["page_size"]
    return JSONResponse({
        "dubs": [dub_view(task, now) for task in page],
        "next_cursor": _encode_cursor(key(page[-1])) if more else None,
        "has_more": more,
    })


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    return None  # no dubbing webhook is documented: dubs are polled


routes = [
    Route(f"{PREFIX}/v1/dubbing", create_dub, methods=["POST"]),
    Route(f"{PREFIX}/v1/dubbing", list_dubs, methods=["GET"]),
    Route(f"{PREFIX}/v1/dubbing/{{dubbing_id}}", get_dub, methods=["GET"]),
    Route(f"{PREFIX}/v1/dubbing/{{dubbing_id}}/audio/{{language_code}}", get_audio, methods=["GET"]),
]
