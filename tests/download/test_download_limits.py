"""A slow host must not hold the settler: the stall timeout (no byte for N
seconds) and the per-origin limit on concurrent downloads."""
from __future__ import annotations

import asyncio
import time

import pytest

from app.download import DownloadError, DownloadPolicy, HostBusy, HostLimiter, download_to_file

MiB = 1024 * 1024


def policy_for(origin: str, **overrides) -> DownloadPolicy:
    return DownloadPolicy(allowed_hosts=(), plain_http_origins=frozenset({origin}), max_bytes=MiB, **overrides)


# ----------------------------------------------------------------- the stall timeout

async def test_a_trickle_is_cut_only_once_it_stops(serve_raw, tmp_path):
    # One byte every half second for two seconds, then silence. A stall
    # timeout of 2 s is four trickle intervals: the trickle must pass, the
    # silence must end the download.
    interval_s, stall_s = 0.5, 2.0
    sent = 0
    stopped = asyncio.Event()
    stopped_at = 0.0

    async def trickle_then_stop(reader, writer):
        nonlocal sent, stopped_at
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(4):
            await asyncio.sleep(interval_s)
            writer.write(b"t")
            await writer.drain()
            sent += 1
        stopped_at = time.monotonic()
        stopped.set()
        await reader.read()  # silent until the client gives up

    raw = await serve_raw(trickle_then_stop)
    with pytest.raises(DownloadError, match="no data for 2 s") as info:
        await download_to_file(f"{raw.url}/o", policy_for(raw.url, stall_timeout_s=stall_s), str(tmp_path))
    failed_at = time.monotonic()
    assert not isinstance(info.value, HostBusy)
    # Not cut while bytes were flowing: the failure came after the last byte,
    # and no sooner than the stall timeout after it (timers never fire early).
    assert stopped.is_set() and sent == 4
    assert failed_at - stopped_at >= stall_s - 0.05
    assert list(tmp_path.iterdir()) == []


async def test_a_steady_trickle_within_the_stall_timeout_completes(serve_raw, tmp_path):
    async def slow_but_complete(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n")
        for _ in range(6):
            await asyncio.sleep(0.2)
            writer.write(b"t")
            await writer.drain()

    raw = await serve_raw(slow_but_complete)
    # The whole body takes longer than the stall timeout; no single gap comes near it.
    got = await download_to_file(f"{raw.url}/o", policy_for(raw.url, stall_timeout_s=1.0), str(tmp_path))
    assert got.bytes == 6


def test_the_default_stall_timeout_is_well_under_the_total():
    policy = DownloadPolicy(allowed_hosts=(), plain_http_origins=frozenset(), max_bytes=1)
    assert policy.stall_timeout_s == 15 and policy.total_timeout_s == 600


# ----------------------------------------------------------------- HostLimiter alone

async def test_a_full_origin_is_busy_at_once_and_others_are_not():
    limiter = HostLimiter(2)
    async with limiter.place("https://a.test:443", 0), limiter.place("https://a.test:443", 0):
        assert limiter.in_use("https://a.test:443") == 2
        with pytest.raises(HostBusy, match="https://a.test:443 already has 2 downloads running"):
            async with limiter.place("https://a.test:443", 0):
                pass
        async with limiter.place("https://b.test:443", 0):
            assert limiter.in_use("https://b.test:443") == 1
    assert limiter.in_use("https://a.test:443") == 0
    assert limiter._origins == {}  # nothing kept for origins no longer in use


async def test_a_waiter_gets_the_place_as_soon_as_one_is_freed():
    limiter = HostLimiter(1)
    release = asyncio.Event()
    holding = asyncio.Event()

    async def holder():
        async with limiter.place("o", 0):
            holding.set()
            await release.wait()

    first = asyncio.create_task(holder())
    await holding.wait()
    second = asyncio.create_task(_enter_and_leave(limiter, "o", wait_s=30))
    await asyncio.sleep(0)  # the second is waiting now
    assert not second.done()
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)  # long before its 30 s
    assert limiter._origins == {}


async def test_a_cancelled_waiter_leaves_no_place_taken():
    limiter = HostLimiter(1)
    async with limiter.place("o", 0):
        waiter = asyncio.create_task(_enter_and_leave(limiter, "o", wait_s=30))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    async with limiter.place("o", 0):  # the place is free again
        assert limiter.in_use("o") == 1
    assert limiter._origins == {}


def test_per_host_must_be_positive():
    with pytest.raises(ValueError):
        HostLimiter(0)


async def _enter_and_leave(limiter: HostLimiter, origin: str, wait_s: float) -> None:
    async with limiter.place(origin, wait_s):
        pass


# ----------------------------------------------------------------- HostLimiter in downloads

async def test_a_host_that_never_answers_takes_only_its_places(serve_raw, tmp_path):
    answered = asyncio.Event()
    both_waiting = asyncio.Event()
    waiting = 0

    async def never_answers(reader, writer):
        nonlocal waiting
        waiting += 1
        if waiting == 2:
            both_waiting.set()
        await reader.read()

    async def answers(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        answered.set()

    stalled = await serve_raw(never_answers)
    healthy = await serve_raw(answers)
    limiter = HostLimiter(2)
    stuck = [asyncio.create_task(download_to_file(
        f"{stalled.url}/o{i}", policy_for(stalled.url, stall_timeout_s=60, host_limiter=limiter), str(tmp_path)))
        for i in range(2)]
    try:
        await asyncio.wait_for(both_waiting.wait(), 10)  # both sent their request and wait for an answer
        # A third to the same origin is turned away without connecting.
        with pytest.raises(HostBusy):
            await download_to_file(f"{stalled.url}/o3",
                                   policy_for(stalled.url, host_limiter=limiter, host_wait_s=0.05), str(tmp_path))
        assert len(stalled.writers) == 2
        # Another origin is not held up by it.
        got = await download_to_file(f"{healthy.url}/x", policy_for(healthy.url, host_limiter=limiter),
                                     str(tmp_path))
        assert got.bytes == 2 and answered.is_set()
    finally:
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
    assert limiter._origins == {}


async def test_a_refused_redirect_frees_its_place(serve_raw, tmp_path):
    async def redirect_inside(reader, writer):
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    raw = await serve_raw(redirect_inside)
    limiter = HostLimiter(1)
    for _ in range(3):  # would be HostBusy from the second on if a place leaked
        with pytest.raises(DownloadError, match="refused"):
            await download_to_file(f"{raw.url}/o", policy_for(raw.url, host_limiter=limiter, host_wait_s=0),
                                   str(tmp_path))
    assert limiter._origins == {}
