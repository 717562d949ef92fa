"""Origins — the scheme, host and port a URL talks to — written once.

An origin is written "scheme://host:port": scheme and host in lower case, the
port always explicit (80 for http, 443 for https), an IPv6 host in brackets.
Two URLs are on the same origin when those three agree. The configuration,
the download policy and the provider adapters all compare servers this way,
so "the same server" means one thing everywhere.

Errors never quote the URL: URLs here often carry signed tokens.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def format_origin(scheme: str, host: str, port: int | None) -> str:
    """The origin of already-parsed parts (`port` None: the scheme's default)."""
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("an origin needs an http or https URL")
    host = host.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError("an origin needs a host")
    if port is None:
        port = DEFAULT_PORTS[scheme]
    if not 1 <= port <= 65535:
        raise ValueError("a port must be between 1 and 65535")
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def origin_of(url: str) -> str:
    """The origin of an absolute http(s) URL; ValueError for anything else
    (another scheme, no host, a port that is not a number from 1 to 65535)."""
    parts = urlsplit(url)
    port = parts.port  # raises ValueError itself for a non-numeric or out-of-range port
    return format_origin(parts.scheme, parts.hostname or "", port)


def host_port(url: str) -> tuple[str, int]:
    """Where an absolute http(s) URL connects: its host (an IPv6 address
    without brackets) and port (the scheme's default made explicit)."""
    host, _, port = origin_of(url).partition("://")[2].rpartition(":")
    return host.strip("[]"), int(port)


def host_of(url: str) -> str:
    """The URL's host in lower case, an IPv6 address without brackets ("" if none)."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def same_origin(url: object, other: object) -> bool:
    """True when both are absolute http(s) URLs on exactly one origin. Values
    often come straight from a provider's JSON, so anything that is not such a
    URL is simply False; so is a URL carrying credentials (user:pass@), which
    would hand them to whoever it names."""
    if not isinstance(url, str) or not isinstance(other, str):
        return False
    try:
        if urlsplit(url).username is not None:
            return False
        return origin_of(url) == origin_of(other)
    except ValueError:
        return False


def is_loopback_host(host: str | None) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1, ::ffff:127.x),
    with or without IPv6 brackets. Only names; nothing is resolved."""
    if not host:
        return False
    host = host.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
