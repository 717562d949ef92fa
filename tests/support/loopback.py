"""ASGI apps served by uvicorn on a port the OS picked, for tests: in its own
thread and event loop (LoopbackServer: small receivers, scripted providers)
or as a task on the test's own loop (serve_in_loop)."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from app.embedded_server import EmbeddedServer


class LoopbackServer:
    def __init__(self, app: Any, *, lifespan: str = "off"):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self) -> LoopbackServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("loopback server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


class InLoopServer:
    """A uvicorn server running as a task on the caller's event loop."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task, port: int, scheme: str):
        self.server, self.task, self.port = server, task, port
        self.url = f"{scheme}://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def serve_in_loop(app: Any, *, port: int = 0, **config: Any) -> InLoopServer:
    """Serve `app` on 127.0.0.1 (`port` 0: one the OS picks, so no race for
    it) on this event loop until `stop()`. The socket is bound before uvicorn
    starts, so a fixed port that is taken raises OSError here. `config` goes
    to uvicorn.Config (defaults: quiet, no lifespan)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    options = {"log_level": "warning", "access_log": False, "lifespan": "off", "timeout_graceful_shutdown": 1,
               **config}
    # EmbeddedServer: the test runner owns Ctrl-C; a server inside a test must not take it.
    server = EmbeddedServer(uvicorn.Config(app, **options))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    scheme = "https" if config.get("ssl_certfile") else "http"
    return InLoopServer(server, task, sock.getsockname()[1], scheme)
