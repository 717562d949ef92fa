"""Small real servers and waits for the simulator tests."""
from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.loopback import LoopbackServer as ServedApp


@dataclass(frozen=True)
class Received:
    path: str
    query: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # unix time of arrival


class Receiver:
    """A webhook receiver that records every request. `fail_next(n)` makes
    the next n requests answer 500."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._statuses: deque[int] = deque()
        self.app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["POST"])])
        self.server = ServedApp(self.app)

    @property
    def url(self) -> str:
        return self.server.url

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        with self._lock:
            self._received.append(Received(
                path=request.url.path,
                query=request.url.query,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                at=time.time(),
            ))
            status = self._statuses.popleft() if self._statuses else 204
        return Response(status_code=status)

    def fail_next(self, n: int, status: int = 500) -> None:
        with self._lock:
            self._statuses.extend([status] * n)

    def clear(self) -> None:
        with self._lock:
            self._received.clear()
            self._statuses.clear()

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        wait_until(lambda: len(self.received) >= count, timeout, f"{count} webhook(s)")
        return self.received


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
