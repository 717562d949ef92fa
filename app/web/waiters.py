"""`GET /v1/jobs/{id}?wait=N`: hold a read until the job changes.

One LISTEN connection per web process (not one per waiting request) hears
every job change (payload: the job id) and wakes the requests watching it.
If the listener is down, waits simply run to their timeout and the read
answers with what the database says then: slower, never wrong.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from app.db import JOBS_CHANNEL, connect

log = logging.getLogger("longcall.web")


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
    def __init__(self, dsn: str):
        self.dsn = dsn
        self._watches: dict[str, set[_Watch]] = {}
        self._task: asyncio.Task | None = None
        self._conn: asyncpg.Connection | None = None

    @contextlib.contextmanager
    def watch(self, job_id: str):
        w = _Watch()
        self._watches.setdefault(job_id, set()).add(w)
        try:
            yield w
        finally:
            bucket = self._watches.get(job_id)
            if bucket is not None:
                bucket.discard(w)
                if not bucket:
                    del self._watches[job_id]

    def _on_notify(self, _conn, _pid, _channel, payload: str) -> None:
        for w in self._watches.get(payload, ()):
            w.event.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                self._conn = await connect(self.dsn, role="web-listen")
                await self._conn.add_listener(JOBS_CHANNEL, self._on_notify)
                # Anything that changed while we were not listening: wake all.
                for bucket in self._watches.values():
                    for w in bucket:
                        w.event.set()
                closed = asyncio.Event()
                self._conn.add_termination_listener(lambda _c: closed.set())
                await closed.wait()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # database away: try again shortly
                log.warning("job change listener down: %s", type(e).__name__)
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._conn is not None and not self._conn.is_closed():
            with contextlib.suppress(Exception):
                await self._conn.close()
