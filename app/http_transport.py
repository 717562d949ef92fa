"""An httpx transport whose sockets are plain asyncio streams.

httpx reaches the network through httpcore, and httpcore on asyncio goes
through anyio. Before each request httpcore asks every idle pooled connection
whether the server closed it; through anyio that costs a getpeername and a
select per connection per request, plus anyio's task bookkeeping on every
read and write. Measured on loopback with 16 concurrent requests (2 cores):
1.1 ms of client CPU per request through anyio, 0.65 ms through these asyncio
streams. The settler makes three provider/download requests per job, so
this is a large share of its CPU.

The pool is httpcore's with its bookkeeping pass made linear (`_Pool`).
httpcore 1.0 runs that pass on every request and every response close, and
it is quadratic in the pooled connections (it counts them once per
connection, and re-filters them once per queued request); it also hands the
same idle connection to every queued request of a pass, so all but one wake
only to fail and queue again. Measured (`proof/bench_http.py`'s loop, 16
requests at once on loopback, one warm process each): 0.93 ms of client CPU
per request with httpcore's pass, 0.62 ms with this one; at the pool alone
0.77 ms against 0.38. The same fix is upstream in review (encode/httpcore
#1035) and merged in pydantic's httpx2 fork (#974, #1075).

`outbound_client` is the one way our processes make an httpx client: no
redirects followed, no proxy or certificates from the environment, and no
cookies kept. One client serves every owner's calls to a host (a provider,
an output host, a notification endpoint), so a cookie one response set
would ride on the next owner's request.

The errors raised are httpcore's own, chosen exactly as its anyio backend
chooses them, so httpx maps them as usual: anything before the connection is
up (resolve, connect, TLS handshake) is a ConnectError/ConnectTimeout — which
the provider layer reads as "nothing was sent" — and anything after is a
Read/Write error or timeout.
"""
from __future__ import annotations

import asyncio
import functools
import http.cookiejar
import ssl
import typing

import httpcore
import httpx


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout("timed out reading the response") from None
        except OSError as exc:
            raise httpcore.ReadError(f"reading failed ({type(exc).__name__})") from None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out sending the request") from None
        except (OSError, RuntimeError) as exc:  # RuntimeError: writing to a closed transport
            raise httpcore.WriteError(f"sending failed ({type(exc).__name__})") from None

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            self._writer.close()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError) as exc:
            self._writer.close()
            raise httpcore.ConnectError(f"TLS handshake failed: {exc}") from None
        return self

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            # Asked of an idle keep-alive connection: did the server close it
            # (EOF read, or reset — which closes the transport)?
            return self._reader.at_eof() or self._writer.transport.is_closing()
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        return None


class _Backend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(local_address, 0) if local_address else None)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise httpcore.ConnectError(f"could not connect to {host}:{port} ({reason})") from None
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return _Stream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _Pool(httpcore.AsyncConnectionPool):
    """httpcore's connection pool, with its bookkeeping pass in one walk of
    the connections and one of the requests (HTTP/1.1 only: we never ask
    for HTTP/2). What it decides is httpcore's: drop closed connections,
    close expired ones and idle ones beyond the keep-alive limit (in the
    pool's order), then give each queued request, in order, an idle
    connection to its origin, else a new one while under the limit, else a
    new one in place of the first idle one. Two of httpcore's slips are not
    kept: the keep-alive limit counts idle connections (httpcore counts
    them all), and an idle connection already handed to a request that has
    not started on it yet is that request's, neither handed to another nor
    closed as surplus (tests/test_http_transport.py)."""

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        held = {id(r.connection) for r in self._requests if r.connection is not None}
        closing: list[httpcore.AsyncConnectionInterface] = []
        live = []
        for pooled in self._connections:
            if pooled.is_closed():
                continue
            if pooled.has_expired():
                closing.append(pooled)
            else:
                live.append(pooled)
        free = [c for c in live if id(c) not in held and c.is_idle()]
        surplus = len(free) - self._max_keepalive_connections
        if surplus > 0:
            closing += free[:surplus]
            gone = {id(c) for c in free[:surplus]}
            live = [c for c in live if id(c) not in gone]
            free = free[surplus:]
        self._connections = live
        for request in self._requests:
            if not request.is_queued():
                continue
            origin = request.request.url.origin
            connection = next((c for c in free if c.can_handle_request(origin) and c.is_available()), None)
            if connection is not None:
                free.remove(connection)
            elif len(self._connections) < self._max_connections:
                connection = self.create_connection(origin)
                self._connections.append(connection)
            elif free:
                replaced = free.pop(0)
                self._connections.remove(replaced)
                closing.append(replaced)
                connection = self.create_connection(origin)
                self._connections.append(connection)
            else:
                continue  # it waits for a connection to come back
            request.assign_to_connection(connection)
        return closing

    async def _close_connections(self, closing: list[httpcore.AsyncConnectionInterface]) -> None:
        if closing:  # httpcore opens a cancel scope (anyio's) even for none
            await super()._close_connections(closing)


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's own HTTP/1.1 transport (pool, keep-alive, request and error
    mapping), over asyncio streams instead of anyio. No proxies: providers
    and downloads are reached directly."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, limits: httpx.Limits | None = None):
        # Not super().__init__: it would build (and load certificates for) a
        # pool we replace; AsyncHTTPTransport's methods use only `_pool`
        # (tests/test_http_transport.py fails if an httpx release changes that).
        limits = limits or httpx.Limits()
        self._pool = _Pool(
            ssl_context=_system_verified_context() if verify is True
            else httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )


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
