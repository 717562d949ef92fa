"""The statements every job runs reach a job by its primary key, whatever
the planner's statistics say; the settler's own statements reach the
intents they already know by the outbox's (at the end).

A prepared statement keeps a generic plan made once per connection, and a
busy new database makes it while `jobs` still looks empty: a plan that
hash-joined the claimed intents to a sequential scan of `jobs` then read
every job on every claim as the table grew (3,000 rows a claim in
`longcall bench`). Here the plans are made the same way, from the
statistics of a table analyzed while it held 3 jobs, then run with 2,000."""
from __future__ import annotations

import pytest

from app.domain import jobs
from app.vocabulary import JobStatus
from outbox import intents
from outbox.settler import CLAIM_BATCH
from tests.support.plans import plan_nodes

GROWN_TO = 2000


async def _explain(db, sql: str, args, plan_mode: str) -> dict:
    """The statement's executed plan under `plan_mode`, its writes rolled back."""
    async with db.acquire() as conn:
        run = conn.transaction()
        await run.start()
        try:
            await conn.execute(f"set local plan_cache_mode = {plan_mode}")
            [plan] = await conn.fetchval("explain (analyze, format json) " + sql, *args)
        finally:
            await run.rollback()
    return plan


async def _make_jobs(db, owner_id: str, n: int) -> list[str]:
    return [(await jobs.create_job(db, owner_id=owner_id, request_key=None, provider="sim", model="m", input={},
                                   max_credits=1, give_up_after_s=3600)).job_id for _ in range(n)]


async def _running_with_a_settle(db, ids: list[str]) -> None:
    await db.execute("update jobs set status = 'running' where id = any($1::text[])", ids)
    await db.execute("insert into outbox (job_id, kind) select unnest($1::text[]), 'settle'", ids)


async def _finished(db, ids: list[str]) -> None:
    """Closed as cancelled and refunded, as a settler leaves them."""
    await db.execute("update jobs set status = 'cancelled', credits_refunded = credits_reserved, finished_at = now(), "
                     "webhook_secret = null where id = any($1::text[])", ids)


@pytest.fixture
async def grown(db, make_owner):
    """Job ids of a `jobs` table analyzed small and grown since."""
    owner = await make_owner(credits=10_000, max_active=10_000)
    ids = await _make_jobs(db, owner.owner_id, 3)
    await db.execute("analyze jobs, outbox")
    ids += await _make_jobs(db, owner.owner_id, GROWN_TO - 3)
    await _running_with_a_settle(db, ids[:500])
    return ids


def _hot_statements(ids):
    job = ids[-1]
    running = ids[0]
    return {
        "claim": (intents.CLAIM, (CLAIM_BATCH, 60.0, 0, False)),
        "claim with submits": (intents.CLAIM, (CLAIM_BATCH, 60.0, 0, True)),
        "begin submit": (jobs.BEGIN_SUBMIT_UNCAPPED, (job,)),
        "save task": (jobs.SAVE_TASK, (job, "task_1", None, None, False, 30.0, [JobStatus.QUEUED], None)),
        "webhook request": (intents.REQUEST_UNFLUSHED, (running, "settle", 0.0, "webhook_accepted")),
    }


@pytest.mark.parametrize("name", ["claim", "claim with submits", "begin submit", "save task", "webhook request"])
async def test_a_generic_plan_from_stale_statistics_reads_jobs_by_primary_key(db, grown, name):
    sql, args = _hot_statements(grown)[name]
    plan = await _explain(db, sql, args, "force_generic_plan")
    on_jobs = [n for n in plan_nodes(plan["Plan"])
               if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"]
    assert on_jobs, "the statement reads jobs"
    for node in on_jobs:
        assert (node["Node Type"], node.get("Index Name")) == ("Index Scan", "jobs_pkey"), node
        assert node["Actual Rows"] <= 1, node


@pytest.fixture
async def backlog(db, grown):
    """2,500 intents (every job's submit, 500 settles), analyzed as they are;
    the first 100 as a settler holds them (id, generation)."""
    await db.execute("analyze outbox")
    rows = await db.fetch("select id, generation from outbox order by id limit 100")
    return [r["id"] for r in rows], [r["generation"] for r in rows]


@pytest.mark.parametrize("plan_mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("name", ["claim", "finish many", "renew"])
async def test_the_outbox_rows_a_statement_knows_are_reached_by_primary_key(db, backlog, name, plan_mode):
    """Joined to a CTE or an unnest alone, these scanned the whole outbox
    (a hash join): a claim, a finish and a renewal each read every intent
    of a backlog."""
    ids, generations = backlog
    sql, args = {"claim": (intents.CLAIM, (CLAIM_BATCH, 60.0, 0, False)),
                 "finish many": (intents.FINISH_MANY, (ids, generations)),
                 "renew": (intents.RENEW, (ids, generations, 60.0))}[name]
    plan = await _explain(db, sql, args, plan_mode)
    on_outbox = [n for n in plan_nodes(plan["Plan"]) if n.get("Relation Name") == "outbox"]
    assert on_outbox, "the statement reads the outbox"
    assert not [n for n in on_outbox if n["Node Type"] == "Seq Scan"], on_outbox
    # The largest claim reads its batch and no more (the backlog is 2,500).
    assert max(n.get("Actual Rows", 0) for n in on_outbox if n["Node Type"] != "ModifyTable") <= 2 * CLAIM_BATCH


@pytest.fixture
async def burst(db, make_owner):
    """Job ids of a `jobs` table analyzed while nearly every job was finished
    (a service's usual state), then a burst of 2,000 in flight: the
    statistics say the in-flight partial index (`jobs_in_flight`) is nearly
    empty."""
    owner = await make_owner(credits=10_000, max_active=10_000)
    done = await _make_jobs(db, owner.owner_id, 1000)
    await db.execute("delete from outbox")
    await _finished(db, done)
    await db.execute("analyze jobs, outbox")
    ids = await _make_jobs(db, owner.owner_id, GROWN_TO)
    await _running_with_a_settle(db, ids[:500])
    return ids


@pytest.mark.parametrize("plan_mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("name", ["claim", "claim with submits", "begin submit", "save task", "webhook request"])
async def test_a_burst_in_flight_after_finished_jobs_still_reads_jobs_by_primary_key(db, burst, name, plan_mode):
    sql, args = _hot_statements(burst)[name]
    plan = await _explain(db, sql, args, plan_mode)
    on_jobs = [n for n in plan_nodes(plan["Plan"])
               if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"]
    assert on_jobs, "the statement reads the jobs"
    for node in on_jobs:
        assert (node["Node Type"], node.get("Index Name")) == ("Index Scan", "jobs_pkey"), node


@pytest.fixture
async def mostly_finished(db, make_owner):
    """2,000 jobs, all but 20 of them finished, analyzed so."""
    owner = await make_owner(credits=10_000, max_active=10_000)
    ids = await _make_jobs(db, owner.owner_id, GROWN_TO)
    await db.execute("delete from outbox where job_id = any($1::text[])", ids[20:])
    await _finished(db, ids[20:])
    await db.execute("analyze jobs, outbox")


@pytest.mark.parametrize("name", ["sweep probe", "in-flight counts", "in-flight jobs", "uncertain jobs",
                                  "metrics"])
async def test_the_readers_of_every_job_in_flight_use_the_in_flight_index(db, mostly_finished, name):
    """The other side of the index's predicate (`finished_at is null`): what
    reads every job in flight reads it through the index, not through the
    finished jobs."""
    from app.domain import operator
    from app.metrics import GAUGES_QUERY
    from outbox.roads import sweep

    sql, args = {"sweep probe": (sweep.PROBE, (1000,)), "in-flight counts": (operator.IN_FLIGHT_COUNTS, ()),
                 "in-flight jobs": (operator.IN_FLIGHT_JOBS, (50,)), "uncertain jobs": (operator.UNCERTAIN_JOBS, (50,)),
                 "metrics": (GAUGES_QUERY, ())}[name]
    [plan] = await db.fetchval("explain (format json) " + sql, *args)
    nodes = list(plan_nodes(plan["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"], nodes
    # jobs_submitted (submitting, running, uncertain) is as small: the uncertain jobs may take it.
    assert {"jobs_in_flight", "jobs_submitted"} & {n.get("Index Name") for n in nodes}, nodes
