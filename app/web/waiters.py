"""`GET /v1/jobs/{id}?wait=N`: hold a read until the job changes.

One connection per web process (not one per waiting request) hears every
job change (payload: the job id) and wakes the requests watching it. If the
listener is down, waits simply run to their timeout and the read answers
with what the database says then: slower, never wrong.

It LISTENs only while some read waits (and LINGER_S after the last, so a
client that waits again and again does not make it LISTEN and UNLISTEN for
each read). PostgreSQL wakes every backend that listens in a database for
every NOTIFY on any channel, and every webhook, create and close sends one:
a web process listening all the time cost each of them a wake-up of its
backend (README, the ingest row).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg

from app.db import JOBS_CHANNEL
from app.listen import hold_connection

log = logging.getLogger("longcall.web")

LINGER_S = 10.0  # listening on after the last wait ends


class _Watch:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False


class JobChanges:
    def __init__(self, dsn: str, *, linger_s: float = LINGER_S):
        self.dsn = dsn
        self.linger_s = linger_s
        self._watches: dict[str, set[_Watch]] = {}
        self._conn: asyncpg.Connection | None = None  # while it is up
        # True only while LISTEN is in effect on _conn and stays so: it is
        # set false before an UNLISTEN is sent, not after.
        self._listening = False
        self._switching = asyncio.Lock()  # one LISTEN or UNLISTEN at a time
        self._unlisten: asyncio.TimerHandle | None = None
        self._unlistening: asyncio.Task | None = None  # kept: the loop holds a task only weakly
        self._task: asyncio.Task | None = None

    @contextlib.asynccontextmanager
    async def watch(self, job_id: str) -> AsyncIterator[_Watch]:
        """Watch a job that a read may wait on. On entry the listener is in
        place (or down), so a change committed after the read that follows
        wakes the watch."""
        w = _Watch()
        self._watches.setdefault(job_id, set()).add(w)
        try:
            await self._listen()
            yield w
        finally:
            bucket = self._watches.get(job_id)
            if bucket is not None:
                bucket.discard(w)
                if not bucket:
                    del self._watches[job_id]
            if not self._watches:
                self._schedule_unlisten()

    @property
    def connected(self) -> bool:
        """Its connection is up (a watch entered now LISTENs at once)."""
        return self._conn is not None

    def watching(self, job_id: str) -> int:
        """How many requests are watching this job now."""
        return len(self._watches.get(job_id, ()))

    def _on_notify(self, _conn, _pid, _channel, payload: str) -> None:
        for w in self._watches.get(payload, ()):
            w.event.set()

    def _wake_all(self) -> None:
        for bucket in self._watches.values():
            for w in bucket:
                w.event.set()

    async def _listen(self) -> None:
        if self._unlisten is not None:
            self._unlisten.cancel()
            self._unlisten = None
        if self._listening:
            return
        async with self._switching:
            conn = self._conn
            if self._listening or conn is None:
                return  # down: the wait runs out, or the reconnect wakes it
            try:
                await conn.add_listener(JOBS_CHANNEL, self._on_notify)
            except Exception as e:  # the connection is going: its loop reconnects
                log.warning("LISTEN failed", extra={"error": type(e).__name__})
                return
            self._listening = True

    def _schedule_unlisten(self) -> None:
        if self._unlisten is None and self._listening:
            loop = asyncio.get_running_loop()
            self._unlisten = loop.call_later(self.linger_s, self._start_unlistening)

    def _start_unlistening(self) -> None:
        self._unlisten = None
        self._unlistening = asyncio.get_running_loop().create_task(self._stop_listening())

    async def _stop_listening(self) -> None:
        async with self._switching:
            conn = self._conn
            if self._watches or not self._listening or conn is None:
                return
            # Before the await: a watch that comes meanwhile must LISTEN again.
            self._listening = False
            try:
                await conn.remove_listener(JOBS_CHANNEL, self._on_notify)
            except Exception as e:
                # The server's LISTEN state is unknown now: start afresh.
                log.warning("UNLISTEN failed", extra={"error": type(e).__name__})
                conn.terminate()

    async def _connected(self, conn: asyncpg.Connection) -> None:
        async with self._switching:
            self._conn = conn
            if self._watches:
                await conn.add_listener(JOBS_CHANNEL, self._on_notify)
                self._listening = True
        # A change may have gone unheard while no one listened, and a woken
        # read looks at the database.
        self._wake_all()

    def _lost(self) -> None:
        self._conn = None
        self._listening = False

    async def start(self) -> None:
        self._task = asyncio.create_task(hold_connection(self.dsn, role="web-listen", on_connected=self._connected,
                                                         on_lost=self._lost, label=JOBS_CHANNEL))

    async def stop(self) -> None:
        if self._unlisten is not None:
            self._unlisten.cancel()
        for task in (self._unlistening, self._task):
            if task:
                task.cancel()  # the connection closes on the way out
                with contextlib.suppress(BaseException):
                    await task
