"""The one LISTEN loop: a dedicated connection that hears a channel for as
long as its task runs, and comes back after the database drops it.

A pooled connection cannot LISTEN (the pool resets it on release), so each
listener holds its own connection, named `longcall-<role>` in
pg_stat_activity (`longcall status` counts settlers by it). Notifications
sent while no connection was listening are lost; `on_connected` runs after
every (re)connect, once the listener is in place, so the caller can look at
the database for anything it missed.

`hold_connection` is the loop without the LISTEN, for a caller that listens
only at times (the web tier's waiting reads, app/web/waiters.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from app.db import connect

log = logging.getLogger("longcall.listen")

RETRY_S = 1.0  # between a lost connection and the next attempt
CLOSE_TIMEOUT_S = 2.0


async def listen_forever(dsn: str, channel: str, on_notify: Callable[[str], None], *, role: str,
                         on_connected: Callable[[], None], retry_s: float = RETRY_S) -> None:
    """Call `on_notify(payload)` for every NOTIFY on `channel`, until
    cancelled. Never returns otherwise and never raises: a failed connect
    or a dropped connection is logged and tried again after `retry_s`."""
    async def listen(conn: asyncpg.Connection) -> None:
        await conn.add_listener(channel, lambda _conn, _pid, _channel, payload: on_notify(payload))
        on_connected()

    await hold_connection(dsn, role=role, on_connected=listen, label=channel, retry_s=retry_s)


async def hold_connection(dsn: str, *, role: str, on_connected: Callable[[asyncpg.Connection], Awaitable[None]],
                          on_lost: Callable[[], None] = lambda: None, label: str,
                          retry_s: float = RETRY_S) -> None:
    """Keep one dedicated connection open until cancelled: after each
    (re)connect `on_connected(conn)`, and `on_lost()` once it is gone (or
    `on_connected` failed), before the next attempt `retry_s` later. Never
    returns otherwise and never raises; `label` names it in the log."""
    while True:
        try:
            await _hold_once(dsn, role=role, on_connected=on_connected)
            log.warning("listener connection lost; reconnecting", extra={"channel": label})
        except asyncio.CancelledError:
            raise
        except Exception as e:  # database away, say: try again shortly
            log.warning("listener down; reconnecting", extra={"channel": label, "error": type(e).__name__})
        finally:
            on_lost()
        await asyncio.sleep(retry_s)


async def _hold_once(dsn: str, *, role: str, on_connected: Callable[[asyncpg.Connection], Awaitable[None]]) -> None:
    """One connection's life: returns when the connection is gone."""
    conn = await connect(dsn, role=role)
    try:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await on_connected(conn)
        await lost.wait()
    finally:
        if not conn.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT_S)
