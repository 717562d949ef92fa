"""A notification receiver on loopback: records every delivery it gets and
answers with the status codes it is told to (then 204)."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.loopback import LoopbackServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    answers: list[int] = field(default_factory=list)  # popped one per delivery; then 204
    delay_s: float = 0.0  # before answering (a slow endpoint)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            body = await request.body()
            with self.lock:
                self.received.append(Received(dict(request.headers), body))
                status = self.answers.pop(0) if self.answers else 204
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return Response(status_code=status)
        return Starlette(routes=[Route("/hook", hook, methods=["POST"])])

    def ids(self) -> list[str]:
        with self.lock:
            return [r.headers["webhook-id"] for r in self.received]


class RunningReceiver:
    def __init__(self, receiver: Receiver):
        self.receiver = receiver
        self.server = LoopbackServer(receiver.app())

    def __enter__(self) -> RunningReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    @property
    def origin(self) -> str:
        return self.server.url

    @property
    def url(self) -> str:
        return self.server.url + "/hook"
