"""Anthropic's Messages API as a sync call: one `POST /v1/messages`, whose
answer is the job's result (output 0, `application/json`: the Message).

Sources:
- the docs: the API reference's "Create a Message"
  (https://platform.claude.com/docs/en/api: `POST /v1/messages` with the
  headers `x-api-key`, `anthropic-version: 2023-06-01`, `content-type`; the
  body; the Message), streaming
  (https://platform.claude.com/docs/en/build-with-claude/streaming: the event
  flow `message_start`, per block `content_block_start`, deltas,
  `content_block_stop`, then `message_delta` with the stop reason and
  cumulative usage, `message_stop`; `ping` anywhere; an `error` event, e.g.
  `overloaded_error`, after HTTP 200; new event types to be ignored, as the
  versioning policy may add them), errors (https://platform.claude.com/docs/en/api/errors:
  the `request-id` header, 429 and 529 with `retry-after`, 500 `api_error`);
- the official client anthropic-sdk-python 2.15: `resources/messages/messages.py`
  (the request), `_streaming.py` (`ping` and events without a name skipped,
  an `error` event raised, an event without data skipped, the rest decoded
  by its data's `type`), `lib/streaming/_messages.py` `accumulate_event`
  (how the stream becomes the final Message: text_delta appended to a text
  block, input_json_delta accumulated for `tool_use` and `server_tool_use`
  blocks, thinking_delta and signature_delta for thinking blocks,
  citations_delta appended to a text block's citations, message_delta's
  stop_reason, stop_sequence, stop_details, container and its cumulative
  usage overwriting the message_start counts — the optional counts only
  when given — and an event before `message_start` an error), `types/usage.py`.

The call: the body is the job's input plus `model` (an input that carries a
`model` of its own is refused before anything is sent: the model is the
job's). 429, 529 and 503 are a retry (http.sync_call), other 4xx Rejected,
anything else once sent Uncertain. Without `"stream": true` the body is
streamed to the output file as it comes and its usage read back from that
file; with it, the events are assembled into the Message, which is written
as the output. Usage: INPUT_TOKENS is input_tokens plus
cache_creation_input_tokens plus cache_read_input_tokens (CONTRACT.md:
cache tokens are counted in), OUTPUT_TOKENS output_tokens.

Where the documents are silent, the choices here:
- a stream that ends before `message_stop`, an `error` event, or an event
  that cannot be read (not JSON, an event before `message_start`, a delta
  for a block that was not started) is Uncertain: the call was made and its
  answer is lost;
- a tool input's JSON is parsed when its block stops (or at `message_stop`
  for a block never stopped), strictly: the SDK re-parses the growing
  buffer in partial mode after every delta, which gives the same value for
  a whole JSON text; an input that is not one is an event we cannot read;
- asked to stream, an answer that is `application/json` anyway is taken as
  the plain Message (a proxy that does not stream);
- a plain answer's usage is read back only when it is at most 16 MiB (a
  Message that large is not text a model writes; a bigger one is kept
  without usage and charged the reservation); a plain answer that is not a
  JSON object of `type` `message` is Uncertain (an error object on HTTP 200
  included: its message is kept, masked);
- usage is reported only when both input_tokens and output_tokens are whole
  numbers (absent cache counts are 0); otherwise none, and the job is
  charged its reservation;
- `request_id` is the `request-id` header when it looks like an id;
- our own disk failing while the answer is written (full, gone) is
  Uncertain: the call was made and its answer is lost.

The pieces every JSON sync call shares (the body, the call with its file
cleanup, the plain answer read back, the stream read) are in
app/providers/llm.py, shared with app/providers/openai.py.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from app.download_errors import OutputTooLarge
from app.providers.base import (
    Observation,
    SubmitRequest,
    Usage,
)
from app.providers.llm import (
    NotAnAnswer,
    SyncJsonProvider,
    call_body,
    json_call,
    sync_facts,
    token_usage,
    wants_stream,
)
from app.providers.sse import Event, StreamError
from app.vocabulary import ProviderName

NAME = ProviderName.ANTHROPIC.value
API_VERSION = "2023-06-01"
MESSAGES_PATH = "/v1/messages"
REQUEST_ID_HEADER = "request-id"
# Blocks whose `input` input_json_delta builds (the SDK's TRACKS_TOOL_INPUT).
TOOL_INPUT_BLOCKS = ("tool_use", "server_tool_use")


# ------------------------------------------------------------------ pure: the request

# The official SDK's rule for a plain (not streamed) call: its length
# estimated at an hour for 128,000 output tokens, and over 10 minutes
# refused (anthropic `_base_client.py`, `_calculate_nonstreaming_timeout`:
# "Streaming is required for operations that may take longer than 10
# minutes"; the errors page's 504: "Consider using streaming for
# long-running requests").
SECONDS_PER_MAX_TOKEN = 3600 / 128_000
PLAIN_CALL_MAX_S = 600.0


def must_stream(job_input: Mapping[str, Any]) -> bool:
    """Whether a call asked for plain must be streamed all the same: a
    plain answer sends nothing until it is whole, so a long one would time
    out here (`call_lost`, refunded) while Anthropic goes on and bills it.
    Where the SDK refuses such a call, we stream it and store the Message
    the stream assembles, the same as the plain answer."""
    max_tokens = job_input.get("max_tokens")
    if wants_stream(job_input) or not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return False
    return max_tokens * SECONDS_PER_MAX_TOKEN > PLAIN_CALL_MAX_S


# ------------------------------------------------------------------ pure: the answer


def message_usage(message: Any) -> tuple[Usage, ...]:
    """The usage of a Message (pure): see the module docstring."""
    usage = message.get("usage") if isinstance(message, Mapping) else None
    if not isinstance(usage, Mapping):
        return ()
    return token_usage(usage.get("input_tokens"), usage.get("output_tokens"),
                       usage.get("cache_creation_input_tokens"), usage.get("cache_read_input_tokens"))


def read_message(value: Any) -> tuple[Usage, ...]:
    """A plain answer's usage (pure); NotAnAnswer unless it is a Message."""
    if not isinstance(value, Mapping) or value.get("type") != "message":
        detail = value.get("error") if isinstance(value, Mapping) else None
        raise NotAnAnswer("the answer is not a Message", detail)
    return message_usage(value)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise StreamError(f"{what} is not a string")
    return value


class MessageStream:
    """The Messages event stream assembled into the final Message, as the
    SDK's `accumulate_event` does (pure). `add` each event; it says True at
    `message_stop`, and `message` is then the answer. StreamError for an
    event that cannot be read or an `error` event; OutputTooLarge once the
    text assembled is over `max_bytes` (the Message is larger still)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.message: dict[str, Any] | None = None
        self._json: dict[int, list[str]] = {}  # tool input JSON by block index, until the block stops
        self._size = 0

    def result(self) -> dict[str, Any]:
        if self.message is None:
            raise StreamError("no message_start")
        return self.message

    def _grow(self, piece: str) -> str:
        self._size += len(piece)
        if self._size > self.max_bytes:
            raise OutputTooLarge(f"output is larger than the {self.max_bytes} byte cap")
        return piece

    def add(self, event: Event) -> bool:
        if event.event == "ping":
            return False
        if event.event == "error":
            detail: Any = event.data
            with contextlib.suppress(ValueError):
                detail = json.loads(event.data)
            raise StreamError("the stream carried an error", detail.get("error") if isinstance(detail, dict)
                              else detail)
        if event.event == "message" or not event.data:
            return False  # no event name (the SDK skips those), or no data
        try:
            data = json.loads(event.data)
        except (ValueError, RecursionError):
            raise StreamError(f"a {event.event[:40]!r} event that is not JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise StreamError(f"a {event.event[:40]!r} event without a type")
        return self._take(data)

    def _take(self, data: dict[str, Any]) -> bool:
        kind = data["type"]
        if kind == "error":
            raise StreamError("the stream carried an error", data.get("error"))
        if kind == "ping":
            return False
        message = self.message
        if message is None:
            if kind != "message_start":
                raise StreamError(f"{kind[:40]} before message_start")
            start = data.get("message")
            if not isinstance(start, dict) or not isinstance(start.get("content"), list) \
                    or not isinstance(start.get("usage"), dict):
                raise StreamError("a message_start without a Message")
            self.message = start
            return False
        content: list[Any] = message["content"]
        if kind == "content_block_start":
            block = data.get("content_block")
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise StreamError("a content_block_start without a block")
            content.append(block)  # the SDK appends, whatever the index says
        elif kind == "content_block_delta":
            self._delta(self._block(data, content), data)
        elif kind == "content_block_stop":
            self._block(data, content)
            self._end_input(data["index"], content)
        elif kind == "message_delta":
            self._message_delta(message, data)
        elif kind == "message_stop":
            for index in list(self._json):  # a block that never stopped
                self._end_input(index, content)
            return True
        # Any other type (a second message_start included) changes nothing,
        # as in the SDK: the versioning policy may add event types.
        return False

    @staticmethod
    def _block(data: dict[str, Any], content: list[Any]) -> dict[str, Any]:
        index = data.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(content):
            raise StreamError(f"a {data['type']} for a block that was not started")
        return content[index]

    def _delta(self, block: dict[str, Any], data: dict[str, Any]) -> None:
        delta = data.get("delta")
        if not isinstance(delta, dict) or not isinstance(delta.get("type"), str):
            raise StreamError("a content_block_delta without a delta")
        kind, block_type = delta["type"], block["type"]
        if kind == "text_delta":
            if block_type == "text":
                block["text"] = _text(block.get("text", ""), "a text block's text") + \
                    self._grow(_text(delta.get("text"), "a text_delta's text"))
        elif kind == "input_json_delta":
            if block_type in TOOL_INPUT_BLOCKS:
                piece = self._grow(_text(delta.get("partial_json"), "an input_json_delta's partial_json"))
                self._json.setdefault(data["index"], []).append(piece)
        elif kind == "citations_delta":
            if block_type == "text":
                citations = block.get("citations")
                if citations and isinstance(citations, list):
                    citations.append(delta.get("citation"))
                else:
                    block["citations"] = [delta.get("citation")]
        elif kind == "thinking_delta":
            if block_type == "thinking":
                block["thinking"] = _text(block.get("thinking", ""), "a thinking block's thinking") + \
                    self._grow(_text(delta.get("thinking"), "a thinking_delta's thinking"))
        elif kind == "signature_delta":
            if block_type == "thinking":
                block["signature"] = self._grow(_text(delta.get("signature"), "a signature_delta's signature"))
        # An unknown delta type changes nothing (the SDK checks them only statically).

    def _end_input(self, index: int, content: list[Any]) -> None:
        pieces = self._json.pop(index, None)
        if not pieces:
            return
        text = "".join(pieces)
        if not text:
            return  # the SDK parses only a non-empty buffer: the block's own input stays
        try:
            content[index]["input"] = json.loads(text)
        except (ValueError, RecursionError):
            raise StreamError(f"the input of tool block {index} is not JSON") from None

    @staticmethod
    def _message_delta(message: dict[str, Any], data: dict[str, Any]) -> None:
        delta, usage = data.get("delta"), data.get("usage")
        if not isinstance(delta, dict) or not isinstance(usage, dict):
            raise StreamError("a message_delta without its delta and usage")
        message["stop_reason"] = delta.get("stop_reason")
        message["stop_sequence"] = delta.get("stop_sequence")
        message["stop_details"] = delta.get("stop_details")
        if delta.get("container") is not None:
            message["container"] = delta["container"]
        totals: dict[str, Any] = message["usage"]
        totals["output_tokens"] = usage.get("output_tokens")
        # Cumulative totals overwrite; the optional ones only when given.
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "server_tool_use",
                    "output_tokens_details"):
            if usage.get(key) is not None:
                totals[key] = usage[key]


# ------------------------------------------------------------------ the call, shared by the JSON sync adapters


# ------------------------------------------------------------------ the adapter


class AnthropicProvider(SyncJsonProvider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, max_output_bytes: int = 2 * 1024**3,
                 spool_dir: str | None = None):
        super().__init__(base_url, api_key, timeout_s=timeout_s, client=client, max_output_bytes=max_output_bytes,
                         spool_dir=spool_dir)
        self.facts = sync_facts(NAME)

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if self._key:
            headers["x-api-key"] = self._key
        return headers

    async def call(self, request: SubmitRequest) -> Observation:
        job_input = {**request.input, "stream": True} if must_stream(request.input) else request.input
        body = call_body(NAME, request.model, job_input)
        stream = wants_stream(job_input)
        return await json_call(
            self._http.submits, NAME, f"{self.base_url}{MESSAGES_PATH}", body=body, headers=self._headers(),
            secrets=self._secrets, timeout_s=request.call_timeout_s,
            assembler=MessageStream(self._max_output_bytes) if stream else None, end="message_stop",
            read=read_message, usage_of=message_usage, request_id_header=REQUEST_ID_HEADER,
            directory=self._spool_dir, max_bytes=self._max_output_bytes,
        )

