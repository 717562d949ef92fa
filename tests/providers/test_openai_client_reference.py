"""OpenAI's own Python client (openai 3.x) against the simulator's /openai
protocol: every answer must parse in the client's types (ChatCompletion,
ChatCompletionChunk through its SSE parser, the `chat.completions.stream`
helper's events and final completion) and every error in its error classes
(`_client.py` `_make_status_error`: the class by status, `code`/`param`/
`type` read from the body's `error` object, `request_id` from
`x-request-id`). The client is only a reference here; longcall's adapter
does not use it.

Pointed at the simulator with `base_url=f"{sim}/openai/v1"` (the client then
posts to `/chat/completions`), its retries off (`max_retries=0`: longcall
never lets a client retry a paid call), and the proxy variables cleared so
it reaches loopback. The controls go in `metadata` as strings, the type
the client declares for it (`Dict[str, str]`)."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.simulator import create_app
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, reset, set_faults, stats

KEY = "sk-proj-reference-key-0123456789"
MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "developer", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}]
HOLD_S = 1.0
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID")


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    served = ServedApp(create_app(hold_s=HOLD_S)).start()
    yield served.url
    served.stop()


@pytest.fixture
def sim(simulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    reset(simulator)  # faults and counts: each test sees its own calls only
    yield simulator
    clear_faults(simulator)


@pytest.fixture
def client(sim: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key=KEY, base_url=f"{sim}/openai/v1", max_retries=0, timeout=10) as made:
        yield made


def controls(**values: str) -> dict[str, str]:
    return {"duration_s": "0", **values}


def calls(sim: str) -> dict[str, int]:
    return stats(sim)["sync_calls_by_body"]


def test_create_parses_as_a_chat_completion_with_usage_and_the_request_id(client, sim):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, metadata=controls(output_text="Hi there!", output_tokens="3"))
    completion = raw.parse()
    assert isinstance(completion, ChatCompletion)
    assert completion._request_id == raw.headers["x-request-id"] and completion._request_id.startswith("req_")
    assert completion.object == "chat.completion" and completion.model == MODEL
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and choice.message.content == "Hi there!"
    assert choice.finish_reason == "stop" and choice.logprobs is None and choice.message.refusal is None
    assert isinstance(completion.usage, CompletionUsage)
    # 34 characters of prompt -> 9 tokens; the completion's count is the control's.
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (9, 3)
    assert completion.usage.total_tokens == 12
    assert completion.usage.prompt_tokens_details and completion.usage.prompt_tokens_details.cached_tokens == 0
    # The body the client sent is the body counted, once.
    (sent,) = calls(sim)
    assert calls(sim)[sent] == 1 and stats(sim)["tasks_created"] == 0


def test_a_plain_create_has_its_request_id_too(client):
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, metadata=controls(), n=2)
    assert completion._request_id and [c.index for c in completion.choices] == [0, 1]


def test_a_stream_with_include_usage_yields_chunks_ending_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        metadata=controls(output_text="one two three", input_tokens="40"))
    chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and isinstance(last.usage, CompletionUsage)
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (40, 4, 44)
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_a_stream_without_include_usage_has_no_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                                 metadata=controls(output_text="short")))
    assert chunks and all(c.choices and c.usage is None for c in chunks)
    assert all(c.obfuscation for c in chunks)  # "included by default"


def test_the_stream_helper_assembles_the_final_completion(client):
    with client.chat.completions.stream(model=MODEL, messages=MESSAGES, stream_options={"include_usage": True},
                                        metadata=controls(output_text="Assembled answer")) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert kinds[0] == "chunk" and "content.delta" in kinds and "content.done" in kinds
    assert final.choices[0].message.content == "Assembled answer"
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.completion_tokens == 4


def test_the_async_client_streams_too(sim):
    async def run() -> list[ChatCompletionChunk]:
        async with openai.AsyncOpenAI(api_key=KEY, base_url=f"{sim}/openai/v1", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True},
                metadata=controls(output_text="async"))
            return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


# ------------------------------------------------------------------ errors in the client's classes


def test_no_key_is_an_authentication_error(client):
    with pytest.raises(openai.AuthenticationError) as raised:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, metadata=controls(),
                                       extra_headers={"Authorization": "Basic c2s="})
    error = raised.value
    assert error.status_code == 401 and error.type == "invalid_request_error" and error.code is None
    assert error.request_id and error.request_id.startswith("req_")


def test_throttle_is_a_rate_limit_error_with_retry_after(client, sim):
    set_faults(sim, throttle=1)
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, metadata=controls())
    assert raised.value.code == "rate_limit_exceeded" and raised.value.response.headers["retry-after"] == "1"
    assert calls(sim) == {}


@pytest.mark.parametrize("fault,status,code", [("submit_error", 500, None), ("overloaded", 503,
                                                                              "server_is_overloaded")])
def test_server_faults_are_internal_server_errors(client, sim, fault, status, code):
    set_faults(sim, **{fault: 1})
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, metadata=controls(), stream=True)
    assert raised.value.status_code == status and raised.value.code == code
    assert calls(sim) == {}


def test_a_failed_outcome_is_a_bad_request_error_raised_before_any_chunk(client, sim):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                       metadata=controls(outcome="failed"))
    assert raised.value.code == "invalid_prompt" and raised.value.type == "invalid_request_error"
    assert sum(calls(sim).values()) == 1


def test_a_bad_parameter_names_it(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=0, metadata=controls())
    assert raised.value.param == "n" and raised.value.code == "invalid_value"


def test_a_dropped_answer_is_a_connection_error_after_the_call_was_made(client, sim):
    set_faults(sim, submit_timeout_after_create=1)
    metadata = controls(output_text="lost")
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, metadata=metadata)
    assert list(calls(sim).values()) == [1]  # the work was done once, its answer lost
