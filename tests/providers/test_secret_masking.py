"""A provider that echoes what we sent it cannot make us repeat a secret.

A real HTTP server on loopback answers every adapter's calls, each in its
provider's own wire shape, with the failure reason set to the Authorization
header it received (as it came, and wrapped in the shapes providers use for
reasons: an object, a pydantic-style list, URL-encoded). Whatever comes of
it — an Observation's error (the job's error column, the API response) or an
exception message (the job's last_error, logs) — must not hold the token,
in any form. The submit path's 4xx echoes every header and the body, whose
callback URL carries a capability token.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from starlette.responses import JSONResponse, Response

from app.providers.base import (
    Observation,
    Provider,
    ProviderError,
    Rejected,
    SubmitRequest,
    Task,
    TaskState,
    Transient,
    WebhookRequest,
)
from app.providers.fal import FalProvider
from app.providers.kie import KieProvider
from app.providers.replicate import ReplicateProvider
from app.providers.sim import SimProvider
from app.signing.webhooks import sign_standard_webhooks

from .scripted import Script, Seen

# `+`, `/` and `=` make the URL-encoded form differ from the token itself.
CORE = "EchoCore7d1f9a2b"  # in every form of the token: none may appear
TOKEN = f"r8_{CORE}+tok/en=="
WEBHOOK_SECRET = f"whsec_{CORE}V2ViaG9va1NlY3JldA=="
CAPABILITY = f"cap{CORE}"
SERVER_KEY = b"masking-server-key-0123456789abcdef"
JOB = "job_" + "e" * 24
CALLBACK = f"http://127.0.0.1:1/webhooks/x/{JOB}?token={CAPABILITY}"
MODELS = {"sim": "image-fast", "replicate": "acme/model", "fal": "fal-ai/flux/dev", "kie": "acme/model"}
PROVIDERS = tuple(MODELS)
SENDS_TOKEN = {"sim": False, "replicate": True, "fal": True, "kie": True}


def make_adapter(name: str, base_url: str) -> Provider:
    if name == "sim":
        return SimProvider(base_url, timeout_s=2)  # holds no credential
    if name == "replicate":
        return ReplicateProvider(base_url, TOKEN, timeout_s=2)
    if name == "fal":
        return FalProvider(base_url, TOKEN, jwks_url=base_url + "/jwks", timeout_s=2)
    return KieProvider(base_url, TOKEN, secret_keys=(SERVER_KEY,), timeout_s=2)


def task_for(name: str) -> Task:
    return Task(task_id="task-1", model=MODELS[name])


def echoed(seen: Seen) -> str:
    """What the provider repeats back: our Authorization header, or, from
    an adapter that sends none, every header it got."""
    return seen.headers.get("authorization") or "; ".join(f"{k}: {v}" for k, v in seen.headers.items())


# How the echo is wrapped as a provider's reason.
SHAPES: dict[str, Callable[[str], Any]] = {
    "plain": lambda text: text,
    "object": lambda text: {"message": f"unauthorized: {text}"},
    "list": lambda text: [{"loc": ["header", "authorization"], "msg": f"bad value {text}"}],
    "urlencoded": lambda text: f"see https://x.example/why?auth={quote(text, safe='')} and {quote(text, safe='')}",
}


def status_answer(name: str, seen: Seen, reason: Any, *, provider_state: str = "failed") -> Response:
    """The status call's answer in each provider's wire shape, its failure
    reason set to `reason`."""
    if name in ("sim", "replicate"):
        return JSONResponse({"id": "task-1", "status": provider_state, "error": reason})
    if name == "fal":
        return JSONResponse({"status": "COMPLETED", "request_id": "task-1", "error": reason,
                             "error_type": "runner_server_error"})
    return JSONResponse({"code": 200, "msg": "success",
                         "data": {"taskId": "task-1", "state": "fail", "failCode": "500", "failMsg": reason}})


def assert_masked(text: str) -> None:
    for form in (TOKEN, quote(TOKEN, safe=""), CORE, WEBHOOK_SECRET, CAPABILITY):
        assert form not in text, text


def assert_nothing_leaked(name: str, script: Script, text: str) -> None:
    """The token went out (so the echo had something to repeat) and came
    back masked; an adapter without a token sent none."""
    assert_masked(text)
    sent = [s.headers.get("authorization") for s in script.seen]
    if SENDS_TOKEN[name]:
        assert sent and all(a is not None and TOKEN in a for a in sent)
        assert "[redacted]" in text, text  # the echo was there, and was masked (not cut off)
    else:
        assert sent and all(a is None for a in sent)


@pytest.fixture(params=PROVIDERS)
async def adapter_on_script(request, script):
    adapter = make_adapter(request.param, script.url)
    yield request.param, adapter, script
    await adapter.aclose()


# ------------------------------------------------------------------ status: the failure reason


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_failure_reason_that_echoes_the_authorization_header_is_masked(adapter_on_script, shape):
    name, adapter, script = adapter_on_script
    script.handler = lambda seen: status_answer(name, seen, SHAPES[shape](echoed(seen)))
    obs = await adapter.status(task_for(name))
    assert obs.state is TaskState.FAILED and obs.error
    assert_nothing_leaked(name, script, obs.error + repr(obs))


@pytest.mark.parametrize("name", ["sim", "replicate"])
async def test_a_cancelled_task_with_an_echoing_reason_is_masked(script, name):
    adapter = make_adapter(name, script.url)
    try:
        state = "cancelled" if name == "sim" else "canceled"
        script.handler = lambda seen: status_answer(name, seen, echoed(seen), provider_state=state)
        obs = await adapter.status(task_for(name))
        assert obs.state is TaskState.CANCELLED and obs.error
        assert_nothing_leaked(name, script, obs.error)
    finally:
        await adapter.aclose()


@pytest.mark.parametrize("shape", SHAPES)
async def test_fal_result_detail_that_echoes_is_masked(script, shape):
    """fal's older answers: the status says COMPLETED, the response URL
    carries the failure as `detail` (a model's 422, or a request error)."""
    adapter = make_adapter("fal", script.url)
    try:
        def handler(seen: Seen) -> Response:
            if seen.path.endswith("/status"):
                return JSONResponse({"status": "COMPLETED", "request_id": "task-1"})
            return JSONResponse({"detail": SHAPES[shape](echoed(seen))}, status_code=422)

        script.handler = handler
        obs = await adapter.status(task_for("fal"))
        assert obs.state is TaskState.FAILED and obs.error
        assert_nothing_leaked("fal", script, obs.error)

        def hiccup(seen: Seen) -> Response:  # not the request's outcome: asked again, with fal's words
            if seen.path.endswith("/status"):
                return JSONResponse({"status": "COMPLETED", "request_id": "task-1"})
            return JSONResponse({"detail": SHAPES[shape](echoed(seen)), "error_type": "internal_error"},
                                status_code=500)

        script.handler = hiccup
        with pytest.raises(Transient) as caught:
            await adapter.status(task_for("fal"))
        assert_nothing_leaked("fal", script, str(caught.value) + repr(caught.value))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ status: exception messages


async def test_an_unknown_status_that_echoes_is_masked(adapter_on_script):
    """The status word itself is provider text: an unknown one is quoted in
    the exception, masked first and only then cut short."""
    name, adapter, script = adapter_on_script

    def handler(seen: Seen) -> Response:
        if name == "kie":
            return JSONResponse({"code": 200, "data": {"taskId": "task-1", "state": echoed(seen)}})
        return JSONResponse({"id": "task-1", "status": echoed(seen)})

    script.handler = handler
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for(name))
    assert_nothing_leaked(name, script, str(caught.value) + repr(caught.value))


@pytest.mark.parametrize("status", [401, 500, 503])
async def test_an_http_error_that_echoes_is_masked(adapter_on_script, status):
    name, adapter, script = adapter_on_script
    script.handler = lambda seen: JSONResponse({"detail": echoed(seen)}, status_code=status)
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for(name))
    assert_nothing_leaked(name, script, str(caught.value) + repr(caught.value))


async def test_kie_body_code_error_that_echoes_is_masked(script):
    adapter = make_adapter("kie", script.url)
    try:
        script.handler = lambda seen: JSONResponse({"code": 500, "msg": echoed(seen), "data": None})
        with pytest.raises(Transient) as caught:
            await adapter.status(task_for("kie"))
        assert_nothing_leaked("kie", script, str(caught.value))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ submit


def echo_everything(seen: Seen) -> str:
    """Our Authorization first (a reason is cut at 200 characters), then
    the request line and the body we sent (the callback URL, with its
    capability token, is in one or the other), then every other header."""
    others = "; ".join(f"{k}: {v}" for k, v in seen.headers.items() if k != "authorization")
    target = f"{seen.path}?{urlencode(seen.query)}" if seen.query else seen.path
    return f"{seen.headers.get('authorization', '')} {seen.method} {target} {seen.body.decode()} {others}"


@pytest.mark.parametrize("status", [400, 401, 403, 422])
async def test_a_submit_refusal_that_echoes_every_header_is_masked(adapter_on_script, status):
    name, adapter, script = adapter_on_script
    script.handler = lambda seen: JSONResponse({"detail": echo_everything(seen)}, status_code=status)
    request = SubmitRequest(job_id=JOB, model=MODELS[name], input={"prompt": "p"}, callback_url=CALLBACK)
    with pytest.raises(Rejected) as caught:
        await adapter.submit(request, JOB)
    sent = script.seen[-1]
    assert CAPABILITY in sent.body.decode() + repr(sent.query)  # it went out, in the callback URL
    assert_nothing_leaked(name, script, str(caught.value) + repr(caught.value))


@pytest.mark.parametrize("shape", SHAPES)
async def test_kie_submit_refused_by_body_code_that_echoes_is_masked(script, shape):
    """KIE answers HTTP 200 and says no with its own `code` and `msg`."""
    adapter = make_adapter("kie", script.url)
    try:
        script.handler = lambda seen: JSONResponse({"code": 422, "msg": SHAPES[shape](echo_everything(seen))})
        request = SubmitRequest(job_id=JOB, model=MODELS["kie"], input={}, callback_url=CALLBACK)
        with pytest.raises(ProviderError) as caught:
            await adapter.submit(request, JOB)
        text = str(caught.value)
        assert_nothing_leaked("kie", script, text)
        assert "token=" not in text  # nor the capability token KIE's adapter added itself
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ Replicate's webhook secrets


async def test_replicate_masks_its_configured_webhook_secret(script):
    adapter = ReplicateProvider(script.url, TOKEN, webhook_secret=WEBHOOK_SECRET, timeout_s=2)
    try:
        # A provider that knows the account's secret and says it.
        script.handler = lambda seen: status_answer("replicate", seen, f"{WEBHOOK_SECRET} {echoed(seen)}")
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
            return status_answer("replicate", seen, f"{WEBHOOK_SECRET} {echoed(seen)}")

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
