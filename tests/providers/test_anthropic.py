"""The Anthropic Messages sync adapter: its pure decisions in tables (the
stream assembled as anthropic-sdk-python's own `accumulate_event` assembles
it, run on the same events), then the adapter over real HTTP against the
simulator's /anthropic protocol and, for answers the simulator never gives
(an error event mid-stream, a stream cut short, a redirect, a 200 that is
not a Message, an answer over the cap, a provider that echoes the key), a
scripted Anthropic on loopback.

Shapes of the events below: the streaming page
(https://platform.claude.com/docs/en/build-with-claude/streaming: the event
flow, the tool use stream's input_json_delta, the thinking stream's
thinking_delta and signature_delta, the error event `{"type": "error",
"error": {"type": "overloaded_error", "message": "Overloaded"}}`) and the
SDK's raw event types (types/raw_*_event.py, citations_delta.py)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from app.download_errors import OutputTooLarge
from app.providers.anthropic import AnthropicProvider, MessageStream, message_usage, read_message
from app.providers.base import (
    ProviderKind,
    Rejected,
    SubmitRequest,
    TaskState,
    Transient,
    Uncertain,
    Usage,
    UsageUnit,
)
from app.providers.llm import MAX_READ_BACK, NotAnAnswer, call_body
from app.providers.sse import Event, StreamError
from app.simulator import create_app
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults, stats

from .scripted import Script, Seen

KEY = "sk-ant-api03-LONGCALL-distinctive-key-7f3a9c"
MODEL = "claude-sonnet-4-5"
PROMPT = [{"role": "user", "content": "Say something durable."}]
REQUEST_ID = re.compile(r"req_01[A-Za-z0-9]{22}")
HOLD_S = 2.0
CALL_TIMEOUT_S = 1.0  # below HOLD_S: a held answer times out


def usage(input_tokens: float, output_tokens: float) -> tuple[Usage, ...]:
    return (Usage(UsageUnit.INPUT_TOKENS, input_tokens), Usage(UsageUnit.OUTPUT_TOKENS, output_tokens))


def call_input(*, stream: bool = False, **metadata: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": 256, "messages": PROMPT, "metadata": {"duration_s": 0.05, **metadata}}
    if stream:
        body["stream"] = True
    return body


def call_request(job_input: dict[str, Any], model: str = MODEL) -> SubmitRequest:
    return SubmitRequest(job_id="job_anthropic_test", model=model, input=job_input, callback_url=None,
                         call_timeout_s=CALL_TIMEOUT_S)


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def sdk_message(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the official SDK's accumulator makes of the events (the reference)."""
    snapshot, buffers = None, {}
    for event in events:
        if event["type"] not in ("ping", "message_stop"):
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    return snapshot.to_dict()


def ours(events: list[dict[str, Any]], max_bytes: int = 1 << 20) -> dict[str, Any]:
    stream = MessageStream(max_bytes)
    done = [stream.add(Event(e["type"], json.dumps(e))) for e in events]
    assert done[-1] is True and not any(done[:-1])
    return stream.result()


# ================================================================== streams (pure)

START = {"type": "message_start", "message": {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant", "content": [], "model": MODEL,
    "stop_reason": None, "stop_sequence": None,
    "usage": {"input_tokens": 472, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
              "output_tokens": 2, "service_tier": "standard"}}}
STOP = {"type": "message_stop"}
PING = {"type": "ping"}


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
              for p in pieces),
            {"type": "content_block_stop", "index": index}]


def tool_block(index: int, kind: str, *pieces: str) -> list[dict[str, Any]]:
    named = {"id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB", "name": "web_search"} if kind == "server_tool_use" \
        else {"id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather"}
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": kind, **named, "input": {}}},
            *({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                         "partial_json": p}} for p in pieces),
            {"type": "content_block_stop", "index": index}]


def message_delta(stop_reason: str = "end_turn", **usage: Any) -> dict[str, Any]:
    return {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 89, **usage}}


THINKING = [
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me solve "}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "this step by step."}},
    {"type": "content_block_delta", "index": 0,
     "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9"}},
    {"type": "content_block_stop", "index": 0},
]
CITATION = {"type": "char_location", "cited_text": "The grass is green.", "document_index": 0,
            "document_title": "Facts", "start_char_index": 0, "end_char_index": 20}
CITED = [
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": CITATION}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "the grass is green"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": CITATION}},
    {"type": "content_block_stop", "index": 0},
]

STREAMS = {
    "text": [START, *text_block(0, "Hello", "!", " How can I help?"), PING, message_delta(), STOP],
    "tool use": [START, *text_block(0, "Okay, let me check."),
                 *tool_block(1, "tool_use", "", '{"location": "San Fra', 'ncisco, CA", "unit": "fahrenheit"}'),
                 message_delta("tool_use"), STOP],
    "server tool": [START, *tool_block(0, "server_tool_use", '{"query": "weather"}'), message_delta("pause_turn"),
                    STOP],
    "tool without input": [START, *tool_block(0, "tool_use", ""), message_delta("tool_use"), STOP],
    "thinking": [START, *THINKING, *text_block(1, "27 * 453 = 12,231"), message_delta(), STOP],
    "citations": [START, *CITED, message_delta(), STOP],
    "cumulative usage": [START, *text_block(0, "cached"),
                         message_delta(input_tokens=10, cache_creation_input_tokens=2000,
                                       cache_read_input_tokens=300,
                                       server_tool_use={"web_search_requests": 1, "web_fetch_requests": 0}), STOP],
    "two message_deltas": [START, *text_block(0, "a"), message_delta("max_tokens"),
                           {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"output_tokens": 120}}, STOP],
    "unknown event and delta types": [START, {"type": "future_event", "x": 1}, *text_block(0, "a"),
                                      {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "future_delta", "y": 2}}, message_delta(), STOP],
    "deltas that do not fit their block": [
        START, *text_block(0, "t"),
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "no"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{"}},
        message_delta(), STOP],
}


@pytest.mark.parametrize("name", STREAMS)
def test_a_stream_is_assembled_as_the_sdk_assembles_it(name):
    events = STREAMS[name]
    message = ours(events)
    assert message == sdk_message(events)
    Message.model_validate(message)


def test_the_assembled_values():
    message = ours(STREAMS["tool use"])
    assert message["content"][1]["input"] == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert message["stop_reason"] == "tool_use" and message["usage"]["output_tokens"] == 89
    thinking = ours(STREAMS["thinking"])["content"][0]
    assert thinking == {"type": "thinking", "thinking": "Let me solve this step by step.",
                        "signature": "EqQBCgIYAhIM1gbcDa9"}
    assert ours(STREAMS["citations"])["content"][0]["citations"] == [CITATION, CITATION]
    cumulative = ours(STREAMS["cumulative usage"])
    assert message_usage(cumulative) == usage(10 + 2000 + 300, 89)


def test_a_tool_block_never_stopped_has_its_input_at_message_stop():
    events = [START, *tool_block(0, "tool_use", '{"a": [1, 2]}')[:-1], message_delta("tool_use"), STOP]
    assert ours(events)["content"][0]["input"] == {"a": [1, 2]}


def test_events_are_read_by_their_data_type_and_unnamed_or_empty_ones_skipped():
    stream = MessageStream(1 << 20)
    assert stream.add(Event("message", json.dumps(STOP))) is False  # no `event:` name: the SDK skips it
    assert stream.add(Event("message_start", "")) is False  # no data
    assert stream.add(Event("ping", "not json")) is False
    assert stream.add(Event("message_start", json.dumps(START))) is False
    assert stream.add(Event("whatever", json.dumps(STOP))) is True  # the data's type decides


@pytest.mark.parametrize(("events", "says"), [
    ([text_block(0, "a")[0]], "content_block_start before message_start"),
    ([START, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}}],
     "content_block_delta for a block that was not started"),
    ([START, *text_block(0, "a")[:1], {"type": "content_block_stop", "index": 1}],
     "content_block_stop for a block that was not started"),
    ([START, {"type": "content_block_start", "index": 0, "content_block": "text"}], "without a block"),
    ([START, *text_block(0)[:1], {"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": 5}}], "text_delta's text is not a string"),
    ([START, *tool_block(0, "tool_use", '{"location": "Par')], "the input of tool block 0 is not JSON"),
    ([START, {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}], "without its delta and usage"),
    ([{"type": "message_start", "message": {"id": "msg_1", "content": None}}], "a message_start without a Message"),
    ([START, {"no": "type"}], "without a type"),
])
def test_an_event_that_cannot_be_read(events, says):
    stream = MessageStream(1 << 20)
    with pytest.raises(StreamError) as caught:
        for event in events:
            stream.add(Event(event.get("type", "x"), json.dumps(event)))
    assert says in str(caught.value)


def test_data_that_is_not_json_cannot_be_read():
    with pytest.raises(StreamError, match="not JSON"):
        MessageStream(1 << 20).add(Event("message_start", "{not json"))


@pytest.mark.parametrize("event", [
    Event("error", json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    Event("message_delta", json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "Overloaded"}})),
])
def test_an_error_event_is_an_error_with_its_message(event):
    stream = MessageStream(1 << 20)
    stream.add(Event("message_start", json.dumps(START)))
    with pytest.raises(StreamError) as caught:
        stream.add(event)
    assert str(caught.value) == "the stream carried an error"
    assert caught.value.detail == {"type": "overloaded_error", "message": "Overloaded"}


def test_an_error_event_that_is_not_json_is_still_an_error():
    with pytest.raises(StreamError) as caught:
        MessageStream(1 << 20).add(Event("error", "upstream went away"))
    assert caught.value.detail == "upstream went away"


def test_text_over_the_cap_is_too_large_before_the_stream_ends():
    stream = MessageStream(10)
    for event in [START, *text_block(0, "0123456789")[:2]]:
        stream.add(Event(event["type"], json.dumps(event)))
    with pytest.raises(OutputTooLarge):
        stream.add(Event("content_block_delta", json.dumps(text_block(0, "x")[1])))


# ================================================================== request, usage (pure)


def test_the_body_is_the_input_with_the_jobs_model():
    body = json.loads(call_body("anthropic", MODEL, {"max_tokens": 5, "messages": PROMPT}))
    assert body == {"model": MODEL, "max_tokens": 5, "messages": PROMPT}


def test_an_input_with_its_own_model_is_refused():
    with pytest.raises(Rejected) as caught:
        call_body("anthropic", MODEL, {"model": "claude-opus", "messages": PROMPT})
    assert "input.model" in str(caught.value)


def test_an_input_that_is_not_json_is_refused():
    with pytest.raises(Rejected, match="not a JSON object"):
        call_body("anthropic", MODEL, {"max_tokens": float("nan")})


@pytest.mark.parametrize(("usage_field", "expected"), [
    ({"input_tokens": 10, "output_tokens": 20}, usage(10, 20)),
    ({"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 7, "output_tokens": 20},
     usage(22, 20)),
    ({"input_tokens": 10, "cache_creation_input_tokens": None, "cache_read_input_tokens": None, "output_tokens": 0},
     usage(10, 0)),
    ({"input_tokens": 10}, ()),
    ({"output_tokens": 10}, ()),
    ({"input_tokens": "10", "output_tokens": 20}, ()),
    ({"input_tokens": True, "output_tokens": 20}, ()),
    ({"input_tokens": -1, "output_tokens": 20}, ()),
    ({"input_tokens": 10, "cache_read_input_tokens": "7", "output_tokens": 20}, ()),
    (None, ()),
    ("12 tokens", ()),
])
def test_usage(usage_field, expected):
    assert message_usage({"type": "message", "usage": usage_field}) == expected


def test_a_message_without_usage_has_none():
    assert message_usage({"type": "message"}) == ()


@pytest.mark.parametrize("value", [[], "text", 3, {"type": "error", "error": {"message": "Overloaded"}},
                                   {"content": []}])
def test_a_plain_answer_must_be_a_message(value):
    with pytest.raises(NotAnAnswer):
        read_message(value)


# ================================================================== against the simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    served = ServedApp(create_app(hold_s=HOLD_S)).start()
    yield served.url
    served.stop()


@pytest.fixture
async def adapter(simulator, tmp_path):
    clear_faults(simulator)
    provider = AnthropicProvider(f"{simulator}/anthropic", KEY, spool_dir=str(tmp_path))
    yield provider
    await provider.aclose()
    clear_faults(simulator)


def stored(observation, tmp_path) -> dict[str, Any]:
    """Output 0: in the spool directory, with the size and sha256 of its bytes."""
    (file,) = observation.files
    assert os.path.dirname(file.path) == str(tmp_path) and file.content_type == "application/json"
    with open(file.path, "rb") as f:
        data = f.read()
    assert file.bytes == len(data) and file.sha256 == hashlib.sha256(data).hexdigest()
    return json.loads(data)


def test_the_facts_say_sync():
    provider = AnthropicProvider("https://api.anthropic.com", KEY)
    facts = provider.facts_for("claude-opus-4-1")
    assert facts.kind is ProviderKind.SYNC and facts.name == "anthropic"
    assert facts.webhook_scheme == "none" and not facts.can_cancel and not facts.can_find
    assert not facts.idempotent_submit and not facts.can_recover
    assert facts.call_timeout_s == 600 and facts.stale_after_s == 900
    assert KEY not in repr(provider)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_call_answers_the_message_with_its_usage_and_request_id(adapter, tmp_path, stream):
    text = "One call, paid once. The answer kept on disk."
    seen = await adapter.call(call_request(call_input(stream=stream, output_text=text, input_tokens=41,
                                                      output_tokens=17)))
    assert seen.state is TaskState.SUCCEEDED
    message = Message.model_validate(stored(seen, tmp_path))
    assert [block.text for block in message.content] == [text]  # type: ignore[union-attr]
    assert message.model == MODEL and message.stop_reason == "end_turn"
    assert seen.usage == usage(41, 17)
    assert seen.request_id is not None and REQUEST_ID.fullmatch(seen.request_id)


async def test_a_stream_stopped_by_a_stop_sequence_says_so(adapter, tmp_path):
    job_input = {**call_input(stream=True, output_text="first part STOP second part"), "stop_sequences": ["STOP"]}
    message = Message.model_validate(stored(await adapter.call(call_request(job_input)), tmp_path))
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "STOP"
    assert message.content[0].text == "first part "  # type: ignore[union-attr]


async def test_a_long_streamed_text_is_whole(adapter, tmp_path):
    text = "".join(f"word{i} é✓ " for i in range(2000))  # many deltas, non-ASCII
    job_input = {**call_input(stream=True, output_text=text), "max_tokens": 64_000}
    message = stored(await adapter.call(call_request(job_input)), tmp_path)
    assert message["content"][0]["text"] == text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("fault", ["throttle", "overloaded"])
async def test_429_and_529_are_a_retry_after_their_retry_after(adapter, simulator, tmp_path, fault, stream):
    set_faults(simulator, **{fault: 1})
    with pytest.raises(Transient) as caught:
        await adapter.call(call_request(call_input(stream=stream)))
    assert caught.value.retry_after == 1.0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_refused_call_is_rejected(adapter, tmp_path, stream):
    with pytest.raises(Rejected) as caught:
        await adapter.call(call_request(call_input(stream=stream, outcome="failed")))
    assert "HTTP 400" in str(caught.value)
    with pytest.raises(Rejected):
        await adapter.call(call_request({"messages": PROMPT, "stream": stream}))  # max_tokens missing
    assert os.listdir(tmp_path) == []


async def test_a_500_is_a_lost_call(adapter, simulator, tmp_path):
    set_faults(simulator, submit_error=1)
    with pytest.raises(Uncertain, match="HTTP 500"):
        await adapter.call(call_request(call_input()))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_answer_dropped_after_the_work_is_a_lost_call_made_once(adapter, simulator, tmp_path, stream):
    set_faults(simulator, submit_timeout_after_create=1)
    job_input = call_input(stream=stream, user_id=f"dropped-{stream}")
    with pytest.raises(Uncertain):
        await adapter.call(call_request(job_input))
    digest = hashlib.sha256(call_body("anthropic", MODEL, job_input)).hexdigest()
    assert stats(simulator)["sync_calls_by_body"].get(digest) == 1
    assert os.listdir(tmp_path) == []


async def test_an_input_with_a_model_is_refused_with_nothing_sent(adapter, simulator, tmp_path):
    before = stats(simulator)["sync_calls_by_body"]
    with pytest.raises(Rejected, match="input.model"):
        await adapter.call(call_request({**call_input(), "model": "claude-opus-4-1"}))
    assert stats(simulator)["sync_calls_by_body"] == before


async def test_without_a_key_the_call_is_rejected(simulator, tmp_path):
    provider = AnthropicProvider(f"{simulator}/anthropic", None, spool_dir=str(tmp_path))
    try:
        with pytest.raises(Rejected, match="HTTP 401"):
            await provider.call(call_request(call_input()))
    finally:
        await provider.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_answer_we_cannot_write_is_a_lost_call(simulator, tmp_path, stream):
    provider = AnthropicProvider(f"{simulator}/anthropic", KEY, spool_dir=str(tmp_path / "gone"))
    try:
        with pytest.raises(Uncertain, match="could not keep the answer"):
            await provider.call(call_request(call_input(stream=stream)))
    finally:
        await provider.aclose()


async def test_nothing_listening_is_a_retry(closed_port_url, tmp_path):
    provider = AnthropicProvider(closed_port_url, KEY, spool_dir=str(tmp_path))
    try:
        with pytest.raises(Transient, match="could not connect"):
            await provider.call(call_request(call_input()))
    finally:
        await provider.aclose()


# ================================================================== against a scripted Anthropic


@pytest.fixture
async def scripted(script: Script, tmp_path):
    provider = AnthropicProvider(script.url, KEY, spool_dir=str(tmp_path), max_output_bytes=64 * 1024)
    yield provider
    await provider.aclose()


def streaming(*pieces: bytes, fail: bool = False, media_type: str = "text/event-stream"):
    async def body():
        for piece in pieces:
            yield piece
            await asyncio.sleep(0)
        if fail:
            raise ConnectionAbortedError("the scripted stream breaks off")  # uvicorn drops the connection

    return lambda seen: StreamingResponse(body(), media_type=media_type)


MESSAGE = {"id": "msg_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message", "role": "assistant", "model": MODEL,
           "content": [{"type": "text", "text": "Hi! My name is Claude."}], "stop_reason": "end_turn",
           "stop_sequence": None, "usage": {"input_tokens": 2095, "output_tokens": 503,
                                            "cache_creation_input_tokens": 2051, "cache_read_input_tokens": 11}}


async def test_what_is_sent(scripted, script):
    script.answer(200, MESSAGE, headers={"request-id": "req_018EeWyXxfu5pfWkrYcMdjWG"})
    job_input = {"max_tokens": 1024, "messages": PROMPT, "system": "Be brief.", "temperature": 0.2}
    seen = await scripted.call(call_request(job_input))
    (sent,) = script.seen
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["x-api-key"] == KEY and sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json" and "authorization" not in sent.headers
    assert json.loads(sent.body) == {"model": MODEL, **job_input}
    assert sent.body == call_body("anthropic", MODEL, job_input)
    assert seen.request_id == "req_018EeWyXxfu5pfWkrYcMdjWG"
    assert seen.usage == usage(2095 + 2051 + 11, 503)  # cache tokens counted in


@pytest.mark.parametrize("name", ["tool use", "thinking", "cumulative usage"])
async def test_a_streamed_answer_is_stored_as_the_sdk_would_assemble_it(scripted, script, tmp_path, name):
    events = STREAMS[name]
    # Chunks of 7 bytes: lines and UTF-8 characters split anywhere.
    raw = sse(events)
    script.handler = streaming(*(raw[i:i + 7] for i in range(0, len(raw), 7)))
    seen = await scripted.call(call_request(call_input(stream=True)))
    message = stored(seen, tmp_path)
    assert message == sdk_message(events)
    Message.model_validate(message)
    assert seen.usage == message_usage(message) != ()


async def test_asked_to_stream_a_json_answer_is_taken_as_it_is(scripted, script, tmp_path):
    script.answer(200, MESSAGE)
    seen = await scripted.call(call_request(call_input(stream=True)))
    assert stored(seen, tmp_path) == MESSAGE and seen.usage == usage(4157, 503)


async def test_a_plain_answer_without_usage_has_none(scripted, script, tmp_path):
    script.answer(200, {k: v for k, v in MESSAGE.items() if k != "usage"})
    seen = await scripted.call(call_request(call_input()))
    assert seen.usage == () and seen.request_id is None
    assert stored(seen, tmp_path)["id"] == MESSAGE["id"]


async def test_a_plain_answer_over_the_read_back_size_is_kept_without_usage(script, tmp_path):
    big = {**MESSAGE, "content": [{"type": "text", "text": "x" * (MAX_READ_BACK + 10)}]}
    raw = json.dumps(big).encode()
    script.handler = lambda seen: Response(raw, media_type="application/json")
    provider = AnthropicProvider(script.url, KEY, spool_dir=str(tmp_path))
    try:
        seen = await provider.call(call_request(call_input()))
    finally:
        await provider.aclose()
    assert seen.usage == () and seen.files[0].bytes == len(raw)


def error_event(message: str = "Overloaded") -> bytes:
    return sse([{"type": "error", "error": {"type": "overloaded_error", "message": message}}])


FAILURES = {
    "an error event mid-stream": (streaming(sse([START, *text_block(0, "Hel")[:2]]), error_event()),
                                  "the stream carried an error: Overloaded"),
    "a stream that ends before message_stop": (streaming(sse([START, *text_block(0, "Hel"), message_delta()])),
                                               "the stream ended before message_stop"),
    "a stream that breaks off": (streaming(sse([START, *text_block(0, "Hel")[:2]]), fail=True),
                                 "the answer broke off"),
    "an event that is not JSON": (streaming(sse([START]), b"event: content_block_start\ndata: {oops\n\n"),
                                  "not JSON"),
    "a delta before message_start": (streaming(sse(text_block(0, "a"))), "before message_start"),
}


@pytest.mark.parametrize("name", FAILURES)
async def test_a_stream_that_goes_wrong_is_a_lost_call(scripted, script, tmp_path, name):
    script.handler, says = FAILURES[name]
    with pytest.raises(Uncertain) as caught:
        await scripted.call(call_request(call_input(stream=True)))
    assert says in str(caught.value)
    assert os.listdir(tmp_path) == []


PLAIN_FAILURES = {
    "a redirect": (lambda seen: RedirectResponse("/elsewhere/v1/messages", status_code=307), "HTTP 307"),
    "a 200 that is not JSON": (lambda seen: Response(b"<html>hello</html>", media_type="text/html"), "not JSON"),
    "a 200 that is an error object": (
        lambda seen: JSONResponse({"type": "error", "error": {"type": "api_error", "message": "Internal"}}),
        "the answer is not a Message: Internal"),
    "a 200 that is a list": (lambda seen: JSONResponse([MESSAGE]), "not a Message"),
    "a 502": (lambda seen: JSONResponse({"error": "bad gateway"}, status_code=502), "HTTP 502"),
}


@pytest.mark.parametrize("name", PLAIN_FAILURES)
async def test_a_plain_answer_that_goes_wrong_is_a_lost_call(scripted, script, tmp_path, name):
    script.handler, says = PLAIN_FAILURES[name]
    with pytest.raises(Uncertain) as caught:
        await scripted.call(call_request(call_input()))
    assert says in str(caught.value)
    assert len(script.seen) == 1  # a redirect is never followed: the key goes nowhere else
    assert os.listdir(tmp_path) == []


async def test_503_is_a_retry_after_its_retry_after(scripted, script, tmp_path):
    script.answer(503, {"type": "error", "error": {"type": "api_error", "message": "unavailable"}},
                  headers={"retry-after": "7"})
    with pytest.raises(Transient) as caught:
        await scripted.call(call_request(call_input(stream=True)))
    assert caught.value.retry_after == 7.0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_answer_over_the_cap_is_too_large_and_leaves_no_file(scripted, script, tmp_path, stream):
    if stream:
        events = [START, *text_block(0, *["x" * 1000] * 100), message_delta(), STOP]
        script.handler = streaming(sse(events))
    else:
        raw = json.dumps({**MESSAGE, "content": [{"type": "text", "text": "x" * 100_000}]}).encode()
        script.handler = lambda seen: Response(raw, media_type="application/json")
    with pytest.raises(OutputTooLarge):
        await scripted.call(call_request(call_input(stream=stream)))
    assert os.listdir(tmp_path) == []


async def test_one_huge_event_is_too_large(scripted, script, tmp_path):
    script.handler = streaming(sse([START]), b"event: content_block_delta\ndata: " + b"x" * 70_000)
    with pytest.raises(OutputTooLarge):
        await scripted.call(call_request(call_input(stream=True)))
    assert os.listdir(tmp_path) == []


async def test_an_input_with_a_model_sends_nothing(scripted, script):
    with pytest.raises(Rejected):
        await scripted.call(call_request({**call_input(stream=True), "model": "claude-3-haiku"}))
    assert script.seen == []


def echo_key(seen: Seen) -> str:
    return f"invalid x-api-key: {seen.headers.get('x-api-key')}"


ECHOES = {
    "a 400": (lambda seen: JSONResponse({"type": "error", "error": {"type": "authentication_error",
                                                                    "message": echo_key(seen)}}, status_code=401),
              Rejected),
    "a 500": (lambda seen: JSONResponse({"type": "error", "error": {"type": "api_error", "message": echo_key(seen)}},
                                        status_code=500), Uncertain),
    "a 429": (lambda seen: Response(echo_key(seen), status_code=429, media_type="text/plain"), Transient),
    "a 200 error object": (lambda seen: JSONResponse({"type": "error", "error": {"type": "api_error",
                                                                                 "message": echo_key(seen)}}),
                           Uncertain),
    "an error event": (lambda seen: streaming(sse([START]), error_event(echo_key(seen)))(seen), Uncertain),
}


@pytest.mark.parametrize("name", ECHOES)
async def test_the_key_is_never_in_an_error(scripted, script, tmp_path, name):
    script.handler, error = ECHOES[name]
    with pytest.raises(error) as caught:
        await scripted.call(call_request(call_input(stream=name == "an error event")))
    assert KEY not in str(caught.value) and "[redacted]" in str(caught.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("max_tokens", [1024, 8192, 21_333, 21_334, 32_000, 64_000, 128_000])
def test_a_plain_call_is_streamed_exactly_where_the_official_sdk_refuses_it(max_tokens):
    """A plain call expected to take over 10 minutes is streamed: plain, it
    would time out here while Anthropic goes on, and bills it."""
    import anthropic

    from app.providers.anthropic import must_stream
    try:
        anthropic.Anthropic(api_key="x")._calculate_nonstreaming_timeout(max_tokens, None)
        sdk_refuses = False
    except ValueError:
        sdk_refuses = True
    assert must_stream({"max_tokens": max_tokens}) == sdk_refuses
    assert not must_stream({"max_tokens": max_tokens, "stream": True})


async def test_a_long_plain_call_is_streamed_and_stored_as_the_plain_message(adapter, simulator, tmp_path):
    plain = await adapter.call(call_request(call_input()))
    job_input = {**call_input(), "max_tokens": 64_000}
    long = await adapter.call(call_request(job_input))
    digest = hashlib.sha256(call_body("anthropic", MODEL, {**job_input, "stream": True})).hexdigest()
    assert stats(simulator)["sync_calls_by_body"].get(digest) == 1  # sent streamed
    [short_file], [long_file] = plain.files, long.files
    stored = [json.loads(open(f.path, "rb").read()) for f in (short_file, long_file)]
    assert stored[1]["type"] == "message" and stored[1]["content"] == stored[0]["content"]
    assert Message.model_validate(stored[1]).stop_reason == stored[0]["stop_reason"]
    for f in (short_file, long_file):
        os.unlink(f.path)
