"""The signing-key cache (app/providers/keycache.py): when it fetches, and
what a failed fetch leaves. A table of steps on an injected clock; the
fetch is a script, nothing sleeps and nothing goes over the network."""
from __future__ import annotations

import asyncio

import pytest

from app.providers.keycache import RefetchingCache, fetch_due

MAX_AGE_S = 100.0
MIN_REFETCH_S = 10.0
BOOM = RuntimeError("the key endpoint is down")


@pytest.mark.parametrize("has_value, age_s, refresh, due", [
    (False, float("inf"), False, True),   # never fetched
    (False, 5.0, False, False),           # the last attempt failed a moment ago
    (False, 10.0, False, True),
    (True, 50.0, False, False),           # fresh enough
    (True, 50.0, True, True),             # a signature failed: look again
    (True, 5.0, True, False),             # ... but not this often
    (True, 100.0, False, True),           # too old
])
def test_fetch_due(has_value, age_s, refresh, due):
    assert fetch_due(has_value, age_s, refresh=refresh, max_age_s=MAX_AGE_S, min_refetch_s=MIN_REFETCH_S) is due


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fetches:
    """Answers each fetch with the next scripted result (a value, None, or
    an exception to raise) and counts the calls."""

    def __init__(self) -> None:
        self.next: object = None
        self.calls = 0

    async def __call__(self):
        self.calls += 1
        if isinstance(self.next, Exception):
            raise self.next
        return self.next


# (at, refresh, the fetch would answer, fetched?, value after)
STEPS = [
    (0.0, False, "k1", True, "k1"),      # first use fetches
    (1.0, False, "k2", False, "k1"),     # cached
    (5.0, True, "k2", False, "k1"),      # refresh asked, but within the minimum interval
    (12.0, True, BOOM, True, "k1"),      # refresh; the fetch fails: the old value stays
    (15.0, True, "k2", False, "k1"),     # the failed attempt counts for the interval
    (23.0, True, None, True, "k1"),      # a fetch that finds nothing keeps the old value too
    (40.0, True, "k2", True, "k2"),      # rotated key picked up
    (60.0, False, "k3", False, "k2"),    # not stale yet (last fetch at 40)
    (140.0, False, "k3", True, "k3"),    # older than max_age: fetched without being asked
]


async def test_refetching_cache_steps() -> None:
    clock, fetches = Clock(), Fetches()
    cache: RefetchingCache[str] = RefetchingCache(fetches, max_age_s=MAX_AGE_S, min_refetch_s=MIN_REFETCH_S,
                                                  clock=clock)
    start = clock.now
    assert cache.value is None
    for at, refresh, answer, fetched, after in STEPS:
        clock.now = start + at
        fetches.next = answer
        before = fetches.calls
        assert await cache.get(refresh=refresh) == after, at
        assert (fetches.calls == before + 1) is fetched, at
        assert cache.value == after


async def test_a_first_fetch_that_fails_is_retried_after_the_interval() -> None:
    clock, fetches = Clock(), Fetches()
    cache: RefetchingCache[list[bytes]] = RefetchingCache(fetches, max_age_s=MAX_AGE_S,
                                                          min_refetch_s=MIN_REFETCH_S, clock=clock)
    fetches.next = BOOM
    assert await cache.get() is None
    fetches.next = []  # an empty key set is no key set
    clock.now += MIN_REFETCH_S
    assert await cache.get() is None
    assert fetches.calls == 2
    fetches.next = [b"key"]
    assert await cache.get() is None  # within the interval: not asked again
    clock.now += MIN_REFETCH_S
    assert await cache.get() == [b"key"]
    assert fetches.calls == 3


async def test_concurrent_gets_share_one_fetch() -> None:
    clock = Clock()
    release = asyncio.Event()
    calls = 0

    async def slow_fetch() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "k1"

    cache: RefetchingCache[str] = RefetchingCache(slow_fetch, max_age_s=MAX_AGE_S, min_refetch_s=MIN_REFETCH_S,
                                                  clock=clock)
    gets = [asyncio.create_task(cache.get(refresh=True)) for _ in range(5)]
    await asyncio.sleep(0)  # let them all reach the lock
    release.set()
    assert await asyncio.gather(*gets) == ["k1"] * 5
    assert calls == 1
