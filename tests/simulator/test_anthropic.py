"""Anthropic's Messages API under /anthropic/v1/messages, answering only what
anthropic-sdk-python 2.15's types name (types/message.py, usage.py,
raw_*_event.py, shared/error_response.py) and the docs say
(https://platform.claude.com/docs/en/api/errors,
https://platform.claude.com/docs/en/build-with-claude/streaming)."""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from typing import Any

import httpx
import pytest

from app.simulator.anthropic import (
    API_VERSIONS,
    DEFAULT_TEXT,
    MAX_DELTAS,
    Answer,
    CallError,
    parse_call,
    plan_answer,
    stream_events,
    text_pieces,
)

from .conftest import HOLD_S

MESSAGES = "/anthropic/v1/messages"
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
REQUEST_ID = re.compile(r"req_01[A-Za-z0-9]{22}")
MESSAGE_ID = re.compile(r"msg_01[A-Za-z0-9]{22}")
MESSAGE_KEYS = {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
USAGE_KEYS = {"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
              "cache_creation", "service_tier"}
EVENTS = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
          "message_delta", "message_stop"]


def request_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 1024,
                            "messages": [{"role": "user", "content": "Hello, Claude"}]}
    body.update(changes)
    return body


def post(client: httpx.Client, body: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(MESSAGES, content=raw, headers={"content-type": "application/json", **(headers or HEADERS)},
                       **kwargs)


def sha(body: Any) -> str:
    return hashlib.sha256(json.dumps(body).encode()).hexdigest()


def stats(client: httpx.Client) -> dict[str, Any]:
    return client.get("/_sim/stats").json()


def faults(client: httpx.Client, **rates: float) -> None:
    client.post("/_sim/faults", json=rates).raise_for_status()


def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event of an SSE body."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) == {"event", "data"}, block
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def assert_error(response: httpx.Response, status: int, error_type: str) -> dict[str, Any]:
    """The documented error shape, with the request-id header as its request_id."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"type", "error", "request_id"}
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert REQUEST_ID.fullmatch(response.headers["request-id"])
    assert body["request_id"] == response.headers["request-id"]
    return body


# ------------------------------------------------------------------ pure: the request


def test_a_minimal_request_reads_with_the_defaults():
    call = parse_call(request_body())
    assert (call.model, call.max_tokens, call.stream, call.stop_sequences) == ("claude-sonnet-4-5", 1024, False, ())
    assert call.input_chars == len("Hello, Claude")
    assert (call.controls.duration_s, call.controls.outcome, call.controls.output_text) == (1.0, "succeeded", None)
    assert (call.input_tokens, call.output_tokens) == (None, None)


def test_the_input_text_is_the_system_prompt_and_the_messages_text_blocks():
    call = parse_call(request_body(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "abc"},
                                         {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
            {"role": "assistant", "content": "de"},
            {"role": "user", "content": "fgh"},
        ],
    ))
    assert call.input_chars == len("Be brief.") + 3 + 2 + 3
    assert parse_call(request_body(system="12345")).input_chars == 5 + len("Hello, Claude")


def test_the_controls_and_token_counts_ride_in_metadata():
    call = parse_call(request_body(stream=True, stop_sequences=["\n\nHuman:"], metadata={
        "user_id": "u-1", "duration_s": 2.5, "outcome": "failed", "output_text": "Hi", "input_tokens": 7,
        "output_tokens": 9.0}))
    assert call.stream and call.stop_sequences == ("\n\nHuman:",)
    assert (call.controls.duration_s, call.controls.outcome, call.controls.output_text) == (2.5, "failed", "Hi")
    assert (call.input_tokens, call.output_tokens) == (7, 9)
    assert parse_call(request_body(max_tokens=16.0)).max_tokens == 16


@pytest.mark.parametrize(("body", "message"), [
    ([], "body: Input should be a JSON object"),
    ({"max_tokens": 1, "messages": []}, "model: Field required"),
    ({"model": "m", "messages": []}, "max_tokens: Field required"),
    ({"model": "m", "max_tokens": 1}, "messages: Field required"),
    (request_body(model=""), "model: Input should be a non-empty string"),
    (request_body(model=5), "model: Input should be a non-empty string"),
    (request_body(max_tokens="5"), "max_tokens: Input should be a valid integer"),
    (request_body(max_tokens=True), "max_tokens: Input should be a valid integer"),
    (request_body(max_tokens=1.5), "max_tokens: Input should be a valid integer"),
    (request_body(max_tokens=0), "max_tokens: Input should be greater than or equal to 1"),
    (request_body(messages={}), "messages: Input should be a valid list"),
    (request_body(messages=[]), "messages: at least one message is required"),
    (request_body(messages=["hi"]), "messages.0: Input should be an object with role and content"),
    (request_body(messages=[{"role": "system", "content": "x"}]), "messages.0.role: Input should be 'user' or"),
    (request_body(messages=[{"role": "user"}]), "messages.0.content: Field required"),
    (request_body(messages=[{"role": "user", "content": 3}]), "messages.0.content: Input should be a valid string"),
    (request_body(messages=[{"role": "user", "content": [{"text": "x"}]}]), "messages.0.content.0: Input should be"),
    (request_body(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages.0.content.0.text: Input"),
    (request_body(system=[{"type": "image"}]), "system.0.type: Input should be 'text'"),
    (request_body(stream="yes"), "stream: Input should be a valid boolean"),
    (request_body(stop_sequences="END"), "stop_sequences: Input should be a list of strings"),
    (request_body(stop_sequences=[1]), "stop_sequences: Input should be a list of strings"),
    (request_body(metadata=[]), "metadata: Input should be an object"),
    (request_body(metadata={"user_id": "u" * 257}), "metadata.user_id: Input should be a string of at most 256"),
    (request_body(metadata={"user_id": 7}), "metadata.user_id: Input should be a string"),
    (request_body(metadata={"duration_s": -1}), "metadata.duration_s must be at least 0"),
    (request_body(metadata={"outcome": "maybe"}), "metadata.outcome must be 'succeeded' or 'failed'"),
    (request_body(metadata={"output_text": 5}), "metadata.output_text must be a string"),
    (request_body(metadata={"input_tokens": -1}), "metadata.input_tokens must be between 0 and"),
    (request_body(metadata={"output_tokens": "many"}), "metadata.output_tokens must be a whole number"),
])
def test_a_body_that_is_not_a_messages_request_is_refused_saying_why(body, message):
    with pytest.raises(CallError) as raised:
        parse_call(body)
    assert str(raised.value).startswith(message), str(raised.value)


# ------------------------------------------------------------------ pure: the answer


@pytest.mark.parametrize(("changes", "expected"), [
    # No control: the default text, tokens by characters / 4 rounded up.
    ({}, Answer(DEFAULT_TEXT, "end_turn", None, 4, math.ceil(len(DEFAULT_TEXT) / 4))),
    ({"metadata": {"output_text": "Hello!"}}, Answer("Hello!", "end_turn", None, 4, 2)),
    ({"metadata": {"output_text": ""}}, Answer("", "end_turn", None, 4, 0)),
    ({"metadata": {"output_text": "Hi", "input_tokens": 1000, "output_tokens": 50}},
     Answer("Hi", "end_turn", None, 1000, 50)),
    # The first stop sequence in the text wins, and is not part of it; an empty one never matches.
    ({"stop_sequences": ["", "C", "B"], "metadata": {"output_text": "aaBbbCcc"}},
     Answer("aa", "stop_sequence", "B", 4, 1)),
    ({"stop_sequences": ["zz"], "metadata": {"output_text": "abc"}}, Answer("abc", "end_turn", None, 4, 1)),
    # More output tokens than max_tokens: cut to max_tokens x 4 characters.
    ({"max_tokens": 2, "metadata": {"output_text": "0123456789abc"}}, Answer("01234567", "max_tokens", None, 4, 2)),
    ({"max_tokens": 10, "metadata": {"output_text": "short", "output_tokens": 11}},
     Answer("short", "max_tokens", None, 4, 10)),
    ({"max_tokens": 1, "stop_sequences": ["X"], "metadata": {"output_text": "abcdefgX"}},
     Answer("abcd", "max_tokens", None, 4, 1)),
])
def test_the_answer_follows_the_controls_stop_sequences_and_max_tokens(changes, expected):
    assert plan_answer(parse_call(request_body(**changes))) == expected


@pytest.mark.parametrize("text", ["", "short", "x" * 16, "y" * 17, "héllo wörld " * 500, "z" * 100_000])
def test_text_pieces_rebuild_the_text_in_at_most_64_deltas(text):
    pieces = text_pieces(text)
    assert "".join(pieces) == text
    assert 1 <= len(pieces) <= MAX_DELTAS
    assert all(pieces) or pieces == [""]


def test_the_stream_is_the_documented_event_flow():
    answer = Answer("Hello, world, from a stream that is long enough", "end_turn", None, 25, 12)
    events = stream_events("msg_01x", "claude-m", answer)
    names = [name for name, _ in events]
    deltas = len(text_pieces(answer.text))
    assert names == EVENTS[:3] + ["content_block_delta"] * deltas + EVENTS[4:]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["id"] == "msg_01x" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 25 and start["usage"]["output_tokens"] == 1
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == answer.text
    assert events[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"input_tokens": 25, "cache_creation_input_tokens": 0,
                                       "cache_read_input_tokens": 0, "output_tokens": 12}}
    empty = stream_events("msg_01y", "claude-m", Answer("", "end_turn", None, 1, 0))
    assert [d for n, d in empty if n == "content_block_delta"] == [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}]
    assert empty[0][1]["message"]["usage"]["output_tokens"] == 0


# ------------------------------------------------------------------ over HTTP: answers


def test_a_call_answers_the_documented_message(client):
    body = request_body(metadata={"output_text": "Hi, I'm Claude.", "duration_s": 0})
    response = post(client, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert REQUEST_ID.fullmatch(response.headers["request-id"])
    message = response.json()
    assert set(message) == MESSAGE_KEYS
    assert MESSAGE_ID.fullmatch(message["id"])
    assert (message["type"], message["role"], message["model"]) == ("message", "assistant", "claude-sonnet-4-5")
    assert message["content"] == [{"type": "text", "text": "Hi, I'm Claude."}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    assert message["usage"] == {
        "input_tokens": math.ceil(len("Hello, Claude") / 4), "output_tokens": math.ceil(len("Hi, I'm Claude.") / 4),
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "service_tier": "standard"}
    assert set(message["usage"]) == USAGE_KEYS
    again = post(client, body)
    assert again.json()["id"] != message["id"] and again.headers["request-id"] != response.headers["request-id"]


def test_the_usage_controls_are_reported_as_given(client):
    message = post(client, request_body(metadata={"duration_s": 0, "input_tokens": 1234, "output_tokens": 56})).json()
    assert (message["usage"]["input_tokens"], message["usage"]["output_tokens"]) == (1234, 56)
    assert message["content"][0]["text"] == DEFAULT_TEXT


def test_the_answer_comes_after_duration_s(client):
    started = time.monotonic()
    assert post(client, request_body(metadata={"duration_s": 0.6})).status_code == 200
    assert time.monotonic() - started >= 0.6


def test_a_streamed_call_answers_the_documented_events(client):
    text = "The quick brown fox jumps over the lazy dog. " * 4
    body = request_body(stream=True, stop_sequences=["lazy cat"],
                        metadata={"output_text": text, "duration_s": 0, "input_tokens": 25})
    response = post(client, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert REQUEST_ID.fullmatch(response.headers["request-id"])
    events = parse_sse(response.text)
    names = [name for name, _ in events]
    assert names[:3] == EVENTS[:3] and names[-3:] == EVENTS[-3:]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in events)

    start = events[0][1]
    assert set(start) == {"type", "message"}
    message = start["message"]
    assert set(message) == MESSAGE_KEYS and MESSAGE_ID.fullmatch(message["id"])
    assert (message["content"], message["stop_reason"], message["stop_sequence"]) == ([], None, None)
    assert set(message["usage"]) == USAGE_KEYS and message["usage"]["input_tokens"] == 25
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[2][1] == {"type": "ping"}
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert all(set(d) == {"type", "index", "delta"} and d["index"] == 0 for d in deltas)
    assert all(set(d["delta"]) == {"type", "text"} and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == text
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    assert events[-2][1] == {"type": "message_delta",
                             "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"input_tokens": 25, "cache_creation_input_tokens": 0,
                                       "cache_read_input_tokens": 0, "output_tokens": math.ceil(len(text) / 4)}}
    assert events[-1][1] == {"type": "message_stop"}


def test_a_stream_stopped_by_a_stop_sequence_says_which(client):
    body = request_body(stream=True, stop_sequences=["STOP"], metadata={"output_text": "one two STOP three",
                                                                         "duration_s": 0})
    events = parse_sse(post(client, body).text)
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == "one two "
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}


def test_a_stream_starts_at_once_and_spreads_its_deltas_over_duration_s(client):
    body = request_body(stream=True, metadata={"output_text": "x" * 200, "duration_s": 1.0})
    arrivals: list[tuple[str, float]] = []
    started = time.monotonic()
    with client.stream("POST", MESSAGES, json=body, headers=HEADERS) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                arrivals.append((line.removeprefix("event: "), time.monotonic() - started))
    assert [name for name, _ in arrivals][0] == "message_start"
    deltas = [at for name, at in arrivals if name == "content_block_delta"]
    assert len(deltas) > 1
    assert deltas[-1] >= 1.0  # the last delta ends the duration...
    assert arrivals[0][1] < deltas[-1] - 0.5  # ... message_start did not wait for it


# ------------------------------------------------------------------ over HTTP: auth, version, body


@pytest.mark.parametrize("headers", [
    {"anthropic-version": "2023-06-01"},
    {"x-api-key": "", "anthropic-version": "2023-06-01"},
    {"authorization": "Bearer", "anthropic-version": "2023-06-01"},
    {"authorization": "Basic c2stYW50", "anthropic-version": "2023-06-01"},
])
def test_a_call_without_an_api_key_is_an_authentication_error(client, headers):
    body = request_body()
    assert_error(post(client, body, headers), 401, "authentication_error")
    assert stats(client)["sync_calls_by_body"] == {}


def test_the_key_may_come_as_a_bearer_token(client):
    response = post(client, request_body(metadata={"duration_s": 0}),
                    {"authorization": "Bearer sk-ant-test", "anthropic-version": "2026-10-21"})
    assert response.status_code == 200


@pytest.mark.parametrize("version", API_VERSIONS)
def test_every_documented_version_is_accepted(client, version):
    response = post(client, request_body(metadata={"duration_s": 0}), {**HEADERS, "anthropic-version": version})
    assert response.status_code == 200


@pytest.mark.parametrize("headers", [{"x-api-key": "k"}, {"x-api-key": "k", "anthropic-version": "2099-01-01"}])
def test_a_missing_or_unknown_version_is_an_invalid_request(client, headers):
    body = assert_error(post(client, request_body(), headers), 400, "invalid_request_error")
    assert body["error"]["message"].startswith("anthropic-version:")


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[1, 2]", json.dumps({"model": "m"}).encode(),
                                 json.dumps(request_body(metadata={"duration_s": "soon"})).encode()])
def test_a_bad_body_is_an_invalid_request_and_no_call(client, raw):
    assert_error(post(client, raw), 400, "invalid_request_error")
    assert stats(client)["sync_calls_by_body"] == {}


def test_a_body_over_the_cap_is_request_too_large(client):
    body = request_body(messages=[{"role": "user", "content": "x" * (1024 * 1024 + 1)}])
    assert_error(post(client, body), 413, "request_too_large")
    assert stats(client)["sync_calls_by_body"] == {}


# ------------------------------------------------------------------ over HTTP: failures and faults


@pytest.mark.parametrize("stream", [False, True])
def test_outcome_failed_is_an_invalid_request_after_the_duration_and_counts_as_a_call(client, stream):
    body = request_body(stream=stream, metadata={"outcome": "failed", "duration_s": 0.3})
    started = time.monotonic()
    response = post(client, body)
    assert time.monotonic() - started >= 0.3
    assert_error(response, 400, "invalid_request_error")  # JSON, not a stream, in both modes
    assert stats(client)["sync_calls_by_body"] == {sha(body): 1}


@pytest.mark.parametrize(("fault", "status", "error_type", "retry_after"), [
    ("throttle", 429, "rate_limit_error", "1"),
    ("overloaded", 529, "overloaded_error", "1"),
    ("submit_error", 500, "api_error", None),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_fault_answers_its_documented_error_instead_of_the_work(client, fault, status, error_type, retry_after,
                                                                    stream):
    faults(client, **{fault: 1})
    response = post(client, request_body(stream=stream, metadata={"duration_s": 5}))
    assert_error(response, status, error_type)
    assert response.headers.get("retry-after") == retry_after
    assert stats(client)["sync_calls_by_body"] == {}
    client.delete("/_sim/faults")
    assert post(client, request_body(stream=stream, metadata={"duration_s": 0})).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_submit_timeout_after_create_does_the_work_then_drops_the_answer(client, stream):
    faults(client, submit_timeout_after_create=1)
    body = request_body(stream=stream, metadata={"duration_s": 0.3})
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, body)
    assert time.monotonic() - started >= 0.3 + HOLD_S * 0.9  # the work, then the hold
    assert stats(client)["sync_calls_by_body"] == {sha(body): 1}


def test_a_caller_that_hangs_up_mid_stream_made_its_call(client, sim_url):
    body = request_body(stream=True, metadata={"duration_s": 5})
    with httpx.Client(base_url=sim_url, timeout=10, trust_env=False) as caller:
        with caller.stream("POST", MESSAGES, content=json.dumps(body).encode(),
                           headers={"content-type": "application/json", **HEADERS}) as response:
            first = next(response.iter_lines())
            assert first == "event: message_start"
    assert stats(client)["sync_calls_by_body"] == {sha(body): 1}


# ------------------------------------------------------------------ stats


def test_sync_calls_are_counted_by_their_raw_body_and_make_no_task(client):
    one = request_body(metadata={"duration_s": 0, "output_text": "a"})
    other = request_body(stream=True, metadata={"duration_s": 0, "output_text": "b"})
    for body in (one, one, other):
        assert post(client, body).status_code == 200
    seen = stats(client)
    assert seen["sync_calls_by_body"] == {sha(one): 2, sha(other): 1}
    assert seen["tasks_created"] == 0 and seen["creates_by_idempotency_key"] == {}
    # The same JSON written another way is another body: the count is of the bytes sent.
    spaced = json.dumps(one, indent=2).encode()
    assert post(client, spaced).status_code == 200
    assert stats(client)["sync_calls_by_body"][hashlib.sha256(spaced).hexdigest()] == 1
