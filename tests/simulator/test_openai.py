"""OpenAI's Chat Completions under /openai/v1/chat/completions, answering only
what OpenAI's API reference names (openai/openai-openapi openapi.yaml:
createChatCompletion and its examples, CreateChatCompletionStreamResponse,
ChatCompletionStreamOptions, ErrorResponse, TooManyRequests)."""
from __future__ import annotations

import hashlib
import json
import re
import time

import httpx
import pytest

from app.simulator.openai import (
    DEFAULT_TEXT,
    MAX_PIECES,
    ChatCall,
    InvalidRequest,
    chunks_of,
    completion_of,
    parse_call,
    prompt_text_length,
    text_pieces,
    usage_of,
)

from .conftest import HOLD_S

PATH = "/openai/v1/chat/completions"
AUTH = {"Authorization": "Bearer sk-test-key"}
MESSAGES = [{"role": "developer", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}]

# The documented answer of the "Default" example of createChatCompletion
# (https://developers.openai.com/api/reference/resources/chat/subresources/completions/methods/create;
# openai/openai-openapi openapi.yaml, x-oaiMeta of createChatCompletion).
DOCUMENTED_COMPLETION = {
    "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
    "object": "chat.completion",
    "created": 1741569952,
    "model": "gpt-5.4",
    "choices": [{
        "index": 0,
        "message": {"role": "assistant", "content": "Hello! How can I assist you today?", "refusal": None,
                    "annotations": []},
        "logprobs": None,
        "finish_reason": "stop",
    }],
    "usage": {
        "prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    },
    "service_tier": "default",
}
# The documented chunk (CreateChatCompletionStreamResponse's example, same file).
DOCUMENTED_CHUNK = {
    "id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190, "model": "gpt-4o-mini",
    "system_fingerprint": "fp_44709d6fcb",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}],
    "obfuscation": "r4N7vQ2m",
}
ERROR_FIELDS = {"message", "type", "param", "code"}  # Error: all four required


def body(**metadata) -> dict:
    return {"model": "gpt-4o-mini", "messages": MESSAGES, "metadata": {"duration_s": "0", **metadata}}


def post(client: httpx.Client, payload: dict, headers: dict | None = AUTH) -> httpx.Response:
    return client.post(PATH, content=json.dumps(payload), headers={"content-type": "application/json",
                                                                  **(headers or {})})


def stats(client: httpx.Client) -> dict:
    return client.get("/_sim/stats").json()


def faults(client: httpx.Client, **rates) -> None:
    client.post("/_sim/faults", json=rates).raise_for_status()


def events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE answer, checking its framing."""
    text = response.text
    assert text.endswith("\n\n")
    blocks = text[:-2].split("\n\n")
    assert all(block.startswith("data: ") and "\n" not in block for block in blocks), text
    return [block.removeprefix("data: ") for block in blocks]


def sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


# ------------------------------------------------------------------ pure: parsing a request


@pytest.mark.parametrize("payload,param,code", [
    ([1], None, None),
    ({"messages": MESSAGES}, None, None),
    ({"model": 3, "messages": MESSAGES}, "model", "invalid_type"),
    ({"model": "m"}, "messages", "missing_required_parameter"),
    ({"model": "m", "messages": "hi"}, "messages", "invalid_type"),
    ({"model": "m", "messages": []}, "messages", "empty_array"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]", "invalid_type"),
    ({"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"model": "m", "messages": MESSAGES, "n": 0}, "n", "invalid_value"),
    ({"model": "m", "messages": MESSAGES, "n": 1.5}, "n", "invalid_type"),
    ({"model": "m", "messages": MESSAGES, "stream": "yes"}, "stream", "invalid_type"),
    ({"model": "m", "messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options", None),
    ({"model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage", "invalid_type"),
    ({"model": "m", "messages": MESSAGES, "metadata": "x"}, "metadata", "invalid_type"),
    ({"model": "m", "messages": MESSAGES, "metadata": {"duration_s": "soon"}}, "metadata.duration_s",
     "invalid_value"),
    ({"model": "m", "messages": MESSAGES, "metadata": {"outcome": "maybe"}}, "metadata.outcome", "invalid_value"),
    ({"model": "m", "messages": MESSAGES, "metadata": {"output_tokens": "-1"}}, "metadata.output_tokens",
     "invalid_value"),
    ({"model": "m", "messages": MESSAGES, "metadata": {"input_tokens": 2.5}}, "metadata.input_tokens",
     "invalid_value"),
])
def test_a_body_that_is_not_a_request_names_its_field(payload, param, code):
    with pytest.raises(InvalidRequest) as raised:
        parse_call(payload)
    assert (raised.value.param, raised.value.code) == (param, code)
    error = raised.value.body()["error"]
    assert set(error) == ERROR_FIELDS and error["type"] == "invalid_request_error" and error["message"]


def test_the_controls_ride_in_metadata_as_strings_or_numbers():
    as_strings = parse_call({"model": "m", "messages": MESSAGES, "metadata": {
        "duration_s": "2.5", "outcome": "failed", "output_text": "Hi", "input_tokens": "7", "output_tokens": "9",
        "trace": "anything else is the caller's"}})
    as_numbers = parse_call({"model": "m", "messages": MESSAGES, "metadata": {
        "duration_s": 2.5, "outcome": "failed", "output_text": "Hi", "input_tokens": 7, "output_tokens": 9}})
    for call in (as_strings, as_numbers):
        assert call.controls.duration_s == 2.5 and call.controls.outcome == "failed"
        assert call.text == "Hi" and (call.input_tokens, call.output_tokens) == (7, 9)
    # A string control that only looks like a number stays text.
    assert parse_call({"model": "m", "messages": MESSAGES, "metadata": {"output_text": "42"}}).text == "42"


def test_the_request_defaults():
    call = parse_call({"model": "m", "messages": MESSAGES, "stream": None, "n": None, "metadata": None,
                       "max_tokens": 3, "temperature": 0.2})
    assert (call.n, call.stream, call.include_usage, call.include_obfuscation) == (1, False, False, True)
    assert call.text == DEFAULT_TEXT and call.input_tokens is None and call.output_tokens is None
    streamed = parse_call({"model": "m", "messages": MESSAGES, "stream": True,
                           "stream_options": {"include_usage": True, "include_obfuscation": False}})
    assert streamed.stream and streamed.include_usage and not streamed.include_obfuscation


# ------------------------------------------------------------------ pure: usage


@pytest.mark.parametrize("messages,chars", [
    (MESSAGES, len("You are a helpful assistant.") + len("Hello!")),
    ([{"role": "user", "content": [{"type": "text", "text": "abc"},
                                   {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                                   {"type": "text", "text": "de"}]}], 5),
    ([{"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "content": "ok",
                                                                  "tool_call_id": "c"}], 2),
])
def test_the_prompt_text_is_the_messages_text(messages, chars):
    assert prompt_text_length(messages) == chars


@pytest.mark.parametrize("metadata,n,usage", [
    # "Hello!" + the developer message: 34 characters -> 9 tokens; "abcde" -> 2.
    ({"output_text": "abcde"}, 1, (9, 2)),
    ({"output_text": "abcd"}, 1, (9, 1)),
    ({"output_text": ""}, 1, (9, 0)),
    ({"output_text": "abcde"}, 3, (9, 6)),
    ({"output_text": "abcde", "input_tokens": 100, "output_tokens": 5}, 3, (100, 5)),
    ({"input_tokens": "0"}, 1, (0, 8)),  # the default text: 31 characters
])
def test_usage_is_the_controls_or_a_quarter_of_the_characters(metadata, n, usage):
    call = parse_call({"model": "m", "messages": MESSAGES, "n": n, "metadata": metadata})
    reported = usage_of(call)
    assert (reported["prompt_tokens"], reported["completion_tokens"]) == usage
    assert reported["total_tokens"] == sum(usage)


# ------------------------------------------------------------------ pure: the answers


def keys(value) -> object:
    """The shape of a JSON value: its keys, recursively."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keys(v) for v in value[:1]]
    return None


def test_the_completion_has_the_documented_examples_fields():
    call = ChatCall(model="gpt-5.4", messages=MESSAGES)
    answer = completion_of(call, "chatcmpl-x", 1741569952)
    documented = {k: v for k, v in DOCUMENTED_COMPLETION.items() if k != "service_tier"}  # optional: not sent
    assert keys(answer) == keys(documented)
    assert answer["choices"][0]["message"]["content"] == DEFAULT_TEXT


def test_n_choices_each_with_its_index():
    answer = completion_of(ChatCall(model="m", messages=MESSAGES, n=3), "chatcmpl-x", 1)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]


@pytest.mark.parametrize("text", ["", "a", "Hello world", "x" * 33, "é🙂" * 100])
def test_text_pieces_join_back_into_the_text(text):
    pieces = text_pieces(text)
    assert "".join(pieces) == text and len(pieces) <= MAX_PIECES and all(pieces)


def test_the_chunks_are_the_documented_chunk_then_text_then_stop_then_usage():
    call = ChatCall(model="gpt-4o-mini", messages=MESSAGES, stream=True, include_usage=True)
    chunks = chunks_of(call, "chatcmpl-123", 1694268190, pad=lambda content: "pad")
    documented = {k: v for k, v in DOCUMENTED_CHUNK.items() if k != "system_fingerprint"}  # deprecated, optional
    assert {k: v for k, v in chunks[0].items() if k != "usage"} == {**documented, "obfuscation": "pad"}
    assert all(chunk["usage"] is None for chunk in chunks[:-1])  # "All other chunks ... with a null value"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == DEFAULT_TEXT
    stop = chunks[-2]["choices"]
    assert stop == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage_of(call)
    assert {c["id"] for c in chunks} == {"chatcmpl-123"} and {c["created"] for c in chunks} == {1694268190}


def test_without_include_usage_no_chunk_has_usage_and_obfuscation_can_be_off():
    call = ChatCall(model="m", messages=MESSAGES, stream=True, include_obfuscation=False)
    chunks = chunks_of(call, "chatcmpl-1", 1)
    assert all("usage" not in c and "obfuscation" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)


def test_n_streams_every_choice():
    call = ChatCall(model="m", messages=MESSAGES, stream=True, n=2)
    chunks = chunks_of(call, "chatcmpl-1", 1)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""} and mine[-1]["finish_reason"] == "stop"
        assert "".join(c["delta"].get("content", "") for c in mine) == DEFAULT_TEXT


def test_obfuscation_pads_the_content_to_a_block():
    call = ChatCall(model="m", messages=MESSAGES, stream=True)
    for chunk in chunks_of(call, "chatcmpl-1", 1):
        content = chunk["choices"][0]["delta"].get("content") or ""
        assert (len(content) + len(chunk["obfuscation"])) % 16 == 0 and chunk["obfuscation"].isalnum()


# ------------------------------------------------------------------ over HTTP: answers


def test_a_call_answers_the_documented_completion_and_is_counted_by_its_body(client):
    payload = body(output_text="Hi there, friend", input_tokens="12")
    response = post(client, payload)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert re.fullmatch(r"req_[0-9a-f]{32}", response.headers["x-request-id"])
    answer = response.json()
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", answer["id"])
    assert answer["object"] == "chat.completion" and answer["model"] == "gpt-4o-mini"
    assert abs(answer["created"] - time.time()) < 60
    (choice,) = answer["choices"]
    assert choice == {"index": 0, "finish_reason": "stop", "logprobs": None,
                      "message": {"role": "assistant", "content": "Hi there, friend", "refusal": None,
                                  "annotations": []}}
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (12, 4, 16)
    seen = stats(client)
    raw = json.dumps(payload).encode()
    assert seen["sync_calls_by_body"] == {sha(raw): 1}
    assert seen["tasks_created"] == 0  # a sync call is no task


def test_the_same_body_twice_is_two_calls_of_that_body(client):
    payload = body()
    post(client, payload)
    post(client, payload)
    post(client, body(output_text="another"))
    counts = stats(client)["sync_calls_by_body"]
    assert counts[sha(json.dumps(payload).encode())] == 2 and sorted(counts.values()) == [1, 2]


def test_the_answer_waits_for_duration_s(client):
    start = time.monotonic()
    assert post(client, body(duration_s="0.5")).status_code == 200
    assert time.monotonic() - start >= 0.5


def test_a_stream_is_sse_chunks_then_done_with_usage_only_when_asked(client):
    payload = {**body(output_text="one two three four"), "stream": True, "stream_options": {"include_usage": True}}
    response = post(client, payload)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert re.fullmatch(r"req_[0-9a-f]{32}", response.headers["x-request-id"])
    data = events(response)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "one two three four"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(c["usage"] is None for c in chunks[:-1])

    plain = events(post(client, {**body(output_text="one two"), "stream": True}))
    assert plain[-1] == "[DONE]"
    assert all("usage" not in json.loads(d) and json.loads(d)["choices"] for d in plain[:-1])
    assert len(stats(client)["sync_calls_by_body"]) == 2


def test_a_stream_spreads_its_chunks_over_duration_s(client, sim_url):
    payload = {**body(duration_s="1", output_text="a b c d e f g h"), "stream": True}
    arrivals = []
    with httpx.Client(base_url=sim_url, timeout=10, trust_env=False) as streaming:
        start = time.monotonic()
        with streaming.stream("POST", PATH, json=payload, headers=AUTH) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic() - start)
    assert arrivals[-1] >= 1.0
    assert arrivals[-1] - arrivals[0] >= 0.5  # the chunks came over time, not at once


# ------------------------------------------------------------------ over HTTP: auth and errors


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer"}, {"Authorization": "Basic c2s6"},
                                     {"x-api-key": "sk-test-key"}])
def test_without_a_bearer_key_the_call_is_a_401_that_echoes_nothing(client, headers):
    response = post(client, body(), headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS and error["type"] == "invalid_request_error"
    assert error["message"].startswith("You didn't provide an API key.")
    assert "c2s6" not in response.text and "sk-test-key" not in response.text
    assert response.headers["x-request-id"].startswith("req_")
    assert stats(client)["sync_calls_by_body"] == {}


@pytest.mark.parametrize("content,param", [
    (b"{not json", None),
    (b"", None),
    (json.dumps({"model": "m"}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": MESSAGES, "stream_options": {}}).encode(), "stream_options"),
    (json.dumps({"model": "m", "messages": MESSAGES, "metadata": {"duration_s": -1}}).encode(),
     "metadata.duration_s"),
])
def test_a_bad_body_is_a_400_in_the_documented_shape_and_no_call(client, content, param):
    response = client.post(PATH, content=content, headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS and error["type"] == "invalid_request_error" and error["param"] == param
    assert stats(client)["sync_calls_by_body"] == {}


def test_a_failed_outcome_is_the_flagged_prompt_400_after_the_call(client):
    start = time.monotonic()
    response = post(client, body(outcome="failed", duration_s="0.3"))
    assert time.monotonic() - start >= 0.3
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_prompt"
    assert response.json()["error"]["type"] == "invalid_request_error"
    streamed = post(client, {**body(outcome="failed"), "stream": True})
    assert streamed.status_code == 400 and streamed.headers["content-type"] == "application/json"
    assert sum(stats(client)["sync_calls_by_body"].values()) == 2  # the calls were made


# ------------------------------------------------------------------ over HTTP: faults


@pytest.mark.parametrize("fault,status,type_,code,retry_after", [
    ("throttle", 429, "requests", "rate_limit_exceeded", "1"),
    ("overloaded", 503, "service_unavailable_error", "server_is_overloaded", "1"),
    ("submit_error", 500, "server_error", None, None),
])
def test_a_fault_answers_instead_of_the_call_and_is_not_counted(client, fault, status, type_, code, retry_after):
    faults(client, **{fault: 1})
    for stream in (False, True):
        response = post(client, {**body(), "stream": stream})
        assert response.status_code == status
        error = response.json()["error"]
        assert set(error) == ERROR_FIELDS and (error["type"], error["code"]) == (type_, code)
        assert response.headers.get("retry-after") == retry_after
    assert stats(client)["sync_calls_by_body"] == {}
    faults(client)
    assert post(client, body()).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_submit_timeout_after_create_does_the_call_then_drops_the_answer(client, stream):
    faults(client, submit_timeout_after_create=1)
    payload = {**body(duration_s="0.2"), "stream": stream}
    start = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, payload)
    assert time.monotonic() - start >= 0.2 + HOLD_S * 0.9
    seen = stats(client)
    assert seen["sync_calls_by_body"] == {sha(json.dumps(payload).encode()): 1} and seen["tasks_created"] == 0


def test_a_call_whose_client_leaves_mid_call_is_counted_once(client, sim_url):
    payload = body(duration_s="5")
    with httpx.Client(base_url=sim_url, timeout=0.3, trust_env=False) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            post(impatient, payload)
    assert stats(client)["sync_calls_by_body"] == {sha(json.dumps(payload).encode()): 1}


def test_the_route_takes_only_post(client):
    assert client.get(PATH, headers=AUTH).status_code == 405
