"""OpenAI's Chat Completions under /openai: `POST /openai/v1/chat/completions`,
the one call of an OpenAI-compatible endpoint (OpenAI, OpenRouter, vLLM, KIE's
LLM API), answered in the same breath: there is no task, so none is created.

Held to OpenAI's API reference (openai/openai-openapi `openapi.yaml`:
`createChatCompletion`, `CreateChatCompletionRequest`,
`CreateChatCompletionResponse` and its example, `CreateChatCompletionStreamResponse`
and its example, `ChatCompletionStreamOptions`, `Metadata`, `ErrorResponse`,
`TooManyRequests`), the API overview's "Debugging requests" (`x-request-id`)
and the official client openai-python (`types/chat/chat_completion.py`,
`chat_completion_chunk.py`, `completion_usage.py`, `_streaming.py`,
`_client.py` `_make_status_error`). Every field answered is one those name.

- The call carries `Authorization: Bearer <key>` (any non-empty key: the
  simulator has no accounts). Without one: 401 with the live answer's message
  ("You didn't provide an API key. ...", type `invalid_request_error`), which
  never echoes what was sent.
- The body is `CreateChatCompletionRequest`: `model` and `messages` (at least
  one, each with a documented `role`) are required; `n` (1..128), `stream`,
  `stream_options` (only with `stream: true`, as documented) and `metadata`
  are read; every other documented parameter is accepted and not applied
  (`max_tokens` truncates nothing: `finish_reason` is always `stop`).
- The simulator's controls ride in `metadata` (CONTRACT.md): `duration_s`
  delays the answer (1 s when not given, as for every task), `outcome:
  "failed"` fails it, `output_text` is the assistant's text (default
  `DEFAULT_TEXT`), `input_tokens`/`output_tokens` are the
  `prompt_tokens`/`completion_tokens` reported. Without them a count
  is the text's length in characters divided by 4, rounded up: for the
  prompt, the text of the messages (string contents and `text` parts); for
  the completion, the assistant's text times `n`. The documented `Metadata`
  values are strings, so a numeric control may be a string holding a JSON
  number ("2.5") as the SDK's `Dict[str, str]` sends it, or a JSON number;
  the documented limits (16 pairs, 64-character keys, 512-character values)
  are not enforced, so a long `output_text` fits. The other controls are
  validated and do not apply (no files, no cost here).
- The answer is a `chat.completion` (`id` `chatcmpl-` and 29 letters and
  digits like the documented example, `created`, `model` echoed as sent,
  `choices[i]` with `message {role, content, refusal: null, annotations: []}`,
  `logprobs: null`, `finish_reason: "stop"`, and `usage` with the details
  objects of the documented example, all zero). `service_tier` and
  `system_fingerprint`, optional, are not answered. Every answer, errors
  included, has an `x-request-id` (`req_` and 32 hex digits, the shape of
  live ids; the SDK exposes it as `_request_id` / `request_id`).
- With `stream: true` the answer is `text/event-stream`: `data: <chunk>`
  events, the first with `delta {role: "assistant", content: ""}` per choice,
  then the text in pieces (at most `MAX_PIECES`), then `delta {}` with
  `finish_reason: "stop"`, then, only with `stream_options.include_usage`,
  the usage chunk with `choices: []`, then `data: [DONE]`. With
  `include_usage` every other chunk has `usage: null`, as documented; without
  it no chunk has `usage`. Every chunk, the usage chunk too, has
  `obfuscation` (random letters padding the content to a 16-character block:
  "included by default") unless `stream_options.include_obfuscation` is
  false. The first chunk goes at once, the others evenly over `duration_s`.
- Errors are the documented `{"error": {"message", "type", "param", "code"}}`
  (messages like the live answers'): 400 `invalid_request_error` for a body
  that is not a valid request (`param` names the field; JSON that does not
  parse has the live "We could not parse the JSON body" message); 429 `requests`
  / `rate_limit_exceeded` with `retry-after` (the `throttle` fault; the
  `Retry-After` header of `TooManyRequests`); 500 `server_error` (the
  `submit_error` fault: "The server had an error while processing your
  request"); 503 `service_unavailable_error` / `server_is_overloaded` with
  `retry-after` for the `overloaded` fault: Anthropic's 529 has no OpenAI
  equivalent, and the error-codes guide's overload answer is "503 - The
  engine is currently overloaded, please try again later" (type and code
  second-hand, from a summary of that guide).
- `outcome: "failed"` answers, after `duration_s`, the 400 a flagged prompt
  gets live (`invalid_prompt`, "Invalid prompt: your prompt was flagged as
  potentially violating our usage policy...", openai/codex#7250): a definite
  refusal that bills nothing, never a 5xx (that would be a lost call). With
  `stream: true` it is the same JSON answer, before any event.
- Faults are rolled after auth, in this order: `throttle`, `overloaded`,
  `submit_error` (each answered at once, no work done). Then the body is
  read; a call with a valid body is counted in `sync_calls_by_body` (the
  sha256 of its raw body) as soon as it is taken on, so a call whose client
  goes away mid-call is counted too; a failed outcome is counted (the call
  was made). `submit_timeout_after_create` does the work (waits
  `duration_s`, counted) and then drops the answer (`HoldThenDrop`), stream
  or not.
- Above `max_concurrent` (calls in flight under /openai: from the start of
  the work until the answer has gone out or was dropped) a call with a
  valid body is the throttle's 429 instead, not counted.
  `output_duration_s` is checked and does not apply (no files here).
"""
from __future__ import annotations

import json
import math
import secrets
import string
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.simulator.controls import ControlError, Controls, parse_controls
from app.simulator.engine import Simulator
from app.simulator.wire import (
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    HoldThenDrop,
    auth_token,
    dumps,
    parse_json,
    read_body,
    sleep_for,
    sleep_until,
)

PROTOCOL = "openai"
PREFIX = "/openai"
PATH = f"{PREFIX}/v1/chat/completions"

DEFAULT_TEXT = "This is the simulator's answer."
MAX_PIECES = 32  # a stream carries the text in at most this many content chunks
MAX_N = 128
MAX_TOKENS = 10**12
CHARS_PER_TOKEN = 4
# ChatCompletionRequestMessage's discriminator values.
ROLES = ("developer", "system", "user", "assistant", "tool", "function")
# Roles whose `content` may be left out or null (an assistant that calls tools).
CONTENT_OPTIONAL = ("assistant", "function")

# The simulator's controls that are numbers (CONTRACT.md); in `metadata` they may come as strings.
NUMERIC_CONTROLS = ("duration_s", "output_bytes", "outputs", "cost", "output_ttl_s", "output_duration_s")
TEXT_CONTROLS = ("outcome", "content_type", "output_text")
TOKEN_CONTROLS = ("input_tokens", "output_tokens")

_ID_ALPHABET = string.ascii_letters + string.digits
_OBFUSCATION_BLOCK = 16

NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer "
    "auth (i.e. Authorization: Bearer YOUR_KEY). You can obtain an API key from "
    "https://platform.openai.com/account/api-keys."
)
NOT_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP "
    "library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)"
)
FLAGGED = (
    "Invalid prompt: your prompt was flagged as potentially violating our usage policy. Please try again with "
    "a different prompt: https://platform.openai.com/docs/guides/reasoning#advice-on-prompting"
)


# ------------------------------------------------------------------ answers


def request_id() -> str:
    return "req_" + secrets.token_hex(16)


def completion_id() -> str:
    return "chatcmpl-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(29))


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """`ErrorResponse`: all four fields of `Error` are required, two nullable."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _error(status: int, body: dict[str, Any], *, retry_after: bool = False) -> JSONResponse:
    headers = {"x-request-id": request_id()}
    if retry_after:
        headers["retry-after"] = str(THROTTLE_RETRY_AFTER_S)
    return JSONResponse(body, status_code=status, headers=headers)


def _unauthorized() -> JSONResponse:
    return _error(401, error_body(NO_KEY, "invalid_request_error"))


def _throttled() -> JSONResponse:
    return _error(429, error_body("Rate limit reached for requests", "requests", None, "rate_limit_exceeded"),
                  retry_after=True)


def _overloaded() -> JSONResponse:
    return _error(503, error_body("The engine is currently overloaded, please try again later",
                                  "service_unavailable_error", None, "server_is_overloaded"), retry_after=True)


def _server_error() -> JSONResponse:
    return _error(500, error_body("The server had an error while processing your request. Sorry about that!",
                                  "server_error"))


# ------------------------------------------------------------------ the request


class InvalidRequest(ValueError):
    """The body is not a request the API takes: a 400 `invalid_request_error`."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, "invalid_request_error", self.param, self.code)


@dataclass(frozen=True)
class ChatCall:
    """What one chat completion request asks of the simulator."""

    model: str
    messages: list[dict[str, Any]]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    include_obfuscation: bool = True
    controls: Controls = Controls()
    input_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def text(self) -> str:
        return DEFAULT_TEXT if self.controls.output_text is None else self.controls.output_text


def _kind(value: Any) -> str:
    """A JSON value's type as the API's messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _wrong_type(param: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
                          param, "invalid_type")


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _optional_bool(body: Mapping[str, Any], name: str, param: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise _wrong_type(param, "a boolean", value)
    return value


def _parse_messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise _missing("messages")
    if not isinstance(value, list):
        raise _wrong_type("messages", "an array of objects", value)
    if not value:
        raise InvalidRequest("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
                             "empty array instead.", "messages", "empty_array")
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _wrong_type(where, "an object", message)
        role = message.get("role")
        if role is None:
            raise _missing(f"{where}.role")
        if role not in ROLES:
            supported = ", ".join(f"'{r}'" for r in ROLES)
            raise InvalidRequest(f"Invalid value: {json.dumps(role)}. Supported values are: {supported}.",
                                 f"{where}.role", "invalid_value")
        content = message.get("content")
        if content is None and role not in CONTENT_OPTIONAL:
            raise _missing(f"{where}.content")
        if content is not None and not isinstance(content, (str, list)):
            raise _wrong_type(f"{where}.content", "one of a string or array of objects", content)
    return value


def _metadata_value(name: str, value: Any) -> Any:
    """A control as `parse_controls` reads it: a string holding a JSON number
    is that number; anything else is left for the parser to judge."""
    if name in NUMERIC_CONTROLS + TOKEN_CONTROLS and isinstance(value, str):
        try:
            number = json.loads(value)
        except ValueError:
            return value
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return number
    return value


def _parse_metadata(value: Any) -> tuple[Controls, int | None, int | None]:
    if value is None:
        return Controls(), None, None
    if not isinstance(value, dict):
        raise _wrong_type("metadata", "an object", value)
    values = {name: _metadata_value(name, value[name])
              for name in NUMERIC_CONTROLS + TEXT_CONTROLS + TOKEN_CONTROLS if name in value}
    try:
        controls = parse_controls(values)
    except ControlError as exc:
        # ControlError says "input.<field> <why>"; under this prefix the field is in metadata.
        why = str(exc).partition(" ")[2]
        raise InvalidRequest(f"Invalid 'metadata.{exc.field}': {why}.", f"metadata.{exc.field}",
                             "invalid_value") from None
    return controls, controls.input_tokens, controls.output_tokens


def parse_call(body: Any) -> ChatCall:
    """The request a body makes (pure); InvalidRequest says what is wrong,
    the first thing found, in the order the fields are documented."""
    if not isinstance(body, dict):
        raise InvalidRequest(NOT_JSON)
    model = body.get("model")
    if model is None or model == "":
        raise InvalidRequest("you must provide a model parameter")
    if not isinstance(model, str):
        raise _wrong_type("model", "a string", model)
    messages = _parse_messages(body.get("messages"))
    n = body.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise _wrong_type("n", "an integer", n)
        if not 1 <= n <= MAX_N:
            raise InvalidRequest(f"Invalid 'n': integer must be between 1 and {MAX_N}.", "n", "invalid_value")
    stream = bool(_optional_bool(body, "stream", "stream"))
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _wrong_type("stream_options", "an object", options)
        if not stream:
            raise InvalidRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                 "stream_options")
    options = options or {}
    include_usage = bool(_optional_bool(options, "include_usage", "stream_options.include_usage"))
    include_obfuscation = _optional_bool(options, "include_obfuscation", "stream_options.include_obfuscation")
    controls, input_tokens, output_tokens = _parse_metadata(body.get("metadata"))
    return ChatCall(
        model=model,
        messages=messages,
        n=1 if n is None else n,
        stream=stream,
        include_usage=include_usage,
        include_obfuscation=include_obfuscation is not False,
        controls=controls,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def prompt_text_length(messages: list[dict[str, Any]]) -> int:
    """Characters of text in the messages: string contents and `text` parts."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part["text"]) for part in content
                         if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str))
    return total


def estimated_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def usage_of(call: ChatCall) -> dict[str, Any]:
    """`CompletionUsage`, with the details objects of the documented example."""
    prompt = call.input_tokens if call.input_tokens is not None else estimated_tokens(
        prompt_text_length(call.messages))
    completion = call.output_tokens if call.output_tokens is not None else call.n * estimated_tokens(len(call.text))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }


def completion_of(call: ChatCall, id_: str, created: int) -> dict[str, Any]:
    """The `chat.completion` answer (pure)."""
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created,
        "model": call.model,
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": call.text, "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
            for index in range(call.n)
        ],
        "usage": usage_of(call),
    }


def text_pieces(text: str, max_pieces: int = MAX_PIECES) -> list[str]:
    """The text cut into at most `max_pieces` pieces of near-equal length
    (none for an empty text); joined, they are the text."""
    if not text:
        return []
    size = math.ceil(len(text) / max_pieces)
    return [text[i:i + size] for i in range(0, len(text), size)]


def random_padding(content: str) -> str:
    """An obfuscation value: random letters that bring the content's length
    up to a whole block, as the field is meant to even out chunk sizes."""
    size = -len(content) % _OBFUSCATION_BLOCK or _OBFUSCATION_BLOCK
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(size))


def chunks_of(call: ChatCall, id_: str, created: int,
              pad: Callable[[str], str] = random_padding) -> list[dict[str, Any]]:
    """Every `chat.completion.chunk` of the stream, in order (pure but for
    `pad`, which makes each chunk's `obfuscation` from its content)."""

    def chunk(choices: list[dict[str, Any]], *, usage: dict[str, Any] | None = None,
              content: str = "") -> dict[str, Any]:
        body: dict[str, Any] = {"id": id_, "object": "chat.completion.chunk", "created": created,
                                "model": call.model, "choices": choices}
        if call.include_usage:
            body["usage"] = usage
        if call.include_obfuscation:
            body["obfuscation"] = pad(content)
        return body

    def choice(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    indexes = range(call.n)
    chunks = [chunk([choice(i, {"role": "assistant", "content": ""})]) for i in indexes]
    for piece in text_pieces(call.text):
        chunks += [chunk([choice(i, {"content": piece})], content=piece) for i in indexes]
    chunks += [chunk([choice(i, {}, "stop")]) for i in indexes]
    if call.include_usage:
        chunks.append(chunk([], usage=usage_of(call)))
    return chunks


def sse_event(data: Any) -> bytes:
    """One server-sent event: `data: <json>` (or the literal `[DONE]`)."""
    payload = data.encode("utf-8") if isinstance(data, str) else dumps(data)
    return b"data: " + payload + b"\n\n"


# ------------------------------------------------------------------ the route


async def _spread(chunks: list[dict[str, Any]], duration_s: float) -> AsyncIterator[bytes]:
    # The first chunk goes at once, the last at about `duration_s`, the others evenly between.
    # Each chunk waits for its own deadline, so that early timers do not add up.
    gap = duration_s / max(len(chunks) - 1, 1)
    start = time.monotonic()
    for i, chunk in enumerate(chunks):
        await sleep_until(start + i * gap)
        yield sse_event(chunk)
    yield sse_event("[DONE]")


async def create_chat_completion(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer") is None:
        return _unauthorized()
    if sim.fault("throttle"):
        return _throttled()
    if sim.fault("overloaded"):
        return _overloaded()
    if sim.fault("submit_error"):
        return _server_error()
    # The stats count calls by the bytes that were sent.
    try:
        raw = await read_body(request)
        call = parse_call(parse_json(raw))
    except BadBody:
        return _error(400, InvalidRequest(NOT_JSON).body())
    except InvalidRequest as exc:
        return _error(400, exc.body())
    return await sim.sync_call(PREFIX, _throttled, lambda: _work(sim, call, raw))


async def _work(sim: Simulator, call: ChatCall, raw: bytes) -> Response:
    """The call's work and its answer (the call is in flight meanwhile)."""
    sim.count_sync_call(raw)
    duration_s = call.controls.duration_s
    if sim.fault("submit_timeout_after_create"):
        await sleep_for(duration_s)
        return HoldThenDrop(sim.hold_s)
    if call.controls.outcome == "failed":
        await sleep_for(duration_s)
        return _error(400, error_body(FLAGGED, "invalid_request_error", None, "invalid_prompt"))
    id_, created = completion_id(), int(time.time())
    headers = {"x-request-id": request_id()}
    if call.stream:
        return StreamingResponse(_spread(chunks_of(call, id_, created), duration_s),
                                 media_type="text/event-stream; charset=utf-8", headers=headers)
    await sleep_for(duration_s)
    return JSONResponse(completion_of(call, id_, created), headers=headers)


routes = [Route(PATH, create_chat_completion, methods=["POST"])]
