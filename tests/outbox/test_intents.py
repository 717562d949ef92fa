"""The outbox's mechanics, on a real PostgreSQL: coalescing, generations,
leases, SKIP LOCKED claims, NOTIFY only when something became due sooner."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.db import OUTBOX_CHANNEL
from app.domain import jobs
from app.domain.record import COLUMNS, JobRecord
from outbox import intents
from tests.support.plans import plan_nodes


@pytest.fixture
async def job_ids(db, make_owner):
    owner = await make_owner(credits=10_000, max_active=1000)
    made = []
    for _ in range(5):
        created = await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim",
                                        model="m", input={}, max_credits=1, give_up_after_s=3600)
        made.append(created.job_id)
    await db.execute("delete from outbox")  # start each test from no intents
    return made


class Heard(list):
    """The payloads heard on the outbox channel, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    def hear(self, payload: str) -> None:
        self.append(payload)
        self.arrived.set()


@pytest.fixture
async def notifications(migrated):
    conn = await asyncpg.connect(migrated)
    got = Heard()
    await conn.add_listener(OUTBOX_CHANNEL, lambda *args: got.hear(args[3]))
    yield got
    await conn.close()


async def settle_notifications(conn, got, before: int) -> list[str]:
    """What was heard since `before`: everything up to a marker sent now (the
    listener hears NOTIFYs in commit order), so no sleep decides the answer."""
    await conn.execute(f"select pg_notify('{OUTBOX_CHANNEL}', 'marker')")
    async with asyncio.timeout(30):
        while "marker" not in got[before:]:
            got.arrived.clear()
            await got.arrived.wait()
    heard = got[before:]
    got.remove("marker")
    return heard[:heard.index("marker")]


async def test_requests_coalesce_into_one_intent_keeping_the_earliest_time(db, job_ids, notifications):
    job = job_ids[0]
    async with db.acquire() as conn:
        await intents.request(conn, job, "settle", delay_s=60)
        await intents.request(conn, job, "settle", delay_s=120)  # later: changes nothing but the generation
        row = await conn.fetchrow("select * from outbox where job_id = $1", job)
        assert row["generation"] == 1
        assert 55 < (row["not_before"] - await conn.fetchval("select now()")).total_seconds() < 65
        await intents.request(conn, job, "settle", delay_s=0)   # sooner: due now
        assert await conn.fetchval("select count(*) from outbox") == 1
        assert await conn.fetchval("select not_before <= now() from outbox") is True


async def test_notify_only_when_an_intent_becomes_due_sooner(db, job_ids, notifications):
    job = job_ids[0]
    async with db.acquire() as conn:
        await intents.request(conn, job, "settle", delay_s=0)
        first = await settle_notifications(conn, notifications, 0)
        assert first == [""]  # new and due now
        for _ in range(5):
            await intents.request(conn, job, "settle", delay_s=0)  # already due: no NOTIFY
        assert await settle_notifications(conn, notifications, 1) == []
        await intents.request(conn, job_ids[1], "settle", delay_s=30)
        timer = await settle_notifications(conn, notifications, 1)
        assert len(timer) == 1 and float(timer[0]) > 0  # a timer: its due time


async def test_an_unflushed_request_commits_without_waiting_for_the_flush_and_leaves_the_session_as_it_was(
        db, job_ids, notifications):
    """REQUEST_UNFLUSHED (a webhook's) turns synchronous_commit off for its
    own transaction; REQUEST commits under the session's setting. Both
    write, coalesce and notify alike, and neither changes the session."""
    async with db.acquire() as conn:
        await conn.execute("set synchronous_commit = on")  # the test cluster's default is off
        try:
            unflushed = await conn.fetchrow(intents.REQUEST_UNFLUSHED, job_ids[0], "settle", 0.0, None)
            assert unflushed["synchronous_commit"] == "off"
            assert await conn.fetchval("show synchronous_commit") == "on"
            flushed = await conn.fetchrow(intents.REQUEST, job_ids[1], "settle", 0.0, None)
            assert flushed["synchronous_commit"] == "on"
            assert await settle_notifications(conn, notifications, 0) == ["", ""]  # each new and due now
            assert await intents.request(conn, job_ids[0], "settle", wait_for_flush=False) is True
            assert await conn.fetchval("select generation from outbox where job_id = $1", job_ids[0]) == 1
        finally:
            await conn.execute("reset synchronous_commit")


async def test_an_unflushed_request_is_refused_inside_a_transaction_and_writes_nothing(db, job_ids):
    """Inside a transaction its setting would cover everything else the
    transaction writes (a webhook's task claim, say)."""
    async with db.acquire() as conn:
        await conn.execute("set synchronous_commit = on")
        try:
            async with conn.transaction():
                with pytest.raises(ValueError, match="unflushed"):
                    await intents.request(conn, job_ids[0], "settle", wait_for_flush=False)
                assert await conn.fetchval("select current_setting('synchronous_commit')") == "on"
        finally:
            await conn.execute("reset synchronous_commit")
        assert await conn.fetchval("select count(*) from outbox") == 0


async def test_the_settlers_bookkeeping_commits_unflushed_and_leaves_the_session_as_it_was(db, job_ids):
    """Claim, renew, retry, finish and release only move leases and due
    times: each turns synchronous_commit off for its own transaction."""
    async with db.acquire() as conn:
        await conn.execute("set synchronous_commit = on")
        try:
            for job in job_ids[:3]:
                await intents.request(conn, job, "settle")
            rows = await conn.fetch(intents.CLAIM, 10, 60.0, 0, False)
            assert {r["unflushed"] for r in rows} == {"off"} and len(rows) == 3
            ids, generations = [r["intent_id"] for r in rows], [r["intent_generation"] for r in rows]
            assert [r[0] for r in await conn.fetch(intents.RENEW, ids, generations, 60.0)] == ["off"] * 3
            assert (await conn.fetchrow(intents.RETRY, ids[0], generations[0], 30.0, False))["unflushed"] == "off"
            assert await conn.fetchval(intents.RELEASE, ids[1]) == "off"
            assert await conn.fetchval(intents.FINISH_MANY, ids[2:], generations[2:]) == "off"
            assert await conn.fetchval("show synchronous_commit") == "on"
        finally:
            await conn.execute("reset synchronous_commit")
        assert await conn.fetchval("select count(*) from outbox") == 2


async def test_the_settlers_bookkeeping_is_refused_inside_a_transaction(db, job_ids):
    async with db.acquire() as conn:
        await intents.request(conn, job_ids[0], "settle")
        [held] = (await intents.claim(conn, 10, lease_s=60)).intents
        async with conn.transaction():
            for call in (intents.claim(conn, 10, 60), intents.renew(conn, [held], 60), intents.release(conn, held),
                         intents.retry(conn, held, 30, failed=False), intents.finish_many(conn, [held])):
                with pytest.raises(ValueError, match="unflushed"):
                    await call
        assert await conn.fetchval("select claimed_until is not null from outbox") is True


async def test_a_request_while_claimed_is_not_lost(db, job_ids):
    job = job_ids[0]
    async with db.acquire() as conn:
        await intents.request(conn, job, "settle")
        [claimed] = (await intents.claim(conn, 10, lease_s=60)).intents
        await intents.request(conn, job, "settle")        # asked again while a worker holds it
        assert await intents.finish_many(conn, [claimed]) == {claimed.id}  # kept, and due
        row = await conn.fetchrow("select * from outbox where job_id = $1", job)
        assert row["claimed_until"] is None and row["not_before"] <= await conn.fetchval("select now()")
        [again] = (await intents.claim(conn, 10, lease_s=60)).intents
        assert await intents.finish_many(conn, [again]) == set()  # nothing new: deleted
        assert await conn.fetchval("select count(*) from outbox") == 0


async def test_retry_waits_unless_asked_meanwhile(db, job_ids):
    async with db.acquire() as conn:
        await intents.request(conn, job_ids[0], "settle")
        await intents.request(conn, job_ids[1], "settle")
        a, b = (await intents.claim(conn, 10, lease_s=60)).intents
        await intents.request(conn, b.job_id, "settle")
        ra = await intents.retry(conn, a, 30, failed=True)
        rb = await intents.retry(conn, b, 30, failed=False)
        assert ra["requested_meanwhile"] is False and rb["requested_meanwhile"] is True
        rows = {r["job_id"]: r for r in await conn.fetch("select *, not_before <= now() as due from outbox")}
        assert rows[a.job_id]["due"] is False and rows[a.job_id]["attempts"] == 1   # failure counts
        assert rows[b.job_id]["due"] is True and rows[b.job_id]["attempts"] == 0    # a normal wait resets


async def test_concurrent_claims_are_disjoint_and_leases_return(db, job_ids):
    async with db.acquire() as conn:
        for job in job_ids:
            await intents.request(conn, job, "settle")
    conns = [await db.acquire() for _ in range(5)]
    try:
        batches = [b.intents for b in await asyncio.gather(*[intents.claim(c, 2, lease_s=1) for c in conns])]
    finally:
        for c in conns:
            await db.release(c)
    claimed = [i.job_id for batch in batches for i in batch]
    assert sorted(claimed) == sorted(job_ids)  # every intent once, none twice
    async with db.acquire() as conn:
        assert (await intents.claim(conn, 10, lease_s=1)).intents == []  # all leased
        await asyncio.sleep(1.2)
        again = (await intents.claim(conn, 10, lease_s=60)).intents      # the leases ended: back they come
        assert sorted(i.job_id for i in again) == sorted(job_ids)
        assert {i.attempts for i in again} == {2}


async def test_closing_a_job_drops_its_submit_and_settle_intents(db, job_ids):
    job = job_ids[0]
    async with db.acquire() as conn:
        await intents.request(conn, job, "submit")
        await intents.request(conn, job, "settle", delay_s=100)
        closed = await jobs.close(conn, job, "cancelled", cancel_at_provider=True)
        assert closed is not None
        # no provider call had started: no provider cancel either
        assert await conn.fetchval("select count(*) from outbox where job_id = $1", job) == 0


async def test_finish_many_deletes_done_work_and_keeps_what_was_asked_again(db, job_ids):
    async with db.acquire() as conn:
        for job in job_ids:
            await intents.request(conn, job, "settle")
        claimed = (await intents.claim(conn, 10, lease_s=60)).intents
        asked_again = claimed[0]
        await intents.request(conn, asked_again.job_id, "settle")
        kept = await intents.finish_many(conn, claimed)
        assert kept == {asked_again.id}
        rows = await conn.fetch("select id, claimed_until from outbox")
        assert [(r["id"], r["claimed_until"]) for r in rows] == [(asked_again.id, None)]


async def test_a_claim_loads_its_jobs_and_says_when_to_wake_next(db, job_ids):
    async with db.acquire() as conn:
        for job in job_ids[:3]:
            await intents.request(conn, job, "settle")
        await intents.request(conn, job_ids[3], "submit")
        await intents.request(conn, job_ids[4], "settle", delay_s=30)
        claimed = await intents.claim(conn, 10, 30)
        assert sorted(i.job_id for i in claimed.intents) == sorted(job_ids[:4])
        # each settle's job, as the steps read it; not the submit's (its claim statement loads it)
        loaded = {claimed_intent.job_id: claimed.jobs[claimed_intent.id] for claimed_intent in claimed.intents
                  if claimed_intent.id in claimed.jobs}
        assert sorted(loaded) == sorted(job_ids[:3])
        for job_id, row in loaded.items():
            full = await jobs.load(conn, job_id)
            assert JobRecord.from_row(row) == JobRecord.from_row(full)  # a KeyError if it reads a column not loaded
            assert {k: row[k] for k in COLUMNS} == {k: full[k] for k in COLUMNS}
        # the next wake is the one intent not yet due (the claimed ones are left out)
        later = await conn.fetchval("select not_before from outbox where job_id = $1", job_ids[4])
        assert claimed.next_due == later
        again = await intents.claim(conn, 10, 30, load_submits=True)
        assert again.intents == [] and again.jobs == {} and again.next_due == later
        await conn.execute("delete from outbox")
        assert (await intents.claim(conn, 10, 30)).next_due is None


async def test_a_capped_submit_is_claimed_with_its_job(db, job_ids):
    async with db.acquire() as conn:
        await intents.request(conn, job_ids[0], "submit")
        claimed = await intents.claim(conn, 10, 30, load_submits=True)
        [intent] = claimed.intents
        assert claimed.jobs[intent.id]["id"] == job_ids[0]


async def test_saving_a_task_deletes_the_submit_intent_it_was_claimed_by(db, job_ids):
    job = job_ids[0]
    async with db.acquire() as conn:
        await intents.request(conn, job, "submit")
        (claimed,) = (await intents.claim(conn, 10, lease_s=60)).intents
        assert await jobs.begin_submit(conn, job)
        saved = await jobs.save_task(conn, job, task_id="task-1", operation=None, webhook_secret=None,
                                     callback_registered=False, first_check_after_s=30)
        assert saved is jobs.Saved.RUNNING
        kinds = [r["kind"] for r in await conn.fetch("select kind from outbox where job_id = $1", job)]
        assert kinds == ["settle"]  # the submit is done: the step has nothing left to delete
        assert await intents.finish_many(conn, [claimed]) == set()  # and a late delete is harmless


async def _now(conn):
    return await conn.fetchval("select now()")


async def test_a_claim_moves_the_intent_to_its_lease_end_and_a_request_pulls_it_back(db, job_ids):
    async with db.acquire() as conn:
        await intents.request(conn, job_ids[0], "settle")
        [held] = (await intents.claim(conn, 10, lease_s=60)).intents
        row = await conn.fetchrow("select not_before, claimed_until from outbox where id = $1", held.id)
        assert row["not_before"] == row["claimed_until"]  # waits at the lease's end, off the due front
        assert 55 < (row["not_before"] - await _now(conn)).total_seconds() < 65
        # A request meanwhile pulls it back to when it asked; the lease still
        # keeps every other claim off it until the worker is done.
        await intents.request(conn, job_ids[0], "settle")
        row = await conn.fetchrow("select not_before, claimed_until from outbox where id = $1", held.id)
        assert row["not_before"] <= await _now(conn) < row["claimed_until"]
        assert (await intents.claim(conn, 10, lease_s=60)).intents == []
        assert await intents.finish_many(conn, [held]) == {held.id}
        [again] = (await intents.claim(conn, 10, lease_s=60)).intents
        assert again.id == held.id


async def test_a_released_claim_is_due_at_once(db, job_ids):
    async with db.acquire() as conn:
        await intents.request(conn, job_ids[0], "settle")
        [held] = (await intents.claim(conn, 10, lease_s=60)).intents
        await intents.release(conn, held)
        row = await conn.fetchrow("select not_before, claimed_until, attempts from outbox where id = $1", held.id)
        assert row["claimed_until"] is None and row["not_before"] <= await _now(conn) and row["attempts"] == 0
        assert [i.id for i in (await intents.claim(conn, 10, lease_s=60)).intents] == [held.id]


async def test_renewing_leases_moves_their_due_time_unless_a_request_came(db, job_ids):
    async with db.acquire() as conn:
        await intents.request(conn, job_ids[0], "settle")
        await intents.request(conn, job_ids[1], "settle")
        quiet, asked = (await intents.claim(conn, 10, lease_s=30)).intents
        await intents.request(conn, asked.job_id, "settle")  # its generation moves
        await intents.renew(conn, [quiet, asked], lease_s=120)
        rows = {r["id"]: r for r in await conn.fetch("select id, not_before, claimed_until from outbox")}
        now = await _now(conn)
        assert rows[quiet.id]["not_before"] == rows[quiet.id]["claimed_until"]
        assert 115 < (rows[quiet.id]["claimed_until"] - now).total_seconds() < 125
        assert rows[asked.id]["not_before"] <= now  # still due the moment its worker lets go
        assert 115 < (rows[asked.id]["claimed_until"] - now).total_seconds() < 125
        # A renewal never takes back an intent its worker already let go of.
        await intents.finish_many(conn, [asked])
        await intents.renew(conn, [asked], lease_s=120)
        assert await conn.fetchval("select claimed_until from outbox where id = $1", asked.id) is None


async def test_a_claim_walks_past_no_intent_another_worker_holds(db, make_owner):
    """The due index's front holds only what may be claimed: with 300
    intents under lease, the claim's scan reads the 3 due ones and stops
    (it used to read, and filter out, every leased one on every claim)."""
    owner = await make_owner(credits=10_000, max_active=1000)
    ids = [(await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim", model="m",
                                  input={}, max_credits=1, give_up_after_s=3600)).job_id for _ in range(303)]
    async with db.acquire() as conn:
        await conn.execute("delete from outbox")
        for job in ids[:300]:
            await intents.request(conn, job, "settle")
        assert len((await intents.claim(conn, 300, lease_s=60)).intents) == 300
        for job in ids[300:]:
            await intents.request(conn, job, "settle")
        explain = conn.transaction()
        await explain.start()
        try:  # the plan as the index serves it, whatever this small table's statistics say
            await conn.execute("set local enable_seqscan = off; set local enable_bitmapscan = off")
            plan = await conn.fetchval("explain (analyze, format json) " + intents.CLAIM, 10, 60.0, 0, False)
        finally:
            await explain.rollback()
    [due_work] = [n for n in plan_nodes(plan[0]["Plan"]) if n.get("Subplan Name") == "CTE due_work"]
    [scan] = [n for n in plan_nodes(due_work) if n.get("Index Name") == "outbox_due"]
    assert scan["Actual Rows"] == 3 and scan.get("Rows Removed by Filter", 0) == 0
