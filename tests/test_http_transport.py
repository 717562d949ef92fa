"""app/http_transport.py against raw asyncio servers on loopback: the error
kinds the provider layer depends on, and keep-alive connections the server
closed while idle. (TLS with SNI is covered in tests/download/test_download_tls.py.)"""
from __future__ import annotations

import asyncio
import socket

import httpcore
import httpx
import pytest
from httpcore._async.connection_pool import AsyncPoolRequest

from app.http_transport import AsyncioTransport, _Pool
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
    import importlib
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
    # _Pool replaces httpcore's bookkeeping pass: what it reads and calls.
    for name in ("_assign_requests_to_connections", "_close_connections", "create_connection"):
        assert callable(getattr(httpcore.AsyncConnectionPool, name)), name
    for name in ("_connections", "_requests", "_max_connections", "_max_keepalive_connections"):
        assert hasattr(transport._pool, name), name
    source = inspect.getsource(importlib.import_module("httpcore._async.connection_pool"))
    assert source.count("self._assign_requests_to_connections()") >= 2  # on each request and each close
    for name in ("connection", "is_queued", "assign_to_connection"):
        assert hasattr(AsyncPoolRequest(httpcore.Request("GET", "http://a.example/")), name), name


async def test_a_burst_shares_the_pools_connections(serve_raw):
    async def handle(reader, writer):
        while True:
            await asyncio.sleep(0.005)  # answers overlap, so the burst queues for the four
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")

    raw = await serve_raw(handle)
    transport = AsyncioTransport(limits=httpx.Limits(max_connections=4))
    async with httpx.AsyncClient(transport=transport, trust_env=False, timeout=10) as c:
        for _ in range(2):
            answers = await asyncio.gather(*[c.get(raw.url) for _ in range(40)])
            assert [r.status_code for r in answers] == [200] * 40
        assert len(raw.writers) == 4  # the second burst made none
        assert raw.requests == 4


async def test_the_keep_alive_limit_counts_idle_connections(serve_raw):
    # httpcore 1.0 compares all its connections with the limit, so a busy
    # pool closes each connection that comes back, and the next burst
    # connects anew; ours keeps up to the limit of idle ones.
    gates: list[asyncio.Event] = []  # one per request received, in order
    arrived = asyncio.Condition()

    async def handle(reader, writer):
        while True:
            gate = asyncio.Event()
            async with arrived:
                gates.append(gate)
                arrived.notify_all()
            await gate.wait()
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")

    async def received(n: int) -> None:
        async with arrived:
            await arrived.wait_for(lambda: len(gates) >= n)

    raw = await serve_raw(handle)
    transport = AsyncioTransport(limits=httpx.Limits(max_connections=10, max_keepalive_connections=2))
    async with httpx.AsyncClient(transport=transport, trust_env=False, timeout=10) as c:
        busy = [asyncio.ensure_future(c.get(raw.url)) for _ in range(6)]
        await received(6)
        for gate in gates[:3]:
            gate.set()
        finished = asyncio.as_completed(busy)
        for _ in range(3):
            await next(finished)
        # Three busy, two idle kept, one closed.
        assert len(transport._pool._connections) == 5
        more = [asyncio.ensure_future(c.get(raw.url)) for _ in range(3)]
        await received(9)
        for gate in gates:
            gate.set()
        answers = await asyncio.gather(*busy, *more)
    assert [r.status_code for r in answers] == [200] * 9
    assert len(raw.writers) == 7  # six, and one for the third of the next three


class _Connection:
    """A stand-in for an httpcore connection's state, for the pool's pass alone."""

    def __init__(self, origin: httpcore.Origin, state: str):
        self.origin, self.state = origin, state

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return origin == self.origin

    def is_available(self) -> bool:
        return self.state == "idle"

    def is_idle(self) -> bool:
        return self.state in ("idle", "expired")

    def has_expired(self) -> bool:
        return self.state == "expired"

    def is_closed(self) -> bool:
        return self.state == "closed"


A = httpcore.Origin(b"http", b"a.example", 80)
B = httpcore.Origin(b"http", b"b.example", 80)


def _request(origin: httpcore.Origin) -> AsyncPoolRequest:
    # The pass tests are async only because httpcore's request events need a running loop.
    return AsyncPoolRequest(httpcore.Request("GET", f"http://{origin.host.decode()}/"))


def _pool(connections, requests, *, max_connections=10, max_keepalive=10) -> _Pool:
    pool = _Pool(max_connections=max_connections, max_keepalive_connections=max_keepalive)
    pool._connections = list(connections)
    pool._requests = list(requests)
    return pool


async def test_pass_gives_an_idle_connection_to_one_request_only():
    idle = _Connection(A, "idle")
    first, second = _request(A), _request(A)
    pool = _pool([idle], [first, second])
    assert pool._assign_requests_to_connections() == []
    assert first.connection is idle
    assert second.connection is not None and second.connection is not idle  # a new one
    assert len(pool._connections) == 2


async def test_pass_leaves_a_connection_handed_out_to_its_request():
    # Handed to `started` in an earlier pass; it has not begun on it, so it still looks idle.
    held = _Connection(A, "idle")
    started, waiting = _request(A), _request(A)
    started.assign_to_connection(held)
    pool = _pool([held], [started, waiting], max_keepalive=0)
    assert pool._assign_requests_to_connections() == []  # not closed as surplus
    assert waiting.connection is not held
    assert held in pool._connections


async def test_pass_drops_closed_closes_expired_and_surplus_idle():
    closed, expired = _Connection(A, "closed"), _Connection(A, "expired")
    idle = [_Connection(A, "idle") for _ in range(3)]
    busy = _Connection(A, "active")
    pool = _pool([closed, expired, *idle, busy], [], max_keepalive=1)
    assert pool._assign_requests_to_connections() == [expired, idle[0], idle[1]]
    assert pool._connections == [idle[2], busy]


async def test_pass_replaces_an_idle_connection_when_the_pool_is_full():
    to_a, busy = _Connection(A, "idle"), _Connection(B, "active")
    for_b, also_for_b = _request(B), _request(B)
    pool = _pool([to_a, busy], [for_b, also_for_b], max_connections=2)
    assert pool._assign_requests_to_connections() == [to_a]
    assert for_b.connection is not None and for_b.connection.can_handle_request(B)
    assert also_for_b.is_queued()  # no room and nothing idle: it waits
    assert pool._connections == [busy, for_b.connection]


# ------------------------------------------------ no cookie kept between calls

async def _cookie_setting_server() -> tuple[str, list[bytes], asyncio.AbstractServer]:
    """Answers every request with a Set-Cookie (one request per connection);
    records each request head."""
    heads: list[bytes] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append((await reader.readuntil(b"\r\n\r\n")).lower())
        if b"content-length:" in heads[-1]:
            await reader.readexactly(int(heads[-1].split(b"content-length:")[1].split(b"\r\n")[0]))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n"
                     b"set-cookie: owner=the-first; Path=/\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads, server


@pytest.mark.parametrize("road", ["provider", "download", "notification"])
async def test_a_cookie_one_answer_sets_never_rides_on_the_next_request(road, tmp_path):
    """One client serves every owner's calls to a host: what one answer set
    must not go out with another owner's request (tested to fail with
    httpx's default jar)."""
    from app.delivery import Sender
    from app.download import DownloadClients, DownloadPolicy, download_to_file
    from app.providers.http import make_client

    origin, heads, server = await _cookie_setting_server()
    try:
        if road == "provider":
            async with make_client(5.0) as c:
                for _ in range(2):
                    assert (await c.post(f"{origin}/v1/tasks", json={})).status_code == 200
        elif road == "download":
            clients = DownloadClients()
            policy = DownloadPolicy(allowed_hosts=(), plain_http_origins=frozenset({origin}), max_bytes=1024,
                                    clients=clients)
            try:
                for _ in range(2):
                    assert (await download_to_file(f"{origin}/out.png", policy, str(tmp_path))).bytes == 2
            finally:
                await clients.aclose()
        else:
            sender = Sender(frozenset({origin}))
            try:
                for _ in range(2):
                    assert await sender.send(f"{origin}/hook", b"{}", {"content-type": "application/json"}) == 200
            finally:
                await sender.aclose()
    finally:
        server.close()
    assert len(heads) == 2
    assert not [h for h in heads if b"\r\ncookie:" in h]


def test_default_transports_share_one_verifying_tls_context():
    """Every default transport verifies against the system's CA bundle
    through one context (built once: loading the bundle is the cost); one
    given another `verify` gets that, not the shared one."""
    import ssl

    first, second = AsyncioTransport(), AsyncioTransport()
    shared = first._pool._ssl_context
    assert second._pool._ssl_context is shared
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert shared.cert_store_stats()["x509_ca"] > 0
    unverified = AsyncioTransport(verify=False)._pool._ssl_context
    assert unverified is not shared and unverified.verify_mode == ssl.CERT_NONE
    own = ssl.create_default_context()
    assert AsyncioTransport(verify=own)._pool._ssl_context is own
