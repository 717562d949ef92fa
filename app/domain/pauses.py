"""Provider pauses: a provider that answered 429 (or 529) with Retry-After
is not sent another submit by any settler until then (the other providers
keep flowing). Owns the `provider_pauses` table."""
from __future__ import annotations

import datetime as dt

import asyncpg

from app.providers.base import Transient

# The later of the pause already there and this one.
PAUSE = """
insert into provider_pauses (provider, until, reason)
values ($1, now() + make_interval(secs => $2), $3)
on conflict (provider) do update set until = greatest(provider_pauses.until, excluded.until),
    reason = case when excluded.until > provider_pauses.until then excluded.reason else provider_pauses.reason end
"""
ACTIVE = "select provider, until, reason from provider_pauses where until > now() order by provider"


async def pause(conn, provider: str, seconds: float, reason: str) -> None:
    await conn.execute(PAUSE, provider, float(seconds), reason[:200])


async def active(conn) -> dict[str, dt.datetime]:
    rows: list[asyncpg.Record] = await conn.fetch(ACTIVE)
    return {r["provider"]: r["until"] for r in rows}


async def pause_if_asked(conn, provider: str, refused: Transient) -> None:
    """A provider that said when to come back (a 429 or 529 with
    Retry-After) gets no submit from any settler until then."""
    if refused.retry_after:
        await pause(conn, provider, refused.retry_after, str(refused))
