"""AI Gateway video jobs end to end: the web API, the settler, real
PostgreSQL, files storage, the real adapter over real HTTP — against the
simulator's /gateway protocol (webhooks over loopback to the web server),
and a scripted Gateway on loopback for answers the simulator never gives
(`uploaded` videos, a Gateway-side cancel)."""
from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

import pytest
from starlette.responses import JSONResponse

from app.simulator import output_sha256
from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.providers.scripted import Script, Seen
from tests.support.loopback import LoopbackServer
from tests.support.simulator import clear_faults, set_faults, stats

KEY = "vck_gateway_jobs_test_key"
MODEL = "klingai/kling-v3.0-t2v"
INLINE_MODEL = "google/veo-3.1-generate-001"  # the simulator answers base64 videos for google/
START = "/video-model/start"
STATUS = "/video-model/status"


def gateway_env(base_url: str, sim_url: str, stale_after_s: float = 1) -> dict[str, str]:
    # STALE_AFTER_S: the lost-webhook check a second after submit, not five minutes.
    return {"SIM_URL": sim_url, "AI_GATEWAY_BASE_URL": base_url, "AI_GATEWAY_API_KEY": KEY,
            "STALE_AFTER_S": str(stale_after_s)}


def video_job(model: str = MODEL, **input) -> dict:
    return {"provider": "gateway", "model": model, "input": {"prompt": "a cat", "duration_s": 0.3, **input},
            "max_credits": 10}


async def started(web, make_settings, start_settler, env: dict[str, str]):
    """The web server, and a settler that registers callbacks to it (the
    simulator calls it back over loopback)."""
    server = await web(**env)
    await start_settler(make_settings(**env, PUBLIC_URL=server.url))
    return server


# ------------------------------------------------------------------ against the simulator


async def test_n_url_videos_are_stored_under_indexes_0_to_2_charged_once(web, make_owner, db, sim, make_settings,
                                                                        start_settler):
    # The timer long after the video's end: the webhook closes the job.
    env = gateway_env(f"{sim.url}/gateway/v4/ai", sim.url, stale_after_s=15)
    server = await started(web, make_settings, start_settler, env)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job(n=3, output_bytes=5000))).json()
        row = await wait_for_status(db, created["id"], JobStatus.SUCCEEDED)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        bodies = [(await c.get(out["url"])).content for out in got["outputs"]]
    task_id = row["provider_task_id"]
    assert task_id.startswith("gwjob_")
    assert [(o["index"], o["bytes"], o["sha256"], o["content_type"], o["label"]) for o in got["outputs"]] == [
        (i, 5000, output_sha256(task_id, i, 5000), "video/mp4", None) for i in range(3)]
    assert [hashlib.sha256(b).hexdigest() for b in bodies] == [o["sha256"] for o in got["outputs"]]
    # The Gateway reports no cost in credits: charged the reservation, once.
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", created["id"]) == 1
    counts = stats(sim.url)
    assert counts["webhooks_delivered"] == 1  # its signed webhook, accepted (answered 204)
    assert counts["creates_by_idempotency_key"] == {created["id"]: 1}
    await assert_money_balances(db)


async def test_inline_videos_are_stored_with_their_bytes(web, make_owner, db, sim, make_settings, start_settler,
                                                         tmp_objects):
    server = await started(web, make_settings, start_settler, gateway_env(f"{sim.url}/gateway/v4/ai", sim.url))
    owner = await make_owner(credits=100)
    size = 200_001
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job(INLINE_MODEL, n=2, output_bytes=size))).json()
        row = await wait_for_status(db, created["id"], JobStatus.SUCCEEDED)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        bodies = [(await c.get(out["url"])).content for out in got["outputs"]]
    task_id = row["provider_task_id"]
    assert [(o["index"], o["bytes"], o["sha256"], o["content_type"]) for o in got["outputs"]] == [
        (i, size, output_sha256(task_id, i, size), "video/mp4") for i in range(2)]
    assert [hashlib.sha256(b).hexdigest() for b in bodies] == [o["sha256"] for o in got["outputs"]]
    assert got["credits"]["charged"] == 10
    await assert_money_balances(db)


async def test_a_failed_generation_is_refunded(web, make_owner, db, sim, make_settings, start_settler):
    server = await started(web, make_settings, start_settler, gateway_env(f"{sim.url}/gateway/v4/ai", sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job(outcome="failed"))).json()
        await wait_for_status(db, created["id"], JobStatus.FAILED)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert got["error"] == {"code": JobError.PROVIDER_FAILED, "message": "simulated failure (input.outcome = 'failed')"}
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and got["outputs"] == []
    await assert_money_balances(db)


async def test_a_lost_start_answer_is_replayed_with_the_same_key_one_task_charged_once(web, make_owner, db, sim,
                                                                                      make_settings, start_settler):
    server = await started(web, make_settings, start_settler, gateway_env(f"{sim.url}/gateway/v4/ai", sim.url))
    owner = await make_owner(credits=100)
    set_faults(sim.url, submit_timeout_after_create=1)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job(duration_s=0.5))).json()
        # The first start made its job and its answer is held (the settler gives up after 2 s):
        # the faults go before the settler sends it again.
        deadline = time.monotonic() + 10
        while stats(sim.url)["tasks_created"] == 0:
            assert time.monotonic() < deadline, "the first start never arrived"
            await asyncio.sleep(0.02)
        clear_faults(sim.url)
        await wait_for_status(db, created["id"], JobStatus.SUCCEEDED, timeout=30)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    counts = stats(sim.url)
    assert counts["tasks_created"] == 1 and counts["creates_by_idempotency_key"] == {created["id"]: 1}
    # The replay named no signing secret: its webhook could not verify (401), the timer closed the job.
    assert counts["webhooks_sent"] >= 1 and counts["webhooks_delivered"] == 0
    assert len(got["outputs"]) == 1 and got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", created["id"]) == 1
    await assert_money_balances(db)


async def test_a_lost_webhook_is_closed_by_the_timer(web, make_owner, db, sim, make_settings, start_settler):
    server = await started(web, make_settings, start_settler, gateway_env(f"{sim.url}/gateway/v4/ai", sim.url))
    owner = await make_owner(credits=100)
    set_faults(sim.url, drop_webhook=1)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job())).json()
        await wait_for_status(db, created["id"], JobStatus.SUCCEEDED)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    counts = stats(sim.url)
    assert counts["webhooks_sent"] == 0 and counts["status_calls"] >= 1
    assert len(got["outputs"]) == 1 and got["credits"]["charged"] == 10
    await assert_money_balances(db)


# ------------------------------------------------------------------ a scripted Gateway


@dataclass
class ScriptedGateway:
    """A Gateway on loopback whose every job answers `status_answer`; `seen`
    is every request it got."""

    url: str
    seen: list[Seen]
    status_answer: dict = field(default_factory=lambda: {"status": "pending"})


@pytest.fixture
def scripted_gateway():
    script = Script()
    gateway = ScriptedGateway(url="", seen=script.seen)
    jobs = iter(range(1, 1000))

    def handler(seen: Seen) -> JSONResponse:
        if seen.path == START:
            job_id = f"job_{next(jobs)}"
            return JSONResponse({"operation": {"gatewayJobId": job_id},
                                 "providerMetadata": {"gateway": {"asyncJob": {"jobId": job_id, "status": "queued"}}}})
        if seen.path == STATUS:
            return JSONResponse(gateway.status_answer)
        return JSONResponse({"error": {"message": "not found", "type": "not_found"}}, status_code=404)

    script.handler = handler
    server = LoopbackServer(script.app()).start()
    gateway.url = server.url
    yield gateway
    server.stop()


@pytest.mark.parametrize("answer,message", [
    ({"status": "completed", "videos": [{"type": "uploaded", "mediaType": "video/mp4"}]},
     "the Gateway uploaded the video elsewhere: nothing to copy"),
    ({"status": "cancelled", "providerMetadata": {"gateway": {"asyncJob": {"jobId": "job_1", "status": "cancelled"}}}},
     "the Gateway reports the video generation cancelled"),
])
async def test_an_uploaded_or_gateway_cancelled_video_fails_refunded(web, make_owner, db, sim, make_settings,
                                                                     start_settler, scripted_gateway, answer, message):
    scripted_gateway.status_answer = answer
    server = await started(web, make_settings, start_settler, gateway_env(scripted_gateway.url, sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job())).json()
        await wait_for_status(db, created["id"], JobStatus.FAILED)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert got["error"] == {"code": JobError.PROVIDER_FAILED, "message": message}
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and got["outputs"] == []
    await assert_money_balances(db)


async def test_a_cancelled_job_is_refunded_and_no_cancel_call_is_made(web, make_owner, db, sim, make_settings,
                                                                      start_settler, scripted_gateway):
    server = await started(web, make_settings, start_settler, gateway_env(scripted_gateway.url, sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=video_job())).json()
        await wait_for_status(db, created["id"], JobStatus.RUNNING)
        cancelled = await c.post(f"/v1/jobs/{created['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == JobStatus.CANCELLED
        # The outbox drains the job's intents (its cancel intent included) without a call to the Gateway.
        deadline = time.monotonic() + 10
        while await db.fetchval("select count(*) from outbox where job_id = $1", created["id"]):
            assert time.monotonic() < deadline, "the job's intents were not drained"
            await asyncio.sleep(0.05)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    assert {seen.path for seen in scripted_gateway.seen} <= {START, STATUS}
    assert [seen.path for seen in scripted_gateway.seen].count(START) == 1
    await assert_money_balances(db)
