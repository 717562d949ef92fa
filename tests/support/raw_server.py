"""Raw TCP servers on 127.0.0.1 that write whatever bytes a test needs (lying
headers, stalls, dropped connections). Fixture `serve_raw(handler)`: the
handler gets each connection after its first request head was read."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    def __init__(self, url: str, port: int, server: asyncio.AbstractServer):
        self.url, self.port, self.server = url, port, server
        self.requests = 0  # first requests of connections
        self.heads: list[bytes] = []  # the first request head of each connection, as received
        self.writers: list[asyncio.StreamWriter] = []  # one per connection accepted


@pytest.fixture
async def serve_raw():
    running: list[RawServer] = []

    async def start(handler: Handler) -> RawServer:
        holder: dict[str, RawServer] = {}

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw = holder["server"]
            raw.writers.append(writer)
            try:
                raw.heads.append(await reader.readuntil(b"\r\n\r\n"))
                raw.requests += 1
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        holder["server"] = RawServer(f"http://127.0.0.1:{port}", port, server)
        running.append(holder["server"])
        return holder["server"]

    yield start
    for raw in running:
        for writer in raw.writers:
            writer.close()
        raw.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(raw.server.wait_closed(), 2)
