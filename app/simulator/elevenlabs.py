"""ElevenLabs' dubbing API and its sync calls (speech, sound effects, the
speech history) under /elevenlabs.

Dubbing
(https://elevenlabs.io/docs/api-reference/dubbing/create, .../get, .../list,
.../audio/get; the official client elevenlabs-python's
`dubbing/raw_client.py`, `dubbing/audio/raw_client.py` and the types
`DoDubbingResponse`, `DubbingMetadataResponse`,
`DubbingMetadataPageResponseModel` say what each answer holds).

`POST /v1/dubbing` takes a multipart form (an urlencoded one parses too, as
the FastAPI form it is): `source_url` or `file`, `target_lang` (required),
`name`, `source_lang` and the other documented fields, each of its declared
type. The simulator's controls (`duration_s`, `outcome`, `output_bytes`,
`output_ttl_s`, `content_type`, `output_duration_s`) ride as form fields too
(CONTRACT.md); a form carries only strings, so the numeric ones are read as
JSON numbers. With `output_duration_s` a dub's audio is a real WAV
(`audio/wav`, app/simulator/media.py), or an MP4 when `content_type` names a
video type. A dub
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

Sync calls
(https://elevenlabs.io/docs/api-reference/text-to-speech/convert, .../stream,
.../text-to-sound-effects/convert, .../history/list, .../history/get,
.../history/get-audio; the official client's `text_to_speech/raw_client.py`,
`text_to_sound_effects/raw_client.py`, `history/raw_client.py` and the types
`SpeechHistoryItemResponse`, `GetSpeechHistoryResponse` say what each takes
and answers.)

`POST /v1/text-to-speech/{voice_id}` (and `/stream`) and
`POST /v1/sound-generation` take a JSON body (`text` required, the other
documented fields each of its declared type; FastAPI's 422 otherwise) and the
query `output_format` (default `mp3_44100_128`, one of the client's enum for
the route) and `enable_logging`; they answer the audio bytes, with the
headers the API reference's "Tracking generation costs" names: `request-id`
and `character-cost`. The controls ride in the JSON body (CONTRACT.md):
`duration_s` is how long the generation takes before the answer, `outcome:
"failed"` fails it, `output_bytes` its size, `content_type` its type, and
`output_duration_s` makes it a real WAV (mono, 16-bit, at the output
format's sample rate) of that many seconds whose samples are the
deterministic bytes. Every call that reached the work is counted by its raw
body (`sync_calls_by_body`); a fault answered instead of the work is not,
and no sync call is a Task. Each text-to-speech generation that succeeded
is an item of `GET /v1/history` (`source: "TTS"`) once it is done, whatever
became of its answer; sound effects are not in the history (documented:
"Music and SFX generations are not included").

Where the documents are silent, the choices here:
- the audio is the deterministic bytes of app/simulator/outputs.py keyed by
  the generation's `request-id`, output 0 (`output_sha256(request_id, 0,
  size)`); its history item's audio is the same bytes;
- the answer is `audio/mpeg` whatever the `output_format` (the reference
  declares that media type; the simulator encodes nothing), `audio/wav` with
  `output_duration_s`, or the `content_type` control's type;
- `character-cost`: the text's length for speech ("Text-to-speech costs one
  credit per character of input text", docs overview); for sound effects,
  charged "per second of audio" at a rate the docs do not state, 20 per
  second of `duration_seconds` (5 s when not given, the simulator's guess);
  `request-id` is sent by sound generation too (the live API sends it on its
  answers), never on an error (errors carry `detail.request_id`); the
  markdown copy of that page reads `x-character-count` where the rendered
  page and live answers have `character-cost`: only the latter is sent;
- a call takes the controls' default `duration_s` (1 s) unless told;
- `/stream` sends its headers at once and the bytes when the generation is
  done (no `content-length`); the plain route sends nothing until then;
- `outcome: "failed"` answers, after `duration_s`, a definite 400
  `invalid_parameters` (nothing charged, no history item); it did reach the
  work, so it is counted; `submit_timeout_after_create` does the work (counted,
  in the history once done) and drops the answer;
- a generation goes on when its client leaves (it lands in the history all
  the same); `enable_logging=false` keeps it out of the history;
- the other controls (`outputs`, `cost`, `output_ttl_s`, `output_text`, the
  token counts) are checked and do not apply: one audio answer, no cost
  reported, history audio kept until `/_sim/reset` (no expiry is documented);
- `model_id` defaults to `eleven_multilingual_v2` (the documented default);
  any voice id is a voice; no character limit per request is enforced;
- a history item: `state` "created", `settings` the request's
  `voice_settings` (null without), `voice_name`, `voice_category`,
  `share_link_id`, `alignments`, `dialogue` null, `date_unix` when it was
  done, `character_count_change_from/to` the account's character counter
  (every successful speech or sound generation since the last
  `/_sim/reset`) before and after it;
- the history is newest first unless `sort_direction=asc`;
  `start_after_history_item_id` naming no item is 400 `invalid_parameters`;
  `search` matches the text, case-insensitively; `source` other than `TTS`
  lists none; `model_id` is a filter and does not make `source` required
  (the client's description says it would; it reads as a copy of `search`'s);
  `scanned_until` is the last listed item's `date_unix` (null for an empty
  page); `DELETE /v1/history/{id}` and `POST /v1/history/download` are not
  served;
- `throttle` answers the 429 above on every sync and history route,
  `submit_error` a 500 on the calls, `status_error` a 500 on the history
  reads and `download_error` on the history audio; history reads are not
  `status_calls`;
- `max_concurrent` counts dubs and sync calls together (one prefix,
  "/elevenlabs"): a dub create or a call (once its body has passed the
  checks) that would exceed it is the same 429, with no dub, no count in
  `sync_calls_by_body`, no history item. A call is in flight from the
  start of its work until its answer has gone out, or was dropped (the
  client left, a `submit_timeout_after_create` hold ended).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import secrets
import string
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.simulator.controls import ControlError, Controls, parse_controls, with_default_type
from app.simulator.engine import Simulator
from app.simulator.media import (
    WAV_CONTENT_TYPE,
    WAV_HEADER_BYTES,
    WAV_SAMPLE_BYTES,
    wav_frames,
    wav_header,
)
from app.simulator.outputs import aiter_chunks, file_chunks, file_size, output_bytes_iter
from app.simulator.state import FAILURE_REASON, QUEUED_SHARE, Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import (
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    HoldThenDrop,
    client_gone,
    is_http_url,
    parse_json,
    read_body,
    server_base,
    sleep_until,
)

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
NUMERIC_CONTROLS = ("duration_s", "output_bytes", "outputs", "cost", "output_ttl_s", "output_duration_s")
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


def _new_id() -> str:
    # The documented example ids: 20 letters and digits ("21m00Tcm4TlvDq8ikWAM").
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
        controls = with_default_type(controls, form, DEFAULT_CONTENT_TYPE)
        # One output per target language, whatever `outputs` says.
        controls = replace(controls, outputs=len(target_languages), output_text=None)
        if sim.busy(PREFIX):
            return _throttled()
        task = sim.create_task(
            task_id=_new_id(),
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
    return StreamingResponse(aiter_chunks(file_chunks(task.id, index, task.controls)),
                             media_type=task.controls.content_type,
                             headers={"content-length": str(file_size(task.controls)), "cache-control": "no-store"})


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


# ------------------------------------------------------------------ sync calls: what they take


TTS_MODEL = "eleven_multilingual_v2"  # the documented default `model_id`
DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
# TextToSpeechConvertRequestOutputFormat, which sound generation's enum
# equals; the /stream route's has no wav_*.
OUTPUT_FORMATS = (
    "alaw_8000", "mp3_22050_32", "mp3_24000_48", "mp3_44100_128", "mp3_44100_192", "mp3_44100_32", "mp3_44100_64",
    "mp3_44100_96", "opus_48000_128", "opus_48000_192", "opus_48000_32", "opus_48000_64", "opus_48000_96",
    "pcm_16000", "pcm_22050", "pcm_24000", "pcm_32000", "pcm_44100", "pcm_48000", "pcm_8000", "ulaw_8000",
    "wav_16000", "wav_22050", "wav_24000", "wav_32000", "wav_44100", "wav_48000", "wav_8000")
STREAM_OUTPUT_FORMATS = tuple(f for f in OUTPUT_FORMATS if not f.startswith("wav_"))
MAX_LATENCY_OPTIMIZATION = 4
SPEECH_CONTENT_TYPE = "audio/mpeg"
# Sound effects are charged "per second of audio" at a rate the docs do not
# state: the simulator's rate, and its guess of a duration left to it.
SFX_CREDITS_PER_SECOND = 20
SFX_GUESSED_DURATION_S = 5.0
# The history list's query (HistoryListRequestSortDirection, ...Source).
MAX_HISTORY_PAGE_SIZE = 1000
DEFAULT_HISTORY_PAGE_SIZE = 100
SORT_DIRECTIONS = ("asc", "desc")
HISTORY_SOURCES = ("TTS", "STS", "Flows")
SPEECH_SOURCE = "TTS"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One documented field of a JSON body: its JSON type and bounds. A
    field that is not required may be null (the client's Optional)."""

    kind: str  # a key of _KINDS
    required: bool = False
    low: float | None = None
    high: float | None = None
    max_items: int | None = None
    items: str | None = None  # the kind of an array's items
    choices: tuple[str, ...] = ()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# kind -> (test, FastAPI's error type, its message)
_KINDS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "string": (lambda v: isinstance(v, str), "string_type", "Input should be a valid string"),
    "integer": (_is_int, "int_type", "Input should be a valid integer"),
    "number": (lambda v: _is_int(v) or isinstance(v, float), "float_type", "Input should be a valid number"),
    "boolean": (lambda v: isinstance(v, bool), "bool_type", "Input should be a valid boolean"),
    "object": (lambda v: isinstance(v, dict), "dict_type", "Input should be a valid dictionary"),
    "array": (lambda v: isinstance(v, list), "list_type", "Input should be a valid list"),
}

# BodyTextToSpeechFull (the client's convert(...) keywords), with the API
# reference's bounds.
TTS_FIELDS: dict[str, FieldSpec] = {
    "text": FieldSpec("string", required=True),
    "model_id": FieldSpec("string"),
    "language_code": FieldSpec("string"),
    "voice_settings": FieldSpec("object"),
    "pronunciation_dictionary_locators": FieldSpec("array", max_items=3, items="object"),
    "seed": FieldSpec("integer", low=0, high=4294967295),
    "previous_text": FieldSpec("string"),
    "next_text": FieldSpec("string"),
    "previous_request_ids": FieldSpec("array", max_items=3, items="string"),
    "next_request_ids": FieldSpec("array", max_items=3, items="string"),
    "use_pvc_as_ivc": FieldSpec("boolean"),
    "apply_text_normalization": FieldSpec("string", choices=("auto", "on", "off")),
    "apply_language_text_normalization": FieldSpec("boolean"),
    "audio_effects": FieldSpec("object"),
}
# The sound generation body ("Must be at least 0.5 and at most 30", "between 0 and 1").
SFX_FIELDS: dict[str, FieldSpec] = {
    "text": FieldSpec("string", required=True),
    "loop": FieldSpec("boolean"),
    "duration_seconds": FieldSpec("number", low=0.5, high=30),
    "prompt_influence": FieldSpec("number", low=0, high=1),
    "model_id": FieldSpec("string"),
}


def _field_problem(value: Any, spec: FieldSpec) -> tuple[str, str] | None:
    """FastAPI's (type, msg) for a non-null value that is not what `spec`
    says, else None (pure)."""
    test, type_, msg = _KINDS[spec.kind]
    if not test(value):
        return type_, msg
    if spec.choices and value not in spec.choices:
        return "enum", "Input should be " + " or ".join(f"'{c}'" for c in spec.choices)
    if spec.low is not None and value < spec.low:
        return "greater_than_equal", f"Input should be greater than or equal to {spec.low:g}"
    if spec.high is not None and value > spec.high:
        return "less_than_equal", f"Input should be less than or equal to {spec.high:g}"
    if spec.max_items is not None and len(value) > spec.max_items:
        return "too_long", f"List should have at most {spec.max_items} items after validation, not {len(value)}"
    if spec.items is not None:
        item_test, item_type, item_msg = _KINDS[spec.items]
        if not all(item_test(item) for item in value):
            return item_type, item_msg
    return None


def check_body(body: Any, fields: Mapping[str, FieldSpec]) -> list[dict[str, Any]]:
    """FastAPI's 422 entries for a JSON body against its documented fields
    (pure). Keys the API does not declare (our controls among them) are
    not checked here."""
    if body is None:
        return [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
    if not isinstance(body, dict):
        return [{"type": "model_attributes_type", "loc": ["body"],
                 "msg": "Input should be a valid dictionary or object to extract fields from", "input": body}]
    errors: list[dict[str, Any]] = []
    for name, spec in fields.items():
        if name not in body:
            if spec.required:
                errors.append(_field_error("missing", "body", name, "Field required", None))
            continue
        value = body[name]
        problem = _field_problem(value, spec) if value is not None or spec.required else None
        if problem is not None:
            errors.append(_field_error(problem[0], "body", name, problem[1], value))
    return errors


def parse_call_query(params: Mapping[str, str], formats: tuple[str, ...], *,
                     latency: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A sync call's query (`output_format`, `enable_logging`, and with
    `latency` the speech routes' `optimize_streaming_latency`), and FastAPI's
    422 entries for what does not parse (pure)."""
    errors: list[dict[str, Any]] = []
    output_format = params.get("output_format", DEFAULT_OUTPUT_FORMAT)
    if output_format not in formats:
        errors.append(_enum_error("output_format", output_format, formats))
    enable_logging = True
    raw = params.get("enable_logging")
    if raw is not None:
        parsed = _bool(raw)
        if parsed is None:
            errors.append(_field_error("bool_parsing", "query", "enable_logging",
                                       "Input should be a valid boolean, unable to interpret input", raw))
        else:
            enable_logging = parsed
    raw = params.get("optimize_streaming_latency") if latency else None
    if raw is not None:
        level = _int(raw)
        if level is None or not 0 <= level <= MAX_LATENCY_OPTIMIZATION:
            errors.append(_field_error("int_parsing", "query", "optimize_streaming_latency",
                                       f"Input should be an integer from 0 to {MAX_LATENCY_OPTIMIZATION}", raw))
    return {"output_format": output_format, "enable_logging": enable_logging}, errors


def call_controls(body: Mapping[str, Any]) -> tuple[Controls, float | None]:
    """The simulator's controls among a sync call's body keys and its
    `output_duration_s` (pure). Raises ControlError on a bad value."""
    controls = parse_controls(body)
    return controls, controls.output_duration_s


# ------------------------------------------------------------------ sync calls: the audio


def sample_rate(output_format: str) -> int:
    """The sample rate an output format names: codec_rate[_bitrate] (pure)."""
    return int(output_format.split("_")[1])


@dataclass(frozen=True, slots=True)
class Audio:
    """One generation's bytes: output 0 of the deterministic bytes keyed by
    `key` (its request id), `size` long; with `rate`, those bytes are the
    samples of a WAV."""

    key: str
    size: int
    content_type: str
    rate: int | None = None

    @property
    def length(self) -> int:
        return self.size + (WAV_HEADER_BYTES if self.rate is not None else 0)

    def chunks(self) -> Iterator[bytes]:
        if self.rate is not None:
            yield wav_header(self.rate, self.size)
        yield from output_bytes_iter(self.key, 0, self.size)


def call_audio(key: str, controls: Controls, output_duration_s: float | None, output_format: str,
               content_type: str | None) -> Audio:
    """What a call answers (pure): a WAV of `output_duration_s` at the
    output format's rate, else `output_bytes` of deterministic bytes; of the
    `content_type` control's type when one was given."""
    if output_duration_s is not None:
        rate = sample_rate(output_format)
        return Audio(key, wav_frames(output_duration_s, rate) * WAV_SAMPLE_BYTES, content_type or WAV_CONTENT_TYPE,
                     rate)
    return Audio(key, controls.output_bytes, content_type or SPEECH_CONTENT_TYPE)


# ------------------------------------------------------------------ sync calls: the history


@dataclass(frozen=True, slots=True)
class HistoryItem:
    history_item_id: str
    request_id: str
    voice_id: str
    model_id: str
    text: str
    settings: dict[str, Any] | None
    output_format: str
    audio: Audio
    done_at: float  # unix seconds: listed from then on
    seq: int
    characters_from: int
    characters_to: int

    @property
    def date_unix(self) -> int:
        return int(self.done_at)


class SpeechHistory:
    """The account's speech history and its character counter, kept in the
    store's protocol state: `/_sim/reset` forgets it."""

    def __init__(self) -> None:
        self.items: dict[str, HistoryItem] = {}
        self.characters = 0
        self._seq = 0

    def charge(self, characters: int) -> tuple[int, int]:
        """Count a generation's characters: the counter before and after."""
        before = self.characters
        self.characters += characters
        return before, self.characters

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def add(self, item: HistoryItem) -> None:
        self.items[item.history_item_id] = item


def speech_history(sim: Simulator) -> SpeechHistory:
    return sim.store.protocol_state.setdefault(PROTOCOL, SpeechHistory())


def history_item_view(item: HistoryItem) -> dict[str, Any]:
    """The item as `SpeechHistoryItemResponse`: exactly its fields."""
    return {
        "history_item_id": item.history_item_id,
        "request_id": item.request_id,
        "voice_id": item.voice_id,
        "model_id": item.model_id,
        "voice_name": None,
        "voice_category": None,
        "text": item.text,
        "date_unix": item.date_unix,
        "character_count_change_from": item.characters_from,
        "character_count_change_to": item.characters_to,
        "content_type": item.audio.content_type,
        "state": "created",
        "settings": item.settings,
        "share_link_id": None,
        "source": SPEECH_SOURCE,
        "alignments": None,
        "dialogue": None,
        "output_format": item.output_format,
    }


def parse_history_query(params: Mapping[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The history list's query, and FastAPI's 422 entries for what does
    not parse (pure)."""
    errors: list[dict[str, Any]] = []
    query: dict[str, Any] = {name: params.get(name) for name in (
        "start_after_history_item_id", "voice_id", "model_id", "search")}
    for name, default in (("page_size", DEFAULT_HISTORY_PAGE_SIZE), ("date_before_unix", None),
                          ("date_after_unix", None)):
        raw = params.get(name)
        number = _int(raw) if raw is not None else default
        if raw is not None and number is None:
            errors.append(_field_error("int_parsing", "query", name,
                                       "Input should be a valid integer, unable to parse string as an integer", raw))
        query[name] = number
    size = query["page_size"]
    if size is not None and not 1 <= size <= MAX_HISTORY_PAGE_SIZE:
        errors.append(_field_error("less_than_equal" if size > MAX_HISTORY_PAGE_SIZE else "greater_than_equal",
                                   "query", "page_size", f"Input should be between 1 and {MAX_HISTORY_PAGE_SIZE}",
                                   params.get("page_size")))
    for name, allowed, fallback in (("sort_direction", SORT_DIRECTIONS, "desc"), ("source", HISTORY_SOURCES, None)):
        value = params.get(name)
        if value is not None and value not in allowed:
            errors.append(_enum_error(name, value, allowed))
        query[name] = value if value in allowed else fallback
    return query, errors


def _history_match(item: HistoryItem, query: Mapping[str, Any]) -> bool:
    if query["voice_id"] is not None and item.voice_id != query["voice_id"]:
        return False
    if query["model_id"] is not None and item.model_id != query["model_id"]:
        return False
    if query["date_after_unix"] is not None and item.date_unix < query["date_after_unix"]:  # inclusive
        return False
    if query["date_before_unix"] is not None and item.date_unix >= query["date_before_unix"]:  # exclusive
        return False
    if query["search"] is not None and query["search"].casefold() not in item.text.casefold():
        return False
    return query["source"] in (None, SPEECH_SOURCE)


def history_page(items: Mapping[str, HistoryItem], query: Mapping[str, Any],
                 now: float) -> tuple[list[HistoryItem], bool] | None:
    """One page of the items done by `now` that match `query`, and whether
    more follow (pure); None when `start_after_history_item_id` names no item."""
    descending = query["sort_direction"] == "desc"

    def key(item: HistoryItem) -> tuple[float, int]:
        return item.done_at, item.seq

    listed: Iterable[HistoryItem] = (i for i in items.values() if i.done_at <= now and _history_match(i, query))
    ordered = sorted(listed, key=key, reverse=descending)
    after_id = query["start_after_history_item_id"]
    if after_id is not None:
        after = items.get(after_id)
        if after is None:
            return None
        ordered = [i for i in ordered if (key(i) < key(after) if descending else key(i) > key(after))]
    size = query["page_size"]
    return ordered[:size], len(ordered) > size


# ------------------------------------------------------------------ sync calls: the routes


@dataclass(frozen=True, slots=True)
class SyncCall:
    """A sync call that passed auth, faults and validation."""

    raw: bytes  # the body as sent: the call is counted by it
    body: dict[str, Any]
    query: dict[str, Any]
    controls: Controls
    output_duration_s: float | None
    done_at: float  # when the generation is done and answered


class AnswerAt(Response):
    """`inner`, sent once `at` (unix seconds) has come: nothing goes out
    before, and nothing at all if the client leaves first."""

    def __init__(self, at: float, inner: Response):
        super().__init__(status_code=inner.status_code)
        self.at = at
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delay = self.at - time.time()
        if delay > 0:
            try:
                await asyncio.wait_for(client_gone(receive), delay)
                return
            except TimeoutError:
                pass
        await self.inner(scope, receive, send)


async def _audio_at(at: float, audio: Audio) -> AsyncIterator[bytes]:
    await sleep_until(at, time.time)
    for chunk in audio.chunks():
        yield chunk


async def _read_call_body(request: Request) -> tuple[bytes, Any]:
    """The body as sent (a sync call is counted by it) and as JSON (None when empty)."""
    raw = await read_body(request)
    return raw, parse_json(raw, empty=None)


async def _accept(request: Request, fields: Mapping[str, FieldSpec], formats: tuple[str, ...], *,
                  latency: bool) -> SyncCall | Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("submit_error"):
        return _server_error("simulated submit error")
    query, errors = parse_call_query(request.query_params, formats, latency=latency)
    try:
        raw, body = await _read_call_body(request)
    except BadBody as exc:
        return _invalid([{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {},
                          "ctx": {"error": str(exc)}}])
    errors += check_body(body, fields)
    controls, output_duration_s = None, None
    if isinstance(body, dict):
        try:
            controls, output_duration_s = call_controls(body)
        except ControlError as exc:
            errors.append(_field_error("value_error", "body", exc.field, str(exc), body.get(exc.field)))
    if errors or controls is None:
        return _invalid(errors)
    return SyncCall(raw=raw, body=body, query=query, controls=controls, output_duration_s=output_duration_s,
                    done_at=time.time() + controls.duration_s)


def _audio_of(call: SyncCall, request_id: str) -> Audio:
    content_type = call.controls.content_type if "content_type" in call.body else None
    return call_audio(request_id, call.controls, call.output_duration_s, call.query["output_format"], content_type)


def _answer(sim: Simulator, call: SyncCall, request_id: str, audio: Audio, cost: int, *,
            streamed: bool) -> Response:
    """The answer to a call whose work is recorded: dropped, failed or the audio."""
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    if call.controls.outcome == "failed":
        return AnswerAt(call.done_at, _error(400, "validation_error", "invalid_parameters", FAILURE_REASON))
    headers = {"request-id": request_id, "character-cost": str(cost)}
    if streamed:
        return StreamingResponse(_audio_at(call.done_at, audio), media_type=audio.content_type, headers=headers)
    headers["content-length"] = str(audio.length)
    return AnswerAt(call.done_at, StreamingResponse(aiter_chunks(audio.chunks()), media_type=audio.content_type,
                                                    headers=headers))


async def _speech(request: Request, *, streamed: bool) -> Response:
    sim: Simulator = request.app.state.sim
    call = await _accept(request, TTS_FIELDS, STREAM_OUTPUT_FORMATS if streamed else OUTPUT_FORMATS, latency=True)
    if isinstance(call, Response):
        return call

    async def work() -> Response:
        request_id = _new_id()
        text: str = call.body["text"]
        audio = _audio_of(call, request_id)
        sim.count_sync_call(call.raw)
        if call.controls.outcome == "succeeded":
            history = speech_history(sim)
            before, after = history.charge(len(text))
            if call.query["enable_logging"]:
                history.add(HistoryItem(
                    history_item_id=_new_id(), request_id=request_id, voice_id=request.path_params["voice_id"],
                    model_id=call.body.get("model_id") or TTS_MODEL, text=text,
                    settings=call.body.get("voice_settings"), output_format=call.query["output_format"],
                    audio=audio, done_at=call.done_at, seq=history.next_seq(), characters_from=before,
                    characters_to=after))
        return _answer(sim, call, request_id, audio, len(text), streamed=streamed)

    return await sim.sync_call(PREFIX, _throttled, work)


async def text_to_speech(request: Request) -> Response:
    return await _speech(request, streamed=False)


async def text_to_speech_stream(request: Request) -> Response:
    return await _speech(request, streamed=True)


def sound_cost(duration_seconds: float | None) -> int:
    """A sound effect's `character-cost` (pure): the simulator's rate per
    second of the duration asked for, or of its guess."""
    seconds = duration_seconds if duration_seconds is not None else SFX_GUESSED_DURATION_S
    return math.ceil(seconds * SFX_CREDITS_PER_SECOND)


async def sound_generation(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    call = await _accept(request, SFX_FIELDS, OUTPUT_FORMATS, latency=False)
    if isinstance(call, Response):
        return call

    async def work() -> Response:
        request_id = _new_id()
        cost = sound_cost(call.body.get("duration_seconds"))
        sim.count_sync_call(call.raw)
        if call.controls.outcome == "succeeded":
            speech_history(sim).charge(cost)  # the account's counter; sound effects are not in the history
        return _answer(sim, call, request_id, _audio_of(call, request_id), cost, streamed=False)

    return await sim.sync_call(PREFIX, _throttled, work)


def _item_not_found() -> JSONResponse:
    return _error(404, "not_found", "history_item_not_found", "History item not found.")


async def list_history(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _server_error("simulated status error")
    query, errors = parse_history_query(request.query_params)
    if errors:
        return _invalid(errors)
    page = history_page(speech_history(sim).items, query, time.time())
    if page is None:
        return _error(400, "validation_error", "invalid_parameters", "No history item has this id.",
                      param="start_after_history_item_id")
    items, more = page
    return JSONResponse({
        "history": [history_item_view(item) for item in items],
        "last_history_item_id": items[-1].history_item_id if items else None,
        "has_more": more,
        "scanned_until": items[-1].date_unix if items else None,
    })


def _done_item(sim: Simulator, request: Request) -> HistoryItem | None:
    item = speech_history(sim).items.get(request.path_params["history_item_id"])
    return item if item is not None and item.done_at <= time.time() else None


async def get_history_item(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("status_error"):
        return _server_error("simulated status error")
    item = _done_item(sim, request)
    return _item_not_found() if item is None else JSONResponse(history_item_view(item))


async def get_history_audio(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not _has_key(request):
        return _unauthorized()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("download_error"):
        return _server_error("simulated download error")
    item = _done_item(sim, request)
    if item is None:
        return _item_not_found()
    return StreamingResponse(aiter_chunks(item.audio.chunks()), media_type=item.audio.content_type,
                             headers={"content-length": str(item.audio.length)})


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    return None  # no dubbing webhook is documented: dubs are polled


routes = [
    Route(f"{PREFIX}/v1/dubbing", create_dub, methods=["POST"]),
    Route(f"{PREFIX}/v1/dubbing", list_dubs, methods=["GET"]),
    Route(f"{PREFIX}/v1/dubbing/{{dubbing_id}}", get_dub, methods=["GET"]),
    Route(f"{PREFIX}/v1/dubbing/{{dubbing_id}}/audio/{{language_code}}", get_audio, methods=["GET"]),
    Route(f"{PREFIX}/v1/text-to-speech/{{voice_id}}", text_to_speech, methods=["POST"]),
    Route(f"{PREFIX}/v1/text-to-speech/{{voice_id}}/stream", text_to_speech_stream, methods=["POST"]),
    Route(f"{PREFIX}/v1/sound-generation", sound_generation, methods=["POST"]),
    Route(f"{PREFIX}/v1/history", list_history, methods=["GET"]),
    Route(f"{PREFIX}/v1/history/{{history_item_id}}", get_history_item, methods=["GET"]),
    Route(f"{PREFIX}/v1/history/{{history_item_id}}/audio", get_history_audio, methods=["GET"]),
]
