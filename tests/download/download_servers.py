"""Real HTTP servers on 127.0.0.1 for the download tests, and a memory sampler.

`start_app` runs an ASGI app under uvicorn in the test's event loop; the raw
servers (`serve_raw`, tests/support/raw_server.py) write whatever bytes a test needs (lying
headers, stalls). Both count the requests they receive, so a test can prove
a refused URL was never fetched.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading

import uvicorn


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # The test runner owns Ctrl-C; a server inside a test must not take it.
        yield


class RunningApp:
    def __init__(self, url: str, port: int, server: uvicorn.Server, task: asyncio.Task):
        self.url, self.port, self.server, self.task = url, port, server, task
        self.requests = 0


async def start_app(app, **config) -> RunningApp:
    """Serve an ASGI app on a free 127.0.0.1 port; stop it with stop_app."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    holder: dict[str, RunningApp] = {}

    async def counting(scope, receive, send):
        if scope["type"] == "http":
            holder["app"].requests += 1
        await app(scope, receive, send)

    scheme = "https" if config.get("ssl_certfile") else "http"
    server = _QuietServer(uvicorn.Config(counting, log_level="warning", lifespan="off",
                                         timeout_graceful_shutdown=1, **config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    holder["app"] = RunningApp(f"{scheme}://127.0.0.1:{port}", port, server, task)
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
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
