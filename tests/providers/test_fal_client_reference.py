"""fal's own Python client (fal-client) against the simulator's /fal
protocol, and against our adapter: the simulator must say what fal-client
can parse, at the URLs fal-client addresses, and a request one side made
must be readable by the other. fal-client is only a reference here; it
retries POSTs, so longcall never submits with it.

fal-client has no base-URL option: its module constants QUEUE_URL_FORMAT
and RUN_URL_FORMAT are read at call time, so they are pointed at the
simulator's /fal/ prefix for each test."""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Iterator

import fal_client
import fal_client.client as fal_wire
import httpx
import pytest

from app.providers.base import Observation, Rejected, SubmitRequest, Submitted, Task, TaskState
from app.providers.fal import FalProvider, queue_root
from app.simulator import output_sha256
from app.simulator.fal import queue_root as simulator_queue_root
from tests.support.simulator import RunningSimulator, clear_faults, stats

KEY = "fal-reference-key"
# (endpoint id, the queue root fal-client addresses its requests under)
ENDPOINTS = [("fal-ai/flux/dev", "fal-ai/flux"), ("workflows/me/wf/sub/path", "workflows/me/wf")]
POLL_S = 0.05


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    with RunningSimulator() as sim:
        yield sim.url


@pytest.fixture(autouse=True)
def _fal_points_at_the_simulator(simulator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fal_wire, "QUEUE_URL_FORMAT", f"{simulator}/fal/")
    monkeypatch.setattr(fal_wire, "RUN_URL_FORMAT", f"{simulator}/fal/")
    # fal-client's httpx clients trust the environment: no proxy between
    # them and the loopback simulator, and no credentials but ours.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "FAL_KEY", "FAL_KEY_ID", "FAL_KEY_SECRET", "FAL_FORCE_AUTH_BY_USER"):
        monkeypatch.delenv(name, raising=False)
    clear_faults(simulator)


@pytest.fixture
def fal() -> Iterator[fal_client.SyncClient]:
    client = fal_client.SyncClient(key=KEY)
    yield client
    # SyncClient has no close(); its httpx client is a cached property.
    http = vars(client).get("_client")
    if http is not None:
        http.close()


def ours(simulator: str) -> FalProvider:
    return FalProvider(f"{simulator}/fal", KEY, jwks_url=f"{simulator}/fal/.well-known/jwks.json")


def adapter_submit(simulator: str, model: str, input: dict) -> Submitted:
    async def go() -> Submitted:
        adapter = ours(simulator)
        try:
            request = SubmitRequest(job_id="job_" + secrets.token_hex(8), model=model, input=input, callback_url=None)
            return await adapter.submit(request, request.job_id)
        finally:
            await adapter.aclose()

    return asyncio.run(go())


def adapter_final(simulator: str, task: Task, timeout_s: float = 10.0) -> Observation:
    """Our adapter's status calls until the task is no longer running."""
    async def go() -> Observation:
        adapter = ours(simulator)
        try:
            deadline = time.monotonic() + timeout_s
            while (observation := await adapter.status(task)).state is TaskState.RUNNING:
                assert time.monotonic() < deadline, "the task did not finish"
                await asyncio.sleep(POLL_S)
            return observation
        finally:
            await adapter.aclose()

    return asyncio.run(go())


def adapter_cancel(simulator: str, task: Task) -> None:
    async def go() -> None:
        adapter = ours(simulator)
        try:
            await adapter.cancel(task)
        finally:
            await adapter.aclose()

    asyncio.run(go())


def final_status(handle: fal_client.SyncRequestHandle, with_logs: bool = False) -> list[fal_client.Status]:
    """Every status fal-client parses until Completed (it raises on any
    answer it cannot parse)."""
    seen = []
    deadline = time.monotonic() + 10
    for status in handle.iter_events(with_logs=with_logs, interval=POLL_S):
        seen.append(status)
        assert time.monotonic() < deadline, "the request did not complete"
    return seen


def image_urls(result: dict) -> list[str]:
    return [image["url"] for image in result["images"]]


# ------------------------------------------------------------------ addressing


@pytest.mark.parametrize("endpoint", [
    "fal-ai/flux/dev", "fal-ai/flux", "fal-ai/kling-video/v2/master/text-to-video", "workflows/me/wf",
    "workflows/me/wf/sub/path", "comfy/me/wf/x", "123-myapp", "1714827-joke-v2", "me/workflows/x",
])
def test_our_queue_root_is_fal_clients(endpoint):
    app = fal_wire.AppId.from_endpoint_id(endpoint)
    theirs = "/".join(part for part in (app.namespace, app.owner, app.alias) if part)
    assert queue_root(endpoint) == theirs
    assert simulator_queue_root(endpoint) == theirs


@pytest.mark.parametrize("endpoint", ["flux", "workflows/me", "comfy/me"])
def test_ids_fal_client_cannot_address_are_rejected_before_anything_is_sent(simulator, endpoint):
    with pytest.raises((ValueError, IndexError)):
        fal_wire.AppId.from_endpoint_id(endpoint)
    before = stats(simulator)["tasks_created"]
    with pytest.raises(Rejected, match="fal endpoint id"):
        adapter_submit(simulator, endpoint, {})
    assert simulator_queue_root(endpoint) is None
    assert stats(simulator)["tasks_created"] == before


# ------------------------------------------------------------------ fal-client alone


@pytest.mark.parametrize("endpoint, root", ENDPOINTS)
def test_a_request_goes_through_every_status_fal_client_knows(simulator, fal, endpoint, root):
    handle = fal.submit(endpoint, {"duration_s": 5, "outputs": 2, "output_bytes": 64})
    assert handle.status_url == f"{simulator}/fal/{root}/requests/{handle.request_id}/status"
    assert handle.response_url == f"{simulator}/fal/{root}/requests/{handle.request_id}"
    assert handle.cancel_url == f"{simulator}/fal/{root}/requests/{handle.request_id}/cancel"

    seen = final_status(handle, with_logs=True)
    kinds = [type(status) for status in seen]
    # Queued for the first 10% of its 5 s, then in progress for 4.5 s: polled every 50 ms, a
    # margin no loaded machine eats (a poll is a loopback round trip).
    assert fal_client.InProgress in kinds and kinds[-1] is fal_client.Completed
    assert set(kinds) <= {fal_client.Queued, fal_client.InProgress, fal_client.Completed}
    assert all(status.logs == [] for status in seen if not isinstance(status, fal_client.Queued))
    done = seen[-1]
    assert isinstance(done, fal_client.Completed) and done.error is None and done.error_type is None
    assert done.metrics["inference_time"] > 0

    result = handle.get(interval=POLL_S)
    assert fal.result(endpoint, handle.request_id) == result  # addressed by fal-client's own rule
    assert len(result["images"]) == 2
    for index, url in enumerate(image_urls(result)):
        body = httpx.get(url, trust_env=False).content
        assert hashlib.sha256(body).hexdigest() == output_sha256(handle.request_id, index, 64)


@pytest.mark.parametrize("endpoint, root", ENDPOINTS)
def test_fal_client_cancels_a_queued_request(simulator, fal, endpoint, root):
    handle = fal.submit(endpoint, {"duration_s": 600})
    queued = fal.status(endpoint, handle.request_id)  # rebuilt by fal-client from the id
    assert queued == fal_client.Queued(position=0)
    assert handle.status(with_logs=True) == fal_client.Queued(position=0)

    fal.cancel(endpoint, handle.request_id)
    done = handle.status()
    assert isinstance(done, fal_client.Completed) and done.logs is None
    assert done.error and done.error_type == "client_cancelled"
    with pytest.raises(fal_client.FalClientHTTPError) as raised:
        handle.get(interval=POLL_S)
    assert raised.value.status_code == 400 and raised.value.error_type == "client_cancelled"


def test_a_failed_request_is_completed_with_an_error_and_its_result_raises(fal):
    handle = fal.submit("fal-ai/flux/dev", {"duration_s": 0.2, "outcome": "failed"})
    done = final_status(handle)[-1]
    assert isinstance(done, fal_client.Completed) and done.error and done.error_type
    with pytest.raises(fal_client.FalClientHTTPError) as raised:
        handle.get(interval=POLL_S)
    assert raised.value.status_code == 422
    assert raised.value.message[0]["msg"]  # fal's `detail`: a list of {loc, msg, type}


def test_subscribe_with_the_key_from_the_environment(simulator, monkeypatch):
    monkeypatch.setenv("FAL_KEY", KEY)
    fal = fal_client.SyncClient()  # fal-client's own credential lookup: FAL_KEY
    enqueued: list[str] = []
    updates: list[fal_client.Status] = []
    result = fal.subscribe("workflows/me/wf", {"duration_s": 0.3}, with_logs=True, interval=POLL_S,
                           on_enqueue=enqueued.append, on_queue_update=updates.append)
    assert len(enqueued) == 1 and isinstance(updates[-1], fal_client.Completed)
    (url,) = image_urls(result)
    assert enqueued[0] in url


def test_fal_clients_webhook_url_reaches_the_simulator(simulator, fal):
    callback = f"{simulator}/nowhere/{secrets.token_hex(6)}"
    fal.submit("fal-ai/flux/dev", {"duration_s": 600}, webhook_url=callback)
    assert stats(simulator)["creates_by_callback_url"][callback] == 1


# ------------------------------------------------------------------ fal-client ⇄ our adapter


@pytest.mark.parametrize("endpoint, root", ENDPOINTS)
def test_a_request_fal_client_made_is_read_by_our_adapter(simulator, fal, endpoint, root):
    handle = fal.submit(endpoint, {"duration_s": 0.3, "outputs": 2})
    result = handle.get(interval=POLL_S)
    given = {"model": endpoint, "status_url": handle.status_url, "response_url": handle.response_url,
             "cancel_url": handle.cancel_url}
    # With the URLs fal gave, and with none (rebuilt by our rule, as for a job stored without them).
    for operation in (given, None):
        final = adapter_final(simulator, Task(task_id=handle.request_id, operation=operation, model=endpoint))
        assert final.state is TaskState.SUCCEEDED and list(final.output_urls) == image_urls(result)

    queued = fal.submit(endpoint, {"duration_s": 600})
    adapter_cancel(simulator, Task(task_id=queued.request_id, model=endpoint))
    done = queued.status()
    assert isinstance(done, fal_client.Completed) and done.error_type == "client_cancelled"


@pytest.mark.parametrize("endpoint, root", ENDPOINTS)
def test_a_request_our_adapter_made_is_read_by_fal_client(simulator, fal, endpoint, root):
    submitted = adapter_submit(simulator, endpoint, {"duration_s": 0.3, "outputs": 2})
    assert submitted.operation is not None
    assert submitted.operation["status_url"] == f"{simulator}/fal/{root}/requests/{submitted.task_id}/status"
    final = adapter_final(simulator, Task(task_id=submitted.task_id, operation=submitted.operation, model=endpoint))
    assert final.state is TaskState.SUCCEEDED
    assert isinstance(fal.status(endpoint, submitted.task_id, with_logs=True), fal_client.Completed)
    assert image_urls(fal.result(endpoint, submitted.task_id)) == list(final.output_urls)

    queued = adapter_submit(simulator, endpoint, {"duration_s": 600})
    assert fal.status(endpoint, queued.task_id) == fal_client.Queued(position=0)
    fal.cancel(endpoint, queued.task_id)
    cancelled = adapter_final(simulator, Task(task_id=queued.task_id, operation=queued.operation, model=endpoint))
    assert cancelled.state is TaskState.CANCELLED
