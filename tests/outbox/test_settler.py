"""The drain loop (outbox/settler.py): batches larger than its slots, run
no more than `concurrency` at once, and claimed intents that never started
given back on shutdown. Real PostgreSQL, a real settler on the test's loop."""
from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import time
import urllib.parse

from app.domain import jobs
from app.vocabulary import IntentKind, JobStatus
from outbox import intents, policy
from outbox import settler as settler_module
from outbox.context import Context
from outbox.outcome import DONE
from outbox.settler import Settler
from tests.outbox.conftest import server_now, wait_for_settlers
from tests.outbox.test_races import env_of, settler_process


class Watched(Settler):
    """A settler that records how many steps ran at once and each claim's size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.peak = 0
        self.claims: list[int] = []

    def _start(self, intent, job) -> None:
        super()._start(intent, job)
        self.peak = max(self.peak, len(self.running) - self.notifying)


async def _no_op_intents(db, make_owner, n: int) -> list[str]:
    """n cancelled jobs that never had a task, each with a cancel intent:
    the cancel step loads the job and is done."""
    owner = await make_owner(credits=n, max_active=n)
    made = []
    for _ in range(n):
        created = await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim",
                                        model="m", input={}, max_credits=1, give_up_after_s=3600)
        async with db.acquire() as conn:
            assert await jobs.close(conn, created.job_id, JobStatus.CANCELLED)
            await conn.execute("insert into outbox (job_id, kind) values ($1, 'cancel')", created.job_id)
        made.append(created.job_id)
    return made


async def _until(check, timeout: float = 20.0) -> None:
    """Until `check()` (a bool, or an awaitable of one) is true."""
    deadline = time.monotonic() + timeout
    while True:
        done = check()
        if inspect.isawaitable(done):
            done = await done
        if done:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_claim_takes_more_than_the_free_slots_and_no_more_than_concurrency_run(db, make_owner,
                                                                                     make_settings, monkeypatch):
    await _no_op_intents(db, make_owner, 40)
    ctx = await Context.open(make_settings())
    settler = Watched(ctx, 2, sweep_interval_s=0)
    real_claim = intents.claim

    async def claim(*args, **kwargs):
        got = await real_claim(*args, **kwargs)
        settler.claims.append(len(got.intents))
        return got

    monkeypatch.setattr(intents, "claim", claim)
    task = asyncio.create_task(settler.run())
    try:
        await _until(lambda: db.fetchval("select not exists (select 1 from outbox)"))
    finally:
        settler.stop()
        await asyncio.wait_for(task, 30)
        await ctx.close()
    assert settler.peak == 2  # never more steps at once than the concurrency
    assert settler.claims[0] == 2  # no step has finished: only what can start
    # then the steps proved short: a batch of the free slots and the waiting room
    assert max(settler.claims) == 2 + policy.waiting_room(2, 0.0) == 32
    assert sum(settler.claims) == 40


async def test_claimed_intents_that_never_started_are_given_back_on_shutdown(db, make_owner, make_settings,
                                                                             monkeypatch):
    batch = 1 + policy.waiting_room(1, 0.001)  # its one slot and the waiting room
    await _no_op_intents(db, make_owner, batch + 4)
    ctx = await Context.open(make_settings())
    settler = Settler(ctx, 1, sweep_interval_s=0)
    settler.mean_step_s = 0.001  # its steps have been short: a claim takes more than its one slot
    gate = asyncio.Event()
    started: list[str] = []

    async def held_step(ctx_, job_id, attempts, job=None):
        started.append(job_id)
        await gate.wait()  # the one slot stays busy: the rest of the batch waits
        return DONE

    monkeypatch.setitem(settler_module.STEPS, IntentKind.CANCEL, held_step)
    task = asyncio.create_task(settler.run())
    try:
        # Waited for on the settler's side: its claim is committed (and seen
        # from here) a moment before the settler has read the claim's answer.
        await _until(lambda: len(started) == 1 and len(settler.waiting) == batch - 1)  # one running, the rest waiting
        assert await db.fetchval("select count(*) from outbox where claimed_until is not null") == batch
        settler.stop()
        await asyncio.sleep(0.1)
        gate.set()  # the running one finishes within the grace
        await asyncio.wait_for(task, 30)
    finally:
        # (A failed assertion must not leave the settler running for the
        # tests after this one: its listener would count as theirs.)
        settler.stop()
        gate.set()
        await asyncio.wait_for(task, 30)
        await ctx.close()
    rows = await db.fetch("select claimed_until from outbox")
    # the finished one is deleted; those that waited are due again at once, unleased
    assert len(rows) == batch + 3 and all(r["claimed_until"] is None for r in rows)
    assert len(started) == 1


async def test_a_full_settler_with_more_due_work_sleeps_until_a_slot_frees(db, make_owner, make_settings,
                                                                          monkeypatch):
    """Its slots and waiting room full and more intents due, the settler
    waits for a step to finish: it does not drain again and again."""
    await _no_op_intents(db, make_owner, 20)
    ctx = await Context.open(make_settings())
    settler = Settler(ctx, 1, sweep_interval_s=0)
    gate = asyncio.Event()

    async def held_step(ctx_, job_id, attempts, job=None):
        await gate.wait()
        return DONE

    drains = 0
    real_drain = settler._drain

    async def drain():
        nonlocal drains
        drains += 1
        await real_drain()

    monkeypatch.setitem(settler_module.STEPS, IntentKind.CANCEL, held_step)
    monkeypatch.setattr(settler, "_drain", drain)
    task = asyncio.create_task(settler.run())
    try:
        await _until(lambda: db.fetchval("select count(*) = 1 from outbox where claimed_until is not null"))
        before = drains
        await asyncio.sleep(1.0)
        # A spinning settler drains thousands of times a second; a listener
        # reconnect or a lease renewal on a loaded machine may add a drain or two.
        assert drains - before <= 10, f"{drains - before} drains in a second while full"
        gate.set()  # the slot frees: the rest drain
        await _until(lambda: db.fetchval("select not exists (select 1 from outbox)"))
    finally:
        gate.set()
        settler.stop()
        await asyncio.wait_for(task, 30)
        await ctx.close()


async def test_a_settler_stopped_while_it_connects_exits_cleanly(tmp_path):
    """A deploy may stop a settler before it is up: SIGTERM while it waits on
    a database that accepts the connection and never answers is a clean exit
    (0, nothing was claimed), not death by the signal (-15)."""
    connected = asyncio.Event()
    held = []

    async def silent(reader, writer):
        held.append(writer)
        connected.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proc = settler_process({"DATABASE_URL": f"postgresql://longcall@127.0.0.1:{port}/longcall",
                            "SECRET_KEY": "test-secret-key-0123456789", "STORAGE_URL": f"file://{tmp_path}/objects",
                            "LOG_LEVEL": "WARNING"})
    try:
        await asyncio.wait_for(connected.wait(), timeout=60)
        proc.send_signal(signal.SIGTERM)
        returncode = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for writer in held:
            writer.close()
        server.close()
    assert returncode == 0


async def test_a_settler_opens_its_whole_pool_before_it_listens(db, make_settings, sim, tmp_objects):
    """Its first jobs find their connections open: concurrency + 4 pooled
    connections exist by the time it listens for work."""
    since = await server_now(db)
    proc = settler_process(env_of(make_settings, sim, tmp_objects))  # --concurrency 8
    try:
        await wait_for_settlers(db, 1, started_after=since)
        pooled = await db.fetchval("select count(*) from pg_stat_activity where datname = current_database()"
                                   " and application_name = 'longcall-settler' and backend_start > $1", since)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert pooled == 8 + 4


async def test_a_settler_starts_on_the_connections_the_server_allows_when_it_refuses_the_whole_pool(
        db, migrated, make_settings, caplog):
    """A server that refuses part of the pool (here a role's connection
    limit of 3 under a pool of 8) does not stop a start: the settler keeps
    what opened, says so, and opens the rest on demand."""
    role, password = "longcall_test_three_connections", "pw-7f3c1e"
    await db.execute(f"drop role if exists {role}")
    await db.execute(f"create role {role} login password '{password}' connection limit 3")
    url = urllib.parse.urlsplit(migrated)
    dsn = url._replace(netloc=f"{role}:{password}@{url.hostname}:{url.port}").geturl()
    try:
        with caplog.at_level(logging.WARNING, logger="longcall.settler"):
            context = await Context.open(make_settings(DATABASE_URL=dsn), pool_size=8, connect_all=True)
        try:
            assert await context.pool.fetchval("select 1") == 1
            connected = await db.fetchval("select count(*) from pg_stat_activity where usename = $1", role)
        finally:
            await context.close()
    finally:
        await db.execute(f"drop role {role}")
    assert connected == 3
    [record] = [r for r in caplog.records if "could not open the whole pool" in r.getMessage()]
    assert (record.opened, record.size) == (3, 8)
    assert password not in record.getMessage() + str(record.error)
