"""The one LISTEN loop: a dedicated connection that hears a channel for as
long as its task runs, and comes back after the database drops it.

A pooled connection cannot LISTEN (the pool resets it on release), so each
listener holds its own connection, named `longcall-<role>` in
pg_stat_activity (`longcall status` counts settlers by it). Notifications
sent while no connection was listening are lost; `on_connected` runs after
every (re)connect, once the listener is in place, so the caller can look at
the database for anything it missed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from app.db import connect

log = logging.getLogger("longcall.listen")

RETRY_S = 1.0  # between a lost connection and the next attempt
CLOSE_TIMEOUT_S = 2.0


async def listen_forever(dsn: str, channel: str, on_notify: Callable[[str], None], *, role: str,
                         on_connected: Callable[[], None], retry_s: float = RETRY_S) -> None:
    """Call `on_notify(payload)` for every NOTIFY on `channel`, until
    cancelled. Never returns otherwise and never raises: a failed connect
    or a dropped connection is logged and tried again after `retry_s`."""
    while True:
        try:
            await _listen_once(dsn, channel, on_notify, role=role, on_connected=on_connected)
            log.warning("listener connection lost; reconnecting", extra={"channel": channel})
        except asyncio.CancelledError:
            raise
        except Exception as e:  # database away, say: try again shortly
            log.warning("listener down; reconnecting", extra={"channel": channel, "error": type(e).__name__})
        await asyncio.sleep(retry_s)


async def _listen_once(dsn: str, channel: str, on_notify: Callable[[str], None], *, role: str,
                       on_connected: Callable[[], None]) -> None:
    """One connection's life: returns when the connection is gone."""
    conn = await connect(dsn, role=role)
    try:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(channel, lambda _conn, _pid, _channel, payload: on_notify(payload))
        on_connected()
        await lost.wait()
    finally:
        if not conn.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT_S)
