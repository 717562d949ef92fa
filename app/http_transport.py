"""An httpx transport whose sockets are plain asyncio streams.

httpx reaches the network through httpcore, and httpcore on asyncio goes
through anyio. Before each request httpcore asks every idle pooled connection
whether the server closed it; through anyio that costs a getpeername and a
select per connection per request, plus anyio's task bookkeeping on every
read and write. Measured on loopback with 16 concurrent requests (2 cores):
1.1 ms of client CPU per request through anyio, 0.65 ms through these asyncio
streams. The settler makes three provider/download requests per job, so
this is a large share of its CPU.

The errors raised are httpcore's own, chosen exactly as its anyio backend
chooses them, so httpx maps them as usual: anything before the connection is
up (resolve, connect, TLS handshake) is a ConnectError/ConnectTimeout — which
the provider layer reads as "nothing was sent" — and anything after is a
Read/Write error or timeout.
"""
from __future__ import annotations

import asyncio
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


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's own HTTP/1.1 transport (pool, keep-alive, request and error
    mapping), over asyncio streams instead of anyio. No proxies: providers
    and downloads are reached directly."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, limits: httpx.Limits | None = None):
        # Not super().__init__: it would build (and load certificates for) a
        # pool we replace; AsyncHTTPTransport's methods use only `_pool`
        # (tests/test_http_transport.py fails if an httpx release changes that).
        limits = limits or httpx.Limits()
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )
