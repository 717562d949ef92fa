"""Baselines measured straight against PostgreSQL from the bench process:
raw asyncpg statements (on a pool like longcall's: no session reset on
release), a raw batched SKIP LOCKED delete loop, and procrastinate
(https://procrastinate.readthedocs.io) running no-op tasks on the same
database with the same worker concurrency as our settler."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import asyncpg

from app import db as app_db
from proof.bench_load import percentile, run_closed, run_open

SKIP_LOCKED_BATCH = 500


async def raw_statement_rate(url: str, sql: str, args: list[tuple], *, connections: int,
                             duration_s: float, warmup_s: float, rate: float | None = None,
                             n_items: int = 10**9, cpu: Callable[[], float] | None = None) -> dict:
    """One statement per call, autocommit, `connections` at once: closed loop
    (rate None) or open loop at `rate`; `args` are taken in turn, round
    again unless `n_items` stops at their end. With `cpu` (the server's CPU
    seconds so far), `cpu_s` is what the run cost it, read while its
    backends are still alive."""
    # longcall's pool (no session reset on release): one round trip a statement.
    pool = await app_db.create_pool(url, role="bench-raw", min_size=connections, max_size=connections)
    try:
        async def call(i: int) -> int:
            await pool.execute(sql, *args[i % len(args)])
            return 200

        cpu0 = cpu() if cpu else 0.0
        if rate is None:
            got = await run_closed(call, n_items, connections, duration_s, warmup_s)
        else:
            got = await run_open(call, n_items, connections, duration_s, warmup_s, rate)
        if cpu:
            got["cpu_s"] = cpu() - cpu0
        return got
    finally:
        await pool.close()


async def skip_locked_drain(url: str, n: int) -> float:
    """Rows/s of one loop deleting batches claimed with FOR UPDATE SKIP LOCKED
    from a queue table shaped like our outbox."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("""
            drop table if exists bench_queue;
            create table bench_queue (id bigserial primary key, job_id text not null, kind text not null,
                                      not_before timestamptz not null default now())""")
        await conn.execute("insert into bench_queue (job_id, kind) "
                           "select 'job_' || lpad(to_hex(i), 24, '0'), 'cancel' from generate_series(1, $1) i", n)
        await conn.execute("analyze bench_queue")
        started = time.perf_counter()
        deleted = 0
        while True:
            status = await conn.execute(
                "delete from bench_queue where id in (select id from bench_queue order by id "
                f"limit {SKIP_LOCKED_BATCH} for update skip locked)")
            got = int(status.split()[-1])
            if got == 0:
                break
            deleted += got
        elapsed = time.perf_counter() - started
        await conn.execute("drop table bench_queue")
        return deleted / elapsed
    finally:
        await conn.close()


# --- procrastinate ---------------------------------------------------------------------

class Arrivals:
    """The defer → run latencies (s) the no-op task records, and a wait for a
    number of them (the task runs on this event loop, in the worker)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self._grown = asyncio.Condition()

    async def add(self, latency: float) -> None:
        async with self._grown:
            self.latencies.append(latency)
            self._grown.notify_all()

    async def wait_for(self, n: int, timeout: float) -> None:
        """Until `n` have arrived or `timeout` s have passed; `latencies` says how many did."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), self._grown:
                await self._grown.wait_for(lambda: len(self.latencies) >= n)


def _procrastinate_app(url: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    seen = Arrivals()

    @app.task(name="bench_noop", queue="bench")
    async def noop(sent_at: float = 0.0) -> None:
        if sent_at:
            await seen.add(time.time() - sent_at)

    return app, noop, seen


async def ensure_procrastinate_schema(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        exists = await conn.fetchval("select to_regclass('procrastinate_jobs') is not null")
    finally:
        await conn.close()
    if not exists:
        app, _, _ = _procrastinate_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()


async def _empty_queue(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("delete from procrastinate_jobs")
    finally:
        await conn.close()


async def procrastinate_drain(url: str, n: int, concurrency: int) -> float:
    """No-op jobs/s: n deferred first (not timed), then one worker with our
    settler's concurrency runs until the queue is empty."""
    await ensure_procrastinate_schema(url)
    await _empty_queue(url)
    app, noop, _ = _procrastinate_app(url)
    async with app.open_async():
        for start in range(0, n, 1000):
            await noop.batch_defer_async(*({} for _ in range(min(1000, n - start))))
        started = time.perf_counter()
        await app.run_worker_async(queues=["bench"], concurrency=concurrency, wait=False,
                                   install_signal_handlers=False, delete_jobs="successful")
        elapsed = time.perf_counter() - started
    left = await _count_jobs(url)
    if left:
        raise RuntimeError(f"procrastinate left {left} jobs")
    return n / elapsed


async def _count_jobs(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("select count(*) from procrastinate_jobs where status <> 'succeeded'")
    finally:
        await conn.close()


async def procrastinate_latency(url: str, rate: float, duration_s: float, concurrency: int,
                                warmup_s: float) -> dict:
    """defer → no-op task finished, at a fixed rate, with a worker already
    waiting (LISTEN/NOTIFY on), after warmup_s of the same load not counted
    (as ours has): p50/p99 in ms."""
    await ensure_procrastinate_schema(url)
    await _empty_queue(url)
    app, noop, seen = _procrastinate_app(url)

    async def paced(n: int) -> None:
        t0 = time.perf_counter()
        for i in range(n):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            await noop.defer_async(sent_at=time.time())

    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(
            queues=["bench"], concurrency=concurrency, install_signal_handlers=False, delete_jobs="successful"))
        await asyncio.sleep(0.5)
        warm_n = max(1, int(rate * warmup_s))
        await paced(warm_n)
        await seen.wait_for(warm_n, 30)
        seen.latencies.clear()
        n = int(rate * duration_s)
        await paced(n)
        await seen.wait_for(n, 30)
        worker.cancel()
        with contextlib.suppress(BaseException):
            await worker
    lat = sorted(x * 1000 for x in seen.latencies)
    return {"n": len(lat), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99)}


@contextlib.asynccontextmanager
async def procrastinate_idle_worker(url: str, concurrency: int):
    """A procrastinate worker waiting on an empty queue, for as long as the
    block runs."""
    await ensure_procrastinate_schema(url)
    app, _, _ = _procrastinate_app(url)
    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(
            queues=["bench"], concurrency=concurrency, install_signal_handlers=False))
        try:
            yield
        finally:
            worker.cancel()
            with contextlib.suppress(BaseException):
                await worker
