"""The web process's one listener for waiting reads (app/web/waiters.py),
on the real test PostgreSQL: it LISTENs only while a read waits (and for
its linger after), and a watch entered at any moment of an UNLISTEN still
hears its job's change. (Reconnecting under held reads is in
tests/roads/test_wait.py.)"""
from __future__ import annotations

import asyncio
import time

import pytest

from app.db import JOBS_CHANNEL
from app.web.waiters import JobChanges

# The listener's last statement: what it is listening to, seen from outside.
LAST_STATEMENT = "select query from pg_stat_activity where application_name = 'longcall-web-listen'"
JOB = "job_0123456789abcdef01234567"
OTHER = "job_76543210fedcba9876543210"
TIMEOUT_S = 10.0


async def _eventually(check, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _started(dsn: str, pool, linger_s: float) -> JobChanges:
    changes = JobChanges(dsn, linger_s=linger_s)
    await changes.start()

    async def connected() -> bool:
        # Up and set up: its backend alone exists before the connection's setup is done.
        return changes.connected

    await _eventually(connected)
    return changes


async def _last_statement_starts(pool, prefix: str) -> bool:
    return (await pool.fetchval(LAST_STATEMENT)).startswith(prefix)


async def test_it_listens_only_while_a_read_waits(migrated, pool):
    changes = await _started(migrated, pool, linger_s=0)
    try:
        # Connected, listening to nothing: the server wakes it for no NOTIFY.
        assert not await _last_statement_starts(pool, "LISTEN")
        async with changes.watch(JOB) as watch:
            assert await _last_statement_starts(pool, "LISTEN")  # in place on entry
            await pool.execute("select pg_notify($1, $2)", JOBS_CHANNEL, OTHER)
            await pool.execute("select pg_notify($1, $2)", JOBS_CHANNEL, JOB)
            assert await watch.wait(TIMEOUT_S)
            assert changes.watching(JOB) == 1
        assert changes.watching(JOB) == 0
        await _eventually(lambda: _last_statement_starts(pool, "UNLISTEN"))
    finally:
        await changes.stop()
    assert await pool.fetchval(LAST_STATEMENT) is None  # its connection closed


async def test_it_listens_on_for_its_linger(migrated, pool):
    changes = await _started(migrated, pool, linger_s=3600)
    try:
        async with changes.watch(JOB):
            pass
        listened_at = await pool.fetchval(LAST_STATEMENT.replace("query", "query_start"))
        async with changes.watch(OTHER) as watch:  # the next wait sends nothing
            await pool.execute("select pg_notify($1, $2)", JOBS_CHANNEL, OTHER)
            assert await watch.wait(TIMEOUT_S)
        assert await _last_statement_starts(pool, "LISTEN")
        assert await pool.fetchval(LAST_STATEMENT.replace("query", "query_start")) == listened_at
    finally:
        await changes.stop()


@pytest.mark.parametrize("turns", range(8))
async def test_a_watch_entered_during_an_unlisten_hears_its_job(migrated, pool, turns):
    """The last watch ends and the UNLISTEN goes out at once (no linger);
    a new watch enters `turns` turns of the event loop later: before the
    UNLISTEN is scheduled, while it is on the wire, or after it. It must
    hear its job's change in every case."""
    changes = await _started(migrated, pool, linger_s=0)
    try:
        async with changes.watch(JOB):
            pass
        for _ in range(turns):
            await asyncio.sleep(0)
        async with changes.watch(JOB) as watch:
            await pool.execute("select pg_notify($1, $2)", JOBS_CHANNEL, JOB)
            assert await watch.wait(TIMEOUT_S)
    finally:
        await changes.stop()
