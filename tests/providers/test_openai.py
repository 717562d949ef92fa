"""The OpenAI-compatible Chat Completions sync adapter: its pure decisions
in tables (the chunks assembled as openai-python's own
ChatCompletionStreamState assembles them, run on the same chunks), then the
adapter over real HTTP against the simulator's /openai protocol and, for
answers the simulator never gives (an error chunk mid-stream, a stream cut
before `[DONE]`, a redirect, a 200 that is not a completion, an answer over
the cap, a provider that echoes the key), a scripted endpoint on loopback.

Shapes of the chunks below: the API reference's
`CreateChatCompletionStreamResponse` and its example, the tool-call deltas
of `ChatCompletionMessageToolCallChunk` (openai-python
types/chat/chat_completion_chunk.py), the usage chunk of
`ChatCompletionStreamOptions.include_usage` (empty `choices`), Azure's
asynchronous filter events (`object: ""`, the SDK's
`_is_valid_chat_completion_chunk_weak`), OpenRouter's `: OPENROUTER
PROCESSING` comments, its `role` in every chunk and its mid-stream error
chunk (https://openrouter.ai/docs/api-reference/streaming), and vLLM's
error object (`{"object": "error", "message", "type", "code"}`)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from app.download_errors import OutputTooLarge
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
from app.providers.llm import NotAnAnswer
from app.providers.openai import (
    CompletionStream,
    OpenAIProvider,
    completion_usage,
    read_completion,
    request_body,
)
from app.providers.sse import Event, StreamError
from app.simulator import create_app
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults, stats

from .scripted import Script, Seen

KEY = "sk-proj-LONGCALL-distinctive-openai-key-4d2e8b"
MODEL = "gpt-4o-mini"
PROMPT = [{"role": "user", "content": "Say something durable."}]
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")
HOLD_S = 2.0
CALL_TIMEOUT_S = 1.0  # below HOLD_S: a held answer times out


def usage(input_tokens: float, output_tokens: float) -> tuple[Usage, ...]:
    return (Usage(UsageUnit.INPUT_TOKENS, input_tokens), Usage(UsageUnit.OUTPUT_TOKENS, output_tokens))


def call_input(*, stream: bool = False, **metadata: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": PROMPT, "metadata": {"duration_s": 0.05, **metadata}}
    if stream:
        body["stream"] = True
    return body


def call_request(job_input: dict[str, Any], model: str = MODEL) -> SubmitRequest:
    return SubmitRequest(job_id="job_openai_test", model=model, input=job_input, callback_url=None,
                         call_timeout_s=CALL_TIMEOUT_S)


def sse(chunks: list[Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def without_nulls(value: Any) -> Any:
    """A value with its null fields (and the SDK's own `parsed` ones) left out."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None and k not in ("parsed",
                                                                                              "parsed_arguments")}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def sdk_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the official client's ChatCompletionStreamState makes of the chunks (the reference)."""
    state = ChatCompletionStreamState()
    for chunk in chunks:
        if chunk.get("object") == "chat.completion.chunk":  # as ChatCompletionStream filters them
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.current_completion_snapshot.to_dict()


def ours(chunks: list[dict[str, Any]], max_bytes: int = 1 << 20) -> dict[str, Any]:
    stream = CompletionStream(max_bytes)
    for chunk in chunks:
        assert stream.add(Event(data=json.dumps(chunk))) is False
    assert stream.add(Event(data="[DONE]")) is True
    return stream.result()


# ================================================================== streams (pure)


def chunk(*choices: dict[str, Any], usage: Any = None, **top: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190, "model": MODEL,
            "system_fingerprint": "fp_44709d6fcb", "choices": list(choices), "usage": usage, **top}


def choice(index: int = 0, finish_reason: str | None = None, logprobs: Any = None, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def call_delta(index: int, arguments: str, **first: Any) -> dict[str, Any]:
    return {"index": index, **first, "function": {"arguments": arguments, **first.pop("function", {})}}


USAGE = {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
         "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
         "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                       "rejected_prediction_tokens": 0}}


def token(text: str) -> dict[str, Any]:
    return {"token": text, "logprob": -0.1, "bytes": list(text.encode()), "top_logprobs": []}


STREAMS = {
    "text with usage": [
        chunk(choice(role="assistant", content="", refusal=None), service_tier="default", obfuscation="aB3"),
        chunk(choice(content="Hello"), obfuscation="x"), chunk(choice(content=" there")),
        chunk(choice(finish_reason="stop")), chunk(usage=USAGE),
    ],
    "tool calls": [
        chunk(choice(role="assistant", content=None,
                     tool_calls=[call_delta(0, "", id="call_abc", type="function",
                                            function={"name": "get_weather"})])),
        chunk(choice(tool_calls=[call_delta(0, '{"location": "Bos')])),
        chunk(choice(tool_calls=[call_delta(1, "", id="call_def", type="function", function={"name": "get_time"})])),
        chunk(choice(tool_calls=[call_delta(0, 'ton, MA"}'), call_delta(1, '{"tz": "EST"}')])),
        chunk(choice(finish_reason="tool_calls")), chunk(usage=USAGE),
    ],
    "two choices": [
        chunk(choice(0, role="assistant", content="")), chunk(choice(1, role="assistant", content="")),
        chunk(choice(0, content="A")), chunk(choice(1, content="B")),
        chunk(choice(0, content="a"), choice(1, content="b")),
        chunk(choice(0, finish_reason="stop"), choice(1, finish_reason="length")),
    ],
    "logprobs": [
        chunk(choice(role="assistant", content="", logprobs={"content": [], "refusal": None})),
        chunk(choice(content="Hi", logprobs={"content": [token("Hi")], "refusal": None})),
        chunk(choice(content="!", logprobs={"content": [token("!")], "refusal": None})),
        chunk(choice(finish_reason="stop")),
    ],
    "refusal": [
        chunk(choice(role="assistant", refusal="")), chunk(choice(refusal="I can't")),
        chunk(choice(refusal=" help with that.")), chunk(choice(finish_reason="stop")),
    ],
    "an Azure filter event first": [
        {"id": "", "object": "", "created": 0, "model": "", "choices": [],
         "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]},
        chunk(choice(role="assistant", content="ok")), chunk(choice(finish_reason="stop")),
    ],
}


@pytest.mark.parametrize("name", STREAMS)
def test_a_stream_is_assembled_as_the_sdk_assembles_it(name):
    chunks = STREAMS[name]
    completion = ours(chunks)
    assert without_nulls(completion) == without_nulls(sdk_completion(chunks))
    ChatCompletion.model_validate(completion)


def test_the_assembled_values():
    completion = ours(STREAMS["tool calls"])
    calls = completion["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("call_abc", "get_weather", {"location": "Boston, MA"}), ("call_def", "get_time", {"tz": "EST"})]
    assert completion["usage"] == USAGE and completion_usage(completion) == usage(19, 10)
    text = ours(STREAMS["text with usage"])
    assert text["object"] == "chat.completion" and "obfuscation" not in text
    assert text["choices"][0]["message"]["content"] == "Hello there"
    assert (text["service_tier"], text["system_fingerprint"]) == ("default", "fp_44709d6fcb")
    assert [c["message"]["content"] for c in ours(STREAMS["two choices"])["choices"]] == ["Aa", "Bb"]


def test_a_role_sent_in_every_chunk_stays_a_role():
    # OpenRouter sends role: "assistant" on every chunk; accumulate_delta would append it.
    completion = ours([chunk(choice(role="assistant", content="Hel")), chunk(choice(role="assistant", content="lo")),
                       chunk(choice(role="assistant", finish_reason="stop"))])
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    ChatCompletion.model_validate(completion)


def test_a_tool_call_id_and_name_repeated_stay_as_they_were():
    completion = ours([
        chunk(choice(role="assistant", tool_calls=[call_delta(0, '{"a":', id="call_1", type="function",
                                                              function={"name": "f"})])),
        chunk(choice(tool_calls=[call_delta(0, " 1}", id="call_1", type="function", function={"name": "f"})])),
        chunk(choice(finish_reason="tool_calls")),
    ])
    (call,) = completion["choices"][0]["message"]["tool_calls"]
    assert (call["id"], call["type"]) == ("call_1", "function")
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_choices_are_ordered_by_index_and_a_late_choices_logprobs_are_taken_once():
    completion = ours([
        chunk(choice(1, role="assistant", content="B", logprobs={"content": [token("B")], "refusal": None})),
        chunk(choice(0, role="assistant", content="A")),
        chunk(choice(0, finish_reason="stop"), choice(1, finish_reason="stop")),
    ])
    assert [c["index"] for c in completion["choices"]] == [0, 1]
    assert completion["choices"][1]["logprobs"]["content"] == [token("B")]


def test_usage_on_an_earlier_chunk_is_kept_and_a_missing_object_is_taken():
    completion = ours([{**chunk(choice(role="assistant", content="x", finish_reason="stop"), usage=USAGE)},
                       {k: v for k, v in chunk(choice(content="y")).items() if k != "object"}])
    assert completion["usage"] == USAGE and completion["choices"][0]["message"]["content"] == "xy"


def test_keep_alive_and_events_without_data_are_skipped():
    stream = CompletionStream(1 << 20)
    assert stream.add(Event(data="")) is False
    assert stream.add(Event(data=json.dumps(chunk(choice(role="assistant", content="a"))))) is False
    assert stream.add(Event(data="[DONE]")) is True
    assert stream.result()["choices"][0]["message"]["content"] == "a"


@pytest.mark.parametrize(("event", "says", "detail"), [
    (Event(data=json.dumps({**chunk(choice(content="", finish_reason="error")),
                            "error": {"code": 502, "message": "Provider disconnected"}})),
     "the stream carried an error", {"code": 502, "message": "Provider disconnected"}),
    (Event(data=json.dumps({"error": {"message": "The server had an error", "type": "server_error"}})),
     "the stream carried an error", {"message": "The server had an error", "type": "server_error"}),
    (Event(data=json.dumps({"object": "error", "message": "out of memory", "type": "InternalServerError",
                            "code": 500})),
     "the stream carried an error", {"object": "error", "message": "out of memory", "type": "InternalServerError",
                                     "code": 500}),
    (Event("error", json.dumps({"message": "went away"})), "the stream carried an error", {"message": "went away"}),
    (Event(data="{not json"), "a chunk that is not JSON", None),
    (Event(data="[1, 2]"), "not a JSON object", None),
    (Event(data=json.dumps(chunk(choices="nope"))), "choices are not a list", None),
    (Event(data=json.dumps(chunk({"delta": {"content": "x"}}))), "a choice without an index", None),
    (Event(data=json.dumps(chunk(choice(tool_calls=[call_delta(0, "{"), {"function": {"arguments": "}"}}])))),
     "integer index", None),
])
def test_a_chunk_that_cannot_be_read_or_carries_an_error(event, says, detail):
    stream = CompletionStream(1 << 20)
    with pytest.raises(StreamError) as caught:
        stream.add(event)
    assert says in str(caught.value) and caught.value.detail == detail


def test_done_before_any_chunk_is_not_an_answer():
    stream = CompletionStream(1 << 20)
    assert stream.add(Event(data="[DONE]")) is True
    with pytest.raises(StreamError):
        stream.result()


def test_text_over_the_cap_is_too_large_before_the_stream_ends():
    stream = CompletionStream(20)
    stream.add(Event(data=json.dumps(chunk(choice(role="assistant", content="0123456")))))  # 16 characters
    stream.add(Event(data=json.dumps(chunk(choice(content="789a")))))  # 20: at the cap
    with pytest.raises(OutputTooLarge):
        stream.add(Event(data=json.dumps(chunk(choice(content="b")))))


# ================================================================== request, usage (pure)


def test_the_body_is_the_input_with_the_jobs_model():
    assert json.loads(request_body(MODEL, {"messages": PROMPT, "temperature": 0})) == {
        "model": MODEL, "messages": PROMPT, "temperature": 0}


@pytest.mark.parametrize(("options", "sent"), [
    (None, {"include_usage": True}),
    ({"include_obfuscation": False}, {"include_obfuscation": False, "include_usage": True}),
    ({"include_usage": False}, {"include_usage": True}),
])
def test_a_stream_asks_for_its_usage_keeping_the_users_options(options, sent):
    job_input: dict[str, Any] = {"messages": PROMPT, "stream": True}
    if options is not None:
        job_input["stream_options"] = options
    assert json.loads(request_body(MODEL, job_input))["stream_options"] == sent


@pytest.mark.parametrize("job_input", [
    {"messages": PROMPT, "model": "gpt-4o"},
    {"messages": PROMPT, "model": "gpt-4o", "stream": True},
])
def test_an_input_with_its_own_model_is_refused(job_input):
    with pytest.raises(Rejected, match="input.model"):
        request_body(MODEL, job_input)


def test_stream_options_that_are_not_an_object_are_refused():
    with pytest.raises(Rejected, match="stream_options"):
        request_body(MODEL, {"messages": PROMPT, "stream": True, "stream_options": "usage"})


@pytest.mark.parametrize(("usage_field", "expected"), [
    (USAGE, usage(19, 10)),
    ({"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}, usage(7, 0)),
    ({"prompt_tokens": 7}, ()),
    ({"prompt_tokens": 7, "completion_tokens": None}, ()),
    ({"prompt_tokens": "7", "completion_tokens": 1}, ()),
    (None, ()),
])
def test_usage(usage_field, expected):
    assert completion_usage({"choices": [], "usage": usage_field}) == expected


@pytest.mark.parametrize("value", [[], "text", {"error": {"message": "No endpoints found"}}, {"id": "x"}])
def test_a_plain_answer_must_be_a_completion(value):
    with pytest.raises(NotAnAnswer):
        read_completion(value)


# ================================================================== against the simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    served = ServedApp(create_app(hold_s=HOLD_S)).start()
    yield served.url
    served.stop()


@pytest.fixture
async def adapter(simulator, tmp_path):
    clear_faults(simulator)
    provider = OpenAIProvider(f"{simulator}/openai/v1", KEY, spool_dir=str(tmp_path))
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
    provider = OpenAIProvider("https://api.openai.com/v1", KEY)
    facts = provider.facts_for("gpt-4o")
    assert facts.kind is ProviderKind.SYNC and facts.name == "openai"
    assert facts.webhook_scheme == "none" and not facts.can_cancel and not facts.can_find
    assert not facts.idempotent_submit and not facts.can_recover
    assert facts.call_timeout_s == 600 and facts.stale_after_s == 900
    assert KEY not in repr(provider)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_call_answers_the_completion_with_its_usage_and_request_id(adapter, tmp_path, stream):
    text = "One call, paid once. The answer kept on disk, é✓."
    seen = await adapter.call(call_request(call_input(stream=stream, output_text=text, input_tokens=41,
                                                      output_tokens=17)))
    assert seen.state is TaskState.SUCCEEDED
    completion = ChatCompletion.model_validate(stored(seen, tmp_path))
    assert [c.message.content for c in completion.choices] == [text]
    assert completion.model == MODEL and completion.choices[0].finish_reason == "stop"
    assert seen.usage == usage(41, 17)
    assert seen.request_id is not None and REQUEST_ID.fullmatch(seen.request_id)


async def test_a_streamed_call_with_several_choices(adapter, tmp_path):
    job_input = {**call_input(stream=True, output_text="same"), "n": 3}
    completion = ChatCompletion.model_validate(stored(await adapter.call(call_request(job_input)), tmp_path))
    assert [(c.index, c.message.content) for c in completion.choices] == [(0, "same"), (1, "same"), (2, "same")]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("fault", ["throttle", "overloaded"])  # 429, 503
async def test_429_and_503_are_a_retry_after_their_retry_after(adapter, simulator, tmp_path, fault, stream):
    set_faults(simulator, **{fault: 1})
    with pytest.raises(Transient) as caught:
        await adapter.call(call_request(call_input(stream=stream)))
    assert caught.value.retry_after == 1.0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_refused_call_is_rejected(adapter, tmp_path, stream):
    with pytest.raises(Rejected, match="HTTP 400"):
        await adapter.call(call_request(call_input(stream=stream, outcome="failed")))
    with pytest.raises(Rejected, match="HTTP 400"):
        await adapter.call(call_request({"messages": [], "stream": stream}))
    assert os.listdir(tmp_path) == []


async def test_a_500_is_a_lost_call(adapter, simulator, tmp_path):
    set_faults(simulator, submit_error=1)
    with pytest.raises(Uncertain, match="HTTP 500"):
        await adapter.call(call_request(call_input(stream=True)))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_answer_dropped_after_the_work_is_a_lost_call_made_once(adapter, simulator, tmp_path, stream):
    set_faults(simulator, submit_timeout_after_create=1)
    job_input = call_input(stream=stream, output_text=f"dropped {stream}")
    with pytest.raises(Uncertain):
        await adapter.call(call_request(job_input))
    digest = hashlib.sha256(request_body(MODEL, job_input)).hexdigest()
    assert stats(simulator)["sync_calls_by_body"].get(digest) == 1
    assert os.listdir(tmp_path) == []


async def test_an_input_with_a_model_is_refused_with_nothing_sent(adapter, simulator):
    before = stats(simulator)["sync_calls_by_body"]
    with pytest.raises(Rejected, match="input.model"):
        await adapter.call(call_request({**call_input(), "model": "gpt-4o"}))
    assert stats(simulator)["sync_calls_by_body"] == before


async def test_without_a_key_the_call_is_rejected(simulator, tmp_path):
    provider = OpenAIProvider(f"{simulator}/openai/v1", None, spool_dir=str(tmp_path))
    try:
        with pytest.raises(Rejected, match="HTTP 401"):
            await provider.call(call_request(call_input()))
    finally:
        await provider.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_answer_we_cannot_write_is_a_lost_call(simulator, tmp_path, stream):
    provider = OpenAIProvider(f"{simulator}/openai/v1", KEY, spool_dir=str(tmp_path / "gone"))
    try:
        with pytest.raises(Uncertain, match="could not keep the answer"):
            await provider.call(call_request(call_input(stream=stream)))
    finally:
        await provider.aclose()


async def test_nothing_listening_is_a_retry(closed_port_url, tmp_path):
    provider = OpenAIProvider(closed_port_url, KEY, spool_dir=str(tmp_path))
    try:
        with pytest.raises(Transient, match="could not connect"):
            await provider.call(call_request(call_input(stream=True)))
    finally:
        await provider.aclose()


# ================================================================== against a scripted endpoint


@pytest.fixture
async def scripted(script: Script, tmp_path):
    # Under a path, as OpenRouter's https://openrouter.ai/api/v1 is.
    provider = OpenAIProvider(f"{script.url}/api/v1/", KEY, spool_dir=str(tmp_path), max_output_bytes=64 * 1024)
    yield provider
    await provider.aclose()


def streaming(*pieces: bytes, fail: bool = False):
    async def body():
        for piece in pieces:
            yield piece
            await asyncio.sleep(0)
        if fail:
            raise ConnectionAbortedError("the scripted stream breaks off")  # uvicorn drops the connection

    return lambda seen: StreamingResponse(body(), media_type="text/event-stream")


COMPLETION = {"id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "object": "chat.completion", "created": 1741569952,
              "model": MODEL, "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!",
                                                                   "refusal": None, "annotations": []},
                                           "logprobs": None, "finish_reason": "stop"}],
              "usage": USAGE, "service_tier": "default"}


async def test_what_is_sent(scripted, script, tmp_path):
    script.answer(200, COMPLETION, headers={"x-request-id": "req_7b2a"})
    job_input = {"messages": PROMPT, "temperature": 0.2, "stream": True, "stream_options": {"include_obfuscation":
                                                                                            False}}
    seen = await scripted.call(call_request(job_input))
    (sent,) = script.seen
    assert (sent.method, sent.path) == ("POST", "/api/v1/chat/completions")
    assert sent.headers["authorization"] == f"Bearer {KEY}" and sent.headers["content-type"] == "application/json"
    assert json.loads(sent.body) == {"model": MODEL, **job_input,
                                     "stream_options": {"include_obfuscation": False, "include_usage": True}}
    assert sent.body == request_body(MODEL, job_input)
    # Asked to stream, the endpoint answered JSON: taken as the plain answer it is.
    assert stored(seen, tmp_path) == COMPLETION
    assert seen.request_id == "req_7b2a" and seen.usage == usage(19, 10)


@pytest.mark.parametrize("name", ["tool calls", "two choices", "an Azure filter event first"])
async def test_a_streamed_answer_is_stored_as_the_sdk_would_assemble_it(scripted, script, tmp_path, name):
    chunks = STREAMS[name]
    raw = b": OPENROUTER PROCESSING\n\n" + sse(chunks)
    script.handler = streaming(*(raw[i:i + 7] for i in range(0, len(raw), 7)))  # lines split anywhere
    seen = await scripted.call(call_request(call_input(stream=True)))
    completion = stored(seen, tmp_path)
    assert without_nulls(completion) == without_nulls(sdk_completion(chunks))
    ChatCompletion.model_validate(completion)


async def test_a_stream_without_a_usage_chunk_has_no_usage(scripted, script, tmp_path):
    script.handler = streaming(sse(STREAMS["two choices"]))
    seen = await scripted.call(call_request(call_input(stream=True)))
    assert seen.usage == () and stored(seen, tmp_path)["usage"] is None


async def test_a_plain_answer_without_usage_has_none(scripted, script, tmp_path):
    script.answer(200, {k: v for k, v in COMPLETION.items() if k != "usage"})
    seen = await scripted.call(call_request(call_input()))
    assert seen.usage == () and seen.request_id is None
    assert stored(seen, tmp_path)["id"] == COMPLETION["id"]


FIRST = [chunk(choice(role="assistant", content="")), chunk(choice(content="Hel"))]
FAILURES = {
    "an error chunk mid-stream": (
        streaming(sse(FIRST, done=False),
                  sse([{**chunk(choice(content="", finish_reason="error")),
                        "error": {"code": 502, "message": "Provider disconnected"}}])),
        "the stream carried an error: Provider disconnected"),
    "a stream that ends without [DONE]": (streaming(sse([*FIRST, chunk(choice(finish_reason="stop"))], done=False)),
                                          "the stream ended before data: [DONE]"),
    "a stream that breaks off": (streaming(sse(FIRST, done=False), fail=True), "the answer broke off"),
    "a chunk that is not JSON": (streaming(sse(FIRST, done=False), b"data: {oops\n\n"), "not JSON"),
}


@pytest.mark.parametrize("name", FAILURES)
async def test_a_stream_that_goes_wrong_is_a_lost_call(scripted, script, tmp_path, name):
    script.handler, says = FAILURES[name]
    with pytest.raises(Uncertain) as caught:
        await scripted.call(call_request(call_input(stream=True)))
    assert says in str(caught.value)
    assert os.listdir(tmp_path) == []


PLAIN_FAILURES = {
    "a redirect": (lambda seen: RedirectResponse("/elsewhere/chat/completions", status_code=302), "HTTP 302"),
    "a 200 that is not JSON": (lambda seen: Response(b"upstream timeout", media_type="text/plain"), "not JSON"),
    "a 200 that is an error object": (
        lambda seen: JSONResponse({"error": {"message": "No endpoints found", "code": 404}}),
        "the answer is not a chat completion: No endpoints found"),
    "a 502": (lambda seen: JSONResponse({"error": {"message": "bad gateway"}}, status_code=502), "HTTP 502"),
}


@pytest.mark.parametrize("name", PLAIN_FAILURES)
async def test_a_plain_answer_that_goes_wrong_is_a_lost_call(scripted, script, tmp_path, name):
    script.handler, says = PLAIN_FAILURES[name]
    with pytest.raises(Uncertain) as caught:
        await scripted.call(call_request(call_input()))
    assert says in str(caught.value)
    assert len(script.seen) == 1  # a redirect is never followed: the key goes nowhere else
    assert os.listdir(tmp_path) == []


async def test_529_is_a_retry_after_its_retry_after(scripted, script, tmp_path):
    script.answer(529, {"error": {"message": "overloaded"}}, headers={"retry-after": "3"})
    with pytest.raises(Transient) as caught:
        await scripted.call(call_request(call_input()))
    assert caught.value.retry_after == 3.0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_an_answer_over_the_cap_is_too_large_and_leaves_no_file(scripted, script, tmp_path, stream):
    if stream:
        script.handler = streaming(sse([chunk(choice(content="x" * 1000)) for _ in range(100)]))
    else:
        raw = json.dumps({**COMPLETION, "choices": [{**COMPLETION["choices"][0],
                                                      "message": {"role": "assistant",
                                                                  "content": "x" * 100_000}}]}).encode()
        script.handler = lambda seen: Response(raw, media_type="application/json")
    with pytest.raises(OutputTooLarge):
        await scripted.call(call_request(call_input(stream=stream)))
    assert os.listdir(tmp_path) == []


async def test_an_input_with_a_model_sends_nothing(scripted, script):
    with pytest.raises(Rejected):
        await scripted.call(call_request({**call_input(stream=True), "model": "gpt-4o"}))
    assert script.seen == []


def echo_key(seen: Seen) -> str:
    return f"Incorrect API key provided: {seen.headers.get('authorization')}"


ECHOES = {
    "a 401": (lambda seen: JSONResponse({"error": {"message": echo_key(seen), "type": "invalid_request_error",
                                                   "param": None, "code": "invalid_api_key"}}, status_code=401),
              Rejected),
    "a 500": (lambda seen: JSONResponse({"error": {"message": echo_key(seen)}}, status_code=500), Uncertain),
    "a 503": (lambda seen: Response(echo_key(seen), status_code=503, media_type="text/plain"), Transient),
    "a 200 error object": (lambda seen: JSONResponse({"error": {"message": echo_key(seen)}}), Uncertain),
    "an error chunk": (lambda seen: streaming(sse([{"error": {"message": echo_key(seen)}}]))(seen), Uncertain),
}


@pytest.mark.parametrize("name", ECHOES)
async def test_the_key_is_never_in_an_error(scripted, script, tmp_path, name):
    script.handler, error = ECHOES[name]
    with pytest.raises(error) as caught:
        await scripted.call(call_request(call_input(stream=name == "an error chunk")))
    assert KEY not in str(caught.value) and "[redacted]" in str(caught.value)
    assert os.listdir(tmp_path) == []
