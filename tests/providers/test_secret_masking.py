"""A provider that echoes what we sent it cannot make us repeat a secret.

A real HTTP server on loopback answers every adapter's calls, each in its
provider's own wire shape, with the failure reason set to the credential
header it received (as it came, and wrapped in the shapes providers use for
reasons: an object, a pydantic-style list, URL-encoded). Whatever comes of
it — an Observation's error (the job's error column, the API response) or an
exception message (the job's last_error, logs) — must not hold the token,
in any form. The submit path's 4xx echoes every header and the body, whose
callback URL carries a capability token.

Each case is one adapter and one wire protocol: the KIE adapter speaks its
Market API (`kie`) and each of its families (`kie-veo`, `kie-runway`,
`kie-flux`, `kie-suno`), each with its own status endpoint and answer. The
credential goes out in the header its adapter sends it in: `Authorization`
(Replicate, fal, KIE, the Gateway's `Bearer`, OpenAI's `Bearer`),
`x-goog-api-key` (Gemini), `x-api-key` (Anthropic), `xi-api-key`
(ElevenLabs: dubbing, the sync speech and sound routes, and the speech
history `recover` reads).

The sync adapters (`anthropic`, `openai`, `elevenlabs-speech`,
`elevenlabs-sound`) make one call, which is never an Observation with an
error: its refusal (4xx), 429, 5xx, a 200 that is an error object, and for
the LLMs an `error` event inside a stream (each shape a protocol has for
one) echo the header into an exception's message; ElevenLabs' speech
`recover` reads the history and an item's audio, whose failures echo it too.
A success's fields (its request id included) must not hold the key either.
Their key holds a backslash, so its JSON-escaped form is not its raw one: a
reason that reaches a message as JSON text (an error object quoted whole)
carries that form, and it is masked too.

Where a provider documents a reason as a string (the Gateway's `error`,
Gemini's `error.message`, ElevenLabs' `error` and `detail.message`,
Anthropic's and OpenAI's `error.message`, KIE's families' `errorMessage` /
`failMsg`), the object and list shapes arrive as their JSON text, which is
how a string field carries them.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from starlette.responses import JSONResponse, Response

from app.providers.anthropic import AnthropicProvider
from app.providers.base import (
    Observation,
    Provider,
    ProviderError,
    Rejected,
    SubmitRequest,
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
from app.signing.webhooks import sign_standard_webhooks

from .scripted import Script, Seen

# `+`, `/` and `=` make the URL-encoded form differ from the token itself.
CORE = "EchoCore7d1f9a2b"  # in every form of the token: none may appear
TOKEN = f"r8_{CORE}+tok/en=="
# The sync adapters' key: its backslash is `\\` in JSON, so its JSON-escaped form differs.
SYNC_TOKEN = f"sk-{CORE}+tok\\en/=="
WEBHOOK_SECRET = f"whsec_{CORE}V2ViaG9va1NlY3JldA=="
CAPABILITY = f"cap{CORE}"
SERVER_KEY = b"masking-server-key-0123456789abcdef"
JOB = "job_" + "e" * 24
CALLBACK = f"http://127.0.0.1:1/webhooks/x/{JOB}?token={CAPABILITY}"
MODELS = {
    "sim": "image-fast", "replicate": "acme/model", "fal": "fal-ai/flux/dev", "kie": "acme/model",
    "gateway": "klingai/kling-v3.0-t2v", "gemini": "veo-3.1-generate-preview", "elevenlabs": "dubbing",
    "kie-veo": "veo/veo3", "kie-runway": "runway/generate", "kie-flux": "flux-kontext/flux-kontext-pro",
    "kie-suno": "suno/V4_5",
}
PROVIDERS = tuple(MODELS)  # the cases: an adapter and one of its wire protocols
KIE_CASES = tuple(case for case in PROVIDERS if case.partition("-")[0] == "kie")
VOICE = "21m00Tcm4TlvDq8ikWAM"
# The sync cases: an adapter and one of its sync models (called, never submitted).
SYNC_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o-mini",
               "elevenlabs-speech": f"text-to-speech/{VOICE}", "elevenlabs-sound": "sound-generation"}
SYNC_CASES = tuple(SYNC_MODELS)
LLM_CASES = ("anthropic", "openai")  # the ones that stream
# The simulator's native protocol has no credential.
SENDS_TOKEN = {case: case != "sim" for case in PROVIDERS + SYNC_CASES}
# Else Authorization.
KEY_HEADERS = {"gemini": "x-goog-api-key", "elevenlabs": "xi-api-key", "anthropic": "x-api-key"}
# Polled providers register no webhook: no callback URL (so no capability token) is ever sent.
NO_CALLBACK = {"gemini", "elevenlabs"}
# A submit input each adapter accepts (so the refusal comes from the provider, not from us).
SUBMIT_INPUT: dict[str, dict[str, Any]] = {
    "gemini": {"instances": [{"prompt": "p"}]},
    "elevenlabs": {"source_url": "https://media.example.com/talk.mp4", "target_lang": "es"},
}
# A Gemini task id is the operation's name.
TASK_IDS = {"gemini": f"models/{MODELS['gemini']}/operations/task-1"}


def provider_of(case: str) -> str:
    return case.partition("-")[0]


def key_header(case: str) -> str:
    """The (lower-cased) header the adapter sends its credential in."""
    return KEY_HEADERS.get(provider_of(case), "authorization")


def make_adapter(case: str, base_url: str, spool_dir: str | None = None) -> Provider:
    name = provider_of(case)
    if case in SYNC_CASES:  # each writes its answers into `spool_dir`
        if name == "anthropic":
            return AnthropicProvider(base_url, SYNC_TOKEN, timeout_s=2, spool_dir=spool_dir)
        if name == "openai":
            return OpenAIProvider(base_url, SYNC_TOKEN, timeout_s=2, spool_dir=spool_dir)
        return ElevenLabsProvider(base_url, SYNC_TOKEN, timeout_s=2, spool_dir=spool_dir)
    if name == "sim":
        return SimProvider(base_url, timeout_s=2)  # holds no credential
    if name == "replicate":
        return ReplicateProvider(base_url, TOKEN, timeout_s=2)
    if name == "fal":
        return FalProvider(base_url, TOKEN, jwks_url=base_url + "/jwks", timeout_s=2)
    if name == "gateway":
        return GatewayProvider(base_url, TOKEN, timeout_s=2)
    if name == "gemini":
        return GeminiProvider(base_url, TOKEN, timeout_s=2)
    if name == "elevenlabs":
        return ElevenLabsProvider(base_url, TOKEN, timeout_s=2)
    return KieProvider(base_url, TOKEN, secret_keys=(SERVER_KEY,), timeout_s=2)


def task_for(case: str) -> Task:
    return Task(task_id=TASK_IDS.get(case, "task-1"), model=MODELS[case])


def echoed(case: str, seen: Seen) -> str:
    """What the provider repeats back: the header our credential went out
    in, or, from an adapter that sends none, every header it got."""
    return seen.headers.get(key_header(case)) or "; ".join(f"{k}: {v}" for k, v in seen.headers.items())


# How the echo is wrapped as a provider's reason.
SHAPES: dict[str, Callable[[str], Any]] = {
    "plain": lambda text: text,
    "object": lambda text: {"message": f"unauthorized: {text}"},
    "list": lambda text: [{"loc": ["header", "authorization"], "msg": f"bad value {text}"}],
    "urlencoded": lambda text: f"see https://x.example/why?auth={quote(text, safe='')} and {quote(text, safe='')}",
}


def as_text(reason: Any) -> str:
    """A reason as a string field carries it: an object or list as its JSON."""
    return reason if isinstance(reason, str) else json.dumps(reason)


def kie_record(data: dict[str, Any], code: int = 200) -> Response:
    return JSONResponse({"code": code, "msg": "success", "data": {"taskId": "task-1", **data}})


def dub(**fields: Any) -> Response:
    """A DubbingMetadataResponse (ElevenLabs' GET /v1/dubbing/{id})."""
    return JSONResponse({"dubbing_id": "task-1", "name": JOB, "status": "dubbing", "source_language": "en",
                         "target_languages": ["es"], "editable": False, "created_at": "2024-01-15T09:30:00Z",
                         "media_metadata": None, "error": None, **fields})


def status_answer(case: str, seen: Seen, reason: Any, *, provider_state: str = "failed") -> Response:
    """The status call's answer in each provider's wire shape, its failure
    reason set to `reason`."""
    if case in ("sim", "replicate"):
        return JSONResponse({"id": "task-1", "status": provider_state, "error": reason})
    if case == "fal":
        return JSONResponse({"status": "COMPLETED", "request_id": "task-1", "error": reason,
                             "error_type": "runner_server_error"})
    if case == "gateway":  # gatewayVideoStatusResponseSchema's error answer
        return JSONResponse({"status": "error", "error": as_text(reason)})
    if case == "gemini":  # a done operation whose `error` is a google.rpc.Status
        return JSONResponse({"name": TASK_IDS["gemini"], "done": True,
                             "error": {"code": 7, "message": as_text(reason)}})
    if case == "elevenlabs":
        return dub(status="failed", error=as_text(reason))
    if case in ("kie-veo", "kie-flux"):  # successFlag 3: created, but the generation failed
        return kie_record({"successFlag": 3, "response": None, "errorCode": 500, "errorMessage": as_text(reason)})
    if case == "kie-runway":
        return kie_record({"state": "fail", "videoInfo": None, "failCode": 400, "failMsg": as_text(reason),
                           "expireFlag": 0})
    if case == "kie-suno":
        return kie_record({"status": "GENERATE_AUDIO_FAILED", "response": None, "errorCode": 500,
                           "errorMessage": as_text(reason)})
    return kie_record({"state": "fail", "failCode": "500", "failMsg": reason})


def unknown_status_answer(case: str, word: str) -> Response:
    """A status answer whose state is `word`, in the field each protocol
    keeps its state in."""
    if case in ("kie", "kie-runway"):
        return kie_record({"state": word})
    if case in ("kie-veo", "kie-flux"):
        return kie_record({"successFlag": word})
    if case == "kie-suno":
        return kie_record({"status": word})
    if case == "gemini":  # an operation has no status word: `done` is its one state field
        return JSONResponse({"name": TASK_IDS["gemini"], "done": word})
    if case == "elevenlabs":
        return dub(status=word)
    return JSONResponse({"id": "task-1", "status": word})


def error_body(case: str, text: str) -> dict[str, Any]:
    """An HTTP error answer's body in the provider's documented shape,
    its message `text`."""
    name = provider_of(case)
    if name == "gateway":  # @ai-sdk/gateway create-gateway-error.ts
        return {"error": {"message": text, "type": "authentication_error", "param": None, "code": None}}
    if name == "gemini":  # the Google API error model
        return {"error": {"code": 401, "message": text, "status": "UNAUTHENTICATED"}}
    if name == "elevenlabs":  # the current `detail` object
        return {"detail": {"message": text, "type": "authentication_error", "code": "invalid_api_key",
                           "status": "invalid_api_key", "request_id": "req_1"}}
    if name == "anthropic":  # the errors page's shape
        return {"type": "error", "error": {"type": "authentication_error", "message": text}, "request_id": "req_1"}
    if name == "openai":  # openapi.yaml's ErrorResponse
        return {"error": {"message": text, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    return {"detail": text}


def assert_masked(text: str, token: str = TOKEN) -> None:
    for form in (token, quote(token, safe=""), json.dumps(token)[1:-1], CORE, WEBHOOK_SECRET, CAPABILITY):
        assert form not in text, text


def assert_nothing_leaked(case: str, script: Script, text: str, *, quoted: bool = True) -> None:
    """The token went out in the adapter's credential header (so the echo
    had something to repeat) and came back masked; an adapter without a
    token sent none. `quoted`: the message repeats the provider's text."""
    token = SYNC_TOKEN if case in SYNC_CASES else TOKEN
    assert_masked(text, token)
    sent = [s.headers.get(key_header(case)) for s in script.seen]
    if SENDS_TOKEN[case]:
        assert sent and all(a is not None and token in a for a in sent), sent
        if quoted:
            assert "[redacted]" in text, text  # the echo was there, and was masked (not cut off)
    else:
        assert sent and all(a is None for a in sent)


@pytest.fixture(params=PROVIDERS)
async def adapter_on_script(request, script):
    adapter = make_adapter(request.param, script.url)
    yield request.param, adapter, script
    await adapter.aclose()


@pytest.fixture
async def adapter_for(script):
    """adapter_for(case) -> an adapter on the scripted provider, closed after the test."""
    made: list[Provider] = []

    def make(case: str) -> Provider:
        made.append(make_adapter(case, script.url))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


def test_no_adapter_repr_holds_its_key(adapter_on_script):
    _, adapter, _ = adapter_on_script
    assert_masked(repr(adapter))


# ------------------------------------------------------------------ status: the failure reason


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_failure_reason_that_echoes_the_credential_header_is_masked(adapter_on_script, shape):
    case, adapter, script = adapter_on_script
    script.handler = lambda seen: status_answer(case, seen, SHAPES[shape](echoed(case, seen)))
    obs = await adapter.status(task_for(case))
    assert obs.state is TaskState.FAILED and obs.error
    assert_nothing_leaked(case, script, obs.error + repr(obs))


@pytest.mark.parametrize("name", ["sim", "replicate"])
async def test_a_cancelled_task_with_an_echoing_reason_is_masked(adapter_for, script, name):
    # The Gateway's `cancelled` answer carries no reason (its error is ours); no other new provider cancels.
    adapter = adapter_for(name)
    state = "cancelled" if name == "sim" else "canceled"
    script.handler = lambda seen: status_answer(name, seen, echoed(name, seen), provider_state=state)
    obs = await adapter.status(task_for(name))
    assert obs.state is TaskState.CANCELLED and obs.error
    assert_nothing_leaked(name, script, obs.error)


@pytest.mark.parametrize("shape", SHAPES)
async def test_fal_result_detail_that_echoes_is_masked(adapter_for, script, shape):
    """fal's older answers: the status says COMPLETED, the response URL
    carries the failure as `detail` (a model's 422, or a request error)."""
    adapter = adapter_for("fal")

    def handler(seen: Seen) -> Response:
        if seen.path.endswith("/status"):
            return JSONResponse({"status": "COMPLETED", "request_id": "task-1"})
        return JSONResponse({"detail": SHAPES[shape](echoed("fal", seen))}, status_code=422)

    script.handler = handler
    obs = await adapter.status(task_for("fal"))
    assert obs.state is TaskState.FAILED and obs.error
    assert_nothing_leaked("fal", script, obs.error)

    def hiccup(seen: Seen) -> Response:  # not the request's outcome: asked again, with fal's words
        if seen.path.endswith("/status"):
            return JSONResponse({"status": "COMPLETED", "request_id": "task-1"})
        return JSONResponse({"detail": SHAPES[shape](echoed("fal", seen)), "error_type": "internal_error"},
                            status_code=500)

    script.handler = hiccup
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for("fal"))
    assert_nothing_leaked("fal", script, str(caught.value) + repr(caught.value))


@pytest.mark.parametrize("shape", SHAPES)
async def test_gemini_filter_reasons_that_echo_are_masked(adapter_for, script, shape):
    """Gemini's other free text: a done operation whose every sample was
    filtered names Google's reasons (`raiMediaFilteredReasons`, strings)."""
    adapter = adapter_for("gemini")
    script.handler = lambda seen: JSONResponse({"name": TASK_IDS["gemini"], "done": True, "response": {
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse",
        "generateVideoResponse": {"raiMediaFilteredCount": 1,
                                  "raiMediaFilteredReasons": [as_text(SHAPES[shape](echoed("gemini", seen)))]}}})
    obs = await adapter.status(task_for("gemini"))
    assert obs.state is TaskState.FAILED and obs.error and "filtered" in obs.error
    assert_nothing_leaked("gemini", script, obs.error + repr(obs))


async def test_a_gateway_video_of_an_unknown_type_that_echoes_is_masked(adapter_for, script):
    """The Gateway's other free text: a completed answer's video `type`
    (url, base64, uploaded) is quoted when it is none of those."""
    adapter = adapter_for("gateway")
    script.handler = lambda seen: JSONResponse({"status": "completed", "videos": [
        {"type": echoed("gateway", seen), "mediaType": "video/mp4"}]})
    obs = await adapter.status(task_for("gateway"))
    assert obs.state is TaskState.FAILED and obs.error
    assert_nothing_leaked("gateway", script, obs.error + repr(obs))


# ------------------------------------------------------------------ status: exception messages


async def test_an_unknown_status_that_echoes_is_masked(adapter_on_script):
    """The status word itself is provider text: an unknown one is quoted in
    the exception, masked first and only then cut short. Gemini has no
    status word (an operation is `done` or not): a `done` that is not a
    boolean is refused without quoting it."""
    case, adapter, script = adapter_on_script
    script.handler = lambda seen: unknown_status_answer(case, echoed(case, seen))
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for(case))
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value), quoted=case != "gemini")


@pytest.mark.parametrize("status", [401, 500, 503])
async def test_an_http_error_that_echoes_is_masked(adapter_on_script, status):
    case, adapter, script = adapter_on_script
    script.handler = lambda seen: JSONResponse(error_body(case, echoed(case, seen)), status_code=status)
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for(case))
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value))


@pytest.mark.parametrize("case", KIE_CASES)
async def test_kie_body_code_error_that_echoes_is_masked(adapter_for, script, case):
    adapter = adapter_for(case)
    script.handler = lambda seen: JSONResponse({"code": 500, "msg": echoed(case, seen), "data": None})
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for(case))
    assert_nothing_leaked(case, script, str(caught.value))


@pytest.mark.parametrize("case", KIE_CASES)
async def test_kie_generation_failed_code_that_echoes_is_masked(adapter_for, script, case):
    """Code 501 ("generation failed") ends the task with KIE's own words."""
    adapter = adapter_for(case)
    script.handler = lambda seen: JSONResponse({"code": 501, "msg": echoed(case, seen), "data": None})
    obs = await adapter.status(task_for(case))
    assert obs.state is TaskState.FAILED and obs.error
    assert_nothing_leaked(case, script, obs.error + repr(obs))


@pytest.mark.parametrize("status", [401, 500])
async def test_elevenlabs_find_that_echoes_is_masked(adapter_for, script, status):
    """ElevenLabs' look-up of a lost submit lists the account's dubs."""
    adapter = adapter_for("elevenlabs")
    script.handler = lambda seen: JSONResponse(error_body("elevenlabs", echoed("elevenlabs", seen)),
                                               status_code=status)
    request = SubmitRequest(job_id=JOB, model="dubbing", input=SUBMIT_INPUT["elevenlabs"], callback_url=None)
    with pytest.raises(Transient) as caught:
        await adapter.find(request)
    assert_nothing_leaked("elevenlabs", script, str(caught.value) + repr(caught.value))


# ------------------------------------------------------------------ submit


def echo_everything(case: str, seen: Seen) -> str:
    """Our credential header first (a reason is cut at 200 characters), then
    the request line and the body we sent (the callback URL, with its
    capability token, is in one or the other), then every other header."""
    header = key_header(case)
    others = "; ".join(f"{k}: {v}" for k, v in seen.headers.items() if k != header)
    target = f"{seen.path}?{urlencode(seen.query)}" if seen.query else seen.path
    return f"{seen.headers.get(header, '')} {seen.method} {target} {seen.body.decode()} {others}"


@pytest.mark.parametrize("status", [400, 401, 403, 422])
async def test_a_submit_refusal_that_echoes_every_header_is_masked(adapter_on_script, status):
    case, adapter, script = adapter_on_script
    script.handler = lambda seen: JSONResponse(error_body(case, echo_everything(case, seen)), status_code=status)
    request = SubmitRequest(job_id=JOB, model=MODELS[case], input=SUBMIT_INPUT.get(case, {"prompt": "p"}),
                            callback_url=CALLBACK)
    with pytest.raises(Rejected) as caught:
        await adapter.submit(request, JOB)
    sent = script.seen[-1]
    if case in NO_CALLBACK:
        assert CAPABILITY not in sent.body.decode() + repr(sent.query)  # polled: no callback goes out
    else:
        assert CAPABILITY in sent.body.decode() + repr(sent.query)  # it went out, in the callback URL
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value))


@pytest.mark.parametrize("case", KIE_CASES)
@pytest.mark.parametrize("shape", SHAPES)
async def test_kie_submit_refused_by_body_code_that_echoes_is_masked(adapter_for, script, shape, case):
    """KIE answers HTTP 200 and says no with its own `code` and `msg`, on
    the Market's create and on every family's generate."""
    adapter = adapter_for(case)
    script.handler = lambda seen: JSONResponse({"code": 422, "msg": SHAPES[shape](echo_everything(case, seen))})
    request = SubmitRequest(job_id=JOB, model=MODELS[case], input={}, callback_url=CALLBACK)
    with pytest.raises(ProviderError) as caught:
        await adapter.submit(request, JOB)
    text = str(caught.value)
    assert CAPABILITY in script.seen[-1].body.decode()
    assert_nothing_leaked(case, script, text)
    assert "token=" not in text  # nor the capability token KIE's adapter added itself


# ------------------------------------------------------------------ Replicate's webhook secrets


async def test_replicate_masks_its_configured_webhook_secret(script):
    adapter = ReplicateProvider(script.url, TOKEN, webhook_secret=WEBHOOK_SECRET, timeout_s=2)
    try:
        # A provider that knows the account's secret and says it.
        script.handler = lambda seen: status_answer("replicate", seen, f"{WEBHOOK_SECRET} {echoed('replicate', seen)}")
        obs = await adapter.status(task_for("replicate"))
        assert_nothing_leaked("replicate", script, _error(obs))
    finally:
        await adapter.aclose()


async def test_replicate_masks_the_webhook_secret_it_fetched(script):
    adapter = ReplicateProvider(script.url, TOKEN, timeout_s=2)
    try:
        def handler(seen: Seen) -> Response:
            if seen.path == "/v1/webhooks/default/secret":
                return JSONResponse({"key": WEBHOOK_SECRET})
            return status_answer("replicate", seen, f"{WEBHOOK_SECRET} {echoed('replicate', seen)}")

        script.handler = handler
        assert await adapter.verify(_standard_webhook(WEBHOOK_SECRET))  # fetched, and now known
        obs = await adapter.status(task_for("replicate"))
        assert_nothing_leaked("replicate", script, _error(obs))
    finally:
        await adapter.aclose()


def _error(obs: Observation) -> str:
    assert obs.error
    return obs.error


def _standard_webhook(secret: str) -> WebhookRequest:
    body = json.dumps({"id": "task-1", "status": "failed"}).encode()
    t = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(t),
               "webhook-signature": sign_standard_webhooks(secret, "msg_1", t, body)}
    return WebhookRequest(job_id=JOB, headers=headers, query={}, raw_body=body)


# ------------------------------------------------------------------ sync calls

# What each HTTP status of a sync call means (http.sync_call).
CALL_OUTCOMES: dict[int, type[ProviderError]] = {
    400: Rejected, 401: Rejected, 403: Rejected, 422: Rejected,
    429: Transient, 503: Transient, 529: Transient,
    500: Uncertain, 502: Uncertain,
}


def sync_input(case: str, *, stream: bool = False) -> dict[str, Any]:
    """An input each sync adapter sends (so the refusal comes from the provider, not from us)."""
    name = provider_of(case)
    if name == "elevenlabs":
        return {"text": "p"}
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "p"}]}
    if name == "anthropic":
        body["max_tokens"] = 16
    return {**body, "stream": True} if stream else body


def sync_request(case: str, *, stream: bool = False) -> SubmitRequest:
    return SubmitRequest(job_id=JOB, model=SYNC_MODELS[case], input=sync_input(case, stream=stream),
                         callback_url=None, first_attempt_at=datetime.now(UTC), call_timeout_s=2)


@pytest.fixture(params=SYNC_CASES)
async def sync_on_script(request, script, tmp_path):
    """(case, its sync adapter on the scripted provider, the script, the spool directory)."""
    adapter = make_adapter(request.param, script.url, str(tmp_path))
    yield request.param, adapter, script, tmp_path
    await adapter.aclose()


@pytest.fixture
async def sync_adapter_for(script, tmp_path):
    """sync_adapter_for(case) -> a sync adapter on the scripted provider, spooling into tmp_path."""
    made: list[Provider] = []

    def make(case: str) -> Provider:
        made.append(make_adapter(case, script.url, str(tmp_path)))
        return made[-1]

    yield make
    for adapter in made:
        await adapter.aclose()


def spooled(spool: Path) -> list[str]:
    return sorted(os.listdir(spool))


def test_no_sync_adapter_repr_holds_its_key(sync_on_script):
    case, adapter, _, _ = sync_on_script
    assert_masked(repr(adapter), SYNC_TOKEN)


@pytest.mark.parametrize("status", CALL_OUTCOMES)
async def test_a_sync_call_refused_with_an_echo_of_every_header_is_masked(sync_on_script, status):
    """The call's 4xx, 429 and 5xx, each in the provider's error shape,
    repeating our credential header, the request line, the body we sent
    and every other header."""
    case, adapter, script, spool = sync_on_script
    script.handler = lambda seen: JSONResponse(error_body(case, echo_everything(case, seen)), status_code=status,
                                               headers={"retry-after": "1"})
    with pytest.raises(CALL_OUTCOMES[status]) as caught:
        await adapter.call(sync_request(case))
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value))
    assert spooled(spool) == []


# A reason that is an object or list whose message holds the key
# JSON-escaped once is escaped once more when written out: Secrets masks each
# string inside before it is written (app/providers/http.py `_scrubbed`).
REASON_SHAPES = SHAPES


@pytest.mark.parametrize("shape", REASON_SHAPES)
async def test_a_sync_call_refused_with_an_echoing_reason_is_masked(sync_on_script, shape):
    """The echo wrapped in each shape a reason takes, in the error's message."""
    case, adapter, script, spool = sync_on_script
    script.handler = lambda seen: JSONResponse(error_body(case, as_text(SHAPES[shape](echoed(case, seen)))),
                                               status_code=400)
    with pytest.raises(Rejected) as caught:
        await adapter.call(sync_request(case))
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value))
    assert spooled(spool) == []


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_200_that_is_an_error_object_echoing_the_key_is_masked(sync_on_script, shape):
    """A 200 that is not the answer (an error object where a Message or
    audio belongs) is a lost call, quoting the provider's words: no message
    holds the key, and no file is left."""
    case, adapter, script, spool = sync_on_script
    script.handler = lambda seen: JSONResponse(error_body(case, as_text(SHAPES[shape](echoed(case, seen)))))
    with pytest.raises(Uncertain) as caught:
        await adapter.call(sync_request(case))
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value))
    assert spooled(spool) == []


def sse(*events: tuple[str | None, Any]) -> bytes:
    """Server-sent events: (name or None, data as JSON)."""
    out = b""
    for name, data in events:
        if name:
            out += f"event: {name}\n".encode()
        out += b"data: " + json.dumps(data).encode() + b"\n\n"
    return out


MESSAGE_START = {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": SYNC_MODELS["anthropic"],
    "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}}
FIRST_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": SYNC_MODELS["openai"],
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
# An error inside a stream that began with HTTP 200, in the shapes each protocol has for it.
STREAM_ERRORS: dict[str, Callable[[str], bytes]] = {
    # The streaming page's `error` event, after message_start and a ping.
    "anthropic-error-event": lambda text: sse(("message_start", MESSAGE_START), ("ping", {"type": "ping"}),
                                              ("error", {"type": "error",
                                                         "error": {"type": "overloaded_error", "message": text}})),
    # OpenAI's and OpenRouter's chunk carrying `error`.
    "openai-error-chunk": lambda text: sse((None, FIRST_CHUNK), (None, {"error": {
        "message": text, "type": "server_error", "param": None, "code": None}})),
    # vLLM's error object as a chunk.
    "openai-error-object": lambda text: sse((None, FIRST_CHUNK), (None, {
        "object": "error", "message": text, "type": "BadRequestError", "param": None, "code": 400})),
    # An SSE event named `error`.
    "openai-error-event": lambda text: sse((None, FIRST_CHUNK), ("error", {"error": {"message": text}})),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", STREAM_ERRORS)
async def test_an_error_event_in_a_stream_that_echoes_the_key_is_masked(sync_adapter_for, script, tmp_path, form,
                                                                       shape):
    case = form.partition("-")[0]
    adapter = sync_adapter_for(case)
    script.handler = lambda seen: Response(STREAM_ERRORS[form](as_text(SHAPES[shape](echoed(case, seen)))),
                                           media_type="text/event-stream")
    with pytest.raises(Uncertain) as caught:
        await adapter.call(sync_request(case, stream=True))
    assert_nothing_leaked(case, script, str(caught.value) + repr(caught.value))
    assert spooled(tmp_path) == []


# ElevenLabs' speech history, read by `recover` to find a lost speech call.
SPEECH = "elevenlabs-speech"


def history_page(text: str = "p") -> dict[str, Any]:
    """A GetSpeechHistoryResponse whose one item is the lost call's."""
    return {"history": [{"history_item_id": "item-1", "request_id": "req_1", "voice_id": VOICE,
                         "model_id": "eleven_multilingual_v2", "text": text, "date_unix": int(time.time()),
                         "source": "TTS", "content_type": "audio/mpeg", "state": "created"}],
            "has_more": False, "last_history_item_id": "item-1"}


@pytest.mark.parametrize("status", [401, 404, 429, 500, 503])
@pytest.mark.parametrize("route", ["history", "audio"])
async def test_elevenlabs_recover_that_echoes_is_masked(sync_adapter_for, script, tmp_path, route, status):
    """The history list, or the found item's audio, refused with the echo."""
    adapter = sync_adapter_for(SPEECH)

    def handler(seen: Seen) -> Response:
        if route == "audio" and seen.path == "/v1/history":
            return JSONResponse(history_page())
        return JSONResponse(error_body(SPEECH, echo_everything(SPEECH, seen)), status_code=status)

    script.handler = handler
    with pytest.raises(Transient) as caught:
        await adapter.recover(sync_request(SPEECH))
    assert [seen.path for seen in script.seen][-1] == ("/v1/history" if route == "history"
                                                       else "/v1/history/item-1/audio")
    assert_nothing_leaked(SPEECH, script, str(caught.value) + repr(caught.value))
    assert spooled(tmp_path) == []


@pytest.mark.parametrize("shape", SHAPES)
async def test_elevenlabs_history_that_is_an_error_object_echoing_the_key_is_masked(sync_adapter_for, script,
                                                                                   shape):
    """A 200 history answer that is an error object, not a page: a read to
    repeat, quoting nothing of it."""
    adapter = sync_adapter_for(SPEECH)
    script.handler = lambda seen: JSONResponse(error_body(SPEECH, as_text(SHAPES[shape](echoed(SPEECH, seen)))))
    with pytest.raises(Transient) as caught:
        await adapter.recover(sync_request(SPEECH))
    assert_nothing_leaked(SPEECH, script, str(caught.value) + repr(caught.value), quoted=False)


def bare_key(case: str, seen: Seen) -> str:
    """The key itself, from the header it came in (OpenAI's without `Bearer`)."""
    return echoed(case, seen).removeprefix("Bearer ")


def success(case: str) -> tuple[bytes, str]:
    """A plain answer each sync adapter takes: (body, media type)."""
    name = provider_of(case)
    if name == "anthropic":
        return json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": SYNC_MODELS[case],
                           "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                           "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}).encode(), \
            "application/json"
    if name == "openai":
        return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": SYNC_MODELS[case],
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode(), \
            "application/json"
    return b"ID3audio", "audio/mpeg"


# Observation.request_id is kept on the job for support ("never a secret"):
# an id that holds the key in any form is not kept (Secrets.clean_id).


async def test_a_request_id_that_echoes_the_key_is_not_kept(sync_on_script):
    """A success whose request id header is the key we sent."""
    case, adapter, script, _ = sync_on_script
    header = "x-request-id" if provider_of(case) == "openai" else "request-id"
    body, media_type = success(case)
    script.handler = lambda seen: Response(body, media_type=media_type, headers={header: bare_key(case, seen)})
    observation = await adapter.call(sync_request(case))
    assert observation.state is TaskState.SUCCEEDED
    assert_nothing_leaked(case, script, repr(observation), quoted=False)


async def test_a_history_item_whose_request_id_echoes_the_key_is_not_kept(sync_adapter_for, script):
    """The lost call's history item names the key as its request id."""
    adapter = sync_adapter_for(SPEECH)

    def handler(seen: Seen) -> Response:
        if seen.path == "/v1/history":
            page = history_page()
            page["history"][0]["request_id"] = bare_key(SPEECH, seen)
            return JSONResponse(page)
        return Response(b"ID3audio", media_type="audio/mpeg")

    script.handler = handler
    observation = await adapter.recover(sync_request(SPEECH))
    assert observation is not None and observation.state is TaskState.SUCCEEDED
    assert_nothing_leaked(SPEECH, script, repr(observation), quoted=False)
