"""A provider that answers whatever the test scripts, over real HTTP, for the
failures the simulator does not produce (429 with Retry-After, garbage
2xx, KIE's body codes, a connection dropped mid-request)."""
from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Seen], Awaitable[Response] | Response]


@dataclass
class Script:
    """`handler` answers every request; `seen` records them in order."""

    handler: Handler = field(default=lambda seen: JSONResponse({}, status_code=500))
    seen: list[Seen] = field(default_factory=list)
    url: str = ""  # where it is served, once it is

    def answer(self, status: int = 200, body: Any = None, headers: dict | None = None, raw: bytes | None = None):
        def handler(seen: Seen) -> Response:
            if raw is not None:
                return Response(raw, status_code=status, headers=headers, media_type="text/plain")
            return JSONResponse(body, status_code=status, headers=headers)
        self.handler = handler

    def hang(self, seconds: float = 30.0):
        async def handler(seen: Seen) -> Response:
            await asyncio.sleep(seconds)
            return JSONResponse({})
        self.handler = handler

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            seen = Seen(
                method=request.method,
                path=request.url.path,
                query=dict(request.query_params),
                headers={k.lower(): v for k, v in request.headers.items()},
                body=await request.body(),
            )
            self.seen.append(seen)
            result = self.handler(seen)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        methods = ["GET", "POST", "PUT", "DELETE"]
        return Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)])


class DroppingServer:
    """Reads each request, then closes the connection without answering:
    the request was sent, the answer never comes."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.requests = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if data:
                        self.requests += 1
                except OSError:
                    pass

    def stop(self) -> None:
        self._stopped = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=2)
