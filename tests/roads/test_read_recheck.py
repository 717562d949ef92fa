"""Road 2: a client's read of a job that has been running a while asks for a
settle — rate limited per job, however many clients poll — so polling
clients close jobs with no webhook at all."""
from __future__ import annotations

import asyncio
import datetime as dt

import httpx

from outbox.roads import read as read_road
from tests.roads.conftest import assert_money_balances, sim_job, sim_task, wait_for_status, wait_until


async def _settle_intents(pool, job_id: str) -> list[dict]:
    return [dict(r) for r in await pool.fetch(
        "select generation, not_before <= now() as due from outbox where job_id = $1 and kind = 'settle'",
        job_id)]


async def _poll(server, api_key: str, status_url: str, job_id: str, n: int) -> None:
    """n reads at once, half with the owner's key, half with the read token."""
    async with server.client(api_key, limits=httpx.Limits(max_connections=n)) as owner, \
            httpx.AsyncClient(base_url=server.url, limits=httpx.Limits(max_connections=n)) as anon:
        answers = await asyncio.gather(*[
            owner.get(f"/v1/jobs/{job_id}") if i % 2 else anon.get(status_url) for i in range(n)])
    assert {r.status_code for r in answers} == {200}
    assert {r.json()["status"] for r in answers} == {"running"}


async def test_many_concurrent_readers_ask_for_one_settle_per_few_seconds(web, make_settings, make_owner, sim,
                                                                         settlers, db):
    server = await web(SIM_URL=sim.url, READ_RECHECK_AFTER_S=30)
    settler = await settlers(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=sim_job(duration_s=600))).json()
    job_id = job["id"]
    await wait_for_status(db, job_id, "running")
    # No settler from here on, and the poll timer gone: whatever intent
    # appears, a read wrote it.
    await settler.stop()
    await db.execute("delete from outbox where job_id = $1", job_id)

    # younger than READ_RECHECK_AFTER_S: reads write nothing
    await _poll(server, owner.api_key, job["status_url"], job_id, 20)
    assert await _settle_intents(db, job_id) == []
    assert await db.fetchval("select recheck_requested_at from jobs where id = $1", job_id) is None

    # older (its clock moved back rather than the test sleeping 30 s)
    await db.execute("update jobs set created_at = created_at - interval '31 s' where id = $1", job_id)
    await _poll(server, owner.api_key, job["status_url"], job_id, 50)
    assert await _settle_intents(db, job_id) == [{"generation": 0, "due": True}]  # written once
    asked = await db.fetchval("select recheck_requested_at from jobs where id = $1", job_id)
    assert asked is not None
    await _poll(server, owner.api_key, job["status_url"], job_id, 50)
    assert await _settle_intents(db, job_id) == [{"generation": 0, "due": True}]  # still once

    # RECHECK_EVERY_S later, the next readers ask once more (coalesced)
    await db.execute("update jobs set recheck_requested_at = recheck_requested_at - make_interval(secs => $2)"
                     " where id = $1", job_id, read_road.RECHECK_EVERY_S + 0.5)
    await _poll(server, owner.api_key, job["status_url"], job_id, 50)
    assert await _settle_intents(db, job_id) == [{"generation": 1, "due": True}]
    assert await db.fetchval("select recheck_requested_at from jobs where id = $1", job_id) > asked

    # a closed job's reads never ask
    async with server.client(owner.api_key) as c:
        assert (await c.post(f"/v1/jobs/{job_id}/cancel")).status_code == 200
        await db.execute("update jobs set recheck_requested_at = null where id = $1", job_id)
        assert (await c.get(f"/v1/jobs/{job_id}")).json()["status"] == "cancelled"
    assert await _settle_intents(db, job_id) == []
    await assert_money_balances(db)


async def test_reads_close_a_job_whose_next_check_is_far_away(web, make_settings, make_owner, sim, settlers,
                                                              db):
    """No PUBLIC_URL (no webhook), the job's next poll an hour away: a
    client polling the job is what closes it."""
    server = await web(SIM_URL=sim.url, READ_RECHECK_AFTER_S=0.5)
    settings = make_settings(SIM_URL=sim.url)
    settler = await settlers(settings)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=0.3, cost=4))).json()["id"]
        row = await wait_for_status(db, job_id, "running")
        assert row["callback_registered"] is False
        await settler.stop()
        await db.execute("update outbox set not_before = now() + interval '1 hour' where job_id = $1", job_id)
        await settlers(settings)
        await wait_until(lambda: _done_at_sim(sim.url, row["provider_task_id"]))
        started = dt.datetime.now(dt.UTC)
        status = None
        for _ in range(150):
            status = (await c.get(f"/v1/jobs/{job_id}")).json()["status"]
            if status == "succeeded":
                break
            await asyncio.sleep(0.1)
    assert status == "succeeded"
    done = await db.fetchrow("select * from jobs where id = $1", job_id)
    # closed by the reads: its next poll is an hour away
    assert (done["finished_at"] - started).total_seconds() < 15
    assert done["credits_charged"] == 4
    await assert_money_balances(db)


async def _done_at_sim(sim_url: str, task_id: str) -> bool:
    return sim_task(sim_url, task_id)["status"] == "succeeded"


def test_wants_recheck_is_a_pure_threshold_and_rate_limit():
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    s = dt.timedelta(seconds=1)
    assert not read_road.wants_recheck("running", now - 10 * s, None, now, 15)
    assert read_road.wants_recheck("running", now - 16 * s, None, now, 15)
    assert not read_road.wants_recheck("running", now - 16 * s, now - 1 * s, now, 15)
    assert read_road.wants_recheck("running", now - 16 * s, now - 5 * s, now, 15)
    for status in ("queued", "submitting", "uncertain", "succeeded", "failed", "cancelled", "expired"):
        assert not read_road.wants_recheck(status, now - 100 * s, None, now, 15)
