"""The operator's reads (app/domain/operator.py) are each served by an
index: the console refreshes every few seconds, and must cost the same with
ten jobs or ten million. With sequential scans priced out, a plan that still
scans `jobs`, `owners`, `ledger`, `notifications` or `deliveries` in full
has no index to use. Also: an operator's grant moves once per key."""
from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest

from app.domain import jobs, operator, owners
from app.vocabulary import JobError
from tests.support.plans import plan_nodes

JOB = "job_" + "0" * 24
OWNER = "own_" + "0" * 24
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
BIG_TABLES = ("jobs", "owners", "ledger", "notifications", "deliveries", "assets", "job_events")

STATEMENTS = [
    pytest.param(operator.IN_FLIGHT_COUNTS, (), id="in-flight-counts"),
    pytest.param(operator.FINISHED_COUNTS, (3600.0,), id="finished-counts"),
    pytest.param(operator.RECENTLY_FINISHED, (10,), id="recently-finished"),
    pytest.param(operator.IN_FLIGHT_JOBS, (20,), id="in-flight-jobs"),
    pytest.param(operator.UNCERTAIN_JOBS, (100,), id="uncertain-jobs"),
    pytest.param(operator.CLOSED_WITH_ERROR, (JobError.SETTLE_EXHAUSTED, 50), id="closed-with-error"),
    pytest.param(operator.COUNT_WITH_ERROR, (), id="count-with-error"),
    pytest.param(operator.JOB, (JOB,), id="job"),
    pytest.param(operator.JOB_OUTPUTS, (JOB,), id="job-outputs"),
    pytest.param(operator.JOB_LEDGER, (JOB,), id="job-ledger"),
    pytest.param(operator.JOB_NOTIFICATIONS, (JOB,), id="job-notifications"),
    pytest.param(operator.NOTIFICATION_OWNER, ("evt_" + "0" * 32,), id="notification-owner"),
    pytest.param(operator.JOBS_BY_TASK, ("task-1", 20), id="jobs-by-task"),
    pytest.param(operator.OWNERS, (NOW, OWNER, 51), id="owners-page"),
    pytest.param(operator.OWNERS, (None, None, 51), id="owners-first-page"),
    pytest.param(operator.OWNER, (OWNER,), id="owner"),
    pytest.param(jobs.LIST, (OWNER, None, None, None, 26), id="owner-jobs"),
    pytest.param(jobs.LIST, (OWNER, "failed", NOW, JOB, 26), id="owner-jobs-of-a-status-page-2"),
    pytest.param(operator.OWNER_GRANTS, (OWNER, 20), id="owner-grants"),
]


@pytest.mark.parametrize("statement,args", STATEMENTS)
async def test_each_operator_read_is_served_by_an_index(db, statement, args):
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("set local enable_seqscan = off")
        plan = await conn.fetchval(f"explain (format json) {statement}", *args)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    assert not seq_scanned(plan) & set(BIG_TABLES), json.dumps(plan, indent=1)


def seq_scanned(plan: list) -> set[str]:
    """The relations a JSON plan reads with sequential scans."""
    return {node["Relation Name"] for top in plan for node in plan_nodes(top["Plan"])
            if node.get("Node Type") == "Seq Scan"}


async def test_an_operators_grant_moves_once_per_key(db, make_owner):
    owner = await make_owner(credits=10)
    key = "console-" + "a" * 32

    async def grant() -> bool:
        async with db.acquire() as conn:
            return await owners.operator_grant(conn, owner.owner_id, credits=5, reason="ticket 9", request_key=key)

    moved = await asyncio.gather(*(grant() for _ in range(10)))
    assert sorted(moved) == [False] * 9 + [True]
    row = await db.fetchrow("select granted, balance from owners where id = $1", owner.owner_id)
    assert tuple(row) == (15, 15)
    async with db.acquire() as conn:
        with pytest.raises(owners.IdempotencyConflict):
            await owners.operator_grant(conn, owner.owner_id, credits=6, reason="ticket 9", request_key=key)
        with pytest.raises(owners.NotFound):
            await owners.operator_grant(conn, OWNER, credits=5, reason="x", request_key=key)
        with pytest.raises(ValueError):
            await owners.operator_grant(conn, owner.owner_id, credits=0, reason="x", request_key="console-" + "b" * 32)
    assert await db.fetchval("select count(*) from ledger where owner_id = $1 and kind = 'grant'", owner.owner_id) == 2
