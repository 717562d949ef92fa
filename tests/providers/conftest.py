"""Fixtures for the adapter tests: small real HTTP servers on loopback."""
from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.loopback import LoopbackServer

from .scripted import Script


@pytest.fixture
def serve() -> Iterator[Callable[[Any], LoopbackServer]]:
    """serve(app) → a started LoopbackServer, stopped after the test."""
    servers: list[LoopbackServer] = []

    def start(app: Any) -> LoopbackServer:
        server = LoopbackServer(app).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


@dataclass
class Arrival:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    """Records every POST it gets, exactly as it arrived."""

    url: str = ""
    arrivals: list[Arrival] = field(default_factory=list)

    async def wait_for(self, path: str, timeout_s: float = 10.0) -> Arrival:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for arrival in list(self.arrivals):
                if arrival.path == path:
                    return arrival
            await asyncio.sleep(0.05)
        raise AssertionError(f"no webhook arrived at {path} within {timeout_s}s")


@pytest.fixture
def receiver(serve) -> WebhookReceiver:
    recorder = WebhookReceiver()

    async def record(request: Request) -> Response:
        recorder.arrivals.append(Arrival(
            path=request.url.path,
            query=dict(request.query_params),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.body(),
        ))
        return Response(status_code=204)

    app = Starlette(routes=[Route("/{path:path}", record, methods=["POST"])])
    recorder.url = serve(app).url
    return recorder


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[Script]:
    script = Script()
    server = LoopbackServer(script.app()).start()
    script.url = server.url
    yield script
    server.stop()


@pytest.fixture
def script(scripted_server: Script) -> Script:
    """A scripted provider on loopback (shared per module, reset per test);
    it answers 500 until the test says otherwise."""
    scripted_server.seen.clear()
    scripted_server.answer(500, {})
    return scripted_server
