"""Connections that never finish a request are closed: one that sends
nothing, half a request line, or half the headers of its next keep-alive
request is closed at the header deadline, while a slow client that does
finish its headers in time, and a request held open by `?wait=`, are
served. `longcall serve` sets the deadline and the concurrency limit, also
in worker processes. Deadlines here are short and the bounds generous: a
busy machine may be slow, never early."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest

from app.embedded import free_port
from app.web.server import protocol_with_header_timeout
from tests.support.loopback import InLoopServer, serve_in_loop

JOB = {"provider": "sim", "model": "image-fast", "input": {}, "max_credits": 10}
DEADLINE_S = 1.0
BOUND_S = 15.0  # far past the deadline: only a connection that is never closed fails


@pytest.fixture
async def served(db, make_settings):
    """The web app under uvicorn with our protocol; keep-alive long, so only
    the header deadline can close an idle connection."""
    from app.web import create_app

    started: list[InLoopServer] = []

    async def start(header_timeout_s: float = DEADLINE_S) -> str:
        server = await serve_in_loop(create_app(make_settings()), lifespan="on", timeout_keep_alive=120,
                                     http=protocol_with_header_timeout(header_timeout_s))
        started.append(server)
        return f"127.0.0.1:{server.port}"

    yield start
    for server in started:
        await server.stop()


async def closed_after(address: str, *sends: bytes) -> tuple[float, bytes]:
    """Open a connection, send these pieces, then wait for the server to
    close it; (seconds from opening to the close, bytes received)."""
    host, port = address.split(":")
    opened = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for piece in sends:
            writer.write(piece)
        await writer.drain()
        received = await asyncio.wait_for(reader.read(), BOUND_S)  # b"" once the server closes
        return time.monotonic() - opened, received
    finally:
        writer.close()


async def test_a_silent_connection_is_closed(served):
    address = await served()
    elapsed, received = await closed_after(address)
    assert received == b"" and elapsed >= DEADLINE_S * 0.5


async def test_half_a_request_line_is_closed(served):
    address = await served()
    elapsed, received = await closed_after(address, b"GET /healthz HT")
    assert received == b"" and elapsed >= DEADLINE_S * 0.5


async def test_half_the_headers_of_a_keep_alive_request_are_closed(served):
    address = await served()
    # The first request is answered; the second never finishes its headers.
    elapsed, received = await closed_after(address, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
                                           b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
    assert received.startswith(b"HTTP/1.1 200") and received.count(b"HTTP/1.1") == 1


async def test_a_slow_client_that_finishes_in_time_is_served(served):
    address = await served(header_timeout_s=5.0)
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for piece in (b"GET /hea", b"lthz HTTP/1.1\r\n", b"Host: t\r\n", b"Connection: close\r\n", b"\r\n"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.1)
        answer = await asyncio.wait_for(reader.read(), BOUND_S)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b'{"ok":true}' in answer


async def test_a_long_request_is_not_cut_by_the_header_deadline(served, make_owner):
    address = await served()
    owner = await make_owner()
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=BOUND_S,
                                 headers={"Authorization": f"Bearer {owner.api_key}"}) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
        started = time.monotonic()
        r = await c.get(f"/v1/jobs/{job_id}", params={"wait": DEADLINE_S * 2.5})  # held past the deadline
        assert r.status_code == 200 and time.monotonic() - started >= DEADLINE_S * 2
        assert (await c.get("/healthz")).status_code == 200  # the same keep-alive connection still works


# --------------------------------------------------------------- longcall serve


def serve_process(migrated, tmp_objects, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": migrated, "SECRET_KEY": "test-secret-key-0123456789",
           "STORAGE_URL": f"file://{tmp_objects}", "LOG_LEVEL": "WARNING"}
    env.pop("HEADER_TIMEOUT_S", None)
    env.pop("LIMIT_CONCURRENCY", None)
    process = subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
                                *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return process, f"127.0.0.1:{port}"


async def wait_until_up(process: subprocess.Popen, address: str) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=2) as c:
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            try:
                if (await c.get(f"http://{address}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("longcall serve did not come up")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def test_serve_workers_close_silent_connections(migrated, tmp_objects):
    process, address = serve_process(migrated, tmp_objects, "--workers", "2", "--header-timeout", "1")
    try:
        await wait_until_up(process, address)
        for _ in range(4):  # several connections: each worker has the deadline
            elapsed, received = await closed_after(address, b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\n")
            assert received == b"" and elapsed >= 0.5
    finally:
        stop(process)


async def test_serve_limits_concurrency(migrated, tmp_objects):
    process, address = serve_process(migrated, tmp_objects, "--limit-concurrency", "3", "--header-timeout", "60")
    try:
        await wait_until_up(process, address)
        host, port = address.split(":")
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        await asyncio.sleep(0.2)  # let the server accept them
        try:
            async with httpx.AsyncClient(timeout=BOUND_S) as c:
                r = await c.get(f"http://{address}/healthz")
            assert r.status_code == 503
        finally:
            for _, writer in idle:
                writer.close()
        await asyncio.sleep(0.5)  # the server notices the closes
        async with httpx.AsyncClient(timeout=BOUND_S) as c:
            assert (await c.get(f"http://{address}/healthz")).status_code == 200
    finally:
        stop(process)


def test_serve_refuses_a_bad_header_timeout(migrated, tmp_objects):
    process, _ = serve_process(migrated, tmp_objects, "--header-timeout", "0")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and b"--header-timeout" in err and b"Traceback" not in err
