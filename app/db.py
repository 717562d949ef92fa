"""Database connections: one asyncpg pool per process, JSON codecs, and the
dedicated connections that LISTEN (a pooled connection is reset on release,
which would drop a LISTEN)."""
from __future__ import annotations

import json

import asyncpg

OUTBOX_CHANNEL = "longcall_outbox"  # an intent became due: settlers wake
JOBS_CHANNEL = "longcall_jobs"  # a job changed (payload: job id): ?wait= readers wake


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default server-side reset (`SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`), which costs
    a round trip and four statements on every release. Pooled connections
    never LISTEN, lock, SET or hold cursors (those use dedicated connections,
    see `connect`); asyncpg still rolls back an open transaction and drops
    client-side listeners before calling this."""


async def create_pool(dsn: str, *, role: str, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """`role` becomes the connection's application_name (longcall-web,
    longcall-settler, ...): `longcall status` counts settlers by it."""
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection, reset=keep_session,
        server_settings={"application_name": f"longcall-{role}"},
        command_timeout=60,
    )


async def connect(dsn: str, *, role: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn, server_settings={"application_name": f"longcall-{role}"})
    await _init_connection(conn)
    return conn
