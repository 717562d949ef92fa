"""The one LISTEN loop (app/listen.py), on the real test PostgreSQL: it
delivers NOTIFYs, comes back after the server kills its connection (and
says so through on_connected, so the caller can look for what it missed),
and closes its connection when cancelled."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from app.embedded import free_port
from app.listen import listen_forever

CHANNEL = "longcall_test_listen"
ROLE = "test-listen"  # application_name longcall-test-listen
MINE = "from pg_stat_activity where application_name = 'longcall-test-listen'"
TIMEOUT_S = 10.0
PASSWORD = "listen-test-password-never-logged"


class Heard:
    """What the loop told us, as queues the test awaits."""

    def __init__(self) -> None:
        self.payloads: asyncio.Queue[str] = asyncio.Queue()
        self.connects: asyncio.Queue[int] = asyncio.Queue()
        self.connected = 0

    def on_notify(self, payload: str) -> None:
        self.payloads.put_nowait(payload)

    def on_connected(self) -> None:
        self.connected += 1
        self.connects.put_nowait(self.connected)


async def _eventually(check, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_delivers_reconnects_after_being_killed_and_closes_when_cancelled(migrated, pool):
    heard = Heard()
    task = asyncio.create_task(listen_forever(migrated, CHANNEL, heard.on_notify, role=ROLE,
                                              on_connected=heard.on_connected, retry_s=0.05))
    try:
        # on_connected runs once the LISTEN is in place: a NOTIFY now is heard.
        assert await asyncio.wait_for(heard.connects.get(), TIMEOUT_S) == 1
        await pool.execute("select pg_notify($1, $2)", CHANNEL, "first")
        assert await asyncio.wait_for(heard.payloads.get(), TIMEOUT_S) == "first"

        killed = await pool.fetchval(f"select count(*) filter (where pg_terminate_backend(pid)) {MINE}")
        assert killed == 1
        assert await asyncio.wait_for(heard.connects.get(), TIMEOUT_S) == 2  # back, and says so
        await pool.execute("select pg_notify($1, $2)", CHANNEL, "second")
        assert await asyncio.wait_for(heard.payloads.get(), TIMEOUT_S) == "second"
        assert await pool.fetchval(f"select count(*) {MINE}") == 1  # the old connection is gone
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await _eventually(lambda: _none_left(pool))
    assert heard.payloads.empty()


class Warnings(logging.Handler):
    """Counts the loop's warnings; `reached(n)` is set at the n-th."""

    def __init__(self, n: int) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.reached = asyncio.Event()
        self._n = n

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if len(self.records) >= self._n:
            self.reached.set()


async def test_keeps_trying_while_the_database_is_away():
    """Nothing listens on the port: every connect fails, the loop logs each
    (without the DSN) and tries again, never calls on_connected, and stops
    when cancelled."""
    heard = Heard()
    dsn = f"postgresql://someone:{PASSWORD}@127.0.0.1:{free_port()}/nothing"
    warnings = Warnings(3)
    logger = logging.getLogger("longcall.listen")
    logger.addHandler(warnings)
    task = asyncio.create_task(listen_forever(dsn, CHANNEL, heard.on_notify, role=ROLE,
                                              on_connected=heard.on_connected, retry_s=0.01))
    try:
        await asyncio.wait_for(warnings.reached.wait(), TIMEOUT_S)
        assert not task.done() and heard.connected == 0
    finally:
        logger.removeHandler(warnings)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for record in warnings.records:
        text = record.getMessage() + repr(record.__dict__)
        assert PASSWORD not in text and "reconnecting" in text


async def _none_left(pool) -> bool:
    return await pool.fetchval(f"select count(*) {MINE}") == 0
