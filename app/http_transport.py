"""An httpx transport whose HTTP/1.1 is aiohttp's.

Every outbound call of ours (provider calls, downloads of outputs,
notifications) goes through httpx's client — its Request and Response, the
errors the provider layer maps onto Rejected / Transient / Uncertain — and
reaches the network through this transport. Below httpx, httpcore parses
HTTP in pure Python (h11) and runs a pool whose bookkeeping is paid on
every request; aiohttp parses in C (llhttp) and its connector is cheaper.
Measured (`/tmp` probe, 16 concurrent POSTs to a uvicorn server answering
204 on loopback, 2 cores, 4,000 requests a round, three rounds): 460–500 µs
of client CPU per request through httpx's own transport over asyncio
streams, 280–300 µs through httpx over aiohttp. The settler makes three
provider and download requests per job.

`outbound_client` is the one way our processes make an httpx client: no
redirects followed, no proxy or certificates from the environment, and no
cookies kept. One client serves every owner's calls to a host (a provider,
an output host, a notification endpoint), so a cookie one response set
would ride on the next owner's request.

The errors raised are httpx's, mapped by the phase in which aiohttp failed
(`_mapped`): anything before the connection is up (resolve, connect, TLS
handshake, waiting for a pooled connection) is a ConnectError or
ConnectTimeout — which the provider layer reads as "nothing was sent" — and
anything after is a Read/Write error or timeout, or a RemoteProtocolError
for an answer that is not HTTP.
"""
from __future__ import annotations

import asyncio
import functools
import http.cookiejar
import ssl
import typing

import aiohttp
import httpx
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL


def _mapped(exc: BaseException, *, reading: bool = False) -> httpx.TransportError:
    """The httpx error that says what an aiohttp failure means (pure).
    Only ClientConnectorError and ConnectionTimeoutError happen before a
    byte of the request can have left: aiohttp raises them from the
    connector, while it resolves, connects, shakes hands or waits for a
    pooled connection (and never after, since it is told not to send a
    request twice: AiohttpTransport._open). Everything else happened on an
    open connection, but for a URL aiohttp cannot reach and a header it
    will not write, refused before sending. `reading`: our own bound
    expired reading the body, not sending the request."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout("timed out connecting")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(f"could not connect ({type(exc).__name__})")
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return httpx.UnsupportedProtocol("the URL is not one HTTP can reach")
    if isinstance(exc, aiohttp.ServerTimeoutError):  # sock_read: no byte for the read timeout
        return httpx.ReadTimeout("timed out reading the response")
    if isinstance(exc, TimeoutError):  # our bounds (handle_async_request, _Body)
        return httpx.ReadTimeout("timed out reading the response") if reading \
            else httpx.WriteTimeout("timed out sending the request")
    if isinstance(exc, (aiohttp.ClientResponseError, HttpProcessingError)):  # an answer that is not HTTP
        return httpx.RemoteProtocolError("the answer was not valid HTTP")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.ReadError("the server closed the connection")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return httpx.ReadError("the answer's body broke off")
    if isinstance(exc, ValueError):  # a header with a line break: aiohttp writes none of it (h11 did the same)
        return httpx.LocalProtocolError("the request could not be written")
    return httpx.ReadError(f"the connection failed ({type(exc).__name__})")


_FAILURES = (aiohttp.ClientError, HttpProcessingError, OSError, TimeoutError, ValueError)


class _Body(httpx.AsyncByteStream):
    """An aiohttp answer's body as httpx reads it: raw bytes as they
    arrive (httpx decodes any content-encoding itself), each within the
    read timeout. aiohttp's own read timeout is stopped by a body whose
    framing breaks in a later packet than the head, which then waits for
    ever (llhttp fails inside data_received and the error never reaches
    the body's stream): the bound here ends that wait."""

    def __init__(self, response: aiohttp.ClientResponse, read_s: float | None):
        self._response = response
        self._read_s = read_s

    async def __aiter__(self) -> typing.AsyncIterator[bytes]:
        content = self._response.content
        try:
            while True:
                # What has arrived, without a timer (a small answer has
                # arrived whole with its head); else wait, within the bound.
                chunk = content.read_nowait()
                if not chunk:
                    if content.at_eof():
                        return
                    async with asyncio.timeout(self._read_s):
                        chunk = await content.readany()
                    if not chunk:
                        return
                yield chunk
        except _FAILURES as exc:
            raise _mapped(exc, reading=True) from None

    async def aclose(self) -> None:
        # Back to the pool when read to its end; a body not read to its end
        # closes its connection (aiohttp's should_close).
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx's requests sent by an aiohttp session (HTTP/1.1, keep-alive
    per `limits`; `max_keepalive_connections=0` is a fresh connection for
    every request). Exactly the request httpx built goes out: its URL as
    encoded, its headers and nothing aiohttp would add, no proxy, no
    cookies, no decompression, one attempt."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, limits: httpx.Limits | None = None):
        self._ssl_context = _system_verified_context() if verify is True \
            else httpx.create_ssl_context(verify=verify, trust_env=False)
        self._limits = limits or httpx.Limits()
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use: an aiohttp session belongs to the running loop.
        limits = self._limits
        fresh = limits.max_keepalive_connections == 0
        connector = aiohttp.TCPConnector(
            ssl=self._ssl_context, limit=limits.max_connections or 0, limit_per_host=0,
            force_close=fresh, keepalive_timeout=None if fresh else limits.keepalive_expiry)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
            auto_decompress=False, skip_auto_headers=("Content-Type",), timeout=aiohttp.ClientTimeout(total=None))
        # One attempt. aiohttp sends a GET, PUT or DELETE again after the
        # connection drops, and if that second connect fails, a request the
        # server already had comes back as a connect error ("nothing was
        # sent"). Its own test client turns this off the same way.
        self._session._retry_connection = False
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session or self._open()
        phases = request.extensions.get("timeout", {})
        connect, read, write, pool = (phases.get(k) for k in ("connect", "read", "write", "pool"))
        body = await request.aread()
        # Passed on as httpx wrote them, but for a streamed body's chunked
        # framing: the body is read whole, and aiohttp gives it a length.
        try:
            headers = [(k.decode("ascii"), v.decode("ascii")) for k, v in request.headers.raw
                       if k.lower() != b"transfer-encoding"]
        except UnicodeDecodeError:  # aiohttp would send them as UTF-8: not what httpx built
            raise httpx.LocalProtocolError("header names and values must be ASCII") from None
        https = request.url.scheme == "https"
        sni = request.extensions.get("sni_hostname") if https else None
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect, sock_read=read,
            # aiohttp's `connect` spans the wait for a pooled connection and the connecting.
            connect=None if connect is None or pool is None else connect + pool)
        # aiohttp's read timeout starts once the request is sent; the
        # sending itself is bounded by all four phases together.
        bound = None if None in (connect, read, write, pool) else connect + pool + write + read
        try:
            async with asyncio.timeout(bound):
                response = await session.request(
                    request.method, URL(str(request.url), encoded=True),
                    headers=headers, data=body or None, allow_redirects=False,
                    timeout=timeout, server_hostname=sni.decode() if isinstance(sni, bytes) else sni)
        except _FAILURES as exc:
            raise _mapped(exc) from None
        return httpx.Response(response.status, headers=response.raw_headers, stream=_Body(response, read),
                              request=request, extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


@functools.cache
def _system_verified_context() -> ssl.SSLContext:
    """The one verifying TLS context every default transport shares.
    Building one loads the whole CA bundle (16 ms); a web process makes
    two clients per provider (reads and fresh-connection submits), and
    building each its own was 277 ms of its start with nine providers. A
    context is only read once built, so sharing it changes nothing a
    connection checks."""
    return httpx.create_ssl_context(verify=True, trust_env=False)


class _NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing (httpx takes any CookieJar)."""

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        return

    def extract_cookies(self, response: typing.Any, request: typing.Any) -> None:
        return


_DEFAULT_TIMEOUT = httpx.Timeout(5.0)  # httpx's own default, for callers that time each request


def outbound_client(transport: httpx.AsyncBaseTransport,
                    timeout: httpx.Timeout = _DEFAULT_TIMEOUT) -> httpx.AsyncClient:
    """An httpx client for calls out of longcall: redirects are the caller's
    to follow (each hop is checked), proxies and certificates never come
    from the environment (a proxy would undo the address pinning), and no
    cookie is kept from one request to the next."""
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False, trust_env=False,
                             cookies=_NoCookies())
