"""Anthropic's own client, anthropic-sdk-python (2.15), against the
simulator's /anthropic protocol: every answer must parse in the client's
types (`Message`, the raw stream events, the stream helper's final message)
and errors, at the path the client addresses, with the key the way the
client sends it. The client is only a reference here.

`Anthropic(base_url=f"{sim}/anthropic")` posts to `{base}/v1/messages`.
2.15 sends the key as `Authorization: Bearer <key>` (`_client.py`
`_api_key_auth`) and `anthropic-version: 2026-10-21`; the `x-api-key` form of
the docs is sent here through `default_headers`. `max_retries=0`: a retried
Messages call is a second paid call, so no test may lean on the client's
retries. The simulator's controls ride in `metadata` (CONTRACT.md), which the
client passes through as given."""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import Omit
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextBlock,
)
from pydantic import BaseModel

from app.simulator import create_app
from tests.simulator.helpers import ServedApp
from tests.support.simulator import reset, set_faults, stats

KEY = "sk-ant-api03-reference-key"
MODEL = "claude-sonnet-4-5"
PROMPT = [{"role": "user", "content": "Write a haiku about durable calls."}]
REQUEST_ID = re.compile(r"req_01[A-Za-z0-9]{22}")
HAIKU = "One call, paid once.\nThe answer kept on disk.\nNo second bill comes."


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    served = ServedApp(create_app(hold_s=1.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
def sim(simulator: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # The client reads its key, base URL and proxies from the environment:
    # none of those here but ours.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    reset(simulator)
    return simulator


def client(sim: str, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=KEY, base_url=f"{sim}/anthropic", max_retries=0, timeout=10, **options)


def strictly(value: Any) -> None:
    """`value`, as the client parsed it, declares every field it holds, all
    the way down, and validates again in its own type (required fields there,
    of their types)."""
    if isinstance(value, BaseModel):
        assert not value.model_extra, (type(value).__name__, value.model_extra)
        for name in type(value).model_fields:
            strictly(getattr(value, name))
    elif isinstance(value, list):
        for item in value:
            strictly(item)


def revalidated(model: type[BaseModel], value: BaseModel) -> None:
    assert isinstance(value, model), type(value)
    strictly(value)
    model.model_validate(value.model_dump(mode="json", exclude_unset=True))


def controls(**values: Any) -> Any:
    """A `metadata` with the simulator's controls (keys the client's
    MetadataParam does not declare; it sends them as given)."""
    return {"duration_s": 0, **values}


def create(sim: str, **metadata: Any) -> Message:
    return client(sim).messages.create(model=MODEL, max_tokens=256, messages=PROMPT, metadata=controls(**metadata))


def test_create_parses_as_a_message_with_its_usage_and_request_id(sim):
    message = create(sim, output_text=HAIKU, input_tokens=21)
    revalidated(Message, message)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert len(message.content) == 1 and isinstance(message.content[0], TextBlock)
    assert message.content[0].text == HAIKU
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (21, math.ceil(len(HAIKU) / 4))
    assert (message.usage.cache_creation_input_tokens, message.usage.cache_read_input_tokens) == (0, 0)
    assert message.usage.cache_creation is not None and message.usage.cache_creation.ephemeral_5m_input_tokens == 0
    assert message.usage.service_tier == "standard"
    assert REQUEST_ID.fullmatch(message._request_id or "")


def test_the_key_in_x_api_key_is_accepted_too(sim):
    docs_style = client(sim, default_headers={"x-api-key": KEY, "Authorization": Omit()})
    message = docs_style.messages.create(model=MODEL, max_tokens=16, messages=PROMPT, metadata=controls())
    revalidated(Message, message)


def test_the_stream_helper_assembles_the_same_message_create_answers(sim):
    metadata = controls(duration_s=0.2, output_text=HAIKU, input_tokens=21)
    with client(sim).messages.stream(model=MODEL, max_tokens=256, messages=PROMPT, metadata=metadata) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
        assert REQUEST_ID.fullmatch(stream.request_id or "")
    assert len(texts) > 1 and "".join(texts) == HAIKU
    revalidated(Message, final)
    plain = create(sim, output_text=HAIKU, input_tokens=21)
    assert final.id != plain.id
    assert final.model_dump(exclude={"id"}) == plain.model_dump(exclude={"id"})


def test_the_stream_helper_reports_a_stop_sequence(sim):
    metadata = controls(output_text="one\nEND\ntwo")
    with client(sim).messages.stream(model=MODEL, max_tokens=256, messages=PROMPT, metadata=metadata,
                                     stop_sequences=["END"]) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "one\n"
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


def test_the_raw_stream_parses_in_the_client_event_types(sim):
    metadata = controls(output_text=HAIKU, output_tokens=17)
    stream = client(sim).messages.create(model=MODEL, max_tokens=256, messages=PROMPT, metadata=metadata,
                                         stream=True)
    events = list(stream)  # the ping is the client's to skip
    for event in events:
        strictly(event)
    kinds = [type(event) for event in events]
    assert kinds[:2] == [RawMessageStartEvent, RawContentBlockStartEvent]
    assert kinds[-3:] == [RawContentBlockStopEvent, RawMessageDeltaEvent, RawMessageStopEvent]
    assert set(kinds[2:-3]) == {RawContentBlockDeltaEvent}
    start, delta = events[0], events[-2]
    assert isinstance(start, RawMessageStartEvent) and start.message.content == []
    assert isinstance(delta, RawMessageDeltaEvent)
    assert (delta.delta.stop_reason, delta.usage.output_tokens) == ("end_turn", 17)
    assert "".join(e.delta.text for e in events
                   if isinstance(e, RawContentBlockDeltaEvent) and e.delta.type == "text_delta") == HAIKU


@pytest.mark.parametrize(("setup", "error_class", "status", "error_type"), [
    ({"fault": "throttle"}, anthropic.RateLimitError, 429, "rate_limit_error"),
    ({"fault": "overloaded"}, anthropic.OverloadedError, 529, "overloaded_error"),
    ({"fault": "submit_error"}, anthropic.InternalServerError, 500, "api_error"),
    ({"metadata": {"outcome": "failed"}}, anthropic.BadRequestError, 400, "invalid_request_error"),
    ({"key": None}, anthropic.AuthenticationError, 401, "authentication_error"),
])
@pytest.mark.parametrize("streamed", [False, True])
def test_each_error_is_the_client_error_class_with_our_request_id(sim, setup, error_class, status, error_type,
                                                                   streamed):
    if "fault" in setup:
        set_faults(sim, **{setup["fault"]: 1})
    caller = client(sim, default_headers={"Authorization": Omit()}) if "key" in setup else client(sim)
    metadata = controls(**setup.get("metadata", {}))
    with pytest.raises(anthropic.APIStatusError) as raised:
        if streamed:
            with caller.messages.stream(model=MODEL, max_tokens=16, messages=PROMPT, metadata=metadata) as stream:
                stream.get_final_message()
        else:
            caller.messages.create(model=MODEL, max_tokens=16, messages=PROMPT, metadata=metadata)
    error = raised.value
    assert type(error) is error_class and error.status_code == status and error.type == error_type
    assert REQUEST_ID.fullmatch(error.request_id or "")
    assert isinstance(error.body, dict) and error.body["request_id"] == error.request_id
    if status in (429, 529):
        assert error.response.headers["retry-after"] == "1"
    # OverloadedError is an InternalServerError in the client's hierarchy: code
    # that catches 5xx catches 529 too.
    assert isinstance(error, anthropic.InternalServerError) == (status >= 500)


def test_a_dropped_answer_is_a_connection_error_after_the_call_was_made(sim):
    set_faults(sim, submit_timeout_after_create=1)
    caller = client(sim)
    sent: list[bytes] = []
    caller._client.event_hooks["request"].append(lambda request: sent.append(request.read()))
    with pytest.raises(anthropic.APIConnectionError):
        caller.messages.create(model=MODEL, max_tokens=16, messages=PROMPT, metadata=controls())
    assert len(sent) == 1  # max_retries=0: one attempt
    assert stats(sim)["sync_calls_by_body"] == {hashlib.sha256(sent[0]).hexdigest(): 1}
    assert stats(sim)["tasks_created"] == 0


def test_the_request_the_client_sends_is_one_the_simulator_reads(sim):
    # What the client puts on the wire (headers, body) is what the simulator's
    # checks were written against.
    seen: list[httpx.Request] = []
    caller = client(sim)
    caller._client.event_hooks["request"].append(seen.append)
    answer = caller.messages.create(model=MODEL, max_tokens=64, messages=PROMPT, system="Be brief.",
                                    metadata=controls())
    revalidated(Message, answer)
    (request,) = seen
    assert request.url.path == "/anthropic/v1/messages"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["anthropic-version"] == "2026-10-21"
    assert json.loads(request.read()) == {"model": MODEL, "max_tokens": 64, "messages": PROMPT, "system": "Be brief.",
                                          "metadata": {"duration_s": 0}}
