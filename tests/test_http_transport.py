"""app/http_transport.py against raw asyncio servers on loopback: the error
kinds the provider layer depends on (a failure before the request could
leave is a connect error, one after never is), keep-alive and fresh
connections, and that exactly the request httpx built goes out. (TLS with
SNI is covered in tests/download/test_download_tls.py.)"""
from __future__ import annotations

import asyncio
import inspect
import socket

import aiohttp
import httpx
import pytest
from aiohttp.http_exceptions import HttpProcessingError

from app.http_transport import AiohttpTransport, _mapped
from tests.support.raw_server import serve_raw  # noqa: F401 (a fixture; it reads each first request head)

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def client(timeout_s: float = 5.0, limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=AiohttpTransport(limits=limits), trust_env=False, timeout=timeout_s)


async def serve_ok_forever(reader, writer):
    while True:
        writer.write(OK)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the next request


async def test_keep_alive_reuses_one_connection(serve_raw):
    raw = await serve_raw(serve_ok_forever)
    async with client() as c:
        for _ in range(5):
            r = await c.get(raw.url)
            assert (r.status_code, r.text) == (200, "ok")
    assert len(raw.writers) == 1


async def test_no_keep_alive_is_a_fresh_connection_for_every_request(serve_raw):
    # The submits' client (app/providers/http.py: Clients): a pooled
    # connection the server closed while idle would fail only once the
    # request is written, an Uncertain submit.
    raw = await serve_raw(serve_ok_forever)
    async with client(limits=httpx.Limits(max_keepalive_connections=0)) as c:
        for _ in range(3):
            assert (await c.post(raw.url, content=b"{}")).status_code == 200
    assert len(raw.writers) == 3


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_connection_the_server_dropped_while_idle_is_not_reused(serve_raw, how):
    # A POST: aiohttp would send a GET again on a new connection and hide
    # the reuse; a POST it sends once.
    async def handle(reader, writer):
        writer.write(OK)
        await writer.drain()
        if how == "reset":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()

    raw = await serve_raw(handle)
    async with client() as c:
        assert (await c.post(raw.url, content=b"{}")).status_code == 200
        await asyncio.sleep(0.2)  # the close reaches the client's event loop
        assert (await c.post(raw.url, content=b"{}")).status_code == 200
    assert len(raw.writers) == 2


async def test_connection_refused_is_a_connect_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.post(f"http://127.0.0.1:{port}/", content=b"{}")


@pytest.mark.parametrize("body, error", [
    (b"{}", httpx.ReadTimeout),  # sent whole, never answered
    # Never read: aiohttp's read timeout starts only once the body is sent;
    # ours bounds the sending too, and a request stuck half sent is not a
    # connect error.
    (b"x" * (64 << 20), httpx.WriteTimeout),
])
async def test_a_server_that_stalls_is_a_timeout_after_connecting(serve_raw, body, error):
    async def handle(reader, writer):
        await asyncio.sleep(10)

    raw = await serve_raw(handle)
    async with client(timeout_s=0.3) as c:
        with pytest.raises(error):
            await c.post(raw.url, content=body)


@pytest.mark.parametrize("answer, error", [
    (b"", httpx.ReadError),  # closed with no answer
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", httpx.RemoteProtocolError),  # not HTTP
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part", httpx.ReadError),  # the body broke off
])
async def test_a_failure_after_the_request_was_sent_is_never_a_connect_error(serve_raw, answer, error):
    # The provider layer must not read these as "not created".
    async def handle(reader, writer):
        writer.write(answer)
        await writer.drain()  # then the fixture closes the connection

    raw = await serve_raw(handle)
    async with client() as c:
        with pytest.raises(error):
            await c.post(raw.url, content=b"{}")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "POST"])
async def test_a_request_the_server_had_is_never_sent_twice(serve_raw, method):
    # Left to itself, aiohttp sends a GET, PUT or DELETE again after the
    # connection drops; with the server gone by then, a request it had
    # would come back as a connect error ("nothing was sent").
    raw = None

    async def handle(reader, writer):
        raw.server.close()  # the request came; nothing listens any more

    raw = await serve_raw(handle)
    async with client() as c:
        with pytest.raises(httpx.ReadError):
            await c.request(method, raw.url, content=b"{}")
    assert raw.requests == 1


async def test_a_body_whose_framing_breaks_later_ends_within_the_read_timeout(serve_raw):
    # llhttp fails inside aiohttp's data_received and the error never
    # reaches the body's stream: without our bound, this read waits for ever.
    async def handle(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"zz\r\n")  # not a chunk size
        await writer.drain()
        await asyncio.sleep(10)

    raw = await serve_raw(handle)
    async with client(timeout_s=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await asyncio.wait_for(c.get(raw.url), 5)


async def test_a_streamed_request_body_goes_out_with_its_length(serve_raw):
    async def handle(reader, writer):
        head = raw.heads[-1].lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        received.append(await reader.readexactly(length))
        writer.write(OK)
        await writer.drain()

    async def pieces():
        yield b"abc"
        yield b"def"

    received: list[bytes] = []
    raw = await serve_raw(handle)
    async with client() as c:
        assert (await c.post(raw.url, content=pieces())).status_code == 200
    assert b"transfer-encoding" not in raw.heads[0].lower()
    assert received == [b"abcdef"]


@pytest.mark.parametrize("value", ["café".encode("latin-1"), "1\r\nx-injected: 2"])  # httpx takes bytes as they are
async def test_a_header_that_cannot_go_out_as_built_is_refused_unsent(serve_raw, value):
    raw = await serve_raw(serve_ok_forever)
    async with client() as c:
        with pytest.raises(httpx.LocalProtocolError):
            await c.post(raw.url, content=b"{}", headers={"x-note": value})
    assert raw.requests == 0


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


async def test_a_body_not_read_to_its_end_closes_its_connection(serve_raw):
    body = b"x" * (1 << 20)  # more than arrives with the head

    async def handle(reader, writer):
        while True:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")

    raw = await serve_raw(handle)
    async with client() as c:
        async with c.stream("GET", raw.url) as r:
            assert r.status_code == 200  # the body is left unread
        assert (await c.get(raw.url)).content == body  # a new connection
        assert (await c.get(raw.url)).content == body  # the last one, kept alive
    assert len(raw.writers) == 2


async def test_exactly_the_request_httpx_built_goes_out(serve_raw):
    """Its URL as encoded (a signed URL's %2F and %41 stay as they are), its
    headers in order, and no header aiohttp would add (no Content-Type on
    a body that has none)."""
    async def handle(reader, writer):
        writer.write(OK)
        await writer.drain()

    raw = await serve_raw(handle)
    async with client() as c:
        await c.post(f"{raw.url}/out/a%2Fb.png?X-Amz-Signature=%41b%2B&x=1", content=b"raw",
                     headers={"X-One": "1", "Authorization": "Bearer t"})
    heads = raw.heads
    lines = heads[0].decode().split("\r\n")
    assert lines[0] == "POST /out/a%2Fb.png?X-Amz-Signature=%41b%2B&x=1 HTTP/1.1"
    names = [line.split(":")[0].lower() for line in lines[1:] if line]
    assert "content-type" not in names
    assert names.count("host") == 1 and names.count("user-agent") == 1
    assert names.index("x-one") < names.index("authorization")
    assert "content-length: 3" in heads[0].decode().lower()


async def test_a_burst_shares_the_pools_connections(serve_raw):
    async def handle(reader, writer):
        while True:
            await asyncio.sleep(0.005)  # answers overlap, so the burst queues for the four
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")

    raw = await serve_raw(handle)
    async with client(timeout_s=10, limits=httpx.Limits(max_connections=4)) as c:
        for _ in range(2):
            answers = await asyncio.gather(*[c.get(raw.url) for _ in range(40)])
            assert [r.status_code for r in answers] == [200] * 40
        assert len(raw.writers) == 4  # the second burst made none
        assert raw.requests == 4


def _key() -> object:
    from aiohttp.client_reqrep import ConnectionKey
    return ConnectionKey("h.example", 443, True, True, None, None, None)


@pytest.mark.parametrize("raised, mapped", [
    # Before a byte can have left: the connector's own failures.
    (lambda: aiohttp.ConnectionTimeoutError("pool or connect"), httpx.ConnectTimeout),
    (lambda: aiohttp.ClientConnectorError(_key(), OSError(111, "refused")), httpx.ConnectError),
    (lambda: aiohttp.ClientConnectorDNSError(_key(), OSError(-2, "no such name")), httpx.ConnectError),
    (lambda: aiohttp.ClientConnectorSSLError(_key(), OSError(1, "handshake")), httpx.ConnectError),
    (lambda: aiohttp.ClientConnectorCertificateError(_key(), ValueError("bad cert")), httpx.ConnectError),
    (lambda: aiohttp.NonHttpUrlClientError("ftp://x/"), httpx.UnsupportedProtocol),
    # On an open connection: never a connect error.
    (lambda: aiohttp.SocketTimeoutError("no byte"), httpx.ReadTimeout),
    (lambda: TimeoutError(), httpx.WriteTimeout),
    (lambda: aiohttp.ServerDisconnectedError(), httpx.ReadError),
    (lambda: aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
    (lambda: aiohttp.ClientConnectionResetError("reset"), httpx.ReadError),
    (lambda: aiohttp.ClientConnectionError("failed to send"), httpx.ReadError),
    (lambda: aiohttp.ClientPayloadError("broke off"), httpx.ReadError),
    (lambda: ConnectionResetError(104, "reset"), httpx.ReadError),
    (lambda: aiohttp.ClientResponseError(None, (), status=400, message="bad status line"),  # type: ignore[arg-type]
     httpx.RemoteProtocolError),
    (lambda: HttpProcessingError(message="bad chunk"), httpx.RemoteProtocolError),  # the pure-Python parser's
    # Refused before sending, and still never read as "nothing was sent".
    (lambda: ValueError("newline in a header"), httpx.LocalProtocolError),
])
def test_what_each_aiohttp_failure_means(raised, mapped):
    assert type(_mapped(raised())) is mapped


def test_our_own_bound_is_a_write_timeout_sending_and_a_read_timeout_reading():
    assert type(_mapped(TimeoutError())) is httpx.WriteTimeout
    assert type(_mapped(TimeoutError(), reading=True)) is httpx.ReadTimeout
    assert type(_mapped(aiohttp.SocketTimeoutError("no byte"), reading=True)) is httpx.ReadTimeout
    assert type(_mapped(aiohttp.ConnectionTimeoutError("pool"), reading=True)) is httpx.ConnectTimeout


def test_the_aiohttp_seams_it_relies_on_still_exist():
    """What the transport passes and reads. If an aiohttp release renames
    one, this fails before users do."""
    request = set(inspect.signature(aiohttp.ClientSession._request).parameters)
    assert {"headers", "data", "allow_redirects", "timeout", "server_hostname"} <= request
    session = set(inspect.signature(aiohttp.ClientSession).parameters)
    assert {"connector", "cookie_jar", "trust_env", "auto_decompress", "skip_auto_headers"} <= session
    connector = set(inspect.signature(aiohttp.TCPConnector).parameters)
    assert {"ssl", "limit", "limit_per_host", "force_close", "keepalive_timeout"} <= connector
    timeout = set(inspect.signature(aiohttp.ClientTimeout).parameters)
    assert {"sock_connect", "sock_read", "connect", "total"} <= timeout
    for name in ("raw_headers", "release", "content", "status"):
        assert hasattr(aiohttp.ClientResponse, name), name
    # One attempt: the switch aiohttp's own test client sets, and the loop that reads it.
    assert "_retry_connection" in aiohttp.ClientSession.ATTRS
    request_source = inspect.getsource(aiohttp.ClientSession._request)
    assert "self._retry_connection and method in IDEMPOTENT_METHODS" in request_source


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

    first, second = AiohttpTransport(), AiohttpTransport()
    shared = first._ssl_context
    assert second._ssl_context is shared
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert shared.cert_store_stats()["x509_ca"] > 0
    unverified = AiohttpTransport(verify=False)._ssl_context
    assert unverified is not shared and unverified.verify_mode == ssl.CERT_NONE
    own = ssl.create_default_context()
    assert AiohttpTransport(verify=own)._ssl_context is own
