"""Bounded, SSRF-safe downloads of provider output URLs.

Output URLs come from providers and are untrusted: a compromised or confused
provider could point us at our own cloud metadata service, a database on the
private network, or an endless stream. So every hop is checked (scheme, host
allowlist, no userinfo, sane port), its name is resolved once and every
address must be global, and the connection goes to that very address (with
the Host header and TLS verification still on the real name) so the answer
cannot change between the check and the connect. Redirects are followed by
hand and re-checked. The byte cap is enforced on the stream itself.

Plain http (and a loopback address) is allowed only for the exact origins the
policy names: the caller gives each provider only its own configured origin
(app.config.Settings.plain_http_origins). Everything else is https, on the
provider's host allowlist, at public addresses.

A provider whose files need its own credentials (Replicate says its output
URLs do) has them sent on the first request only, and only to its own
hosts: a redirect, even back to one of them, goes without.

A slow host must not hold the settler: no byte for `stall_timeout_s` ends a
download (waiting for the answer or between chunks), and a HostLimiter lets
only a few downloads at once talk to one origin, so a host that accepts
connections and never answers takes a few settler slots, not all of them.

Messages never carry a URL's path or query string: output URLs often carry
signed tokens, and these messages end up in job errors and logs.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import re
import socket
import ssl
import tempfile
import threading
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx

from app.download_errors import DownloadError as DownloadError
from app.download_errors import HostBusy as HostBusy
from app.download_errors import OutputGone as OutputGone
from app.download_errors import OutputTooLarge as OutputTooLarge
from app.download_errors import Refused as Refused
from app.http_transport import AiohttpTransport, outbound_client
from app.origins import DEFAULT_PORTS, format_origin

CHUNK_BYTES = 1024 * 1024  # writes are batched to this size; memory stays near it
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_LABELS = re.compile(rf"^(?=.{{1,253}}$)({_LABEL})(\.{_LABEL})*$")
# NAT64 prefixes embed an IPv4 address that a NAT64 gateway would reach for us.
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))

# Takes (host, port), returns the IP addresses the host resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]


class _Origin:
    def __init__(self, per_host: int):
        self.places = asyncio.Semaphore(per_host)
        self.users = 0  # downloads waiting for a place or holding one
        self.holding = 0


class HostLimiter:
    """At most `per_host` downloads at once talk to one origin (in this
    process). A download that finds its origin full waits at most `wait_s`
    for a place, then gives up with HostBusy, so the settle step backs its
    job off and frees the settler slot instead of queueing behind a host
    that may never answer. Entries exist only while an origin is in use."""

    def __init__(self, per_host: int):
        if per_host < 1:
            raise ValueError("per_host must be at least 1")
        self.per_host = per_host
        self._origins: dict[str, _Origin] = {}

    def in_use(self, origin: str) -> int:
        """Downloads holding a place at `origin` now."""
        entry = self._origins.get(origin)
        return entry.holding if entry else 0

    @contextlib.asynccontextmanager
    async def place(self, origin: str, wait_s: float) -> AsyncIterator[None]:
        entry = self._origins.setdefault(origin, _Origin(self.per_host))
        entry.users += 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await entry.places.acquire()
            except TimeoutError:
                raise HostBusy(f"{origin} already has {self.per_host} downloads running") from None
            entry.holding += 1
            try:
                yield
            finally:
                entry.holding -= 1
                entry.places.release()
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._origins[origin]


class DownloadClients:
    """Keep-alive for downloads: one httpx client per origin, shared by a
    process's downloads, so the next output from a provider's file host
    reuses a connection (and, over https, its TLS session) instead of a new
    handshake each time.

    Keyed by the origin as the URL names it (scheme, host name, port), and
    each request goes to an address pinned for its hop, so a connection is
    only ever used again for the host name it was made and verified for, at
    the same address. A response not read to its end closes its connection.
    At most `max_origins` clients are kept; the least recently used idle one
    makes room (a download finding every one busy uses a client of its own)."""

    def __init__(self, *, max_origins: int = 32, per_origin: int = 4, idle_s: float = 30.0):
        self.max_origins = max_origins
        self.per_origin = per_origin
        self.idle_s = idle_s
        self._clients: dict[str, httpx.AsyncClient] = {}  # least recently used first
        self._users: dict[str, int] = {}

    @property
    def kept(self) -> int:
        """Origins with a client kept now."""
        return len(self._clients)

    def _new(self, verify: ssl.SSLContext, keep: int) -> httpx.AsyncClient:
        return outbound_client(AiohttpTransport(verify=verify, limits=httpx.Limits(
            max_keepalive_connections=keep, keepalive_expiry=self.idle_s)))

    @contextlib.asynccontextmanager
    async def client(self, origin_: str, verify: ssl.SSLContext) -> AsyncIterator[httpx.AsyncClient]:
        client = self._clients.pop(origin_, None)
        if client is None and len(self._clients) >= self.max_origins:
            idle = next((o for o in self._clients if not self._users.get(o)), None)
            if idle is not None:
                await self._clients.pop(idle).aclose()
        if client is None and len(self._clients) >= self.max_origins:
            async with self._new(verify, keep=0) as own:
                yield own
            return
        if client is None:
            client = self._new(verify, keep=self.per_origin)
        self._clients[origin_] = client  # now the most recently used
        self._users[origin_] = self._users.get(origin_, 0) + 1
        try:
            yield client
        finally:
            self._users[origin_] -= 1
            if not self._users[origin_]:
                del self._users[origin_]

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()


@dataclass(frozen=True)
class DownloadPolicy:
    allowed_hosts: tuple[str, ...]  # exact host names, or ".suffix" for any subdomain of suffix
    # Exact "http://host:port" origins allowed over plain http and on a
    # loopback address: only the provider's own configured origin, if any.
    plain_http_origins: frozenset[str]
    max_bytes: int
    connect_timeout_s: float = 10
    # No byte for this long — waiting for the answer or between two chunks —
    # fails the download (a DownloadError: retried later).
    stall_timeout_s: float = 15
    total_timeout_s: float = 600  # the whole download, however steadily it trickles
    max_redirects: int = 3
    # Shared by every download of the process (None: no per-host limit).
    host_limiter: HostLimiter | None = field(default=None, compare=False)
    host_wait_s: float = 1.0  # how long to wait for a place at a full origin
    # Shared keep-alive connections (None: each download makes its own).
    clients: DownloadClients | None = field(default=None, compare=False)
    # The provider's own credentials (Replicate's Authorization) and the
    # hosts that may see them: sent on the first request only, and only when
    # its host is one of these; never to another host, never after a redirect.
    credential_hosts: tuple[str, ...] = ()
    credentials: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # Any https host will do (the allowlist is not consulted): every other
    # check — public addresses only, no userinfo, the redirect limit — holds.
    any_host: bool = False

    def credentials_for(self, url: httpx.URL, hop: int) -> Mapping[str, str]:
        """The headers carrying credentials for the request to `url`, the
        `hop`-th of a download (0: the URL the provider gave). Pure."""
        if hop or not self.credentials or not host_allowed(url.host, self.credential_hosts):
            return {}
        return self.credentials


@dataclass(frozen=True)
class Downloaded:
    path: str  # a file in the directory given; the caller owns it (moves or deletes it)
    bytes: int
    sha256: str
    content_type: str | None


def describe(url: httpx.URL | str) -> str:
    """scheme://host[:port] only: paths and query strings may carry tokens."""
    try:
        url = httpx.URL(url) if isinstance(url, str) else url
        netloc = url.netloc.decode("ascii", "replace")
        return f"{url.scheme}://{netloc}" if netloc else "an invalid URL"
    except Exception:
        return "an invalid URL"


def origin(url: httpx.URL) -> str:
    """app.origins' scheme://host:port of a URL httpx parsed (the very parse
    we connect by, so the check and the connection cannot disagree)."""
    return format_origin(url.scheme, url.raw_host.decode("ascii", "replace"), url.port)


def host_allowed(host: str, allowed_hosts: tuple[str, ...]) -> bool:
    host = host.lower()
    for allowed in allowed_hosts:
        allowed = allowed.lower()
        if allowed.startswith("."):
            if host.endswith(allowed) and len(host) > len(allowed):
                return True
        elif host == allowed:
            return True
    return False


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _parse_checked(url: str, policy: DownloadPolicy) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except Exception:
        raise Refused("refused: not a valid URL") from None
    scheme = parsed.scheme
    if scheme not in ("https", "http"):
        raise Refused(f"refused: scheme {scheme[:16]!r} is not allowed")
    if parsed.userinfo:
        raise Refused("refused: credentials in the URL")
    raw_host = parsed.raw_host.decode("ascii", "replace").lower()
    host = raw_host[1:-1] if raw_host.startswith("[") else raw_host
    if not raw_host or not (_HOST_LABELS.match(raw_host) or _is_ip_literal(host)):
        raise Refused("refused: not a valid host name")
    port = parsed.port
    if port is not None and not 1 <= port <= 65535:
        raise Refused("refused: invalid port")
    is_plain_origin = origin(parsed) in policy.plain_http_origins
    if scheme == "http" and not is_plain_origin:
        raise Refused(f"refused: plain http is not allowed for {describe(parsed)}")
    if not is_plain_origin and not policy.any_host and not host_allowed(host, policy.allowed_hosts):
        raise Refused(f"refused: host {host!r} is not in the provider's allowlist")
    return parsed


def check_url(url: str, policy: DownloadPolicy) -> None:
    """Raise Refused unless the URL may be fetched under the policy (no I/O)."""
    _parse_checked(url, policy)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    # IPv4-compatible (::a.b.c.d, deprecated) still routes to the IPv4 host on some stacks.
    if int(ip) >> 32 == 0 and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip))
    return None


def is_public_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True only for globally routable unicast addresses (and IPv6 forms that
    embed an IPv4 address only when that address is public too)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return False
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return is_public_address(embedded)
        if ip.is_site_local:
            return False
    return (
        ip.is_global
        and not ip.is_multicast
        and not ip.is_private
        and not ip.is_loopback
        and not ip.is_link_local
        and not ip.is_reserved
        and not ip.is_unspecified
    )


def _is_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


async def resolve_allowed(url: httpx.URL, resolve: Resolver, timeout_s: float,
                          may_connect: Callable[[Address], bool]) -> list[str]:
    """Resolve once; the distinct addresses, each one `may_connect` allows.
    Refused if any answer is not allowed (or not an address), DownloadError
    when DNS does not answer. Shared by downloads and notification deliveries."""
    port = url.port or DEFAULT_PORTS[url.scheme]
    try:
        async with asyncio.timeout(timeout_s):
            answers = await resolve(url.host, port)
    except TimeoutError:
        raise DownloadError(f"DNS lookup timed out for {describe(url)}") from None
    except (OSError, UnicodeError):
        raise DownloadError(f"could not resolve {describe(url)}") from None
    addresses: list[str] = []
    for answer in answers:
        try:
            ip = ipaddress.ip_address(answer)
        except ValueError:
            raise Refused(f"refused: {describe(url)} resolved to something that is not an address") from None
        if not may_connect(ip):
            raise Refused(f"refused: {describe(url)} resolves to a non-public address ({ip})")
        if answer not in addresses:
            addresses.append(answer)
    if not addresses:
        raise DownloadError(f"could not resolve {describe(url)}")
    return addresses


async def _resolve_checked(url: httpx.URL, policy: DownloadPolicy, resolve: Resolver) -> list[str]:
    """Every address must be public (or loopback, for an origin the policy
    allows over plain http: the provider's own simulator)."""
    loopback_ok = origin(url) in policy.plain_http_origins
    return await resolve_allowed(url, resolve, policy.connect_timeout_s,
                                 lambda ip: is_public_address(ip) or (loopback_ok and _is_loopback(ip)))


def pinned_request(client: httpx.AsyncClient, url: httpx.URL, ip: str,
                   credentials: Mapping[str, str] | None = None, *, method: str = "GET",
                   content: bytes | None = None, headers: Mapping[str, str] | None = None,
                   timeout: httpx.Timeout | None = None) -> httpx.Request:
    """A request (a GET unless told) that connects to `ip` while speaking to
    `url`'s host: the Host header names the host and TLS sends it as SNI and
    verifies the certificate against it (httpx's `sni_hostname` extension,
    which app/http_transport.py hands aiohttp as `server_hostname`)."""
    return client.build_request(
        method,
        url.copy_with(host=ip),
        content=content,
        headers={**(headers or {}), **(credentials or {}), "Host": url.netloc.decode("ascii"),
                 "Accept-Encoding": "identity"},
        extensions={"sni_hostname": url.raw_host.decode("ascii")},
        timeout=timeout if timeout is not None else client.timeout,
    )


_ssl_context: ssl.SSLContext | None = None


def _default_ssl_context() -> ssl.SSLContext:
    # Built once: loading the CA bundle is the slow part of making a client.
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


async def _open(client: httpx.AsyncClient, url: httpx.URL, addresses: list[str],
                policy: DownloadPolicy, hop: int, timeout: httpx.Timeout) -> httpx.Response:
    for ip in addresses:
        try:
            return await client.send(pinned_request(client, url, ip, policy.credentials_for(url, hop),
                                                    timeout=timeout), stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            continue  # next address of the same checked answer
        except httpx.TimeoutException:
            raise DownloadError(f"timed out waiting for {describe(url)}: no answer for "
                                f"{policy.stall_timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise DownloadError(f"request to {describe(url)} failed ({type(exc).__name__})") from None
    raise DownloadError(f"could not connect to {describe(url)}")


def _content_type(response: httpx.Response) -> str | None:
    value = response.headers.get("content-type", "").strip()
    return value[:255] or None


class _Spool:
    """The file a download goes into, made by its first write. Writes run
    in a worker thread, and so does making the file: creating one waits on
    the filesystem's journal while the storage fsyncs in other threads
    (py-spy, e2e bench: 11% of a settler's event-loop samples were
    mkstemp's open), and on the event loop that wait stalls every job."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path: str | None = None
        self.size = 0
        self.digest = hashlib.sha256()
        self._file: typing.BinaryIO | None = None
        # A write's thread runs on when the download is cancelled (a
        # timeout): discard waits for it, and a write after discard does nothing.
        self._lock = threading.Lock()
        self._discarded = False

    def write(self, data: bytes | bytearray, *, last: bool = False) -> None:
        """In a worker thread: `data` appended (the file made first if need
        be); with `last`, the file closed, made even when nothing came."""
        with self._lock:
            if self._discarded:
                return
            if self._file is None:
                try:
                    fd, self.path = tempfile.mkstemp(prefix=".download-", suffix=".part", dir=self.directory)
                except OSError as exc:
                    raise DownloadError(f"could not create a file for the download ({exc.strerror})") from None
                self._file = os.fdopen(fd, "wb")
            self.digest.update(data)
            self._file.write(data)
            self.size += len(data)  # every byte goes through here, in order
            if last:
                self._file.close()

    def discard(self) -> None:
        """The file removed, if made (on a failed download)."""
        with self._lock:
            self._discarded = True
            if self._file is not None:
                self._file.close()
            if self.path is not None:
                _remove(self.path)


async def _stream_to(response: httpx.Response, url: httpx.URL, policy: DownloadPolicy, spool: _Spool) -> None:
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > policy.max_bytes:
        raise OutputTooLarge(f"output is larger than the {policy.max_bytes} byte cap")
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        # We asked for identity; decoding here could turn a small body into a huge one.
        raise DownloadError(f"{describe(url)} sent an encoded body ({encoding[:32]})")

    total = 0
    pending = bytearray()
    try:
        async for piece in response.aiter_raw():
            total += len(piece)
            if total > policy.max_bytes:
                raise OutputTooLarge(f"output is larger than the {policy.max_bytes} byte cap")
            pending += piece
            if len(pending) >= CHUNK_BYTES:
                # Handed to the writing thread, not copied: this loop never
                # touches it again (a new buffer takes the next bytes).
                full, pending = pending, bytearray()
                await asyncio.to_thread(spool.write, full)
    except httpx.TimeoutException:
        raise DownloadError(f"timed out reading from {describe(url)}: no data for "
                            f"{policy.stall_timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise DownloadError(f"reading from {describe(url)} failed ({type(exc).__name__})") from None
    # One thread hop for a small output: made, written and closed.
    await asyncio.to_thread(spool.write, pending, last=True)


async def _download(url: str, policy: DownloadPolicy, spool: _Spool,
                    resolve: Resolver, verify: ssl.SSLContext) -> str | None:
    # httpx's read timeout bounds each read of the socket, so it is a stall
    # timeout: it starts again with every chunk that arrives.
    timeout = httpx.Timeout(connect=policy.connect_timeout_s, read=policy.stall_timeout_s,
                            write=policy.stall_timeout_s, pool=policy.connect_timeout_s)
    # None shared: this download's own, closed after it.
    clients = policy.clients or DownloadClients(per_origin=0)
    try:
        current = _parse_checked(url, policy)
        redirects = 0
        while True:
            addresses = await _resolve_checked(current, policy, resolve)
            # Each hop holds a place at its own origin while its answer is open.
            async with _place(policy, current), clients.client(origin(current), verify) as client:
                response = await _open(client, current, addresses, policy, redirects, timeout)
                try:
                    if response.status_code in REDIRECT_STATUSES:
                        location = response.headers.get("location")
                        if not location:
                            raise DownloadError(f"{describe(current)} answered a redirect without a Location")
                        redirects += 1
                        if redirects > policy.max_redirects:
                            raise Refused(f"refused: more than {policy.max_redirects} redirects")
                        try:
                            target = current.join(location)
                        except Exception:
                            raise Refused("refused: redirect to an invalid URL") from None
                        current = _parse_checked(str(target), policy)
                        continue
                    if response.status_code in (404, 410):
                        raise OutputGone(f"HTTP {response.status_code} from {describe(current)}")
                    if not 200 <= response.status_code < 300:
                        raise DownloadError(f"HTTP {response.status_code} from {describe(current)}")
                    await _stream_to(response, current, policy, spool)
                    return _content_type(response)
                finally:
                    await response.aclose()
    finally:
        if clients is not policy.clients:
            await clients.aclose()


def _place(policy: DownloadPolicy, url: httpx.URL) -> contextlib.AbstractAsyncContextManager[None]:
    if policy.host_limiter is None:
        return contextlib.nullcontext()
    return policy.host_limiter.place(origin(url), policy.host_wait_s)


async def download_to_file(url: str, policy: DownloadPolicy, directory: str, *,
                           resolve: Resolver = system_resolver,
                           verify: ssl.SSLContext | None = None) -> Downloaded:
    """Fetch `url` under `policy` into a new file in `directory`.

    `resolve` and `verify` exist for tests (a fake DNS answer, a test CA);
    production code passes neither.
    """
    spool = _Spool(directory)
    try:
        async with asyncio.timeout(policy.total_timeout_s):
            content_type = await _download(url, policy, spool, resolve, verify or _default_ssl_context())
        assert spool.path is not None  # the last write made it
        return Downloaded(path=spool.path, bytes=spool.size, sha256=spool.digest.hexdigest(),
                          content_type=content_type)
    except TimeoutError:
        spool.discard()
        raise DownloadError(f"download from {describe(url)} took longer than {policy.total_timeout_s:g} s") from None
    except OSError as exc:  # the disk, not the network: full, gone, read-only
        spool.discard()
        raise DownloadError(f"could not write the download ({exc.strerror})") from None
    except BaseException:
        spool.discard()
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
