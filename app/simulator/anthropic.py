"""Anthropic's Messages API under /anthropic: `POST /anthropic/v1/messages`,
a sync call: the answer comes back on the call itself, and there is no task,
nothing to read back later.

Held to the official SDK, anthropic-sdk-python 2.15 (`resources/messages/
messages.py` and `types/message_create_params.py` for the request;
`types/message.py`, `usage.py`, `cache_creation.py`, `text_block.py`,
`stop_reason.py` for the Message; `raw_message_*_event.py`,
`raw_content_block_*_event.py`, `text_delta.py`, `message_delta_usage.py`
and `lib/streaming/_messages.py` for the stream; `_exceptions.py`,
`_error_classes.py` and `types/shared/error_response.py` for errors), and to
the docs' errors page (https://platform.claude.com/docs/en/api/errors: the
error shape, the `request-id` header, the status of each error type),
streaming page (https://platform.claude.com/docs/en/build-with-claude/streaming:
the event flow, cumulative `message_delta` usage, `ping`) and versions page
(https://platform.claude.com/docs/en/api/versioning).

- A call needs its API key, in `x-api-key` (the docs' header) or as
  `Authorization: Bearer <key>` (the authentication page's current form,
  https://platform.claude.com/docs/en/manage-claude/authentication, and what
  SDK 2.15 sends). Any non-empty key will do: the simulator has no accounts;
  without one, 401 `authentication_error`. It needs `anthropic-version` too,
  one of the documented versions (2023-01-01, 2023-06-01, and 2026-10-21,
  which SDK 2.15 sends); else 400 `invalid_request_error`.
- The body is a Messages request: `model`, `max_tokens` (a whole number, at
  least 1), `messages` (1 to 100,000 objects with `role` user|assistant and
  `content`, a string or a list of typed blocks), optional `system` (a string
  or text blocks), `stream`, `stop_sequences`, `metadata` (`user_id`: a
  string of at most 256 characters, or null); every other documented field
  (`temperature`, `tools`, `thinking`, ...) is accepted and has no effect. A
  body that is not that is 400 `invalid_request_error`; one over the
  simulator's 1 MiB is 413 `request_too_large` (the API's own limit is 32 MB).
- The simulator's controls ride in `metadata` (CONTRACT.md): `duration_s`
  delays the answer (1 s when not given, as for every task), `outcome: "failed"` fails it, `output_text` is the
  assistant's text, `input_tokens`/`output_tokens` set the usage; without
  them a count is the text's length in characters divided by 4, rounded up
  (the input text: `system` and the messages' text, blocks of other types
  not counted). A bad control is 400 `invalid_request_error`.
- The answer is the Message (`id` msg_…, `type`, `role`, `content` of one
  text block, `model` as asked, `stop_reason`, `stop_sequence`, `usage`)
  with the `request-id` header every answer carries, errors included (whose
  body carries the same id as `request_id`). With `stream: true` it is the
  documented event flow, each event named (`event:`) as its `type`:
  `message_start` (the Message with empty `content`, null `stop_reason`,
  `output_tokens` at most 1), `content_block_start` (an empty text block),
  `ping`, one or more `content_block_delta` `text_delta`, `content_block_stop`,
  `message_delta` (`stop_reason`, `stop_sequence`, cumulative usage), and
  `message_stop`. `message_start` goes out at once and the deltas are spread
  evenly over `duration_s`; a non-streamed answer comes after `duration_s`.
- Errors are `{"type": "error", "error": {"type", "message"}, "request_id"}`:
  400 invalid_request_error, 401 authentication_error, 413
  request_too_large, 429 rate_limit_error with `retry-after: 1` (the
  `throttle` fault), 500 api_error (`submit_error`), 529 overloaded_error
  with `retry-after: 1` (`overloaded`).

Where the documents are silent, the choices here:
- `outcome: "failed"` is a 400 invalid_request_error sent after
  `duration_s`, before any stream byte in both modes: the only documented
  answer that says the call will not succeed (5xx and 529 say "try again",
  and 500 is already the `submit_error` fault). The call did its work, so it
  is counted in `sync_calls_by_body`, like every call that got past the
  checks and faults (counted when its work starts, so a caller that hangs up
  mid-call is counted too); the fault answers sent instead of the work (429,
  529, 500) are not. `submit_timeout_after_create` counts the call, does
  its work (waits `duration_s`), then holds and drops the answer
  (`HoldThenDrop`), stream or not. A sync call creates no task:
  `tasks_created` does not move.
- Auth, then the version header, then the faults, then the body: the real
  order is not documented.
- Ids are shaped like the documented examples: `msg_01` / `req_01` and 22
  base62 characters. The default text (no `output_text`) is DEFAULT_TEXT. A stop sequence found
  in the text cuts it before the sequence (`stop_reason: "stop_sequence"`,
  `stop_sequence` the one that occurs first; empty ones never match); an
  answer whose output tokens would exceed `max_tokens` is cut to
  `max_tokens` × 4 characters and reports `max_tokens` output tokens and
  `stop_reason: "max_tokens"`; otherwise `end_turn`. An empty text counts 0
  output tokens (the contract's rule; the real API counts at least 1).
- `usage` has the documented cache fields at 0 (`cache_creation_input_tokens`,
  `cache_read_input_tokens`, `cache_creation` with its 5m/1h counts) and
  `service_tier: "standard"`: the simulator caches nothing. Fields the SDK
  types allow but a plain text answer leaves out (`container`,
  `stop_details`, `server_tool_use`, `inference_geo`, ...) are not sent.
- Unknown top-level fields and metadata keys other than `user_id` are
  accepted (the controls are among them); the real API's treatment of them
  is not documented.
- No `error` event is sent inside a stream (no fault asks for one), and no
  `anthropic-ratelimit-*` headers are sent.
- Above `max_concurrent` (calls in flight under /anthropic: from the start
  of the work until the answer has gone out or was dropped) a call that
  passed the checks is the throttle's 429 instead, not counted.
  `output_duration_s` is checked and does not apply (no files here).
"""
from __future__ import annotations

import math
import secrets
import string
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.simulator.controls import ControlError, Controls, parse_controls
from app.simulator.engine import Simulator
from app.simulator.wire import (
    MAX_BODY,
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    BodyTooLarge,
    HoldThenDrop,
    auth_token,
    dumps,
    parse_json,
    read_body,
    sleep_for,
    sleep_until,
)

PROTOCOL = "anthropic"
PREFIX = "/anthropic"
MESSAGES = f"{PREFIX}/v1/messages"

# The versions page's history, and the version anthropic-sdk-python 2.15 sends.
API_VERSIONS = ("2023-01-01", "2023-06-01", "2026-10-21")
DEFAULT_TEXT = "This is a simulated answer from the longcall simulator."
CHARS_PER_TOKEN = 4  # the contract's estimate of a token
MAX_MESSAGES = 100_000  # "There is a limit of 100,000 messages in a single request."
MAX_USER_ID = 256
ROLES = ("user", "assistant")
# A stream has at most this many text deltas, each at least MIN_DELTA_CHARS long
# (but the last): a long text is not tens of thousands of events.
MAX_DELTAS = 64
MIN_DELTA_CHARS = 16

# Error types with the HTTP status the errors page gives each.
INVALID_REQUEST = ("invalid_request_error", 400)
AUTHENTICATION = ("authentication_error", 401)
REQUEST_TOO_LARGE = ("request_too_large", 413)
RATE_LIMIT = ("rate_limit_error", 429)
API_ERROR = ("api_error", 500)
OVERLOADED = ("overloaded_error", 529)

_ID_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    """An id shaped like the documented ones (`msg_013Zva2CMHLNnXjNJJKqJ2EF`,
    `req_018EeWyXxfu5pfWkrYcMdjWG`): the prefix, "01", 22 base62 characters."""
    return prefix + "01" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(22))


# ------------------------------------------------------------------ errors


def error_body(kind: tuple[str, int], message: str, request_id: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind[0], "message": message}, "request_id": request_id}


def _error(kind: tuple[str, int], message: str, request_id: str, *, retry_after: bool = False) -> JSONResponse:
    headers = {"request-id": request_id}
    if retry_after:
        headers["retry-after"] = str(THROTTLE_RETRY_AFTER_S)
    return JSONResponse(error_body(kind, message, request_id), status_code=kind[1], headers=headers)


def refusal(request: Request) -> tuple[tuple[str, int], str] | None:
    """The error (kind, message) for a call's headers, or None when they are right."""
    if not request.headers.get("x-api-key", "").strip() and auth_token(request, "Bearer") is None:
        return AUTHENTICATION, "x-api-key header is required"
    version = request.headers.get("anthropic-version")
    if version is None:
        return INVALID_REQUEST, "anthropic-version: header is required"
    if version not in API_VERSIONS:
        return INVALID_REQUEST, f"anthropic-version: unknown version {version!r}; known: {', '.join(API_VERSIONS)}"
    return None


# ------------------------------------------------------------------ the request


class CallError(ValueError):
    """The body is not a Messages request; the message says why."""


@dataclass(frozen=True)
class Call:
    """What the simulator reads from one Messages request."""

    model: str
    max_tokens: int
    stream: bool
    stop_sequences: tuple[str, ...]
    input_chars: int  # of the text sent: system and messages
    controls: Controls
    input_tokens: int | None  # the controls, when given
    output_tokens: int | None


def _is_int(value: Any) -> bool:
    # 3.0 is a whole number too, as the API's validation reads it.
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer()))


def _text_blocks_chars(blocks: Any, where: str, *, text_only: bool) -> int:
    """The characters of the text blocks in `blocks` (a list of typed
    blocks); CallError when it is not one."""
    if not isinstance(blocks, list):
        raise CallError(f"{where}: Input should be a valid string or a list of content blocks")
    chars = 0
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise CallError(f"{where}.{i}: Input should be a content block with a type")
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise CallError(f"{where}.{i}.text: Input should be a valid string")
            chars += len(block["text"])
        elif text_only:
            raise CallError(f"{where}.{i}.type: Input should be 'text'")
    return chars


def _content_chars(content: Any, where: str, *, text_only: bool = False) -> int:
    if isinstance(content, str):
        return len(content)
    return _text_blocks_chars(content, where, text_only=text_only)


def parse_call(body: Any) -> Call:
    """The call a parsed body asks for (pure); CallError when it is not a
    Messages request or a control in its metadata is wrong."""
    if not isinstance(body, dict):
        raise CallError("body: Input should be a JSON object")
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            raise CallError(f"{name}: Field required")
    model = body["model"]
    if not isinstance(model, str) or not model.strip():
        raise CallError("model: Input should be a non-empty string")
    max_tokens = body["max_tokens"]
    if not _is_int(max_tokens):
        raise CallError("max_tokens: Input should be a valid integer")
    if max_tokens < 1:
        raise CallError("max_tokens: Input should be greater than or equal to 1")

    messages = body["messages"]
    if not isinstance(messages, list):
        raise CallError("messages: Input should be a valid list")
    if not messages:
        raise CallError("messages: at least one message is required")
    if len(messages) > MAX_MESSAGES:
        raise CallError(f"messages: at most {MAX_MESSAGES} messages are allowed")
    chars = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise CallError(f"messages.{i}: Input should be an object with role and content")
        if message.get("role") not in ROLES:
            raise CallError(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise CallError(f"messages.{i}.content: Field required")
        chars += _content_chars(message["content"], f"messages.{i}.content")
    if "system" in body:
        chars += _content_chars(body["system"], "system", text_only=True)

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise CallError("stream: Input should be a valid boolean")
    stop_sequences = body.get("stop_sequences", [])
    if not isinstance(stop_sequences, list) or not all(isinstance(s, str) for s in stop_sequences):
        raise CallError("stop_sequences: Input should be a list of strings")

    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CallError("metadata: Input should be an object")
    user_id = metadata.get("user_id")
    if user_id is not None and (not isinstance(user_id, str) or len(user_id) > MAX_USER_ID):
        raise CallError(f"metadata.user_id: Input should be a string of at most {MAX_USER_ID} characters")
    try:
        controls = parse_controls(metadata)
    except ControlError as exc:
        # ControlError names the field as `input.<name>`; here it is metadata's.
        raise CallError("metadata." + str(exc).removeprefix("input.")) from None
    return Call(model=model, max_tokens=int(max_tokens), stream=stream, stop_sequences=tuple(stop_sequences),
                input_chars=chars, controls=controls, input_tokens=controls.input_tokens,
                output_tokens=controls.output_tokens)


# ------------------------------------------------------------------ the answer


@dataclass(frozen=True)
class Answer:
    text: str
    stop_reason: str
    stop_sequence: str | None
    input_tokens: int
    output_tokens: int


def estimate_tokens(chars: int) -> int:
    """The contract's usage without a control: characters / 4, rounded up."""
    return math.ceil(chars / CHARS_PER_TOKEN)


def plan_answer(call: Call) -> Answer:
    """What the model "says" to `call` (pure): the controls' text (or the
    default) cut at the first stop sequence it contains, then at max_tokens."""
    text = call.controls.output_text if call.controls.output_text is not None else DEFAULT_TEXT
    stop_reason, stop_sequence = "end_turn", None
    hits = [(text.find(s), n, s) for n, s in enumerate(call.stop_sequences) if s and s in text]
    if hits:
        at, _, stop_sequence = min(hits)
        text, stop_reason = text[:at], "stop_sequence"
    output_tokens = call.output_tokens if call.output_tokens is not None else estimate_tokens(len(text))
    if output_tokens > call.max_tokens:
        text, output_tokens = text[:call.max_tokens * CHARS_PER_TOKEN], call.max_tokens
        stop_reason, stop_sequence = "max_tokens", None
    input_tokens = call.input_tokens if call.input_tokens is not None else estimate_tokens(call.input_chars)
    return Answer(text=text, stop_reason=stop_reason, stop_sequence=stop_sequence,
                  input_tokens=input_tokens, output_tokens=output_tokens)


def usage_view(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def message_view(message_id: str, model: str, answer: Answer) -> dict[str, Any]:
    """The Message of a non-streamed answer."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": answer.text}],
        "stop_reason": answer.stop_reason,
        "stop_sequence": answer.stop_sequence,
        "usage": usage_view(answer.input_tokens, answer.output_tokens),
    }


def text_pieces(text: str) -> list[str]:
    """The text deltas of `text` (pure): at most MAX_DELTAS, one empty delta
    for an empty text (a block has "one or more" deltas)."""
    if not text:
        return [""]
    size = max(MIN_DELTA_CHARS, math.ceil(len(text) / MAX_DELTAS))
    return [text[i:i + size] for i in range(0, len(text), size)]


def stream_events(message_id: str, model: str, answer: Answer) -> list[tuple[str, dict[str, Any]]]:
    """The stream of an answer as (event name, data) pairs (pure)."""
    start = message_view(message_id, model, answer)
    start.update(content=[], stop_reason=None, stop_sequence=None,
                 usage=usage_view(answer.input_tokens, min(1, answer.output_tokens)))
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": piece}})
               for piece in text_pieces(answer.text)]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": answer.stop_reason, "stop_sequence": answer.stop_sequence},
            # Cumulative totals (the streaming page; MessageDeltaUsage).
            "usage": {"input_tokens": answer.input_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": answer.output_tokens},
        }),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(data) + b"\n\n"


async def _stream(events: list[tuple[str, dict[str, Any]]], duration_s: float) -> AsyncIterator[bytes]:
    """The events, the text deltas spread evenly over `duration_s`."""
    deltas = sum(1 for name, _ in events if name == "content_block_delta")
    pause = duration_s / deltas
    start, sent = time.monotonic(), 0
    for name, data in events:
        if name == "content_block_delta":
            sent += 1
            await sleep_until(start + sent * pause)  # its own deadline: early timers do not add up
        yield sse(name, data)


# ------------------------------------------------------------------ the route


async def create_message(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    request_id = new_id("req_")
    refused = refusal(request)
    if refused is not None:
        return _error(*refused, request_id)
    if sim.fault("throttle"):
        return _rate_limited(request_id)
    if sim.fault("overloaded"):
        return _error(OVERLOADED, "Overloaded", request_id, retry_after=True)
    if sim.fault("submit_error"):
        return _error(API_ERROR, "Internal server error (simulated)", request_id)
    try:
        raw = await read_body(request)
        body = parse_json(raw)
    except BodyTooLarge:
        return _error(REQUEST_TOO_LARGE, f"Request exceeds the maximum size of {MAX_BODY} bytes", request_id)
    except BadBody as exc:
        return _error(INVALID_REQUEST, str(exc), request_id)
    try:
        call = parse_call(body)
    except CallError as exc:
        return _error(INVALID_REQUEST, str(exc), request_id)

    return await sim.sync_call(PREFIX, lambda: _rate_limited(request_id), lambda: _work(sim, call, raw, request_id))


def _rate_limited(request_id: str) -> JSONResponse:
    # The `throttle` fault's answer, and `max_concurrent`'s.
    return _error(RATE_LIMIT, "Number of requests has exceeded your rate limit (simulated)", request_id,
                  retry_after=True)


async def _work(sim: Simulator, call: Call, raw: bytes, request_id: str) -> Response:
    """The call's work and its answer (the call is in flight meanwhile)."""
    sim.count_sync_call(raw)  # the work starts: from here on the call was made
    duration_s = call.controls.duration_s
    if sim.fault("submit_timeout_after_create"):
        await sleep_for(duration_s)  # the work, whose answer never comes
        return HoldThenDrop(sim.hold_s)
    if call.controls.outcome == "failed":
        await sleep_for(duration_s)
        return _error(INVALID_REQUEST, "The simulated call failed (metadata.outcome: failed)", request_id)
    answer = plan_answer(call)
    message_id = new_id("msg_")
    if call.stream:
        return StreamingResponse(_stream(stream_events(message_id, call.model, answer), duration_s),
                                 media_type="text/event-stream", headers={"request-id": request_id})
    await sleep_for(duration_s)
    return JSONResponse(message_view(message_id, call.model, answer), headers={"request-id": request_id})


routes = [Route(MESSAGES, create_message, methods=["POST"])]
