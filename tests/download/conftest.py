"""Fixtures: servers started for one test and stopped after it."""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from download_servers import Handler, PeakRss, RawServer, RunningApp, start_app, stop_app


@pytest.fixture
async def serve_app():
    """serve_app(app, **uvicorn_config) -> RunningApp, stopped after the test."""
    running: list[RunningApp] = []

    async def start(app, **config) -> RunningApp:
        running.append(await start_app(app, **config))
        return running[-1]

    yield start
    await asyncio.gather(*(stop_app(app) for app in running))


@pytest.fixture
async def serve_raw():
    """serve_raw(handler) -> RawServer; the handler gets each connection after
    its request head was read."""
    running: list[RawServer] = []

    async def start(handler: Handler) -> RawServer:
        holder: dict[str, RawServer] = {}

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw = holder["server"]
            raw.writers.append(writer)
            try:
                await reader.readuntil(b"\r\n\r\n")
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


@pytest.fixture
def peak_rss():
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc to sample memory")
    return PeakRss
