"""The benchmark's load generator, and the timing loops it shares with the
in-process database baselines.

Run as its own process (`python -m proof.bench_load SPEC.json`) so its
CPU is not the server's: it reads pre-built raw HTTP/1.1 requests from a file
(built by the parent, so no signing or JSON work happens while measuring),
sends them over keep-alive connections with a small asyncio Protocol client
(much cheaper per request than an HTTP library), and prints one JSON line of
results.

Two modes:
- closed: `connections` workers each send the next request as soon as the
  last answer came back (the most the server can take);
- open: request i is *scheduled* at t0 + i/rate and its latency counts from
  that time, not from when a free connection sent it, so a stalled server
  shows up in the percentiles instead of quietly slowing the sender
  (no coordinated omission).

Requests that start during the first `warmup_s` are sent but not counted.
"""
from __future__ import annotations

import asyncio
import collections
import json
import resource
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

# --- pure summaries -------------------------------------------------------------

def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


@dataclass
class Sample:
    start: float  # when it was sent (closed) or scheduled (open), monotonic seconds
    end: float
    status: int


def summarize(samples: list[Sample], warm_end: float, stop: float, total_sent: int) -> dict:
    """Rate and latency over the requests that started after the warm-up
    and finished before the stop."""
    counted = [s for s in samples if s.start >= warm_end and s.end <= stop]
    statuses: dict[str, int] = {}
    for s in counted:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    if not counted:
        return {"n": 0, "rate": 0.0, "window_s": 0.0, "statuses": statuses, "total_sent": total_sent}
    window = max(s.end for s in counted) - warm_end
    lat = sorted((s.end - s.start) * 1000 for s in counted)
    return {
        "n": len(counted),
        "rate": len(counted) / window if window > 0 else 0.0,
        "window_s": window,
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1],
        "statuses": statuses,
        "total_sent": total_sent,
    }


# --- the timing loops (used here over HTTP and in-process over asyncpg) ----------

async def run_closed(call: Callable[[int], Awaitable[int]], n_items: int, workers: int,
                     duration_s: float, warmup_s: float) -> dict:
    """`workers` loops each calling `call(i)` for the next item as soon as the
    last returned, until `warmup_s + duration_s` pass or items run out."""
    samples: list[Sample] = []
    next_item = 0
    t0 = time.perf_counter()
    stop = t0 + warmup_s + duration_s

    async def worker():
        nonlocal next_item
        while True:
            now = time.perf_counter()
            if now >= stop or next_item >= n_items:
                return
            i = next_item
            next_item += 1
            status = await call(i)
            samples.append(Sample(now, time.perf_counter(), status))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return summarize(samples, t0 + warmup_s, stop, next_item)


async def run_open(call: Callable[[int], Awaitable[int]], n_items: int, workers: int,
                   duration_s: float, warmup_s: float, rate: float) -> dict:
    """Item i is due at t0 + i/rate; latency counts from then. `workers`
    bounds how many are outstanding at once."""
    samples: list[Sample] = []
    next_item = 0
    t0 = time.perf_counter() + 0.05
    stop = t0 + warmup_s + duration_s

    async def worker():
        nonlocal next_item
        while True:
            i = next_item
            due = t0 + i / rate
            if i >= n_items or due >= stop:
                return
            next_item += 1
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            status = await call(i)
            samples.append(Sample(due, time.perf_counter(), status))

    await asyncio.gather(*(worker() for _ in range(workers)))
    result = summarize(samples, t0 + warmup_s, float("inf"), next_item)
    result["target_rate"] = rate
    return result


# --- a minimal HTTP/1.1 keep-alive client ------------------------------------------

class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time. Understands exactly
    what our servers answer: Content-Length bodies (or none), and chunked
    bodies for completeness."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes):
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        status = int(head[9:12])
        body_start = end + 4
        at = head.find(b"\r\ncontent-length:")
        if at >= 0:
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + 17:line_end if line_end > 0 else len(head)])
            total = body_start + length
        elif b"transfer-encoding: chunked" in head:
            last = self.buffer.find(b"\r\n0\r\n\r\n", body_start - 2)
            if last < 0:
                return
            total = last + 7
        else:
            total = body_start
        if len(self.buffer) < total:
            return
        del self.buffer[:total]
        waiter.set_result(status)

    def connection_lost(self, exc):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed"))

    def closed(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    async def send(self, raw: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter


def read_requests(path: str) -> list[bytes]:
    """The parent writes each request as a 4-byte big-endian length + bytes."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def write_requests(path: str, requests: Sequence[bytes]) -> None:
    with open(path, "wb") as f:
        for raw in requests:
            f.write(struct.pack(">I", len(raw)))
            f.write(raw)


async def run_http(spec: dict) -> dict:
    requests = read_requests(spec["requests_file"])
    workers = spec["connections"]
    loop = asyncio.get_running_loop()

    async def connect() -> _Connection:
        _, proto = await loop.create_connection(_Connection, spec["host"], spec["port"])
        return proto

    # First in, first out: at a low fixed rate every connection stays in use,
    # so none sits idle past the server's keep-alive timeout.
    free = collections.deque([await connect() for _ in range(workers)])

    async def call(i: int) -> int:
        conn = free.popleft()
        try:
            if conn.closed():  # the server closed an idle one: nothing was sent on it
                conn = await connect()
            return await conn.send(requests[i])
        except ConnectionError:  # closed while we waited: counted as status 0
            return 0
        finally:
            free.append(conn)

    before = resource.getrusage(resource.RUSAGE_SELF)
    if spec["mode"] == "open":
        result = await run_open(call, len(requests), workers, spec["duration_s"], spec["warmup_s"], spec["rate"])
    else:
        result = await run_closed(call, len(requests), workers, spec["duration_s"], spec["warmup_s"])
    after = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for conn in free:
        if not conn.closed():
            conn.transport.close()
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    try:
        import uvloop

        result = uvloop.run(run_http(spec))
    except ImportError:  # plain asyncio works, a little slower
        result = asyncio.run(run_http(spec))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
