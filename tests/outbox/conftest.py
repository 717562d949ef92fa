"""Fixtures for the settler: the simulator (a real HTTP server in its own
process), settlers running in-process on the test's event loop, and helpers
to wait for a job to reach a state (`start_settler` is in tests/conftest.py:
the web tests run settlers too)."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.domain import jobs
from tests.support.simulator import RunningSimulator


@pytest.fixture(scope="session")
def sim_server():
    with RunningSimulator() as sim:
        yield sim


@pytest.fixture
def sim(sim_server):
    httpx.post(f"{sim_server.url}/_sim/reset", timeout=5)
    yield sim_server
    httpx.delete(f"{sim_server.url}/_sim/faults", timeout=5)


async def wait_for_status(pool, job_id: str, statuses, timeout: float = 20.0) -> dict:
    statuses = (statuses,) if isinstance(statuses, str) else tuple(statuses)
    deadline = time.monotonic() + timeout
    while True:
        row = await pool.fetchrow("select * from jobs where id = $1", job_id)
        if row["status"] in statuses:
            return dict(row)
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {row['status']} (last_error={row['last_error']!r}), "
                                 f"not {statuses} after {timeout}s")
        await asyncio.sleep(0.05)


async def succeeded_with_one_output(server, api_key: str, pool, job: dict) -> tuple[dict, dict, bytes]:
    """Create `job` over the API, wait for its success, and read it back:
    the job, its one output and that output's bytes."""
    async with server.client(api_key) as c:
        created = (await c.post("/v1/jobs", json=job)).json()
        await wait_for_status(pool, created["id"], "succeeded")
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        (out,) = got["outputs"]
        body = (await c.get(out["url"])).content
    return got, out, body


async def server_now(pool):
    """The database's clock now: what `wait_for_settlers` counts from."""
    return await pool.fetchval("select clock_timestamp()")


async def wait_for_settlers(pool, count: int, *, started_after, timeout: float = 30.0) -> None:
    """Until `count` settler processes started after `started_after` (the
    database's clock, `server_now`) listen on this database: each has taken
    its signals over by then, and a test of two processes races two. (Not
    any listener: a killed settler's backend may linger a moment.)"""
    deadline = time.monotonic() + timeout
    while True:
        listening = await pool.fetchval(
            "select count(*) from pg_stat_activity where datname = current_database()"
            " and application_name = 'longcall-settler-listen' and backend_start > $1", started_after)
        if listening >= count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{listening} of {count} settlers listening after {timeout}s")
        await asyncio.sleep(0.05)


async def assert_money_balances(pool) -> None:
    """DESIGN.md's money invariants, from the database."""
    bad = await pool.fetch("""
        select j.id from jobs j
        where (j.status in ('succeeded', 'failed', 'cancelled', 'expired')
               and j.credits_charged + j.credits_refunded <> j.credits_reserved)
           or (j.status not in ('succeeded', 'failed', 'cancelled', 'expired')
               and (j.credits_charged <> 0 or j.credits_refunded <> 0))
           or coalesce((select sum(amount) from ledger l where l.job_id = j.id and kind = 'charge'), 0)
              <> j.credits_charged
           or coalesce((select sum(amount) from ledger l where l.job_id = j.id and kind = 'refund'), 0)
              <> j.credits_refunded""")
    assert not bad, f"jobs whose money does not add up: {[r['id'] for r in bad]}"
    owners = await pool.fetch("""
        select o.id, o.granted, o.balance, o.reserved, o.charged, o.active,
          (select coalesce(sum(credits_reserved), 0) from jobs where owner_id = o.id
             and status in ('queued', 'submitting', 'running', 'uncertain')) as in_flight_reserved,
          (select coalesce(sum(credits_charged), 0) from jobs where owner_id = o.id) as jobs_charged,
          (select count(*) from jobs where owner_id = o.id
             and status in ('queued', 'submitting', 'running', 'uncertain')) as in_flight
        from owners o""")
    for o in owners:
        assert o["granted"] == o["balance"] + o["reserved"] + o["charged"], dict(o)
        assert o["reserved"] == o["in_flight_reserved"], dict(o)
        assert o["charged"] == o["jobs_charged"], dict(o)
        assert o["active"] == o["in_flight"], dict(o)


async def running_job(pool, owner_id: str, provider: str, model: str, task_id: str) -> str:
    """A job whose submit the provider answered with `task_id`: saved as the
    submit step saves it (no webhook registered), its first settle due at once."""
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=None, provider=provider,
                                    model=model, input={}, max_credits=10, give_up_after_s=3600)
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)
        saved = await jobs.save_task(conn, created.job_id, task_id=task_id, operation=None, webhook_secret=None,
                                     callback_registered=False, first_check_after_s=0)
    assert saved == jobs.Saved.RUNNING
    return created.job_id
