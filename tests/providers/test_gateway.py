"""The AI Gateway adapter: its pure readings of the documented answers (the
fixtures of @ai-sdk/gateway's own tests), then the adapter over real HTTP —
against the simulator's /gateway protocol, and a scripted Gateway on
loopback for what the simulator never answers (`uploaded` videos, a cost,
an echoed key)."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import time
from pathlib import Path

import httpx
import pytest
from starlette.responses import JSONResponse

from app.download_errors import OutputTooLarge
from app.providers.base import (
    Observation,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    Usage,
    UsageUnit,
    WebhookRequest,
)
from app.providers.gateway import (
    NO_VIDEO,
    UPLOADED,
    Completed,
    GatewayProvider,
    Video,
    operation_for,
    operation_id,
    read_status,
    start_body,
    submitted_from_start,
    usage_of,
    video_model,
)
from app.providers.http import Secrets, read_failure
from app.providers.inline import Spilled
from app.signing.webhooks import sign_tv1
from app.simulator import output_sha256
from tests.download.download_servers import PeakRss
from tests.support.simulator import RunningSimulator, clear_faults, set_faults, stats

MiB = 1024 * 1024
KEY = "vck_gateway_test_key_0123456789"
MODEL = "klingai/kling-v3.0-t2v"
INLINE_MODEL = "google/veo-3.1-generate-001"  # the simulator answers base64 videos for google/
TIMEOUT_S = 1.5
NO_SECRETS = Secrets(KEY)

# The documented answers, as @ai-sdk/gateway's tests write them:
# https://github.com/vercel/ai/blob/main/packages/gateway/src/gateway-video-model.test.ts (doStart, doStatus)
START_FIXTURE = {"operation": {"gatewayJobId": "job_123"},
                 "warnings": [{"type": "other", "message": "queued"}],
                 "providerMetadata": {"gateway": {"asyncJob": {"jobId": "job_123", "status": "queued"}}}}
PENDING_FIXTURE = {"status": "pending",
                   "providerMetadata": {"gateway": {"asyncJob": {"jobId": "job_123", "status": "running"}}}}
COMPLETED_FIXTURE = {"status": "completed",
                     "videos": [{"type": "url", "url": "https://cdn.example.com/v.mp4", "mediaType": "video/mp4"}],
                     "warnings": [{"type": "other", "message": "complete"}],
                     "providerMetadata": {"gateway": {"asyncJob": {"jobId": "job_123", "result": {"expiresAt": 1234},
                                                                   "status": "completed"}}}}
ERROR_FIXTURE = {"status": "error", "error": "Async video job failed"}
CANCELLED_FIXTURE = {"status": "cancelled",
                     "providerMetadata": {"gateway": {"asyncJob": {"jobId": "job_123", "status": "cancelled"}}}}
# The `uploaded` form: gatewayVideoDataSchema in @ai-sdk/gateway 4.0.146 (CHANGELOG: "Accept explicit
# uploaded-video outcomes in video generation and status responses").
UPLOADED_VIDEO = {"type": "uploaded", "mediaType": "video/mp4"}
# providerMetadata of a blocking result with its cost (the same test file, "should return provider metadata").
COST_METADATA = {"fal": {"videos": [{"duration": 5.0, "fps": 24, "width": 1280, "height": 720}]},
                 "gateway": {"routing": {"provider": "fal"}, "cost": "0.15"}}
# The documented error body (packages/gateway/src/errors/create-gateway-error.ts).
ERROR_BODY = {"error": {"message": "Invalid request", "type": "invalid_request_error", "param": None,
                        "code": "invalid_request"}, "generationId": "gen_01"}


# ------------------------------------------------------------------ pure


@pytest.mark.parametrize("model,ok", [
    ("klingai/kling-v3.0-t2v", True), ("fal/luma-ray-2", True), ("google/veo-3.1-generate-001", True),
    ("veo", False), ("", False), ("google/veo 3", False), ("google/veo\n3", False), ("/veo", False),
    ("google/", False), ("gööglé/veo", False),
])
def test_a_model_is_a_gateway_model_id(model, ok):
    if ok:
        assert video_model(model) == model
    else:
        with pytest.raises(Rejected):
            video_model(model)


def test_the_start_body_is_the_input_and_our_callback():
    job_input = {"prompt": "A beautiful sunset", "n": 2, "duration": 5, "aspectRatio": "16:9",
                 "image": {"type": "url", "url": "https://example.com/a.png"}, "providerOptions": {"gateway": {}}}
    assert start_body(job_input, None) == job_input
    assert start_body(job_input, "https://us.example/webhooks/gateway/job_1?token=t") == {
        **job_input, "callbackUrl": "https://us.example/webhooks/gateway/job_1?token=t"}
    with pytest.raises(Rejected, match="callbackUrl"):
        start_body({"prompt": "x", "callbackUrl": "https://elsewhere.example/hook"}, None)


@pytest.mark.parametrize("answer,expected", [
    (START_FIXTURE, Submitted("job_123", {"operation": {"gatewayJobId": "job_123"}})),
    ({"operation": {"gatewayJobId": "job_123"}},  # the SDK test's start without metadata
     Submitted('{"gatewayJobId":"job_123"}', {"operation": {"gatewayJobId": "job_123"}})),
    ({"operation": {"b": 1, "a": [2]}, "providerMetadata": None},
     Submitted('{"a":[2],"b":1}', {"operation": {"b": 1, "a": [2]}})),
    ({"operation": "op-1", "providerMetadata": {"gateway": {"asyncJob": {
        "jobId": "job_9", "status": "queued", "webhookSigningSecret": "whs_per_job"}}}},
     Submitted("job_9", {"operation": "op-1"}, webhook_secret="whs_per_job")),
    ({"operation": {"x": 1}, "providerMetadata": {"gateway": {"asyncJob": {"jobId": "has a space"}}}},
     Submitted('{"x":1}', {"operation": {"x": 1}})),
])
def test_a_start_answer_is_stored_as_its_operation_task_id_and_secret(answer, expected):
    assert submitted_from_start(answer) == expected


@pytest.mark.parametrize("answer", [{}, {"operation": None}, {"providerMetadata": {}}])
def test_a_start_answer_without_an_operation_is_uncertain(answer):
    with pytest.raises(Uncertain):
        submitted_from_start(answer)


@pytest.mark.parametrize("task,operation", [
    (Task("job_123", {"operation": {"gatewayJobId": "job_123"}}), {"gatewayJobId": "job_123"}),
    (Task("job_123", {"operation": "opaque"}), "opaque"),
    (Task("job_123", None), {"gatewayJobId": "job_123"}),  # an operator's resolve: the id alone
    (Task("job_123", {}), {"gatewayJobId": "job_123"}),
    (Task('{"a":[2],"b":1}', None), {"a": [2], "b": 1}),  # operation_id's own form
    (Task("{not json", None), {"gatewayJobId": "{not json"}),
    (Task("123", None), {"gatewayJobId": "123"}),
])
def test_the_operation_asked_about_is_the_stored_one_else_the_one_the_id_names(task, operation):
    assert operation_for(task) == operation


def test_an_operations_id_does_not_depend_on_key_order():
    assert operation_id({"a": 1, "b": {"c": 2, "d": 3}}) == operation_id({"b": {"d": 3, "c": 2}, "a": 1})


@pytest.mark.parametrize("answer,expected", [
    (PENDING_FIXTURE, Observation(state=TaskState.RUNNING)),
    ({"status": "pending"}, Observation(state=TaskState.RUNNING)),
    (COMPLETED_FIXTURE, Completed((Video("video/mp4", url="https://cdn.example.com/v.mp4"),))),
    ({"status": "completed", "videos": [{"type": "base64", "data": "AAAA", "mediaType": "video/mp4"}],
      "providerMetadata": COST_METADATA},
     Completed((Video("video/mp4", data="AAAA"),), (Usage(UsageUnit.USD, 0.15),))),
    (ERROR_FIXTURE, Observation(state=TaskState.FAILED, error="Async video job failed")),
    (CANCELLED_FIXTURE, Observation(state=TaskState.CANCELLED,
                                    error="the Gateway reports the video generation cancelled")),
    ({"status": "completed", "videos": [UPLOADED_VIDEO]}, Observation(state=TaskState.FAILED, error=UPLOADED)),
    ({"status": "completed", "videos": [COMPLETED_FIXTURE["videos"][0], UPLOADED_VIDEO]},
     Observation(state=TaskState.FAILED, error=UPLOADED)),
    ({"status": "completed", "videos": []}, Observation(state=TaskState.FAILED, error=NO_VIDEO)),
    ({"status": "completed"}, Observation(state=TaskState.FAILED, error=NO_VIDEO)),
    ({"status": "completed", "videos": [{"type": "hologram", "mediaType": "video/mp4"}]},
     Observation(state=TaskState.FAILED, error="the Gateway answered a video of unknown type 'hologram'")),
    ({"status": "completed", "videos": [{"type": "url", "url": "ftp://x/v.mp4", "mediaType": "video/mp4"}]},
     Observation(state=TaskState.FAILED, error="the Gateway answered a video URL that is not http(s)")),
    ({"status": "error", "error": f"bad key Bearer {KEY}"}, Observation(state=TaskState.FAILED,
                                                                       error="bad key Bearer [redacted]")),
    ({"status": "error", "error": Spilled("/tmp/x", 70_000)},
     Observation(state=TaskState.FAILED, error="the video generation failed")),
])
def test_a_status_answer_reads_as_documented(answer, expected):
    assert read_status(answer, NO_SECRETS) == expected


@pytest.mark.parametrize("answer", [{"status": "exploded"}, {}, [], "completed"])
def test_an_unknown_status_answer_is_asked_again(answer):
    with pytest.raises(Transient):
        read_status(answer, NO_SECRETS)


@pytest.mark.parametrize("gateway,expected", [
    ({"cost": "0.15"}, (Usage(UsageUnit.USD, 0.15),)), ({"cost": "0"}, (Usage(UsageUnit.USD, 0.0),)),
    ({"cost": 0.2}, (Usage(UsageUnit.USD, 0.2),)), ({}, ()), ({"cost": None}, ()), ({"cost": "free"}, ()),
    ({"cost": "-1"}, ()), ({"cost": "nan"}, ()), ({"cost": True}, ()),
])
def test_the_gateways_cost_is_usage_in_usd(gateway, expected):
    assert usage_of({"providerMetadata": {"gateway": gateway}}) == expected


def _response(status: int, body: dict, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


@pytest.mark.parametrize("status,retry_after,kind,hint", [
    (404, None, Rejected, None), (429, "1", Transient, 1.0), (503, "7", Transient, 7.0),
    (500, "7", Transient, None), (401, None, Transient, None), (400, None, Transient, None),
])
def test_a_failed_status_call_is_no_such_job_or_asked_again(status, retry_after, kind, hint):
    headers = {"retry-after": retry_after} if retry_after else {}
    error = read_failure(_response(status, ERROR_BODY, **headers), "gateway", secrets=NO_SECRETS,
                         not_found="no such video job")
    assert type(error) is kind and f"HTTP {status}" in str(error) and "Invalid request" in str(error)
    if isinstance(error, Transient):
        assert error.retry_after == hint


def test_a_failed_calls_message_never_carries_the_key():
    echoed = {"error": {"message": f"bad Authorization: Bearer {KEY}", "type": "authentication_error"}}
    assert KEY not in str(read_failure(_response(401, echoed), "gateway", secrets=Secrets(KEY)))


# ------------------------------------------------------------------ over HTTP, against the simulator


@pytest.fixture(scope="module")
def simulator():
    with RunningSimulator() as sim:
        yield sim.url


@pytest.fixture
async def gateway(simulator, tmp_path):
    clear_faults(simulator)
    adapter = GatewayProvider(f"{simulator}/gateway/v4/ai", KEY, timeout_s=TIMEOUT_S, spool_dir=str(tmp_path))
    yield adapter
    await adapter.aclose()
    clear_faults(simulator)


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def request_for(model: str = MODEL, callback: str | None = None, **input) -> SubmitRequest:
    job_id = new_job_id()
    return SubmitRequest(job_id=job_id, model=model, input={"prompt": f"a cat for {job_id}", **input},
                         callback_url=f"{callback}/webhooks/gateway/{job_id}?token=tok_{job_id}" if callback else None)


def task_of(request: SubmitRequest, submitted: Submitted) -> Task:
    return Task(task_id=submitted.task_id, operation=submitted.operation, model=request.model)


async def final(adapter: GatewayProvider, task: Task, timeout_s: float = 10.0) -> Observation:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await adapter.status(task)
        if seen.state is not TaskState.RUNNING or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.05)


async def test_a_job_runs_then_succeeds_with_its_n_url_videos(gateway, simulator):
    request = request_for(n=3, duration_s=0.3, output_bytes=2000)
    submitted = await gateway.submit(request, request.job_id)
    assert submitted.task_id.startswith("gwjob_") and submitted.webhook_secret is None  # no callback: no secret
    assert submitted.operation == {"operation": {"gatewayJobId": submitted.task_id}}
    task = task_of(request, submitted)
    assert (await gateway.status(task)).state is TaskState.RUNNING
    seen = await final(gateway, task)
    assert seen.state is TaskState.SUCCEEDED and seen.files == () and seen.error is None
    assert seen.output_urls == tuple(f"{simulator}/outputs/{submitted.task_id}/{i}" for i in range(3))
    async with httpx.AsyncClient(trust_env=False) as client:
        for index, url in enumerate(seen.output_urls):
            body = (await client.get(url)).content
            assert hashlib.sha256(body).hexdigest() == output_sha256(submitted.task_id, index, 2000)


async def test_a_google_model_answers_its_videos_inline_and_they_are_written_to_files(gateway, tmp_path):
    request = request_for(INLINE_MODEL, n=2, duration_s=0, output_bytes=300_001)
    submitted = await gateway.submit(request, request.job_id)
    seen = await final(gateway, task_of(request, submitted))
    assert seen.state is TaskState.SUCCEEDED and seen.output_urls == ()
    assert [(f.bytes, f.sha256, f.content_type, f.label) for f in seen.files] == [
        (300_001, output_sha256(submitted.task_id, i, 300_001), "video/mp4", None) for i in range(2)]
    for file in seen.files:
        assert Path(file.path).parent == tmp_path
        assert hashlib.sha256(Path(file.path).read_bytes()).hexdigest() == file.sha256
        os.unlink(file.path)
    assert os.listdir(tmp_path) == []  # the spooled answer is gone with it


async def test_a_small_inline_video_is_written_like_a_long_one(gateway, tmp_path):
    request = request_for(INLINE_MODEL, duration_s=0, output_bytes=10)  # a 16-character string: never spilled
    submitted = await gateway.submit(request, request.job_id)
    seen = await final(gateway, task_of(request, submitted))
    (file,) = seen.files
    assert (file.bytes, file.sha256) == (10, output_sha256(submitted.task_id, 0, 10))
    os.unlink(file.path)
    assert os.listdir(tmp_path) == []


async def test_an_inline_video_over_the_cap_fails_the_job_and_leaves_no_file(simulator, tmp_path):
    adapter = GatewayProvider(f"{simulator}/gateway/v4/ai", KEY, timeout_s=TIMEOUT_S, spool_dir=str(tmp_path),
                              max_output_bytes=100_000)
    try:
        for size in (100_001, 1_000_000):  # just over (decoded), far over (stops reading)
            request = request_for(INLINE_MODEL, duration_s=0, output_bytes=size)
            submitted = await adapter.submit(request, request.job_id)
            # Over the cap: the settle step fails the job output_too_large.
            with pytest.raises(OutputTooLarge, match="100000 byte cap"):
                await final(adapter, task_of(request, submitted))
            assert os.listdir(tmp_path) == []
    finally:
        await adapter.aclose()


async def test_a_50_mib_inline_video_is_read_with_flat_memory(simulator, tmp_path):
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc to sample memory")
    size = 50 * MiB
    adapter = GatewayProvider(f"{simulator}/gateway/v4/ai", KEY, timeout_s=10, spool_dir=str(tmp_path),
                              max_output_bytes=size)
    try:
        request = request_for(INLINE_MODEL, duration_s=0, output_bytes=size)
        submitted = await adapter.submit(request, request.job_id)
        with PeakRss() as rss:
            seen = await adapter.status(task_of(request, submitted))
        (file,) = seen.files
        assert (file.bytes, file.sha256) == (size, output_sha256(submitted.task_id, 0, size))
        assert rss.growth < 24 * MiB, f"resident memory grew by {rss.growth / MiB:.1f} MiB"
        os.unlink(file.path)
    finally:
        await adapter.aclose()


async def test_a_failed_job_is_failed_with_the_gateways_reason(gateway):
    request = request_for(duration_s=0, outcome="failed")
    submitted = await gateway.submit(request, request.job_id)
    seen = await final(gateway, task_of(request, submitted))
    assert seen == Observation(state=TaskState.FAILED, error="simulated failure (input.outcome = 'failed')")


async def test_a_lost_start_answer_is_sent_again_and_answers_the_same_job(gateway, simulator, receiver):
    set_faults(simulator, submit_timeout_after_create=1)
    request = request_for(callback=receiver.url, duration_s=30)
    started = time.monotonic()
    with pytest.raises(Uncertain):
        await gateway.submit(request, request.job_id)
    assert time.monotonic() - started < TIMEOUT_S + 2
    clear_faults(simulator)
    again = await gateway.submit(request, request.job_id)
    # The same job; the replay names no signing secret (the simulator's reading: start-response-only).
    assert again.webhook_secret is None
    assert (await gateway.status(task_of(request, again))).state is TaskState.RUNNING
    counts = stats(simulator)
    assert counts["creates_by_idempotency_key"][request.job_id] == 1
    assert counts["creates_by_callback_url"][request.callback_url.partition("?")[0]] == 1


async def test_a_start_the_gateway_failed_is_uncertain_and_creates_nothing(gateway, simulator):
    set_faults(simulator, submit_error=1)
    before = stats(simulator)["tasks_created"]
    request = request_for()
    with pytest.raises(Uncertain, match="HTTP 500"):
        await gateway.submit(request, request.job_id)
    assert stats(simulator)["tasks_created"] == before


async def test_throttle_is_transient_with_the_gateways_retry_after(gateway, simulator):
    request = request_for(duration_s=5)
    submitted = await gateway.submit(request, request.job_id)
    set_faults(simulator, throttle=1)
    with pytest.raises(Transient) as on_submit:
        await gateway.submit(request_for(), new_job_id())
    with pytest.raises(Transient) as on_status:
        await gateway.status(task_of(request, submitted))
    assert on_submit.value.retry_after == on_status.value.retry_after == 1.0
    assert "429" in str(on_submit.value) and "Rate limit exceeded" in str(on_status.value)


async def test_a_status_error_is_transient(gateway, simulator):
    request = request_for(duration_s=5)
    submitted = await gateway.submit(request, request.job_id)
    set_faults(simulator, status_error=1)
    with pytest.raises(Transient, match="HTTP 500"):
        await gateway.status(task_of(request, submitted))


async def test_an_invalid_request_is_rejected_and_creates_nothing(gateway, simulator):
    before = stats(simulator)["tasks_created"]
    request = request_for(duration_s="soon")
    with pytest.raises(Rejected, match="duration_s"):
        await gateway.submit(request, request.job_id)
    assert stats(simulator)["tasks_created"] == before


async def test_an_unknown_job_is_rejected(gateway):
    with pytest.raises(Rejected, match="HTTP 404"):
        await gateway.status(Task("gwjob_nosuchjob", {"operation": {"gatewayJobId": "gwjob_nosuchjob"}}, MODEL))
    with pytest.raises(Rejected, match="HTTP 404"):
        await gateway.status(Task("gwjob_nosuchjob", None, MODEL))


async def test_a_job_without_its_stored_operation_is_asked_by_its_task_id(gateway):
    request = request_for(duration_s=5)
    submitted = await gateway.submit(request, request.job_id)
    assert (await gateway.status(Task(submitted.task_id, None, MODEL))).state is TaskState.RUNNING


async def test_a_wrong_key_is_rejected_at_start(simulator):
    adapter = GatewayProvider(f"{simulator}/gateway/v4/ai", None, timeout_s=TIMEOUT_S)
    try:
        request = request_for()
        with pytest.raises(Rejected, match="HTTP 401"):
            await adapter.submit(request, request.job_id)
    finally:
        await adapter.aclose()


async def test_the_webhook_verifies_with_the_jobs_secret_only(gateway, receiver):
    request = request_for(callback=receiver.url, duration_s=0.2)
    submitted = await gateway.submit(request, request.job_id)
    assert submitted.webhook_secret
    arrival = await receiver.wait_for(f"/webhooks/gateway/{request.job_id}")
    assert json.loads(arrival.body) == {"type": "video.generation.completed"}
    hook = WebhookRequest(request.job_id, arrival.headers, arrival.query, arrival.body, submitted.webhook_secret)
    assert await gateway.verify(hook)
    changed = arrival.body[:-2] + bytes([arrival.body[-2] ^ 1]) + arrival.body[-1:]
    assert not await gateway.verify(WebhookRequest(hook.job_id, hook.headers, hook.query, changed, hook.job_secret))
    for secret in (None, "", "another-jobs-secret"):
        assert not await gateway.verify(WebhookRequest(hook.job_id, hook.headers, hook.query, hook.raw_body, secret))
    # The same scheme, signed by us: within 300 s passes, outside it does not.
    body = b'{"type":"video.generation.failed"}'
    for age, ok in ((290, True), (-290, True), (310, False), (-310, False)):
        signed = {"x-ai-gateway-signature": sign_tv1(submitted.webhook_secret, body, int(time.time()) - age)}
        assert await gateway.verify(WebhookRequest(hook.job_id, signed, {}, body, submitted.webhook_secret)) is ok
    assert not await gateway.verify(WebhookRequest(hook.job_id, {"x-signature": signed["x-ai-gateway-signature"]},
                                                   {}, body, submitted.webhook_secret))


async def test_connection_refused_is_transient(closed_port_url):
    adapter = GatewayProvider(closed_port_url, KEY, timeout_s=TIMEOUT_S)
    try:
        request = request_for()
        with pytest.raises(Transient):
            await adapter.submit(request, request.job_id)
        with pytest.raises(Transient):
            await adapter.status(Task("t", {"operation": {"gatewayJobId": "t"}}, MODEL))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ over HTTP, a scripted Gateway


@pytest.fixture
async def scripted(script, tmp_path):
    adapter = GatewayProvider(script.url, KEY, timeout_s=TIMEOUT_S, spool_dir=str(tmp_path))
    yield adapter, script
    await adapter.aclose()


async def test_start_and_status_send_what_the_sdk_sends(scripted):
    adapter, script = scripted
    script.answer(200, START_FIXTURE)
    request = request_for(callback="https://us.example", n=2, duration=5, aspectRatio="16:9")
    submitted = await adapter.submit(request, request.job_id)
    assert submitted == Submitted("job_123", {"operation": {"gatewayJobId": "job_123"}})
    script.answer(200, PENDING_FIXTURE)
    assert (await adapter.status(task_of(request, submitted))).state is TaskState.RUNNING
    start, status = script.seen
    assert (start.method, start.path, status.method, status.path) == ("POST", "/video-model/start",
                                                                      "POST", "/video-model/status")
    for seen in (start, status):
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        assert seen.headers["ai-gateway-protocol-version"] == "0.0.1"
        assert seen.headers["ai-gateway-auth-method"] == "api-key"
        assert seen.headers["ai-video-model-specification-version"] == "4"
        assert seen.headers["ai-model-id"] == MODEL
    assert start.headers["idempotency-key"] == request.job_id and "idempotency-key" not in status.headers
    assert json.loads(start.body) == {**request.input, "callbackUrl": request.callback_url}
    assert json.loads(status.body) == {"operation": {"gatewayJobId": "job_123"}}


async def test_an_uploaded_video_fails_the_job_nothing_to_copy(scripted):
    adapter, script = scripted
    script.answer(200, {"status": "completed", "videos": [UPLOADED_VIDEO]})
    seen = await adapter.status(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))
    assert seen == Observation(state=TaskState.FAILED, error=UPLOADED)


async def test_a_cost_is_usage_and_base64_and_url_videos_are_both_outputs(scripted, tmp_path):
    adapter, script = scripted
    video = b"\x00\x01mp4 bytes\xff" * 10
    script.answer(200, {"status": "completed", "providerMetadata": COST_METADATA, "videos": [
        {"type": "url", "url": "https://cdn.example.com/v.mp4", "mediaType": "video/mp4"},
        {"type": "base64", "data": base64.b64encode(video).decode(), "mediaType": "video/webm"}]})
    seen = await adapter.status(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))
    assert seen.output_urls == ("https://cdn.example.com/v.mp4",) and seen.usage == (Usage(UsageUnit.USD, 0.15),)
    (file,) = seen.files
    assert (file.bytes, file.sha256, file.content_type) == (len(video), hashlib.sha256(video).hexdigest(),
                                                            "video/webm")
    os.unlink(file.path)


@pytest.mark.parametrize("data", ["not base64!", "QUJD\\u0041"])
async def test_inline_data_that_is_not_base64_fails_the_job(scripted, tmp_path, data):
    adapter, script = scripted
    script.answer(200, {"status": "completed", "videos": [{"type": "base64", "data": data, "mediaType": "video/mp4"}]})
    seen = await adapter.status(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))
    assert seen.state is TaskState.FAILED and "base64" in (seen.error or "")
    assert os.listdir(tmp_path) == []


async def test_a_garbled_answer_is_asked_again(scripted):
    adapter, script = scripted
    script.answer(200, raw=b'{"status": "completed", "videos": [')
    with pytest.raises(Transient, match="not JSON"):
        await adapter.status(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))


async def test_the_key_and_the_callback_token_never_reach_a_message(scripted):
    adapter, script = scripted
    request = request_for(callback="https://us.example")
    token = request.callback_url.partition("token=")[2]

    def echo(seen):
        # A Gateway repeating what it was sent: the key, and (to a start) the callback URL and its token.
        sent = json.loads(seen.body)
        echoed = f"denied {seen.headers.get('authorization')}"
        if "callbackUrl" in sent:
            echoed += f" for {sent['callbackUrl']} (token {token})"
        return JSONResponse({"error": {"message": echoed, "type": "forbidden"}}, status_code=403)

    script.handler = echo
    with pytest.raises(Rejected) as on_submit:
        await adapter.submit(request, request.job_id)
    with pytest.raises(Transient) as on_status:
        await adapter.status(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))
    assert "token [redacted]" in str(on_submit.value)
    for error in (on_submit.value, on_status.value):
        assert KEY not in str(error) and token not in str(error) and "denied Bearer [redacted]" in str(error)


async def test_a_409_to_a_start_is_asked_again_with_the_same_key(scripted):
    """Vercel's client retries a 409 (its GatewayError's retryable codes):
    the first start with that key may still be being made; failing the job
    would refund it while that start runs."""
    adapter, script = scripted
    script.answer(409, {"error": {"message": "a request with this idempotency key is in progress",
                                  "type": "conflict"}})
    with pytest.raises(Transient, match="HTTP 409"):
        await adapter.submit(request_for(), "job_key")


async def test_a_huge_error_answer_is_read_only_so_far(scripted):
    adapter, script = scripted
    script.answer(502, raw=b"x" * (4 * MiB))
    with pytest.raises(Transient, match="HTTP 502") as caught:
        await adapter.status(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))
    assert len(str(caught.value)) < 300


async def test_cancel_makes_no_call(scripted):
    adapter, script = scripted
    assert not adapter.facts.can_cancel
    await adapter.cancel(Task("job_123", {"operation": {"gatewayJobId": "job_123"}}, MODEL))
    assert script.seen == []


async def test_an_input_naming_its_own_callback_is_rejected_before_any_call(scripted):
    adapter, script = scripted
    request = SubmitRequest(new_job_id(), MODEL, {"prompt": "x", "callbackUrl": "https://else.example"}, None)
    with pytest.raises(Rejected, match="callbackUrl"):
        await adapter.submit(request, request.job_id)
    assert script.seen == []


def test_the_facts():
    facts = GatewayProvider("https://ai-gateway.vercel.sh/v4/ai", KEY).facts
    assert (facts.webhook_scheme, facts.idempotent_submit, facts.can_find, facts.can_cancel) == (
        "t/v1", True, False, False)
    assert facts.outputs_from_any_host and facts.credential_hosts == ()
    assert facts.stale_after_s == 300.0 and 10.0 <= min(facts.poll_delays_s) <= max(facts.poll_delays_s) <= 30.0
    assert GatewayProvider("https://ai-gateway.vercel.sh/v4/ai", KEY).download_credentials() == {}
