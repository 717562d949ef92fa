"""HTTP helpers shared by every protocol of the simulator."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.origins import origin_of

MAX_BODY = 1024 * 1024
MAX_IDEMPOTENCY_KEY = 255


class BadBody(ValueError):
    """The request body is not the JSON we can read."""


async def read_json(request: Request, *, empty: Any = ...) -> Any:
    """The parsed JSON body (at most 1 MiB). An empty body is `empty` when
    given, an error otherwise."""
    return parse_json(await read_body(request), empty=empty)


class BodyTooLarge(BadBody):
    """The body is larger than MAX_BODY."""


async def read_body(request: Request) -> bytes:
    """The raw body, at most 1 MiB (BodyTooLarge): read as it arrives, so an
    oversized one is refused before it is whole. A sync call is counted by
    these bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise BodyTooLarge("body is larger than 1 MiB")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyTooLarge("body is larger than 1 MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, *, empty: Any = ...) -> Any:
    """A JSON body: finite numbers only, no NaN/Infinity; an empty one is
    `empty` when given (BadBody otherwise, and for anything not JSON)."""
    if not raw.strip():
        if empty is not ...:
            return empty
        raise BadBody("body must be JSON")
    try:
        return json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        raise BadBody("body is not valid JSON") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    # 1e400 parses to inf, which no JSON answer could echo back.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def is_http_url(value: Any) -> bool:
    """An absolute http(s) URL that an HTTP client can actually call."""
    if not isinstance(value, str) or len(value) > 2048 or not value.isprintable() or " " in value:
        return False
    try:
        origin_of(value)  # an http(s) scheme, a host, a port from 1 to 65535
        httpx.URL(value)  # and a URL an HTTP client will take
    except (ValueError, httpx.InvalidURL):
        return False
    return True


def server_base(request: Request) -> str:
    """This server's origin as the client addressed it."""
    return str(request.base_url).rstrip("/")


def auth_token(request: Request, *schemes: str) -> str | None:
    """The credential after one of `schemes` ("Bearer", "Key", ...), if any.
    Any non-empty value is accepted: the simulator has no accounts."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() in (s.lower() for s in schemes) and token.strip():
        return token.strip()
    return None


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class AbortConnection(Exception):
    """Raised after a response has started to make the server drop the
    connection mid-response (submit_timeout_after_create)."""


class HoldThenDrop(Response):
    """Never answers: waits `hold_s` (or until the client gives up), then
    breaks the connection without a complete response."""

    def __init__(self, hold_s: float):
        super().__init__(status_code=200)
        self.hold_s = hold_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await asyncio.wait_for(client_gone(receive), self.hold_s)
            return  # the client went away: nobody to answer
        except TimeoutError:
            pass
        # Promise a body and fail before sending it: the server closes the
        # connection, which the client sees as a dropped response.
        await send({
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
        })
        raise AbortConnection()


async def sleep_until(deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep until `clock()` has reached `deadline`. The loop's timers may fire
    a hair early (uvloop's run on a millisecond grid against a cached time),
    and a `duration_s` is a promise: the answer never comes before it."""
    while (left := deadline - clock()) > 0:  # noqa: ASYNC110 -- waits on a clock, not on a state an Event could signal
        await asyncio.sleep(left)


async def sleep_for(seconds: float) -> None:
    await sleep_until(time.monotonic() + seconds)


async def client_gone(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class _HideAbort(logging.Filter):
    """Keeps the deliberate AbortConnection out of uvicorn's error log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, AbortConnection):
                return False
            exc = exc.__cause__ or exc.__context__
        return True


def hide_abort_in_server_log() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _HideAbort) for f in logger.filters):
        logger.addFilter(_HideAbort())


# The simulator's throttle answers ask the client to wait this long.
THROTTLE_RETRY_AFTER_S = 1


class ReleaseAfter(Response):
    """`inner`, then `release()` once it has been sent, or has failed or
    been cut short (the client left): whatever became of it."""

    def __init__(self, inner: Response, release: Callable[[], None]):
        super().__init__(status_code=inner.status_code)
        self.inner = inner
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.release()
