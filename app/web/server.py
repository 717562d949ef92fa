"""How uvicorn serves the web app: a deadline for each request's headers,
and a cap on concurrent connections and requests.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but
that timer only starts after a response, and the first byte of data cancels
it: a connection that never sends a byte, or sends half a request line and
stops, is held open for ever (slowloris). So each connection gets a header
deadline, armed when it opens and again whenever it waits for its next
request, and cancelled once that request's headers are complete; when it
fires the connection is closed. A slow request *body* is not covered here:
the body is read inside the app, under its size cap, and
`limit_concurrency` bounds how many of those can be held at once (uvicorn
answers 503 above it, counting connections and running requests).

Built on uvicorn's httptools protocol (its default when httptools is
installed, as `uvicorn[standard]` guarantees); the hooks used are its
`connection_made`, `on_headers_complete` (httptools' parser callback),
`on_response_complete` and `connection_lost`.
"""
from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import Mapping

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.config import ConfigError

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_LIMIT_CONCURRENCY = 1000
# `longcall serve --workers N`: uvicorn imports the protocol by name in each
# worker process, so the deadline travels in the environment.
HEADER_TIMEOUT_ENV = "HEADER_TIMEOUT_S"
LIMIT_CONCURRENCY_ENV = "LIMIT_CONCURRENCY"


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    _header_deadline: asyncio.TimerHandle | None = None

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_deadline_passed)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._cancel_header_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request's headers are already in
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm_header_deadline()  # waiting for the next request (keep-alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)


def listen_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port (a name that resolves to
    nothing, a port in use), in one line; None when it can. Checked before
    uvicorn starts, which reports these as several log lines and exit 3."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return f"cannot listen on {host}:{port}: no such address"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind(address)
            except OSError as e:
                return f"cannot listen on {host}:{port}: {e.strerror or type(e).__name__}"
    return None


def protocol_with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for an in-process server (one worker, dev, tests)."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": float(seconds)})


def _exported_header_timeout() -> float:
    """HEADER_TIMEOUT_S as exported for the workers. This module is imported
    before `longcall serve` checks the setting (serve_limits): a value that
    is no number must not be a traceback here, but serve's one-line error."""
    try:
        return float(os.environ.get(HEADER_TIMEOUT_ENV) or DEFAULT_HEADER_TIMEOUT_S)
    except ValueError:
        return DEFAULT_HEADER_TIMEOUT_S


class HeaderDeadlineFromEnv(HeaderDeadlineProtocol):
    """The protocol class for worker processes: its deadline is
    HEADER_TIMEOUT_S as `longcall serve` exported it (already validated)."""

    header_timeout_s = _exported_header_timeout()


WORKER_PROTOCOL = f"{__name__}:{HeaderDeadlineFromEnv.__name__}"


def serve_limits(header_timeout: str | None, limit_concurrency: str | None,
                 env: Mapping[str, str]) -> tuple[float, int]:
    """(header timeout in seconds, concurrency limit) for `longcall serve`:
    the flag, else the environment, else the default. ConfigError names
    whichever value is wrong."""
    def pick(flag: str | None, name: str, option: str, default: str) -> tuple[str, str]:
        if flag is not None:
            return flag, option
        if env.get(name):
            return env[name], name
        return default, option

    raw, source = pick(header_timeout, HEADER_TIMEOUT_ENV, "--header-timeout", str(DEFAULT_HEADER_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 3600:  # NaN fails this too
        raise ConfigError(f"{source} must be a number of seconds above 0 and at most 3600, not {raw!r}")
    raw, source = pick(limit_concurrency, LIMIT_CONCURRENCY_ENV, "--limit-concurrency",
                       str(DEFAULT_LIMIT_CONCURRENCY))
    if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
        raise ConfigError(f"{source} must be a whole number of at least 1, not {raw!r}")
    return seconds, int(raw)
