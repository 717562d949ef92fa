"""`GET /v1/jobs/{id}?wait=N`: the read is held until the job changes (woken
by the database's NOTIFY through the web process's one listener) or N
seconds pass."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.roads.conftest import sim_job, wait_for_status, wait_until
from tests.support.simulator import set_faults

LISTENERS = "select count(*) from pg_stat_activity where application_name = 'longcall-web-listen'"


async def _timed_get(client: httpx.AsyncClient, url: str) -> tuple[httpx.Response, float]:
    r = await client.get(url)
    return r, time.time()


async def test_a_waiting_read_returns_as_soon_as_the_job_succeeds(web, make_settings, make_owner, sim,
                                                                  settlers, db):
    server = await web(SIM_URL=sim.url)
    await settlers(make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url))  # the webhook closes it
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=1.0))).json()["id"]
        await wait_for_status(db, job_id, "running")
        started = time.time()
        r, answered = await _timed_get(c, f"/v1/jobs/{job_id}?wait=20")
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    finished = (await db.fetchval("select finished_at from jobs where id = $1", job_id)).timestamp()
    assert finished > started  # it was still running when the read began
    # Woken by the change, not by the 20 s timeout (bounds no loaded machine eats).
    assert answered - finished < 10
    assert answered - started < 15


async def test_wait_bounds(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=sim_job())).json()
        for bad in ("31", "30.5", "-1", "abc", "nan", "inf", ""):
            r = await c.get(f"/v1/jobs/{job['id']}", params={"wait": bad})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", bad
        assert (await c.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
        # a job already terminal answers at once, whatever the wait
        started = time.monotonic()
        r = await c.get(f"/v1/jobs/{job['id']}", params={"wait": "30"})
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        assert time.monotonic() - started < 10  # not the 30 s wait
        # a bad wait is refused before anything else: no job is looked up
        r = await c.get("/v1/jobs/job_0123456789abcdef01234567?wait=99")
        assert r.status_code == 400


@pytest.fixture
async def running(web, make_settings, make_owner, sim, settlers, db):
    """A web server and a job running at the simulator for 10 minutes (no
    settler left: only what the test does changes it)."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url)
    settler = await settlers(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100, max_active=10)
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=sim_job(duration_s=600))).json()
        other = (await c.post("/v1/jobs", json=sim_job(duration_s=600))).json()
    for j in (job, other):
        await wait_for_status(db, j["id"], "running")
    await settler.stop()
    return server, owner, job, other


async def test_a_wait_runs_out_and_other_jobs_do_not_wake_it(running, db):
    server, owner, job, other = running
    async with server.client(owner.api_key) as c:
        started = time.monotonic()
        waiting = asyncio.create_task(c.get(f"/v1/jobs/{job['id']}?wait=1.5"))
        await asyncio.sleep(0.3)
        assert (await c.post(f"/v1/jobs/{other['id']}/cancel")).status_code == 200  # another job changes
        r = await waiting
    took = time.monotonic() - started
    assert r.status_code == 200 and r.json()["status"] == "running"
    assert 1.5 <= took < 10  # ran its 1.5 s out: not woken by the other job


async def _true(value: bool) -> bool:
    return value


async def _no_busy_web_connection(db) -> bool:
    busy = await db.fetchval("select count(*) from pg_stat_activity where application_name = 'longcall-web'"
                             " and state <> 'idle'")
    return busy == 0


async def test_many_waiters_share_one_listener_and_hold_no_connection(running, db):
    """150 held reads (owner key and read token), more than the web pool's
    20 connections: one LISTEN connection serves them all, none holds a
    pooled connection while it waits, and the change wakes every one."""
    server, owner, job, _ = running
    assert await db.fetchval(LISTENERS) == 1
    limits = httpx.Limits(max_connections=200)
    async with server.client(owner.api_key, limits=limits) as c, \
            httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30) as anon:
        waiters = [asyncio.create_task(c.get(f"/v1/jobs/{job['id']}?wait=20") if i % 2 else
                                       anon.get(f"{job['status_url']}&wait=20")) for i in range(150)]
        # All 150 are in (each watches before its first read) ...
        changes = server.app.state.job_changes
        await wait_until(lambda: _true(changes.watching(job["id"]) == 150), timeout=15)
        # ... and once their first reads are done, none holds a pooled
        # connection while it waits: were it otherwise, the web's connections
        # would stay busy for the whole 20 s wait, far past this bound.
        await wait_until(lambda: _no_busy_web_connection(db), timeout=10)
        assert not any(w.done() for w in waiters)
        assert await db.fetchval(LISTENERS) == 1
        started = time.monotonic()
        account = await c.get("/v1/account")  # the pool is free for everyone else
        # (held connections would make this wait out the 20 s waits)
        assert account.status_code == 200 and time.monotonic() - started < 10
        cancelled_at = time.monotonic()
        assert (await c.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
        answers = await asyncio.gather(*waiters)
        woken = time.monotonic() - cancelled_at
    assert [r.status_code for r in answers] == [200] * 150
    assert {r.json()["status"] for r in answers} == {"cancelled"}
    assert woken < 10  # woken by the change, not by their 20 s timeout


async def test_waiters_survive_the_listener_connection_dropping(running, db):
    """The listener's connection is killed: the web process reconnects, and
    a waiting read still answers with what the database says (at the
    latest when its wait runs out)."""
    server, owner, job, _ = running
    async with server.client(owner.api_key) as c:
        waiting = asyncio.create_task(c.get(f"/v1/jobs/{job['id']}?wait=10"))
        await asyncio.sleep(0.3)
        assert await db.fetchval("select pg_terminate_backend(pid) from pg_stat_activity"
                                 " where application_name = 'longcall-web-listen'")
        assert (await c.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
        r = await asyncio.wait_for(waiting, 12)
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        await wait_until(lambda: _one_listener(db), timeout=5)
        # Set up, not only connected: a read that came before would be woken by the reconnect itself.
        changes = server.app.state.job_changes
        await wait_until(lambda: _true(changes.connected), timeout=5)
        # and the new listener works: a fresh wait is woken by a change
        other_started = time.monotonic()
        waiting = asyncio.create_task(c.get(f"/v1/jobs/{running[3]['id']}?wait=20"))
        await asyncio.sleep(0.3)
        assert (await c.post(f"/v1/jobs/{running[3]['id']}/cancel")).status_code == 200
        r = await waiting
    assert r.json()["status"] == "cancelled" and time.monotonic() - other_started < 10  # not the 20 s wait


async def _one_listener(pool) -> bool:
    return await pool.fetchval(LISTENERS) == 1
