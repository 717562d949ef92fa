"""Races that really race: many settle requests and steps at once, two
settler processes, and a settler killed between storing outputs and
committing."""
from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.domain import jobs
from app.simulator.outputs import output_sha256
from app.vocabulary import IntentKind, JobStatus
from outbox import intents
from outbox.context import Context
from outbox.outcome import Done
from outbox.settle import settle
from outbox.submit import TAKES_ITS_ANSWER
from tests.outbox.conftest import assert_money_balances, server_now, wait_for_settlers, wait_for_status
from tests.roads.conftest import sim_task, wait_until
from tests.support.simulator import clear_faults, set_faults, stats

REPO = Path(__file__).resolve().parents[2]


def job(**input):
    return {"provider": "sim", "model": "m", "input": {"duration_s": 0.3, **input}, "max_credits": 10}


def settler_process(settings_env: dict) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **settings_env}
    return subprocess.Popen([sys.executable, "-m", "app", "settler", "--concurrency", "8"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def env_of(make_settings, sim, tmp_objects, **extra) -> dict:
    s = make_settings(SIM_URL=sim.url)
    return {"DATABASE_URL": s.database_url, "SECRET_KEY": "test-secret-key-0123456789",
            "STORAGE_URL": f"file://{tmp_objects}", "SIM_URL": sim.url, "SWEEP_INTERVAL_S": "0",
            "LOG_LEVEL": "WARNING", **{k: str(v) for k, v in extra.items()}}


async def test_concurrent_settle_steps_close_once(web, make_owner, db, sim, make_settings, start_settler):
    """Twenty settle steps for one finished task at the same moment (as the
    webhook, read and timer roads may ask): one closes, all others see a
    closed job; one charge, one asset set."""
    settings = make_settings(SIM_URL=sim.url)
    server = await web(SIM_URL=sim.url)
    settler = await start_settler(settings)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(duration_s=0.5, outputs=2, cost=4))).json()
    await wait_for_status(db, created["id"], "running")
    settler.stop()  # the test drives the steps itself from here
    await asyncio.sleep(0.8)  # the task is done at the provider
    ctx = await Context.open(settings, provider_timeout_s=5)
    try:
        outcomes = await asyncio.gather(*[settle(ctx, created["id"], 1) for _ in range(20)])
    finally:
        await ctx.close()
    assert all(isinstance(o, Done) for o in outcomes)
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == "succeeded" and row["credits_charged"] == 4
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", row["id"]) == 1
    assert await db.fetchval("select count(*) from assets where job_id = $1", row["id"]) == 2
    await assert_money_balances(db)


async def test_settle_requests_storm_with_two_settler_processes(web, make_owner, db, sim, make_settings,
                                                                tmp_objects):
    server = await web(SIM_URL=sim.url)
    owner = await make_owner(credits=1000, max_active=50)
    since = await server_now(db)
    procs = [settler_process(env_of(make_settings, sim, tmp_objects)) for _ in range(2)]
    try:
        await wait_for_settlers(db, 2, started_after=since)
        async with server.client(owner.api_key) as c:
            ids = [(await c.post("/v1/jobs", json=job(duration_s=0.5, cost=3))).json()["id"] for _ in range(20)]

        async def storm(job_id):
            for _ in range(30):
                async with db.acquire() as conn:
                    await intents.request(conn, job_id, "settle")
                await asyncio.sleep(0.01)

        await asyncio.gather(*[storm(j) for j in ids for _ in range(3)])
        for job_id in ids:
            await wait_for_status(db, job_id, "succeeded", timeout=30)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(30) == 0  # SIGTERM: finish or release, then exit cleanly
    charges = await db.fetch("select job_id, count(*) from ledger where kind = 'charge' group by job_id")
    assert len(charges) == 20 and all(r["count"] == 1 for r in charges)
    assert await db.fetchval("select count(*) from assets") == 20
    assert await db.fetchval("select count(*) from outbox") == 0
    stats = __import__("tests.support.simulator", fromlist=["stats"]).stats(sim.url)
    assert stats["tasks_created"] == 20
    await assert_money_balances(db)


async def test_settler_killed_after_storing_before_commit(web, make_owner, db, sim, make_settings,
                                                          tmp_objects):
    """SIGKILL a settler once it has written the first output to storage and
    before it commits; another settler finishes after the lease: the same
    keys are overwritten, money moves once."""
    server = await web(SIM_URL=sim.url)
    owner = await make_owner(credits=100)
    size = 24 * 1024 * 1024
    env = env_of(make_settings, sim, tmp_objects, SETTLER_LEASE_S=3)
    first = settler_process(env)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(duration_s=0.2, outputs=3, output_bytes=size))).json()
    job_dir = Path(tmp_objects) / "outputs" / owner.owner_id / created["id"]
    deadline = time.monotonic() + 30
    while not (job_dir.exists() and any(p.name == "0" for p in job_dir.iterdir())):
        assert time.monotonic() < deadline, "the first output never reached storage"
        await asyncio.sleep(0.002)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == "running", "killed too late: the job had already committed"
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == 0

    second = settler_process(env)
    try:
        row = await wait_for_status(db, created["id"], "succeeded", timeout=30)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == 1
    objects = sorted(p.name for p in job_dir.iterdir() if not p.name.startswith("."))
    assert objects == ["0", "1", "2"]
    for index in range(3):
        digest = hashlib.sha256((job_dir / str(index)).read_bytes()).hexdigest()
        assert digest == output_sha256(row["provider_task_id"], index, size)
    await assert_money_balances(db)


async def submitting_job(pool, owner_id: str) -> str:
    """A job whose submit is out (claimed, no answer yet)."""
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=None, provider="sim", model="m",
                                    input={}, max_credits=10, give_up_after_s=3600)
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)
    return created.job_id


async def save_answer(pool, job_id: str, task_id: str) -> jobs.Saved:
    async with pool.acquire() as conn:
        return await jobs.save_task(conn, job_id, task_id=task_id, operation=None, webhook_secret=None,
                                    callback_registered=False, first_check_after_s=0,
                                    from_statuses=TAKES_ITS_ANSWER)


async def until_blocked(db, pid: int) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while not await db.fetchval("select cardinality(pg_blocking_pids($1)) > 0", pid):
        assert asyncio.get_running_loop().time() < deadline, "the save never waited for the job's row"
        await asyncio.sleep(0.01)


async def test_a_submit_answer_saved_while_a_cancel_commits_keeps_the_task_and_queues_its_cancel(db, make_owner):
    """The cancel's close holds the job's row; the save of the submit's
    answer waits for it (seen waiting in PostgreSQL), then the close
    commits: the id is saved on the cancelled job and a provider cancel is
    due. (Its two UPDATEs judged the row by the snapshot before the close:
    neither matched, and the task ran on unseen.)"""
    owner = await make_owner()
    job_id = await submitting_job(db, owner.owner_id)
    async with db.acquire() as closer, db.acquire() as saver:
        tx = closer.transaction()
        await tx.start()
        assert await jobs.close(closer, job_id, JobStatus.CANCELLED, cancel_at_provider=True) is not None
        saving = asyncio.ensure_future(jobs.save_task(saver, job_id, task_id="task-1", operation=None,
                                                      webhook_secret=None, callback_registered=False,
                                                      first_check_after_s=0))
        await until_blocked(db, saver.get_server_pid())
        await tx.commit()
        assert await saving is jobs.Saved.ON_CLOSED_JOB
    row = await db.fetchrow("select status, provider_task_id from jobs where id = $1", job_id)
    assert (row["status"], row["provider_task_id"]) == ("cancelled", "task-1")
    assert await db.fetchval("select count(*) from outbox where job_id = $1 and kind = 'cancel' "
                             "and not_before <= now()", job_id) == 1
    await assert_money_balances(db)


async def test_submit_answers_and_cancels_started_together_never_lose_a_task(db, make_owner):
    owner = await make_owner(credits=10_000, max_active=1_000)
    job_ids = [await submitting_job(db, owner.owner_id) for _ in range(100)]

    async def cancel(job_id):
        async with db.acquire() as conn:
            await jobs.close(conn, job_id, JobStatus.CANCELLED, cancel_at_provider=True)

    saved = await asyncio.gather(*[step for j in job_ids for step in (cancel(j), save_answer(db, j, "t-" + j))])
    assert jobs.Saved.LOST not in saved[1::2]
    assert await db.fetchval("select count(*) from jobs where provider_task_id is null") == 0
    assert await db.fetchval("select count(*) from jobs j where status = 'cancelled' and not exists "
                             "(select 1 from outbox o where o.job_id = j.id and o.kind = 'cancel')") == 0
    await assert_money_balances(db)


async def test_a_task_saved_after_the_cancel_step_read_the_job_keeps_the_cancel_intent_due(db, make_owner):
    """The cancel's intent is claimed with its job row (no task id yet), the
    submit's answer is saved, then the step ends finding nothing to cancel:
    the intent stays (its generation moved) and runs again with the id."""
    owner = await make_owner()
    job_id = await submitting_job(db, owner.owner_id)
    async with db.acquire() as conn:
        assert (await jobs.close(conn, job_id, JobStatus.CANCELLED, cancel_at_provider=True)).cancel_queued
        claimed = await intents.claim(conn, 10, 60.0)
        [held] = [i for i in claimed.intents if i.kind is IntentKind.CANCEL]
        assert claimed.jobs[held.id]["provider_task_id"] is None
    assert await save_answer(db, job_id, "task-1") is jobs.Saved.ON_CLOSED_JOB
    async with db.acquire() as conn:
        assert await intents.finish_many(conn, [held]) == {held.id}  # kept: asked again meanwhile
        again = await intents.claim(conn, 10, 60.0)
    [intent] = again.intents
    assert (intent.id, again.jobs[intent.id]["provider_task_id"]) == (held.id, "task-1")


async def test_a_submit_answer_for_a_job_gone_uncertain_meanwhile_is_its_task(db, make_owner):
    """Another settler (this one's lease lapsed mid-call) could not find the
    task and marked the job uncertain; the first call's answer then comes:
    the job runs with it instead of losing it."""
    owner = await make_owner()
    job_id = await submitting_job(db, owner.owner_id)
    async with db.acquire() as conn:
        assert await jobs.mark_uncertain(conn, job_id, "not found")
    assert await save_answer(db, job_id, "task-1") is jobs.Saved.RUNNING
    row = await db.fetchrow("select status, provider_task_id from jobs where id = $1", job_id)
    assert (row["status"], row["provider_task_id"]) == ("running", "task-1")


async def test_a_cancel_while_the_submits_answer_is_lost_still_stops_the_task(web, make_owner, db, sim,
                                                                              make_settings, start_settler):
    """The simulator makes the task and holds its answer; the owner cancels
    while the submit waits (refunded at once); the submit's answer never
    comes. The job's intents went with the cancel, the submit's retry with
    them: the settler asks once more with the same key, gets the task back,
    saves it on the closed job and has the provider stop it — one task,
    cancelled, not one left running and billed."""
    set_faults(sim.url, submit_timeout_after_create=1)
    server = await web(SIM_URL=sim.url)
    # The lost answer is held 60 s; the submit gives up on it after 10 s,
    # the cancel coming within moments of the task's creation.
    await start_settler(make_settings(SIM_URL=sim.url), provider_timeout_s=10.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(duration_s=300))).json()

        async def task_made() -> bool:
            return stats(sim.url)["tasks_created"] == 1
        await wait_until(task_made, timeout=15)
        clear_faults(sim.url)
        cancelled = await c.post(f"/v1/jobs/{created['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["provider_task_id"] is None  # the answer is still out

    async def task_saved() -> bool:
        return await db.fetchval("select provider_task_id from jobs where id = $1", created["id"]) is not None
    await wait_until(task_saved, timeout=40)
    task_id = await db.fetchval("select provider_task_id from jobs where id = $1", created["id"])

    async def task_stopped() -> bool:
        return sim_task(sim.url, task_id)["status"] == "cancelled"
    await wait_until(task_stopped, timeout=20)
    assert stats(sim.url)["tasks_created"] == 1  # the same task came back: none made twice
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == "cancelled" and (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    await assert_money_balances(db)
