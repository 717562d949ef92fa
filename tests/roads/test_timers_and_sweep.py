"""Road 3: durable timers (the lost-webhook check, the poll schedule, the
give-up deadline) and the backstop sweep, with the real settler, the real
simulator and the real `longcall sweep --once` command."""
from __future__ import annotations

import asyncio

import asyncpg

from app import db as app_db
from outbox.context import Context
from outbox.roads.sweep import sweep_once
from outbox.settler import Settler
from tests.roads.conftest import (
    assert_money_balances,
    longcall,
    sim_job,
    sim_task,
    wait_for_status,
    wait_until,
)
from tests.support.simulator import set_faults, stats


def _elapsed(row) -> float:
    return (row["finished_at"] - row["created_at"]).total_seconds()


async def test_a_lost_webhook_is_caught_by_the_stale_check(web, make_settings, make_owner, sim, settlers, db):
    """PUBLIC_URL set, every webhook dropped: the lost-webhook timer
    (STALE_AFTER_S) asks the provider and closes the job."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url)
    await settlers(make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url, STALE_AFTER_S=1))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=0.2, cost=2))).json()["id"]
    row = await wait_for_status(db, job_id, "succeeded", timeout=10)
    assert row["callback_registered"] is True
    assert stats(sim.url)["webhooks_sent"] == 0
    assert stats(sim.url)["status_calls"] == 1  # one check, at the timer
    assert _elapsed(row) >= 1.0
    assert row["credits_charged"] == 2
    await assert_money_balances(db)


async def test_without_public_url_the_poll_schedule_closes_jobs(web, make_settings, make_owner, sim, settlers,
                                                                db):
    server = await web(SIM_URL=sim.url)
    await settlers(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=0.2))).json()["id"]
    row = await wait_for_status(db, job_id, "succeeded", timeout=10)
    assert row["callback_registered"] is False
    assert stats(sim.url)["webhooks_sent"] == 0
    assert stats(sim.url)["status_calls"] == 1  # done at the first poll (2 s)
    assert 2.0 <= _elapsed(row) < 15  # not before the first poll; one poll (above) did it
    await assert_money_balances(db)


async def test_the_give_up_deadline_expires_refunds_and_cancels_at_the_provider(web, make_settings, make_owner,
                                                                                sim, settlers, db):
    """A task that runs past GIVE_UP_AFTER_S: the deadline is a timer of its
    own, even when the next lost-webhook check (30 s) is further away."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url, GIVE_UP_AFTER_S=2)
    await settlers(make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url, GIVE_UP_AFTER_S=2))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=600))).json()["id"]
    row = await wait_for_status(db, job_id, "expired", timeout=10)
    assert row["error_code"] == "give_up"
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    assert 2.0 <= _elapsed(row) < 20  # the deadline's own timer, not the 30 s lost-webhook check
    # the provider is asked to stop the task, through the outbox
    await wait_until(lambda: _no_intents(db, job_id))
    assert sim_task(sim.url, row["provider_task_id"])["status"] == "cancelled"
    await assert_money_balances(db)


async def test_a_task_done_before_the_deadline_is_kept_when_the_deadline_is_seen_late(web, make_settings,
                                                                                     make_owner, sim, settlers,
                                                                                     db):
    """The task finished (and the provider billed it), its webhook was lost,
    and the settler next looks only after the give-up deadline (it was down,
    or the timer ran late): the provider is asked once more, and the job
    succeeds with its outputs and its cost, rather than expire refunded
    with the paid result thrown away."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url)
    settings = make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url)
    settler = await settlers(settings)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=0.2, cost=3))).json()["id"]
    row = await wait_for_status(db, job_id, "running")
    await settler.stop()

    async def task_done() -> bool:
        return sim_task(sim.url, row["provider_task_id"])["status"] == "succeeded"
    await wait_until(task_done)
    await db.execute("update jobs set deadline_at = now() - interval '1 second' where id = $1", job_id)
    await db.execute("update outbox set not_before = now() where job_id = $1", job_id)  # the deadline's timer

    await settlers(settings)
    row = await wait_for_status(db, job_id, "succeeded", timeout=10)
    assert (row["credits_charged"], row["credits_refunded"]) == (3, 7)
    assert await db.fetchval("select count(*) from assets where job_id = $1", job_id) == 1
    assert sim_task(sim.url, row["provider_task_id"])["status"] == "succeeded"  # nothing asked to stop it
    await assert_money_balances(db)


async def _no_intents(pool, job_id: str) -> bool:
    return await pool.fetchval("select count(*) from outbox where job_id = $1", job_id) == 0


async def test_sweep_finds_in_flight_jobs_without_intents(web, make_settings, make_owner, sim, settlers, db,
                                                          migrated):
    """The settler stops while jobs run and their intents are deleted by
    hand: `longcall sweep --once` gives each its intent back (a submit for
    a queued job, a settle for a running one), and the settler's own sweep
    does the same and the jobs close."""
    server = await web(SIM_URL=sim.url)
    settings = make_settings(SIM_URL=sim.url)
    settler = await settlers(settings)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        running = [(await c.post("/v1/jobs", json=sim_job(duration_s=0.2))).json()["id"] for _ in range(2)]
        for job_id in running:
            await wait_for_status(db, job_id, "running")
        await settler.stop()
        queued = (await c.post("/v1/jobs", json=sim_job(duration_s=0.2))).json()["id"]
    await db.execute("delete from outbox")

    done = longcall(migrated, "sweep", "--once")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("sweep: 1 submit and 2 settle intents queued for jobs that had none, "
                        "0 uncertain jobs expired")
    assert sorted(lines[1:]) == sorted([f"  submit: {queued}"] + [f"  settle: {j}" for j in running])
    intents = {(r["job_id"], r["kind"]) for r in await db.fetch("select job_id, kind from outbox")}
    assert intents == {(queued, "submit")} | {(j, "settle") for j in running}

    again = longcall(migrated, "sweep", "--once")  # every in-flight job has its intent now
    assert again.stdout.splitlines() == [
        "sweep: 0 submit and 0 settle intents queued for jobs that had none, 0 uncertain jobs expired"]

    # lost again; this time the settler's own sweep finds them, and they close
    await db.execute("delete from outbox")
    await settlers(settings, sweep_interval_s=0.5)
    for job_id in running + [queued]:
        await wait_for_status(db, job_id, "succeeded", timeout=15)
    await assert_money_balances(db)


class StatementCounter:
    """Every statement a pool's connections send, seen by asyncpg itself
    (but for asyncpg's own reset of a connection returned to the pool)."""

    def __init__(self):
        self.queries: list[str] = []

    async def init(self, conn) -> None:
        await app_db._init_connection(conn)
        conn.add_query_logger(self._log)

    def _log(self, record) -> None:
        if not record.query.startswith("SELECT pg_advisory_unlock_all();"):
            self.queries.append(record.query)


async def test_with_nothing_in_flight_the_sweep_is_one_statement(web, make_settings, make_owner, sim,
                                                                 settlers, db, migrated):
    counter = StatementCounter()
    pool = await asyncpg.create_pool(migrated, min_size=1, max_size=2, init=counter.init)
    try:
        counter.queries.clear()
        report = await sweep_once(pool, make_settings())
        assert len(counter.queries) == 1 and report.next_due is None
        assert not (report.queued_submit or report.queued_settle or report.expired)

        # with jobs in flight that all have their intent: still one
        server = await web(SIM_URL=sim.url)
        await settlers(make_settings(SIM_URL=sim.url))
        owner = await make_owner(credits=100)
        async with server.client(owner.api_key) as c:
            job_id = (await c.post("/v1/jobs", json=sim_job(duration_s=600))).json()["id"]
        await wait_for_status(db, job_id, "running")
        counter.queries.clear()
        report = await sweep_once(pool, make_settings())
        assert len(counter.queries) == 1 and report.next_due is not None
        assert not (report.queued_submit or report.queued_settle or report.expired)
    finally:
        await pool.close()


async def test_a_stop_during_a_drain_is_not_lost(make_settings, db):
    """A settler told to stop while it is draining stops at once, not at its
    next timer: with an empty outbox there is none, and a lost stop would
    leave it asleep for good. Drains are triggered by hand (a NOTIFY) and
    the stop is sent at varying moments around them."""
    ctx = await Context.open(make_settings(), provider_timeout_s=2.0)  # shared: opening one is slow
    try:
        for i in range(40):
            settler = Settler(ctx, 8, sweep_interval_s=0)
            task = asyncio.create_task(settler.run())
            await asyncio.sleep(0.002 * (i % 5))
            await db.execute("select pg_notify('longcall_outbox', '')")
            await asyncio.sleep(0.0005 * (i % 7))
            settler.stop()
            await asyncio.wait_for(task, 5)
    finally:
        await ctx.close()
