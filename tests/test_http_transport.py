"""app/http_transport.py against raw asyncio servers on loopback: the error
kinds the provider layer depends on, and keep-alive connections the server
closed while idle. (TLS with SNI is covered in tests/download/test_download_tls.py.)"""
from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest

from app.http_transport import AsyncioTransport

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@contextlib.asynccontextmanager
async def raw_server(handle):
    """A TCP server on loopback running `handle(reader, writer)` per connection;
    yields (url, list of connections accepted)."""
    accepted = []

    async def on_connect(reader, writer):
        accepted.append(writer)
        try:
            await handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()
        for w in accepted:
            w.close()


async def read_request(reader) -> None:
    await reader.readuntil(b"\r\n\r\n")


def client(**timeout) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=AsyncioTransport(), trust_env=False,
                             timeout=httpx.Timeout(timeout.get("t", 5.0)))


async def test_keep_alive_reuses_one_connection():
    async def handle(reader, writer):
        while True:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()

    async with raw_server(handle) as (url, accepted), client() as c:
        for _ in range(5):
            r = await c.get(url)
            assert (r.status_code, r.text) == (200, "ok")
        assert len(accepted) == 1


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_connection_the_server_dropped_while_idle_is_not_reused(how):
    # If it were reused, the request would fail after being written: for a
    # submit, an Uncertain outcome instead of a clean new connection.
    async def handle(reader, writer):
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if how == "reset":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()

    async with raw_server(handle) as (url, accepted), client() as c:
        assert (await c.get(url)).status_code == 200
        await asyncio.sleep(0.2)  # the close reaches the client's event loop
        assert (await c.get(url)).status_code == 200
        assert len(accepted) == 2


async def test_connection_refused_is_a_connect_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://127.0.0.1:{port}/")


async def test_a_server_that_never_answers_is_a_read_timeout():
    async def handle(reader, writer):
        await read_request(reader)
        await asyncio.sleep(5)

    async with raw_server(handle) as (url, _), client(t=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(url)


async def test_a_connection_closed_before_the_answer_is_not_a_connect_error():
    # The request was sent: the provider layer must not read this as "not created".
    async def handle(reader, writer):
        await read_request(reader)

    async with raw_server(handle) as (url, _), client() as c:
        with pytest.raises(httpx.HTTPError) as caught:
            await c.post(url, content=b"{}")
        assert not isinstance(caught.value, (httpx.ConnectError, httpx.ConnectTimeout))


async def test_streamed_body_arrives_whole():
    body = bytes(range(256)) * 4096  # 1 MiB

    async def handle(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async with raw_server(handle) as (url, _), client() as c:
        async with c.stream("GET", url) as r:
            got = b"".join([chunk async for chunk in r.aiter_raw()])
    assert got == body
