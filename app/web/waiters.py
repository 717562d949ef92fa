"""`GET /v1/jobs/{id}?wait=N`: hold a read until the job changes.

One LISTEN connection per web process (not one per waiting request) hears
every job change (payload: the job id) and wakes the requests watching it.
If the listener is down, waits simply run to their timeout and the read
answers with what the database says then: slower, never wrong.
"""
from __future__ import annotations

import asyncio
import contextlib

from app.db import JOBS_CHANNEL
from app.listen import listen_forever


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

    def watching(self, job_id: str) -> int:
        """How many requests are watching this job now."""
        return len(self._watches.get(job_id, ()))

    def _on_notify(self, payload: str) -> None:
        for w in self._watches.get(payload, ()):
            w.event.set()

    def _wake_all(self) -> None:
        for bucket in self._watches.values():
            for w in bucket:
                w.event.set()

    async def start(self) -> None:
        # After each (re)connect, wake every waiter: a change may have gone
        # unheard while no one listened, and a woken read looks at the database.
        self._task = asyncio.create_task(listen_forever(self.dsn, JOBS_CHANNEL, self._on_notify, role="web-listen",
                                                        on_connected=self._wake_all))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()  # the listener closes its connection on the way out
            with contextlib.suppress(BaseException):
                await self._task
