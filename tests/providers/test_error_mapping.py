"""Every way an HTTP call fails lands in exactly one error class, for every
adapter, over real HTTP against a scripted loopback provider."""
from __future__ import annotations

import os
import time

import pytest
from starlette.responses import JSONResponse, Response

from app.download_errors import OutputTooLarge
from app.providers.base import Rejected, SubmitRequest, Task, TaskState, Transient, Uncertain
from app.providers.fal import FalProvider
from app.providers.kie import KieProvider
from app.providers.replicate import ReplicateProvider
from app.providers.sim import SimProvider

from .scripted import DroppingServer

TOKEN = "SECRET-TOKEN-0123456789"
SERVER_KEY = b"server-secret-key-0123456789abcdef"
MODELS = {"sim": "image-fast", "replicate": "acme/model", "fal": "fal-ai/flux/dev", "kie": "acme/model"}
PROVIDERS = tuple(MODELS)
SHORT_TIMEOUT_S = 1.0


def make_adapter(name: str, base_url: str, timeout_s: float = SHORT_TIMEOUT_S):
    if name == "sim":
        return SimProvider(base_url, timeout_s=timeout_s)
    if name == "replicate":
        return ReplicateProvider(base_url, TOKEN, timeout_s=timeout_s)
    if name == "fal":
        return FalProvider(base_url, TOKEN, jwks_url=base_url + "/jwks", timeout_s=timeout_s)
    return KieProvider(base_url, TOKEN, secret_keys=(SERVER_KEY,), timeout_s=timeout_s)


def request_for(name: str, callback: str | None = "http://127.0.0.1:1/webhooks/x/job_1") -> SubmitRequest:
    return SubmitRequest(job_id="job_" + "a" * 24, model=MODELS[name], input={"prompt": "p"}, callback_url=callback)


def task_for(name: str) -> Task:
    return Task(task_id="task-1", model=MODELS[name])


def assert_no_secret(error: Exception) -> None:
    text = str(error) + repr(error)
    assert TOKEN not in text
    assert "token=" not in text


@pytest.fixture(params=PROVIDERS)
async def adapter_on_script(request, script):
    adapter = make_adapter(request.param, script.url)
    yield request.param, adapter, script
    await adapter.aclose()


# ------------------------------------------------------------------ submit


async def test_submit_429_is_transient_with_retry_after(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.answer(429, {"detail": "slow down"}, headers={"Retry-After": "12"})
    with pytest.raises(Transient) as caught:
        await adapter.submit(request_for(name), "job_key")
    assert caught.value.retry_after == 12.0
    assert_no_secret(caught.value)


@pytest.mark.parametrize("status", [400, 401, 403, 422])
async def test_submit_4xx_is_rejected(adapter_on_script, status):
    name, adapter, script = adapter_on_script
    # A provider that echoes what we sent must not make us leak it.
    script.handler = lambda seen: JSONResponse(
        {"detail": f"bad request from {seen.headers.get('authorization')} to http://x{seen.path}?token=zzz"},
        status_code=status,
    )
    with pytest.raises(Rejected) as caught:
        await adapter.submit(request_for(name), "job_key")
    assert str(status) in str(caught.value)
    assert_no_secret(caught.value)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_submit_5xx_is_uncertain(adapter_on_script, status):
    name, adapter, script = adapter_on_script
    script.answer(status, {"detail": "oops"})
    with pytest.raises(Uncertain):
        await adapter.submit(request_for(name), "job_key")


NGINX_502 = b"<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>"


@pytest.mark.parametrize("status, raw, headers, error", [
    (409, b'{"detail": "conflict"}', {}, Transient),  # fal_client's RETRY_CODES: 408, 409, 429
    (502, NGINX_502, {}, Transient),  # an ingress error: fal's app never saw the request
    (503, NGINX_502, {}, Transient),
    (504, NGINX_502, {}, Transient),
    (502, NGINX_502, {"x-fal-request-id": "req-1"}, Uncertain),  # fal's own server answered
    (502, b'{"detail": "bad gateway"}', {}, Uncertain),  # no ingress page: it may have been queued
    (500, NGINX_502, {}, Uncertain),
])
async def test_a_fal_submit_is_asked_again_where_fals_own_client_sends_it_again(script, status, raw, headers,
                                                                                 error):
    adapter = make_adapter("fal", script.url)
    try:
        script.answer(status, raw=raw, headers=headers)
        with pytest.raises(error):
            await adapter.submit(request_for("fal"), "job_key")
    finally:
        await adapter.aclose()


async def test_submit_garbage_2xx_is_uncertain(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.answer(200, raw=b"<html>gateway says hi</html>")
    with pytest.raises(Uncertain):
        await adapter.submit(request_for(name), "job_key")
    script.answer(200, {"nothing": "useful"})
    with pytest.raises(Uncertain):
        await adapter.submit(request_for(name), "job_key")


async def test_submit_read_timeout_is_uncertain_within_the_timeout(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.hang(SHORT_TIMEOUT_S + 0.5)
    started = time.monotonic()
    with pytest.raises(Uncertain):
        await adapter.submit(request_for(name), "job_key")
    assert time.monotonic() - started < SHORT_TIMEOUT_S + 1.5
    assert len(script.seen) == 1  # it was sent


@pytest.mark.parametrize("name", PROVIDERS)
async def test_submit_connection_dropped_after_sending_is_uncertain(name):
    server = DroppingServer()
    adapter = make_adapter(name, server.url)
    try:
        with pytest.raises(Uncertain):
            await adapter.submit(request_for(name), "job_key")
        assert server.requests == 1
    finally:
        await adapter.aclose()
        server.stop()


@pytest.mark.parametrize("name", PROVIDERS)
async def test_connection_refused_is_transient_everywhere(name, closed_port_url):
    adapter = make_adapter(name, closed_port_url)
    try:
        with pytest.raises(Transient):
            await adapter.submit(request_for(name), "job_key")
        with pytest.raises(Transient):
            await adapter.status(task_for(name))
        if name not in ("kie",):  # KIE has no cancel endpoint: a no-op
            with pytest.raises(Transient):
                await adapter.cancel(task_for(name))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ reads


@pytest.mark.parametrize("status", [401, 429, 500, 503])
async def test_status_failures_are_transient(adapter_on_script, status):
    name, adapter, script = adapter_on_script
    script.answer(status, {"detail": f"leak {TOKEN}"}, headers={"Retry-After": "3"})
    with pytest.raises(Transient) as caught:
        await adapter.status(task_for(name))
    if name != "sim":  # the simulator adapter holds no token to leak
        assert_no_secret(caught.value)


async def test_status_garbage_and_timeout_are_transient(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.answer(200, raw=b"not json")
    with pytest.raises(Transient):
        await adapter.status(task_for(name))
    script.hang(SHORT_TIMEOUT_S + 0.5)
    with pytest.raises(Transient):
        await adapter.status(task_for(name))


async def test_status_of_a_missing_task_is_rejected(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.answer(404, {"detail": "Not found."})
    # KIE's "no such task" is its body code (see test_kie_status_body_codes);
    # an HTTP 404 there is no statement about the task.
    with pytest.raises(Transient if name == "kie" else Rejected):
        await adapter.status(task_for(name))


async def test_cancel_of_a_missing_or_finished_task_is_not_an_error(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.answer(404, {"detail": "Not found."})
    await adapter.cancel(task_for(name))
    script.answer(409, {"detail": "already finished"})
    await adapter.cancel(task_for(name))
    script.answer(500, {"detail": "oops"})
    if name == "kie":
        await adapter.cancel(task_for(name))  # no endpoint: nothing is sent
        assert not [s for s in script.seen if "cancel" in s.path]
    else:
        with pytest.raises(Transient):
            await adapter.cancel(task_for(name))


# ------------------------------------------------------------------ wire details


async def test_auth_headers_per_provider(adapter_on_script):
    name, adapter, script = adapter_on_script
    script.answer(500, {})
    with pytest.raises(Uncertain):
        await adapter.submit(request_for(name), "job_key")
    headers = script.seen[-1].headers
    expected = {"sim": None, "replicate": f"Bearer {TOKEN}", "fal": f"Key {TOKEN}", "kie": f"Bearer {TOKEN}"}
    assert headers.get("authorization") == expected[name]
    if name == "sim":
        assert headers["idempotency-key"] == "job_key"


@pytest.mark.parametrize("code, error", [(422, Rejected), (402, Rejected), (401, Rejected), (501, Rejected),
                                         (429, Transient), (455, Transient), (500, Uncertain)])
async def test_kie_body_codes_under_http_200(script, code, error):
    adapter = make_adapter("kie", script.url)
    try:
        script.answer(200, {"code": code, "msg": f"no ({TOKEN})", "data": None})
        with pytest.raises(error) as caught:
            await adapter.submit(request_for("kie"), "job_key")
        assert_no_secret(caught.value)
    finally:
        await adapter.aclose()


async def test_kie_status_body_codes(script):
    adapter = make_adapter("kie", script.url)
    try:
        script.answer(200, {"code": 404, "msg": "task not found", "data": None})
        with pytest.raises(Rejected):
            await adapter.status(task_for("kie"))
        script.answer(200, {"code": 500, "message": f"server error ({TOKEN})", "data": None})
        with pytest.raises(Transient) as caught:
            await adapter.status(task_for("kie"))
        assert "server error" in str(caught.value)  # the current page's `message` is read too
        assert_no_secret(caught.value)
        assert script.seen[-1].query == {"taskId": "task-1"}
    finally:
        await adapter.aclose()


async def test_fal_result_errors_and_gateway_hiccups(script):
    adapter = make_adapter("fal", script.url)

    result: dict = {"status": 422, "body": {"detail": [{"loc": ["body", "prompt"], "msg": "field required"}]}}

    def handler(seen):
        if seen.path.endswith("/status"):
            return JSONResponse({"status": "COMPLETED"})
        if result["body"] is None:
            return Response("<html>bad gateway</html>", status_code=result["status"])
        return JSONResponse(result["body"], status_code=result["status"])

    script.handler = handler
    try:
        observation = await adapter.status(task_for("fal"))
        assert observation.state.value == "failed" and "field required" in observation.error
        assert script.seen[-1].path == "/fal-ai/flux/requests/task-1"
        for status, body in [(502, None), (500, {"detail": "oops", "error_type": "internal_error"}),
                             (401, {"detail": "bad key"}), (404, {"detail": "gone"})]:
            result.update(status=status, body=body)
            with pytest.raises(Transient):
                await adapter.status(task_for("fal"))
        result.update(status=504, body={"detail": "Request timed out", "error_type": "request_timeout"})
        observation = await adapter.status(task_for("fal"))
        assert observation.state.value == "failed" and observation.error == "Request timed out"
    finally:
        await adapter.aclose()


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40


@pytest.fixture
async def fal_result(script, tmp_path):
    """A COMPLETED fal request whose result answer is `script.result`."""
    def handler(seen):
        if seen.path.endswith("/status"):
            return JSONResponse({"status": "COMPLETED", "request_id": "task-1"})
        return JSONResponse(script.result)
    script.handler = handler
    adapter = FalProvider(script.url, TOKEN, jwks_url=script.url + "/jwks", timeout_s=SHORT_TIMEOUT_S,
                          spool_dir=str(tmp_path), max_output_bytes=len(PNG))
    yield adapter
    await adapter.aclose()


async def test_a_fal_file_sent_as_a_data_uri_is_written_out_as_the_file(script, fal_result, tmp_path):
    """`sync_mode` (fal's model schemas: "the media will be returned as a
    data URI"): each data URI under a `url` key is the file, its declared
    type kept; http URLs beside it are still downloaded."""
    import base64
    import hashlib
    encoded = base64.b64encode(PNG).decode()
    script.result = {"images": [{"url": f"data:image/png;base64,{encoded}", "width": 8},
                                {"url": "https://v3.fal.media/files/a/b.png"}],
                     "audio": {"url": f"data:audio/mpeg;name=x.mp3;base64,{encoded}"}, "seed": 3}
    seen = await fal_result.status(task_for("fal"))
    assert seen.state is TaskState.SUCCEEDED and seen.values == ()
    assert seen.output_urls == ("https://v3.fal.media/files/a/b.png",)
    assert [(f.bytes, f.sha256, f.content_type) for f in seen.files] == \
        [(len(PNG), hashlib.sha256(PNG).hexdigest(), "image/png"), (len(PNG), hashlib.sha256(PNG).hexdigest(),
                                                                    "audio/mpeg")]
    assert [open(f.path, "rb").read() == PNG for f in seen.files] == [True, True]
    for f in seen.files:
        os.unlink(f.path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("url, outcome", [
    ("data:image/png;base64,%%%not-base64", TaskState.FAILED),  # asking again cannot help
    ("data:image/png;base64," + "QUFB" * 4000, OutputTooLarge),  # over the byte cap
])
async def test_a_fal_data_uri_that_cannot_be_the_file(script, fal_result, tmp_path, url, outcome):
    script.result = {"image": {"url": url}}
    if outcome is OutputTooLarge:
        with pytest.raises(OutputTooLarge):
            await fal_result.status(task_for("fal"))
    else:
        seen = await fal_result.status(task_for("fal"))
        assert seen.state is outcome and "data URI" in (seen.error or "")
    assert os.listdir(tmp_path) == []
