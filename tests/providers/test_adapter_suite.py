"""The suite every adapter passes, each pointed at the real simulator over
HTTP (its native protocol, or its emulation of the provider's wire protocol
under /replicate, /fal, /kie, ...). What differs between providers is read
from the adapter's facts (can it cancel, does it call back, is its submit
idempotent, can it look a task up), never from its name, except for checks
only one provider's protocol allows.

Sync models (an LLM's one call, ElevenLabs' speech and sound effects) are
told apart the same way: by `facts_for(model).kind`. The cases are split by
it (`CASES`, the async ones, each submitted and polled; `SYNC_CASES`, each
called once), and every case's kind is held to the registry's
`provider_kind`. A sync case's tests read its facts too: a lost call is
looked up again only when `can_recover` says it can be."""
from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from app.providers import provider_kind
from app.providers.anthropic import AnthropicProvider
from app.providers.base import (
    Observation,
    OutputFile,
    Provider,
    ProviderKind,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
)
from app.providers.elevenlabs import ElevenLabsProvider
from app.providers.fal import FalProvider
from app.providers.gateway import GatewayProvider
from app.providers.gemini import GeminiProvider
from app.providers.kie import KieProvider
from app.providers.openai import OpenAIProvider
from app.providers.replicate import ReplicateProvider
from app.providers.sim import SimProvider
from app.signing.tokens import make_capability_token
from app.simulator import output_sha256
from tests.support.simulator import RunningSimulator, clear_faults, set_faults, stats

SUBMIT_TIMEOUT_S = 1.5
SERVER_KEYS = (b"suite-server-key-0123456789abcdef",)
FAST = {"duration_s": 0.4}


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    # (simulator URL, timeout[, spool directory]) → adapter; a sync case's
    # adapter writes its answers into the spool directory.
    make: Callable[..., Provider]
    reports_cost: bool = False
    # Input the model needs besides the simulator's controls (a dub's source).
    input: dict = field(default_factory=dict)
    # The outputs a success has when the `outputs` control says 2 (a dub has
    # one per target language, whatever the control says).
    two_outputs: int = 2
    label: str = ""  # the case's id when one provider has several cases
    # The suite's input (a prompt and the simulator's controls) in the shape
    # the provider's protocol takes it (Gemini: the predictLongRunning body).
    shape: Callable[[dict], dict] = dict
    # The model's API refuses a submit without a callback URL (KIE's Suno):
    # a test that registers none gives it one where nothing listens.
    callback_required: bool = False

    def __str__(self) -> str:
        return self.label or self.name


def predict_long_running_body(flat: dict) -> dict:
    """Gemini's body: the prompt an instance, the rest (the simulator's
    controls) in `parameters`, where /gemini reads them (CONTRACT.md)."""
    rest = dict(flat)
    return {"instances": [{"prompt": rest.pop("prompt")}], "parameters": rest}


def messages_body(flat: dict, *, stream: bool = False) -> dict:
    """A Messages (Anthropic) or Chat Completions (OpenAI) body: the prompt
    the user's message, the simulator's controls in `metadata`, where both
    simulators read them (CONTRACT.md); Anthropic's required `max_tokens`."""
    rest = dict(flat)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": rest.pop("prompt")}], "metadata": rest}
    return {**body, "stream": True} if stream else body


def anthropic_body(flat: dict, *, stream: bool = False) -> dict:
    return {"max_tokens": 256, **messages_body(flat, stream=stream)}


def speech_body(flat: dict) -> dict:
    """ElevenLabs' speech and sound bodies: the prompt is the `text`, the
    controls ride in the JSON body beside it."""
    rest = dict(flat)
    return {"text": rest.pop("prompt"), **rest}


VOICE = "21m00Tcm4TlvDq8ikWAM"


# The sync adapters, each writing its answers into `spool`.
def anthropic_adapter(url: str, timeout_s: float, spool: str | None = None) -> Provider:
    return AnthropicProvider(url + "/anthropic", "suite-anthropic-key", timeout_s=timeout_s, spool_dir=spool)


def openai_adapter(url: str, timeout_s: float, spool: str | None = None) -> Provider:
    return OpenAIProvider(url + "/openai/v1", "suite-openai-key", timeout_s=timeout_s, spool_dir=spool)


def elevenlabs_adapter(url: str, timeout_s: float, spool: str | None = None) -> Provider:
    return ElevenLabsProvider(url + "/elevenlabs", "suite-xi-key", timeout_s=timeout_s, spool_dir=spool)


ALL_CASES = [
    Case("sim", "image-fast", lambda url, t: SimProvider(url, timeout_s=t), reports_cost=True),
    Case("replicate", "acme/image-model",
         lambda url, t: ReplicateProvider(url + "/replicate", "r8_suite_token", timeout_s=t)),
    Case("fal", "fal-ai/flux/dev",
         lambda url, t: FalProvider(url + "/fal", "suite-fal-key", timeout_s=t,
                                    jwks_url=url + "/fal/.well-known/jwks.json")),
    Case("kie", "acme/image-model",
         lambda url, t: KieProvider(url + "/kie", "suite-kie-key", secret_keys=SERVER_KEYS, timeout_s=t)),
    # KIE's own families: each its own endpoints, the model after the prefix
    # its body's `model` (Runway has none: `runway/generate`).
    Case("kie", "veo/veo3_fast",
         lambda url, t: KieProvider(url + "/kie", "suite-kie-key", secret_keys=SERVER_KEYS, timeout_s=t),
         label="kie-veo"),
    Case("kie", "runway/generate",
         lambda url, t: KieProvider(url + "/kie", "suite-kie-key", secret_keys=SERVER_KEYS, timeout_s=t),
         input={"duration": 5, "quality": "720p"}, two_outputs=1, label="kie-runway"),  # one video per task
    Case("kie", "flux-kontext/flux-kontext-pro",
         lambda url, t: KieProvider(url + "/kie", "suite-kie-key", secret_keys=SERVER_KEYS, timeout_s=t),
         two_outputs=1, label="kie-flux-kontext"),  # one image per task
    Case("kie", "suno/V4_5",
         lambda url, t: KieProvider(url + "/kie", "suite-kie-key", secret_keys=SERVER_KEYS, timeout_s=t),
         input={"customMode": False, "instrumental": False}, callback_required=True, label="kie-suno"),
    # One output per target language, whatever the `outputs` control says.
    Case("elevenlabs", "dubbing",
         lambda url, t: ElevenLabsProvider(url + "/elevenlabs", "suite-xi-key", timeout_s=t),
         input={"source_url": "https://media.example.com/talk.mp4", "target_lang": "es"}, two_outputs=1),
    # Idempotent start, no cancel, outputs on any public host.
    Case("gateway", "klingai/kling-v3.0-t2v",
         lambda url, t: GatewayProvider(url + "/gateway/v4/ai", "suite-gateway-key", timeout_s=t)),
    # Polled (no webhooks), no idempotency key, no look-up, no cancel.
    Case("gemini", "veo-3.1-generate-preview",
         lambda url, t: GeminiProvider(url + "/gemini", "suite-gemini-key", timeout_s=t),
         shape=predict_long_running_body),
    # Sync: one call each, its answer output 0, written to the spool directory.
    Case("anthropic", "claude-sonnet-4-5", anthropic_adapter, shape=anthropic_body),
    Case("anthropic", "claude-sonnet-4-5", anthropic_adapter, shape=lambda flat: anthropic_body(flat, stream=True),
         label="anthropic-stream"),
    Case("openai", "gpt-4o-mini", openai_adapter, shape=messages_body),
    Case("openai", "gpt-4o-mini", openai_adapter, shape=lambda flat: messages_body(flat, stream=True),
         label="openai-stream"),
    # Speech is in the history (recoverable); sound effects are not.
    Case("elevenlabs", f"text-to-speech/{VOICE}", elevenlabs_adapter, shape=speech_body, label="elevenlabs-speech"),
    Case("elevenlabs", "sound-generation", elevenlabs_adapter, shape=speech_body, label="elevenlabs-sound"),
]


# A callback base nothing listens on (the discard port): deliveries there fail, harmlessly.
DISCARD = "http://127.0.0.1:9"


def kind_of(case: Case) -> ProviderKind:
    """What the case's adapter says its model is (its facts; nothing is sent)."""
    adapter = case.make(DISCARD, SUBMIT_TIMEOUT_S)
    try:
        return adapter.facts_for(case.model).kind
    finally:
        asyncio.run(adapter.aclose())


# Split by the adapters' own facts, never by name: the async cases are
# submitted and polled, the sync ones called.
KINDS = {str(case): kind_of(case) for case in ALL_CASES}
CASES = [case for case in ALL_CASES if KINDS[str(case)] is ProviderKind.ASYNC]
SYNC_CASES = [case for case in ALL_CASES if KINDS[str(case)] is ProviderKind.SYNC]


@pytest.fixture(scope="module")
def simulator():
    with RunningSimulator() as sim:
        yield sim.url


@pytest.fixture(params=CASES, ids=str)
async def case(request, simulator):
    clear_faults(simulator)
    case: Case = request.param
    adapter = case.make(simulator, SUBMIT_TIMEOUT_S)
    yield case, adapter, simulator
    await adapter.aclose()
    clear_faults(simulator)


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def submit_request(case: Case, callback_base: str | None = None, **controls) -> SubmitRequest:
    job_id = new_job_id()
    if callback_base is None and case.callback_required:
        callback_base = DISCARD
    # As Settings.callback_url makes it: the job's URL with our capability token.
    token = make_capability_token(case.name, job_id, SERVER_KEYS[0])
    callback = f"{callback_base}/webhooks/{case.name}/{job_id}?token={token}" if callback_base else None
    # The job id in the prompt: Replicate's `find` matches on the input, so
    # each test's prediction must be told from the others'.
    return SubmitRequest(job_id=job_id, model=case.model,
                         input=case.shape({"prompt": f"a cat for {job_id}", **case.input, **controls}),
                         callback_url=callback)


def task_of(request: SubmitRequest, submitted: Submitted) -> Task:
    return Task(task_id=submitted.task_id, operation=submitted.operation, model=request.model)


async def wait_until_final(adapter: Provider, task: Task, timeout_s: float = 10.0) -> Observation:
    deadline = time.monotonic() + timeout_s
    while True:
        observation = await adapter.status(task)
        if observation.state is not TaskState.RUNNING or time.monotonic() > deadline:
            return observation
        await asyncio.sleep(0.1)


def host_allowed(url: str, hosts: tuple[str, ...]) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return any(host == h or (h.startswith(".") and host.endswith(h)) for h in hosts)


def calls_back(adapter: Provider) -> bool:
    return adapter.facts.webhook_scheme != "none"


def output_count(observation: Observation) -> int:
    return len(observation.output_urls) + len(observation.files) + len(observation.values)


# ------------------------------------------------------------------ lifecycle


async def test_submit_runs_then_succeeds_with_outputs(case):
    case, adapter, sim_url = case
    request = submit_request(case, outputs=2, cost=3, output_bytes=100, **FAST)
    submitted = await adapter.submit(request, request.job_id)
    assert submitted.task_id
    task = task_of(request, submitted)

    assert (await adapter.status(task)).state is TaskState.RUNNING
    final = await wait_until_final(adapter, task)
    assert final.state is TaskState.SUCCEEDED, final
    assert output_count(final) == case.two_outputs and final.error is None
    assert final.cost == (3 if case.reports_cost else None)
    async with httpx.AsyncClient(trust_env=False) as client:
        for url in final.output_urls:
            assert adapter.facts.outputs_from_any_host or host_allowed(url, adapter.facts.output_hosts), url
            # The provider's credentials, only where its facts say they may go.
            credentials = adapter.download_credentials() if host_allowed(url, adapter.facts.credential_hosts) \
                else {}
            response = await client.get(url, headers=dict(credentials))
            assert response.status_code == 200 and len(response.content) == 100
    for file in final.files:
        assert file.bytes == 100


async def test_failed_outcome_is_failed_with_a_reason(case):
    case, adapter, _ = case
    request = submit_request(case, outcome="failed", **FAST)
    submitted = await adapter.submit(request, request.job_id)
    final = await wait_until_final(adapter, task_of(request, submitted))
    assert final.state is TaskState.FAILED
    assert final.error and output_count(final) == 0


async def test_cancel(case):
    case, adapter, _ = case
    request = submit_request(case, duration_s=30)
    submitted = await adapter.submit(request, request.job_id)
    task = task_of(request, submitted)
    await adapter.cancel(task)
    observation = await adapter.status(task)
    if adapter.facts.can_cancel:
        assert observation.state is TaskState.CANCELLED
    else:
        # No cancel at this provider (KIE, the Gateway, ...): the task runs on.
        assert observation.state is TaskState.RUNNING
    await adapter.cancel(task)  # cancelling again is not an error


async def test_cancel_after_finish_is_not_an_error(case):
    case, adapter, _ = case
    request = submit_request(case, duration_s=0)
    submitted = await adapter.submit(request, request.job_id)
    task = task_of(request, submitted)
    assert (await wait_until_final(adapter, task)).state is TaskState.SUCCEEDED
    await adapter.cancel(task)
    assert (await adapter.status(task)).state is TaskState.SUCCEEDED


# ------------------------------------------------------------------ webhooks


def tamper(adapter: Provider, hook: WebhookRequest) -> WebhookRequest:
    """The same webhook with one byte changed where the scheme looks: the
    body (signed schemes) or the capability token (KIE)."""
    if adapter.facts.webhook_scheme == "capability-url":
        token = hook.query["token"]
        changed = ("A" if token[5] != "A" else "B")
        return WebhookRequest(hook.job_id, hook.headers, {**hook.query, "token": token[:5] + changed + token[6:]},
                              hook.raw_body, hook.job_secret)
    body = hook.raw_body
    return WebhookRequest(hook.job_id, hook.headers, hook.query, body[:-2] + bytes([body[-2] ^ 1]) + body[-1:],
                          hook.job_secret)


async def test_webhook_verifies_and_one_changed_byte_does_not(case, receiver):
    case, adapter, _ = case
    if not calls_back(adapter):
        pytest.skip(f"{case.name} sends no webhooks: its jobs are polled")
    request = submit_request(case, callback_base=receiver.url, duration_s=0.2)
    submitted = await adapter.submit(request, request.job_id)
    arrival = await receiver.wait_for(f"/webhooks/{case.name}/{request.job_id}")

    hook = WebhookRequest(job_id=request.job_id, headers=arrival.headers, query=arrival.query,
                          raw_body=arrival.body, job_secret=submitted.webhook_secret)
    assert await adapter.verify(hook)
    assert not await adapter.verify(tamper(adapter, hook))
    if case.name in ("sim", "kie"):
        # Bound to one job: replayed at another job's URL (which has its own
        # secret, for sim), it is refused.
        other = WebhookRequest(new_job_id(), hook.headers, hook.query, hook.raw_body, secrets.token_urlsafe(32))
        assert not await adapter.verify(other)
    if case.name == "sim":
        assert submitted.webhook_secret
        assert not await adapter.verify(WebhookRequest(hook.job_id, hook.headers, hook.query, hook.raw_body, None))
    if case.name == "kie":
        # The body is never what KIE's check rests on.
        body_changed = WebhookRequest(hook.job_id, hook.headers, hook.query, hook.raw_body + b" ", None)
        assert await adapter.verify(body_changed)
        assert request.callback_url not in repr(submitted)


async def test_unsigned_webhook_is_refused(case):
    case, adapter, _ = case
    hook = WebhookRequest(job_id=new_job_id(), headers={}, query={}, raw_body=b'{"status":"succeeded"}',
                          job_secret="some-secret")
    assert not await adapter.verify(hook)


# ------------------------------------------------------------------ one task per job


async def test_resubmit_or_find_recovers_the_same_task(case, receiver):
    case, adapter, sim_url = case
    request = submit_request(case, callback_base=receiver.url, duration_s=30)
    first = await adapter.submit(request, request.job_id)
    if adapter.facts.idempotent_submit:
        again = await adapter.submit(request, request.job_id)
        assert again.task_id == first.task_id
        assert stats(sim_url)["creates_by_idempotency_key"][request.job_id] == 1
    elif adapter.facts.can_find:
        found = await adapter.find(request)
        assert found is not None and found.task_id == first.task_id
        if case.name == "replicate":
            # Found by model and input, not by the callback URL (the listed predictions carry none).
            no_callback = SubmitRequest(request.job_id, request.model, request.input, None)
            assert (await adapter.find(no_callback)) == first
            other_input = SubmitRequest(new_job_id(), request.model, {**request.input, "prompt": "a dog"},
                                        f"{receiver.url}/webhooks/replicate/{new_job_id()}")
            assert await adapter.find(other_input) is None
    else:
        assert not adapter.facts.can_find
        assert await adapter.find(request) is None
    await adapter.cancel(task_of(request, first))


# ------------------------------------------------------------------ faults


async def test_submit_error_is_uncertain(case):
    case, adapter, sim_url = case
    set_faults(sim_url, submit_error=1)
    before = stats(sim_url)["tasks_created"]
    request = submit_request(case, **FAST)
    with pytest.raises(Uncertain):
        await adapter.submit(request, request.job_id)
    assert stats(sim_url)["tasks_created"] == before


async def test_submit_timeout_after_create_is_uncertain_and_the_task_exists(case, receiver):
    case, adapter, sim_url = case
    set_faults(sim_url, submit_timeout_after_create=1)
    request = submit_request(case, callback_base=receiver.url, duration_s=30)
    started = time.monotonic()
    with pytest.raises(Uncertain):
        await adapter.submit(request, request.job_id)
    assert time.monotonic() - started < SUBMIT_TIMEOUT_S + 2
    clear_faults(sim_url)
    if calls_back(adapter):
        counts = stats(sim_url)["creates_by_callback_url"]
        assert counts[request.callback_url.partition("?")[0]] == 1  # keyed without the query string
    if adapter.facts.idempotent_submit:
        # Submitting again returns the task the lost answer named.
        again = await adapter.submit(request, request.job_id)
        assert stats(sim_url)["creates_by_idempotency_key"][request.job_id] == 1
        await adapter.cancel(task_of(request, again))
    elif adapter.facts.can_find:
        found = await adapter.find(request)
        assert found is not None
        assert (await adapter.status(task_of(request, found))).state is TaskState.RUNNING
        await adapter.cancel(task_of(request, found))


async def test_status_error_is_transient(case):
    case, adapter, sim_url = case
    request = submit_request(case, **FAST)
    submitted = await adapter.submit(request, request.job_id)
    set_faults(sim_url, status_error=1)
    with pytest.raises(Transient):
        await adapter.status(task_of(request, submitted))
    clear_faults(sim_url)
    assert (await adapter.status(task_of(request, submitted))).state in (TaskState.RUNNING, TaskState.SUCCEEDED)


async def test_validation_error_is_rejected_and_creates_nothing(case):
    case, adapter, sim_url = case
    before = stats(sim_url)["tasks_created"]
    request = submit_request(case, duration_s="soon")
    with pytest.raises(Rejected) as caught:
        await adapter.submit(request, request.job_id)
    assert "duration_s" in str(caught.value)
    assert stats(sim_url)["tasks_created"] == before


async def test_unknown_task_status_is_rejected(case):
    case, adapter, _ = case
    task = Task(task_id="nosuchtask0123456789abcdef", model=case.model)
    with pytest.raises(Rejected):
        await adapter.status(task)


async def test_connection_refused_is_transient(case, closed_port_url):
    case, _, _ = case
    adapter = case.make(closed_port_url, SUBMIT_TIMEOUT_S)
    try:
        request = submit_request(case, **FAST)
        with pytest.raises(Transient):
            await adapter.submit(request, request.job_id)
        with pytest.raises(Transient):
            await adapter.status(Task(task_id="t1", model=case.model))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ every case: its kind


@pytest.mark.parametrize("each", ALL_CASES, ids=str)
async def test_the_adapters_kind_is_the_registrys(each):
    """Where a job goes (submitted, or called) is decided from the registry
    before any adapter is asked; the adapter's facts say the same."""
    adapter = each.make(DISCARD, SUBMIT_TIMEOUT_S)
    try:
        assert adapter.facts_for(each.model).kind is provider_kind(each.name, each.model)
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ sync cases: one call

# Done at once; 3000 bytes where the answer is the simulator's bytes (speech, sound).
QUICK = {"duration_s": 0, "output_bytes": 3000}
# A dropped answer's call is given up after this (the simulator holds it 60 s).
LOST_CALL_TIMEOUT_S = 1.0


@pytest.fixture(params=SYNC_CASES, ids=str)
async def sync_case(request, simulator, tmp_path):
    clear_faults(simulator)
    case: Case = request.param
    spool = tmp_path / "spool"
    spool.mkdir()
    adapter = case.make(simulator, SUBMIT_TIMEOUT_S, str(spool))
    yield case, adapter, simulator, spool
    await adapter.aclose()
    clear_faults(simulator)


def call_request(case: Case, *, timeout_s: float = 10.0, **controls) -> SubmitRequest:
    """A sync job's call: the job id in the prompt (each test's call is its
    own body at the simulator, and its own speech in the history), started now."""
    job_id = new_job_id()
    return SubmitRequest(job_id=job_id, model=case.model,
                         input=case.shape({"prompt": f"a cat for {job_id}", **case.input, **controls}),
                         callback_url=None, first_attempt_at=datetime.now(UTC), call_timeout_s=timeout_s)


def sync_calls(sim_url: str) -> dict[str, int]:
    """The calls that did their work, counted by body."""
    return stats(sim_url)["sync_calls_by_body"]


def new_calls(before: dict[str, int], after: dict[str, int]) -> list[int]:
    """How often each body not counted before (or counted more since) was called."""
    return sorted(count - before.get(body, 0) for body, count in after.items() if count != before.get(body, 0))


def spooled(spool: Path) -> list[str]:
    return sorted(os.listdir(spool))


def the_file(observation: Observation, spool: Path) -> tuple[OutputFile, bytes]:
    """A success's one output, a file in the spool directory that is what
    the Observation says it is; and its bytes."""
    assert observation.state is TaskState.SUCCEEDED and observation.error is None
    assert observation.output_urls == () and observation.values == ()
    (file,) = observation.files
    assert Path(file.path).parent == spool
    data = Path(file.path).read_bytes()
    assert file.bytes == len(data) > 0 and file.sha256 == hashlib.sha256(data).hexdigest()
    assert file.content_type
    return file, data


async def test_a_call_succeeds_with_one_file_and_its_usage(sync_case):
    case, adapter, sim_url, spool = sync_case
    before = sync_calls(sim_url)
    result = await adapter.call(call_request(case, **QUICK))
    file, _ = the_file(result, spool)
    assert spooled(spool) == [os.path.basename(file.path)]
    assert result.usage and all(usage.amount > 0 for usage in result.usage)
    assert result.request_id  # every simulated answer names its request
    assert new_calls(before, sync_calls(sim_url)) == [1]


async def test_a_throttled_call_is_transient_after_its_retry_after(sync_case):
    case, adapter, sim_url, spool = sync_case
    set_faults(sim_url, throttle=1)
    before = sync_calls(sim_url)
    with pytest.raises(Transient) as caught:
        await adapter.call(call_request(case, **QUICK))
    assert caught.value.retry_after == 1
    assert sync_calls(sim_url) == before  # the 429 came instead of the work: nothing was made
    assert spooled(spool) == []


async def test_a_500_is_uncertain(sync_case):
    case, adapter, sim_url, spool = sync_case
    set_faults(sim_url, submit_error=1)
    with pytest.raises(Uncertain):
        await adapter.call(call_request(case, **QUICK))
    assert spooled(spool) == []


async def test_a_refused_call_is_rejected(sync_case):
    case, adapter, sim_url, spool = sync_case
    with pytest.raises(Rejected):
        await adapter.call(call_request(case, outcome="failed", **QUICK))  # the simulators' definite 400
    assert spooled(spool) == []


async def test_a_dropped_answer_is_uncertain_one_call_and_recovered_only_where_it_can_be(sync_case):
    case, adapter, sim_url, spool = sync_case
    set_faults(sim_url, submit_timeout_after_create=1)
    request = call_request(case, timeout_s=LOST_CALL_TIMEOUT_S, **QUICK)
    before = sync_calls(sim_url)
    started = time.monotonic()
    with pytest.raises(Uncertain):
        await adapter.call(request)
    # Given up after the call's own timeout, not after the simulator's 60 s hold.
    assert time.monotonic() - started < LOST_CALL_TIMEOUT_S + 10
    clear_faults(sim_url)
    assert spooled(spool) == []
    assert new_calls(before, sync_calls(sim_url)) == [1]  # made once, and not again by the adapter

    found = await adapter.recover(request)
    if adapter.facts_for(case.model).can_recover:
        assert found is not None
        file, _ = the_file(found, spool)
        # The simulator's bytes for the request that made them: the lost answer's.
        assert found.request_id and file.sha256 == output_sha256(found.request_id, 0, QUICK["output_bytes"])
        assert found.usage and all(usage.amount > 0 for usage in found.usage)
    else:
        assert found is None and spooled(spool) == []
    assert new_calls(before, sync_calls(sim_url)) == [1]  # looking it up made no call


async def test_an_answered_call_recovers_as_it_answered_where_it_can_be(sync_case):
    case, adapter, sim_url, spool = sync_case
    request = call_request(case, **QUICK)
    answered = await adapter.call(request)
    answer, data = the_file(answered, spool)
    found = await adapter.recover(request)
    if adapter.facts_for(case.model).can_recover:
        assert found is not None
        file, recovered = the_file(found, spool)
        assert file.path != answer.path and recovered == data and file.sha256 == answer.sha256
        assert file.content_type == answer.content_type
        assert found.usage == answered.usage and found.request_id == answered.request_id
    else:
        assert found is None and spooled(spool) == [os.path.basename(answer.path)]


async def test_a_sync_model_has_no_task_no_webhook_and_no_cancel(sync_case):
    case, adapter, sim_url, _ = sync_case
    facts = adapter.facts_for(case.model)
    assert facts.kind is ProviderKind.SYNC
    assert facts.webhook_scheme == "none" and not facts.can_cancel
    assert not facts.can_find and not facts.idempotent_submit
    assert facts.stale_after_s >= facts.call_timeout_s  # the lost-call threshold is never before the timeout
    hook = WebhookRequest(job_id=new_job_id(), headers={"webhook-signature": "v1,c2lnbmF0dXJl"}, query={},
                          raw_body=b'{"status":"succeeded"}', job_secret="some-secret")
    assert not await adapter.verify(hook)
    before = sync_calls(sim_url)
    request = call_request(case, **QUICK)
    with pytest.raises(Rejected):
        await adapter.submit(request, request.job_id)  # called, never submitted
    assert sync_calls(sim_url) == before


async def test_a_sync_call_that_cannot_connect_is_transient(sync_case, closed_port_url):
    case, _, _, spool = sync_case
    adapter = case.make(closed_port_url, SUBMIT_TIMEOUT_S, str(spool))
    try:
        with pytest.raises(Transient):
            await adapter.call(call_request(case, **QUICK))
    finally:
        await adapter.aclose()
    assert spooled(spool) == []
