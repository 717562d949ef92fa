"""app/http_transport.py against raw asyncio servers on loopback: the error
kinds the provider layer depends on, and keep-alive connections the server
closed while idle. (TLS with SNI is covered in tests/download/test_download_tls.py.)"""
from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from app.http_transport import AsyncioTransport
from tests.support.raw_server import serve_raw  # noqa: F401 (a fixture; it reads each first request head)

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def client(timeout_s: float = 5.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=AsyncioTransport(), trust_env=False, timeout=timeout_s)


async def test_keep_alive_reuses_one_connection(serve_raw):
    async def handle(reader, writer):
        while True:
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the next request

    raw = await serve_raw(handle)
    async with client() as c:
        for _ in range(5):
            r = await c.get(raw.url)
            assert (r.status_code, r.text) == (200, "ok")
    assert len(raw.writers) == 1


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_connection_the_server_dropped_while_idle_is_not_reused(serve_raw, how):
    # If it were reused, the request would fail after being written: for a
    # submit, an Uncertain outcome instead of a clean new connection.
    async def handle(reader, writer):
        writer.write(OK)
        await writer.drain()
        if how == "reset":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()

    raw = await serve_raw(handle)
    async with client() as c:
        assert (await c.get(raw.url)).status_code == 200
        await asyncio.sleep(0.2)  # the close reaches the client's event loop
        assert (await c.get(raw.url)).status_code == 200
    assert len(raw.writers) == 2


async def test_connection_refused_is_a_connect_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://127.0.0.1:{port}/")


async def test_a_server_that_never_answers_is_a_read_timeout(serve_raw):
    async def handle(reader, writer):
        await asyncio.sleep(5)

    raw = await serve_raw(handle)
    async with client(timeout_s=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(raw.url)


async def test_a_connection_closed_before_the_answer_is_not_a_connect_error(serve_raw):
    # The request was sent: the provider layer must not read this as "not created".
    async def handle(reader, writer):
        return  # the fixture closes the connection

    raw = await serve_raw(handle)
    async with client() as c:
        with pytest.raises(httpx.HTTPError) as caught:
            await c.post(raw.url, content=b"{}")
        assert not isinstance(caught.value, (httpx.ConnectError, httpx.ConnectTimeout))


async def test_streamed_body_arrives_whole(serve_raw):
    body = bytes(range(256)) * 4096  # 1 MiB

    async def handle(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    raw = await serve_raw(handle)
    async with client() as c:
        async with c.stream("GET", raw.url) as r:
            got = b"".join([chunk async for chunk in r.aiter_raw()])
    assert got == body


def test_the_httpx_and_httpcore_seams_it_relies_on_still_exist():
    """AsyncioTransport skips AsyncHTTPTransport.__init__ and sets `_pool`
    itself, and implements httpcore's network backend. If an httpx or
    httpcore release renames what it touches, this fails before users do."""
    import inspect

    import httpcore

    for method in ("handle_async_request", "aclose"):
        source = inspect.getsource(getattr(httpx.AsyncHTTPTransport, method))
        assert "self._pool" in source, method
    assert {"verify", "trust_env"} <= set(inspect.signature(httpx.create_ssl_context).parameters)
    pool_params = set(inspect.signature(httpcore.AsyncConnectionPool).parameters)
    assert {"ssl_context", "max_connections", "max_keepalive_connections", "keepalive_expiry",
            "network_backend"} <= pool_params
    for name in ("connect_tcp", "connect_unix_socket", "sleep"):
        assert callable(getattr(httpcore.AsyncNetworkBackend, name)), name
    for name in ("read", "write", "aclose", "start_tls", "get_extra_info"):
        assert callable(getattr(httpcore.AsyncNetworkStream, name)), name
    for error in ("ConnectError", "ConnectTimeout", "ReadError", "ReadTimeout", "WriteError", "WriteTimeout"):
        assert issubclass(getattr(httpcore, error), Exception), error
    # The transport builds its pool with our backend, and closing it works.
    transport = AsyncioTransport()
    assert isinstance(transport._pool, httpcore.AsyncConnectionPool)
