"""A value an adapter fetches over HTTP to verify webhooks (fal's JWKS,
Replicate's account signing secret), kept between webhooks.

It is fetched when there is none yet, when it is older than `max_age_s`, or
when the caller asks (a signature failed to verify: the key may have been
rotated) — but never more often than every `min_refetch_s`, so a flood of
badly signed webhooks cannot turn into a flood of fetches. A fetch that
fails (raises, or finds nothing) keeps the value there was: a provider
hiccup must not make every webhook fail.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("longcall.providers")


def fetch_due(has_value: bool, age_s: float, *, refresh: bool, max_age_s: float, min_refetch_s: float) -> bool:
    """Whether to fetch now (pure). `age_s` is the time since the last fetch
    attempt, failed ones included."""
    wanted = not has_value or refresh or age_s >= max_age_s
    return wanted and age_s >= min_refetch_s


class RefetchingCache(Generic[T]):
    def __init__(self, fetch: Callable[[], Awaitable[T | None]], *, max_age_s: float, min_refetch_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self._fetch = fetch
        self._max_age_s = max_age_s
        self._min_refetch_s = min_refetch_s
        self._clock = clock
        self._value: T | None = None
        self._attempted_at = float("-inf")
        self._lock = asyncio.Lock()  # concurrent webhooks share one fetch

    @property
    def value(self) -> T | None:
        """What is held now, without fetching."""
        return self._value

    async def get(self, *, refresh: bool = False) -> T | None:
        """The value, fetched first when due (see the module). None only
        while no fetch has ever succeeded."""
        async with self._lock:
            now = self._clock()
            if fetch_due(bool(self._value), now - self._attempted_at, refresh=refresh,
                         max_age_s=self._max_age_s, min_refetch_s=self._min_refetch_s):
                self._attempted_at = now
                try:
                    fresh = await self._fetch()
                except Exception as e:  # keep what we had
                    log.warning("signing key fetch failed", extra={"error": type(e).__name__})
                    fresh = None
                if fresh:
                    self._value = fresh
            return self._value
