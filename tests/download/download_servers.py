"""Real HTTP servers on 127.0.0.1 for the download tests, and a memory sampler.

`start_app` runs an ASGI app under uvicorn in the test's event loop; the raw
servers (`serve_raw`, tests/support/raw_server.py) write whatever bytes a test needs (lying
headers, stalls). Both count the requests they receive, so a test can prove
a refused URL was never fetched.
"""
from __future__ import annotations

import asyncio
import os
import threading

import uvicorn

from tests.support.loopback import serve_in_loop


class RunningApp:
    def __init__(self, url: str, port: int, server: uvicorn.Server, task: asyncio.Task):
        self.url, self.port, self.server, self.task = url, port, server, task
        self.requests = 0


async def start_app(app, **config) -> RunningApp:
    """Serve an ASGI app on a free 127.0.0.1 port, counting its requests;
    stop it with stop_app."""
    holder: dict[str, RunningApp] = {}

    async def counting(scope, receive, send):
        if scope["type"] == "http":
            holder["app"].requests += 1
        await app(scope, receive, send)

    running = await serve_in_loop(counting, **config)
    holder["app"] = RunningApp(running.url, running.port, running.server, running.task)
    return holder["app"]


async def stop_app(app: RunningApp) -> None:
    app.server.should_exit = True
    await app.task


class PeakRss:
    """Samples this process's resident memory from a thread while active.
    (ru_maxrss is a lifetime peak, so earlier tests could hide growth.)"""

    def __init__(self, every_s: float = 0.005):
        self.every_s = every_s
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def current() -> int:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.current())

    def __enter__(self) -> PeakRss:
        self.baseline = self.peak = self.current()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, self.current())

    @property
    def growth(self) -> int:
        return self.peak - self.baseline
