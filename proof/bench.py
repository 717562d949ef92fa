"""`longcall bench` (`make bench`): every figure beside a baseline measured
in the same run on the same PostgreSQL, printed as one table with ratios.

Everything runs in a temp dir with its own durable embedded PostgreSQL; our
servers are real processes (`longcall serve`, `longcall settler`, the
simulator); HTTP load comes from a separate process (proof/bench_load.py).
Each figure is the median over `--rounds` rounds (3; 1 with `--quick`, which
also shortens every window and shrinks every data set: a smoke test, not a
measurement). Rows (`--only`): ingest, create, reads, drain, e2e, idle,
sweep, rss, http.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from app.vocabulary import EventType, IntentKind, JobStatus, NotificationType
from outbox import intents
from proof import BENCH_GROUPS, bench_db
from proof.bench_baseline import CREATE_TABLE
from proof.bench_baseline import TABLE as HOOK_TABLE
from proof.bench_baseline import UPSERT as HOOK_UPSERT
from proof.bench_env import PROCRASTINATE_ROLE, SETTLER_ROLE, Env, Owner, by_backend, http_request, webhook_requests

GROUPS = BENCH_GROUPS
TERMINAL = ("succeeded", "failed", "cancelled", "expired")


@dataclass(frozen=True)
class Params:
    rounds: int
    duration_s: float  # each closed-loop or fixed-rate window, after the warm-up
    warmup_s: float
    max_rate: float  # requests prepared per second of window (more than any server here takes)
    drain_intents: int
    procrastinate_tasks: int
    e2e_jobs: int
    latency_window_s: float
    idle_sweep_s: float
    idle_window_s: float
    sweep_finished_jobs: int
    rss_bytes: int
    probe_runs: int = 21
    connections: int = 32
    fixed_rate: float = 1000.0
    low_rate: float = 20.0  # jobs/s: the e2e latency row's light load, beside half the capacity
    peer_jobs: int = 600  # the DBOS Transact peer's e2e jobs (one round; it runs at a tenth of our rate)
    latency_task_s: float = 0.2
    latency_warmup_s: float = 2.0  # paced jobs before each latency window, not counted
    concurrency: int = 16  # the settler's default (`longcall settler`)
    sweep_in_flight: int = 100
    http_requests: int = 4800  # per measurement of the provider HTTP client


FULL = Params(rounds=3, duration_s=4.0, warmup_s=1.0, max_rate=8000, drain_intents=20_000,
              procrastinate_tasks=3000, e2e_jobs=3000, latency_window_s=10.0, idle_sweep_s=3.0,
              idle_window_s=30.0, sweep_finished_jobs=1_000_000, rss_bytes=1024**3)
QUICK = Params(rounds=1, duration_s=0.6, warmup_s=0.2, max_rate=8000, drain_intents=1000,
               procrastinate_tasks=200, e2e_jobs=100, latency_window_s=1.0, idle_sweep_s=0.5,
               idle_window_s=2.0, sweep_finished_jobs=20_000, rss_bytes=64 * 1024**2, probe_runs=7,
               http_requests=480, peer_jobs=40, latency_warmup_s=0.3)


# --- results ------------------------------------------------------------------------

@dataclass
class Measure:
    name: str
    values: list[float] = field(default_factory=list)  # one per round: the main figure (p99 for latency)
    p50: list[float] = field(default_factory=list)  # latency rows only

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def median_p50(self) -> float | None:
        return statistics.median(self.p50) if self.p50 else None


@dataclass
class Row:
    key: str
    group: str
    label: str
    unit: str  # "/s", "ms", "/h", "MiB"
    ours: Measure
    baselines: list[Measure]
    target: str
    meets: Callable[[Row], bool] | None = None
    notes: list[str] = field(default_factory=list)
    others: list[float] = field(default_factory=list)  # per round: machine CPU share not ours (other tenants)

    def ratios(self) -> list[float]:
        return [self.ours.median / b.median if b.median else float("nan") for b in self.baselines]

    def as_json(self) -> dict:
        return {
            "key": self.key, "group": self.group, "label": self.label, "unit": self.unit,
            "ours": self.ours.median, "ours_p50": self.ours.median_p50, "ours_rounds": self.ours.values,
            "baselines": [{"name": b.name, "value": b.median, "p50": b.median_p50, "rounds": b.values}
                          for b in self.baselines],
            "ratios": self.ratios(), "target": self.target,
            "meets_target": self.meets(self) if self.meets else None, "notes": self.notes,
            "others_cpu_share": self.others,
        }


def fmt(value: float | None, unit: str, p50: float | None = None) -> str:
    if value is None or value != value:
        return "n/a"
    if unit == "ms":
        main = f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"
        return f"p50 {p50:.1f} / p99 {main}" if p50 is not None else main
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "µs":
        return f"{value:,.0f} µs"
    if unit == "/job":
        return f"{value:.1f}/job"
    return f"{value:,.0f}{unit}"


def render_table(rows: list[Row]) -> str:
    head = ("row", "ours", "baseline(s)", "ratio ours/base", "target", "met")
    lines = []
    for r in rows:
        bases = "; ".join(f"{b.name} {fmt(b.median, r.unit, b.median_p50)}" for b in r.baselines)
        ratios = "; ".join(f"{x:.2f}×" for x in r.ratios())
        met = "" if r.meets is None else ("yes" if r.meets(r) else "NO")
        lines.append((r.label, fmt(r.ours.median, r.unit, r.ours.median_p50), bases, ratios, r.target, met))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]

    def one(cols):
        return " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()

    return "\n".join([one(head), "-+-".join("-" * w for w in widths), *(one(line) for line in lines)])


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine_info() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: {os.cpu_count()} CPUs ({model}), {psutil.virtual_memory().total / 1024**3:.0f} GiB, "
            f"Python {platform.python_version()}, load average {load}\n"
            f"date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}")


def cpu_note(result: dict, unit: str = "req") -> str:
    parts = [f"{name} {ms * 1000:.0f} µs" for name, ms in result["cpu_ms_per_req"].items()]
    return f"CPU per {unit}: " + ", ".join(parts)


def _expect(result: dict, status: str, what: str) -> None:
    bad = {k: v for k, v in result["statuses"].items() if k != status}
    if bad or not result["n"]:
        raise RuntimeError(f"{what}: expected only {status}, got {result['statuses']}")


# --- the floor: a minimal endpoint and the raw upsert ---------------------------------------

async def _floor(env: Env, p: Params, rate: float | None = None, *, baseline: str = "baseline",
                 with_raw: bool = False) -> tuple[dict, dict | None]:
    """The minimal HMAC + upsert endpoint (`baseline`: one of bench_env.BASELINES),
    and with `with_raw` the raw single-row upsert, on `max_rate × window` fresh
    rows (each upsert takes its update path, as our webhook's coalescing upsert
    does)."""
    await env.start(baseline)
    n = int((rate or p.max_rate) * (p.duration_s + p.warmup_s)) + 10
    fake_ids = [f"job_{i:024x}" for i in range(1, n + 1)]
    async with env.pool.acquire() as conn:
        await conn.execute(f"drop table if exists {HOOK_TABLE}; {CREATE_TABLE}")
        await conn.copy_records_to_table(HOOK_TABLE, records=[(j, 0) for j in fake_ids])
        await conn.execute(f"analyze {HOOK_TABLE}")
    mode = "open" if rate else "closed"
    endpoint = await env.load(env.port(baseline), webhook_requests(fake_ids), mode=mode, rate=rate,
                              connections=p.connections, duration_s=p.duration_s, warmup_s=p.warmup_s,
                              watch=(baseline,))
    _expect(endpoint, "204", "minimal endpoint")
    if not with_raw:
        return endpoint, None
    # The web tier's pool size (app/web/__init__.py): as many statements in flight.
    raw = await bench_db.raw_statement_rate(env.url, HOOK_UPSERT, [(j,) for j in fake_ids], connections=20,
                                            duration_s=p.duration_s, warmup_s=p.warmup_s)
    return endpoint, raw


# The webhook's one write (outbox/intents.REQUEST_UNFLUSHED) and the same
# statement as every other request commits it (REQUEST: waiting for the WAL
# flush), with and without its NOTIFY (the same payload computed, not sent):
# NOTIFY takes a cluster-wide lock held through the commit.
REQUEST_UNNOTIFIED = intents.REQUEST.replace("then pg_notify(", "then concat(")


async def _webhook_write_probe(env: Env, p: Params) -> list[str]:
    """The ingest row's limit, measured: our webhook's write alone over raw
    asyncpg (the floor's 20 connections, each statement a running job's
    first webhook: its 30 s timer moved to now), as written, waiting for
    the WAL flush, and waiting without its NOTIFY; PostgreSQL CPU per
    statement for each."""
    if REQUEST_UNNOTIFIED == intents.REQUEST:
        raise RuntimeError("the webhook write's NOTIFY was not found in outbox/intents.REQUEST")
    owner = await env.owner(name="probe")
    # Half the window: even unnotified the statement stays within max_rate.
    duration_s = p.duration_s / 2
    n = int(p.max_rate * (duration_s + p.warmup_s))
    notes = []
    for label, sql in (("as written (commit not waiting for the WAL flush)", intents.REQUEST_UNFLUSHED),
                       ("waiting for the flush", intents.REQUEST),
                       ("waiting, without its NOTIFY", REQUEST_UNNOTIFIED)):
        job_ids = await env.insert_jobs(owner, n, "running", intent="settle", intent_delay_s=30)
        got = await bench_db.raw_statement_rate(
            env.url, sql, [(j, IntentKind.SETTLE, 0.0, EventType.WEBHOOK_ACCEPTED) for j in job_ids],
            connections=20, duration_s=duration_s, warmup_s=p.warmup_s, n_items=n, cpu=env.postgres_cpu)
        cpu_us = got["cpu_s"] / max(got["total_sent"], 1) * 1e6
        notes.append(f"{label} {got['rate']:,.0f}/s, PostgreSQL {cpu_us:,.0f} µs per statement")
    return ["our webhook write alone (raw asyncpg, 20 connections): " + "; ".join(notes)]


# --- rows -----------------------------------------------------------------------------

async def bench_ingest(env: Env, p: Params) -> list[Row]:
    await env.start("web")
    ours, floor, raw = Measure("ours"), Measure("minimal endpoint"), Measure("raw asyncpg upsert")
    bare = Measure("minimal endpoint without pool reset")
    ours_lat, floor_lat = Measure("ours"), Measure("minimal endpoint")
    notes, others, others_lat, rounds = [], [], [], []
    for r in range(p.rounds):
        say(f"ingest round {r + 1}/{p.rounds}")
        await env.reset()
        owner = await env.owner()
        n = int(p.max_rate * (p.duration_s + p.warmup_s))
        n_fixed = int(p.fixed_rate * (p.duration_s + p.warmup_s)) + 10
        # Running jobs as a settler leaves them: a per-job secret (encrypted)
        # and the lost-webhook timer 30 s out. Each webhook is its job's
        # first, so each moves a timer to now (and NOTIFYs).
        job_ids = await env.insert_jobs(owner, n + n_fixed, "running", with_secret=True,
                                        intent="settle", intent_delay_s=30)
        requests = webhook_requests(job_ids)
        got = await env.load(env.port("web"), requests[:n], mode="closed", connections=p.connections,
                             duration_s=p.duration_s, warmup_s=p.warmup_s, watch=("web",))
        _expect(got, "204", "webhook ingest")
        ours.values.append(got["rate"])
        others.append(got["others_share"])
        fixed = await env.load(env.port("web"), requests[n:], mode="open", rate=p.fixed_rate,
                               connections=p.connections, duration_s=p.duration_s, warmup_s=p.warmup_s,
                               watch=("web",))
        _expect(fixed, "204", "webhook ingest at a fixed rate")
        ours_lat.values.append(fixed["p99_ms"])
        others_lat.append(fixed["others_share"])
        ours_lat.p50.append(fixed["p50_ms"])
        endpoint, raw_got = await _floor(env, p, with_raw=True)
        floor.values.append(endpoint["rate"])
        raw.values.append(raw_got["rate"])
        endpoint_bare, _ = await _floor(env, p, baseline="baseline-bare")
        bare.values.append(endpoint_bare["rate"])
        endpoint_fixed, _ = await _floor(env, p, rate=p.fixed_rate)
        floor_lat.values.append(endpoint_fixed["p99_ms"])
        floor_lat.p50.append(endpoint_fixed["p50_ms"])
        if r == 0:
            notes += [f"ours {cpu_note(got)}", f"minimal endpoint {cpu_note(endpoint)}",
                      f"minimal endpoint without pool reset {cpu_note(endpoint_bare)}"]
        # Each round's ratio beside its CPU: the ratio moves between rounds
        # of one run more than the medians move between runs.
        ours_us = sum(got["cpu_ms_per_req"][k] for k in ("web", "postgres")) * 1000
        floor_us = sum(endpoint["cpu_ms_per_req"][k] for k in ("baseline", "postgres")) * 1000
        rounds.append(f"{got['rate'] / endpoint['rate']:.2f}× ({ours_us:.0f} against {floor_us:.0f} µs)")
    notes.append("each round's ratio to the minimal endpoint (server + PostgreSQL CPU per webhook, ours against "
                 "its): " + ", ".join(rounds))
    due_now = await env.pool.fetchval("select count(*) from outbox where not_before <= now()")
    notes.append(f"path measured: valid t/v1 webhook, the job's first (its 30 s timer moved to now + NOTIFY, "
                 "committed without waiting for the WAL flush); "
                 f"{due_now} intents made due in the last round; {p.connections} keep-alive connections")
    notes.append("the goal's floor uses asyncpg's default pool, which resets each connection on release "
                 "(a second round trip); the one without that reset makes one round trip a request, as "
                 "longcall's pools do; the raw upsert too")
    notes += await _webhook_write_probe(env, p)
    return [
        Row("ingest", "ingest", "webhook ingest, max req/s", "/s", ours, [floor, raw, bare], "≥ 3,000/s and ≥ 0.6×",
            lambda row: row.ours.median >= 3000 and row.ratios()[0] >= 0.6, notes, others),
        Row("ingest_latency", "ingest", f"webhook ingest at {p.fixed_rate:,.0f}/s", "ms", ours_lat, [floor_lat],
            "(none given)", None, ["open loop: latency counts from each request's scheduled time"], others_lat),
    ]


async def bench_create(env: Env, p: Params) -> list[Row]:
    await env.start("web")
    ours, floor, raw = Measure("ours"), Measure("minimal endpoint"), Measure("raw asyncpg upsert")
    notes, others = [], []
    owners_n = 16
    for r in range(p.rounds):
        say(f"create round {r + 1}/{p.rounds}")
        await env.reset()
        n = int(p.max_rate * (p.duration_s + p.warmup_s))
        owners = [await env.owner(credits=n, max_active=n, name=f"bench{i}") for i in range(owners_n)]
        body = json.dumps({"provider": "sim", "model": "bench", "input": {"duration_s": 0},
                           "max_credits": 1}).encode()
        requests = [http_request("POST", "/v1/jobs", {"authorization": f"Bearer {owners[i % owners_n].api_key}",
                                                      "content-type": "application/json"}, body)
                    for i in range(n)]
        got = await env.load(env.port("web"), requests, mode="closed", connections=p.connections,
                             duration_s=p.duration_s, warmup_s=p.warmup_s, watch=("web",))
        _expect(got, "202", "job creation")
        ours.values.append(got["rate"])
        others.append(got["others_share"])
        endpoint, raw_got = await _floor(env, p, with_raw=True)
        floor.values.append(endpoint["rate"])
        raw.values.append(raw_got["rate"])
        if r == 0:
            notes.append(f"ours {cpu_note(got)}")
    notes.append(f"{owners_n} owners round-robin (one owner's creates serialize on its row lock by design), "
                 "no Idempotency-Key, no settler running; each create = auth + 1-statement create + read back")
    return [Row("create", "create", "job creation POST /v1/jobs, max req/s", "/s", ours, [floor, raw],
                "≥ 1,500/s", lambda row: row.ours.median >= 1500, notes, others)]


async def bench_reads(env: Env, p: Params) -> list[Row]:
    await env.start("web")
    ours, raw = Measure("ours"), Measure("raw PK SELECT")
    ours_lat, raw_lat = Measure("ours"), Measure("raw PK SELECT")
    notes, others, others_lat = [], [], []
    for r in range(p.rounds):
        say(f"reads round {r + 1}/{p.rounds}")
        await env.reset()
        owner = await env.owner()
        job_ids = await env.insert_jobs(owner, 10_000, "succeeded", with_asset=True)
        n = int(p.max_rate * (p.duration_s + p.warmup_s))
        auth = {"authorization": f"Bearer {owner.api_key}"}
        requests = [http_request("GET", f"/v1/jobs/{job_ids[i % len(job_ids)]}", auth) for i in range(n)]
        got = await env.load(env.port("web"), requests, mode="closed", connections=p.connections,
                             duration_s=p.duration_s, warmup_s=p.warmup_s, watch=("web",))
        _expect(got, "200", "status reads")
        ours.values.append(got["rate"])
        others.append(got["others_share"])
        fixed = await env.load(env.port("web"), requests, mode="open", rate=p.fixed_rate,
                               connections=p.connections, duration_s=p.duration_s, warmup_s=p.warmup_s,
                               watch=("web",))
        _expect(fixed, "200", "status reads at a fixed rate")
        ours_lat.values.append(fixed["p99_ms"])
        others_lat.append(fixed["others_share"])
        ours_lat.p50.append(fixed["p50_ms"])
        args = [(j,) for j in job_ids]
        raw_got = await bench_db.raw_statement_rate(env.url, "select * from jobs where id = $1", args,
                                                    connections=20, duration_s=p.duration_s, warmup_s=p.warmup_s)
        raw.values.append(raw_got["rate"])
        raw_fixed = await bench_db.raw_statement_rate(env.url, "select * from jobs where id = $1", args,
                                                      connections=20, duration_s=p.duration_s,
                                                      warmup_s=p.warmup_s, rate=p.fixed_rate)
        raw_lat.values.append(raw_fixed["p99_ms"])
        raw_lat.p50.append(raw_fixed["p50_ms"])
        if r == 0:
            notes.append(f"ours {cpu_note(got)}")
    notes.append("succeeded jobs with one output each, read by their owner (API key); each read = auth + 1 SELECT")
    return [
        Row("reads", "reads", "status reads GET /v1/jobs/{id}, max req/s", "/s", ours, [raw], "≥ 4,000/s",
            lambda row: row.ours.median >= 4000, notes, others),
        Row("reads_latency", "reads", f"status reads at {p.fixed_rate:,.0f}/s", "ms", ours_lat, [raw_lat],
            "p99 ≤ 10 ms", lambda row: row.ours.median <= 10, [], others_lat),
    ]


async def _settler(env: Env, p: Params) -> None:
    """The general settler (the CLI's default concurrency), up and listening."""
    if "settler" in env.procs and env.procs["settler"].alive():
        return
    proc = await env.start("settler", concurrency=p.concurrency)
    await env.wait_listening(proc=proc)


async def _sim_request(env: Env, method: str, path: str, **kwargs) -> httpx.Response:
    """One call to the simulator's own API; async, so the event loop (which
    may be timing something meanwhile) never waits on it."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{env.port('sim')}", timeout=10) as client:
        return await client.request(method, path, **kwargs)


async def _wait_until(check, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


async def bench_drain(env: Env, p: Params) -> list[Row]:
    await env.start("sim")
    ours, raw, procr = Measure("ours"), Measure("raw SKIP LOCKED loop"), Measure("procrastinate")
    notes, others = [], []
    for r in range(p.rounds):
        say(f"drain round {r + 1}/{p.rounds}")
        env.stop("settler")
        await env.reset()
        await _settler(env, p)
        owner = await env.owner()
        n = p.drain_intents
        # Cancel intents of cancelled jobs that never got a task id: the
        # cancel step loads the job and is done (a no-op step, production code).
        await env.insert_jobs(owner, n, "cancelled", with_task=False, intent="cancel")
        settler = env.procs["settler"]
        cpu0, pg0 = settler.cpu(), env.postgres_cpu()
        since = env.snapshot()
        started = time.perf_counter()
        await env.pool.execute("select pg_notify('longcall_outbox', '')")
        await _wait_until(lambda: _outbox_empty(env), 300, "the settler to drain the outbox", 0.01)
        elapsed = time.perf_counter() - started
        ours.values.append(n / elapsed)
        others.append(env.others_share(since))
        if r == 0:
            notes.append(f"ours CPU per intent: settler {(settler.cpu() - cpu0) / n * 1e6:.0f} µs, "
                         f"postgres {(env.postgres_cpu() - pg0) / n * 1e6:.0f} µs")
        raw.values.append(await bench_db.skip_locked_drain(env.url, n))
        procr.values.append(await bench_db.procrastinate_drain(env.url, p.procrastinate_tasks, p.concurrency))
    notes.append(f"{n:,} cancel intents (a no-op step: job loaded, no task id) drained by one `longcall settler` "
                 f"(concurrency {p.concurrency}), timed from the NOTIFY to an empty outbox; raw loop: one connection "
                 f"deleting {bench_db.SKIP_LOCKED_BATCH}-row SKIP LOCKED batches of {n:,}; procrastinate: "
                 f"{p.procrastinate_tasks:,} no-op tasks, one worker of concurrency {p.concurrency}")
    return [Row("drain", "drain", "no-op outbox drain, intents/s", "/s", ours, [raw, procr],
                "≥ 20,000/s and ≥ 40× procrastinate",
                lambda row: row.ours.median >= 20000 and row.ratios()[1] >= 40, notes, others)]


async def _outbox_empty(env: Env) -> bool:
    return await env.pool.fetchval("select not exists (select 1 from outbox)")


async def _terminal_count(env: Env) -> int:
    return await env.pool.fetchval("select count(*) from jobs where status = any($1::text[])", list(TERMINAL))


def _create_requests(owner: Owner, n: int, task_s: float) -> list[bytes]:
    body = json.dumps({"provider": "sim", "model": "bench", "max_credits": 1,
                       "input": {"duration_s": task_s, "output_bytes": 1024}}).encode()
    headers = {"authorization": f"Bearer {owner.api_key}", "content-type": "application/json"}
    return [http_request("POST", "/v1/jobs", headers, body) for _ in range(n)]


E2E_OWNERS = 16  # the spread-out variant of the e2e row: the same jobs over this many owners
MODELS_TOML = """[[models]]
provider = "sim"
model = "bench"
price = { credits = 1, per = "output" }
"""


def _create_requests_of(owners: list[Owner], n: int, task_s: float) -> list[bytes]:
    """n creates, round-robin over `owners`."""
    per_owner = [_create_requests(o, -(-n // len(owners)), task_s) for o in owners]
    return [per_owner[i % len(owners)][i // len(owners)] for i in range(n)]


async def _configured(env: Env, receiver: str | None) -> None:
    """(Re)start the web tier as a run needs it: the default configuration
    (receiver None), or with a models file and notifications allowed to the
    bench's receiver."""
    extra: dict[str, str] = {}
    if receiver:
        models = env.root / "models.toml"
        models.write_text(MODELS_TOML)
        extra = {"MODELS_FILE": str(models), "NOTIFY_ALLOWED_ORIGINS": receiver}
    env.stop("web")
    env.extra_env = extra
    await env.start("web", env=env.child_env(**extra))


async def _e2e_run(env: Env, p: Params, *, owners_n: int = 1, receiver: str | None = None) -> dict:
    """One e2e run: `e2e_jobs` jobs over `owners_n` owners created as fast
    as `concurrency` connections go, then every one to succeeded. With
    `receiver` (the web tier already configured for it) each owner has an
    endpoint there asking for every event. Returns jobs/s, CPU µs per job
    by process, statements per job (sent; and run inside them), and notes."""
    env.stop("settler")
    await env.reset()
    await _sim_request(env, "POST", "/_sim/reset")
    settler_env = env.child_env(**env.extra_env) if receiver else None
    proc = await env.start("settler", env=settler_env, concurrency=p.concurrency)
    await env.wait_listening(proc=proc)
    m = p.e2e_jobs
    owners = [await env.owner(credits=m, max_active=m, name=f"bench{i}") for i in range(owners_n)]
    if receiver:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{env.port('web')}", timeout=10) as client:
            for o in owners:
                r = await client.post("/v1/webhook-endpoints", headers={"authorization": f"Bearer {o.api_key}"},
                                      json={"url": f"{receiver}/notifications", "events": list(NotificationType)})
                r.raise_for_status()
    watch = ("web", "settler", "sim")
    cpu0 = {w: env.procs[w].cpu() for w in watch}
    pg0, backends0 = env.postgres_cpu(), await env.postgres_backends()
    await env.pool.execute("select pg_stat_statements_reset()")
    since = env.snapshot()
    created = await env.load(env.port("web"), _create_requests_of(owners, m, 0.0), mode="closed",
                             connections=p.concurrency, duration_s=600, warmup_s=0)
    _expect(created, "202", "e2e creates")
    await _wait_until(functools.partial(_count_is, env, m), 120 + m / 10, "every e2e job to finish", 0.05)
    if receiver:
        await _wait_until(lambda: _deliveries_done(env), 120, "every notification to be delivered", 0.05)
    span = await env.pool.fetchrow(
        "select count(*) filter (where status = 'succeeded') as ok, "
        "extract(epoch from max(finished_at) - min(created_at)) as s from jobs")
    if span["ok"] != m:
        raise RuntimeError(f"only {span['ok']} of {m} e2e jobs succeeded")
    others = env.others_share(since)
    cpu = {w: (env.procs[w].cpu() - cpu0[w]) / m * 1e6 for w in watch}
    cpu["postgres"] = (env.postgres_cpu() - pg0) / m * 1e6
    pg_by = {name: s / m * 1e6 for name, s in by_backend(backends0, await env.postgres_backends()).items()}
    cpu["loadgen"] = created["cpu_s"] / m * 1e6
    # The bench's own reads (the waits above) are left out; `toplevel` tells
    # the statements longcall sent from those PostgreSQL ran inside them
    # (foreign-key checks).
    counted = """from pg_stat_statements s join pg_roles r on r.oid = s.userid
                 where r.rolname = 'postgres' and s.query not like '%pg_stat_statements%'
                   and s.query not like '%from jobs where status = any%'
                   and s.query not like '%filter (where status%' and s.query not like '%from deliveries%'"""
    sent = int(await env.pool.fetchval(f"select coalesce(sum(calls), 0) {counted} and s.toplevel"))
    nested = int(await env.pool.fetchval(f"select coalesce(sum(calls), 0) {counted} and not s.toplevel"))
    top = await env.pool.fetch(f"""
        select s.calls, s.total_exec_time, s.shared_blks_hit + s.shared_blks_read as blocks, s.query
        {counted} and s.toplevel
        order by s.total_exec_time desc limit 10""")
    stats = (await _sim_request(env, "GET", "/_sim/stats")).json()
    ended = cpu["postgres"] - sum(pg_by.values())
    pg_note = ("PostgreSQL's by the process it ran in (a connection by its application name): "
               + ", ".join(f"{k} {v:.0f} µs" for k, v in pg_by.items() if v >= 0.5)
               + (f"; processes that ended during the run {ended:.0f} µs" if ended >= 0.5 else ""))
    notes = ["CPU per job: " + ", ".join(f"{k} {v:.0f} µs" for k, v in cpu.items()), pg_note,
             f"simulator webhooks: {stats['webhooks_sent']} attempts, {stats['webhooks_delivered']} accepted for "
             f"{m} jobs (a webhook that beats the saved task id is refused, then retried 1 s later); "
             f"status calls {stats['status_calls']}",
             f"statements per job: {sent / m:.1f} sent, and {nested / m:.1f} foreign-key checks run inside them; "
             "top by server time (calls/job, mean ms, mean buffers read or hit):"]
    notes += [f"  {x['calls'] / m:.2f}/job {x['total_exec_time'] / max(1, x['calls']):.2f} ms "
              f"{x['blocks'] / max(1, x['calls']):.0f} buf  {' '.join(x['query'].split())[:80]}" for x in top]
    if receiver:
        delivered = await env.pool.fetchval("select count(*) from deliveries where status = 'delivered'")
        notes.append(f"notifications: {delivered} delivered to the receiver ({delivered / m:.1f} per job)")
    return {"rate": m / float(span["s"]), "cpu": cpu, "ours_cpu_us": cpu["web"] + cpu["settler"] + cpu["postgres"],
            "sent": sent / m, "nested": nested / m, "others": others, "notes": notes, "pg_note": pg_note}


async def _deliveries_done(env: Env) -> bool:
    return await env.pool.fetchval("select not exists (select 1 from deliveries where status = 'pending')")


async def bench_e2e(env: Env, p: Params) -> list[Row]:
    from proof.bench_peer import peer_e2e

    await env.start("sim")
    await env.start("web")
    ours, spread, procr = Measure("ours"), Measure(f"same jobs over {E2E_OWNERS} owners"), \
        Measure("procrastinate no-op")
    cpu, floor_cpu = Measure("ours (web + settler + PostgreSQL)"), Measure("minimal endpoint (server + PostgreSQL)")
    bare_cpu = Measure("the same without pool reset")
    sent, nested = Measure("ours"), Measure("foreign-key checks inside them")
    notes, spread_notes, cpu_notes, others, spread_others = [], [], [], [], []
    for r in range(p.rounds):
        say(f"e2e round {r + 1}/{p.rounds}: one owner")
        one = await _e2e_run(env, p)
        ours.values.append(one["rate"])
        others.append(one["others"])
        cpu.values.append(one["ours_cpu_us"])
        ours_by = ", ".join(f"{k} {one['cpu'][k]:.0f}" for k in ("web", "settler", "postgres"))
        cpu_notes.append(f"round {r + 1}: {ours_by} µs per job; {one['pg_note']}")
        sent.values.append(one["sent"])
        nested.values.append(one["nested"])
        say(f"e2e round {r + 1}/{p.rounds}: {E2E_OWNERS} owners")
        many = await _e2e_run(env, p, owners_n=E2E_OWNERS)
        spread.values.append(many["rate"])
        spread_others.append(many["others"])
        env.stop("settler")
        endpoint, _ = await _floor(env, p)
        floor_cpu.values.append(sum(endpoint["cpu_ms_per_req"][k] for k in ("baseline", "postgres")) * 1000)
        endpoint_bare, _ = await _floor(env, p, baseline="baseline-bare")
        bare_cpu.values.append(sum(endpoint_bare["cpu_ms_per_req"][k] for k in ("baseline-bare", "postgres"))
                               * 1000)
        procr.values.append(await bench_db.procrastinate_drain(env.url, p.e2e_jobs, p.concurrency))
        if r == 0:
            notes += one["notes"]
            spread_notes += many["notes"][:1]
            cpu_notes[:0] = [f"minimal endpoint {cpu_note(endpoint)}",
                             f"minimal endpoint without pool reset {cpu_note(endpoint_bare)}"]
    notes.append(f"{p.e2e_jobs:,} jobs of one owner created as fast as {p.concurrency} connections go, simulator "
                 "at duration_s=0, 1 KiB output, webhooks on (PUBLIC_URL), file storage (fsync); jobs/s = jobs ÷ "
                 "(last finished_at − first created_at); every real step (create, submit, webhook, status, "
                 "download, store, close); the default configuration (no models file, no endpoints)")
    capacity = ours.median

    env.stop("settler")
    dbos, peer_notes = Measure("DBOS Transact peer"), []
    # As many rounds as ours: the ratio's target is 10×, and one round of
    # the peer moved it by a fifth between runs (11 to 14 jobs/s).
    for r in range(p.rounds):
        say(f"e2e: the DBOS Transact peer, round {r + 1}/{p.rounds}")
        peer = await peer_e2e(env, p, m=p.peer_jobs)
        dbos.values.append(peer["jobs_per_s"])
        if r == 0:
            peer_notes += [f"peer {n}" for n in peer["notes"]]
    peer_notes.append(f"peer: {p.peer_jobs:,} jobs a round, fewer than ours (at a tenth of our rate, as many would "
                      "take minutes); see proof/peer_dbos.py and the README for what it does and does not do")

    say("e2e: with a models file and an endpoint receiving every notification")
    receiver = f"http://127.0.0.1:{env.port('baseline')}"
    await env.start("baseline")
    await _configured(env, receiver)
    try:
        full = await _e2e_run(env, p, receiver=receiver)
    finally:
        await _configured(env, None)
    configured = Measure("ours with a models file and an endpoint", [full["rate"]])

    half = capacity / 2
    ours_lat, procr_lat, low_lat = Measure("ours"), Measure("procrastinate defer→done"), Measure("ours")
    procr_low = Measure("procrastinate defer→done")
    lat_notes, others_lat = [], []
    for r in range(p.rounds):
        say(f"e2e latency round {r + 1}/{p.rounds}: {half:.0f} jobs/s (half the capacity)")
        lat = await _paced_latency(env, p, half)
        ours_lat.values.append(lat["p99"])
        ours_lat.p50.append(lat["p50"])
        others_lat.append(lat["others_share"])
        if r == 0:
            lat_notes.append(f"create→succeeded minus the task's {p.latency_task_s:g} s: p50 {lat['whole50']:.1f} "
                             f"/ p99 {lat['whole99']:.1f} ms")
            lat_notes.append(f"the warm-up's jobs (a settler's first {p.latency_warmup_s:g} s after its start): "
                             f"webhook→succeeded p50 {lat['warm50']:.1f} / p99 {lat['warm99']:.1f} ms")
        lat_notes.append(f"round {r + 1}: {lat['phases']}")
        low = await _paced_latency(env, p, p.low_rate)
        low_lat.values.append(low["p99"])
        low_lat.p50.append(low["p50"])
        pl_low = await bench_db.procrastinate_latency(env.url, p.low_rate, p.latency_window_s, p.concurrency,
                                                        p.latency_warmup_s)
        procr_low.values.append(pl_low["p99_ms"])
        procr_low.p50.append(pl_low["p50_ms"])
        pl = await bench_db.procrastinate_latency(env.url, half, p.latency_window_s, p.concurrency,
                                                    p.latency_warmup_s)
        procr_lat.values.append(pl["p99_ms"])
        procr_lat.p50.append(pl["p50_ms"])
    lat_notes.insert(0, f"half of the e2e capacity measured above ({capacity:.0f} jobs/s) for "
                        f"{p.latency_window_s:g} s after {p.latency_warmup_s:g} s of the same load not counted (the "
                        f"settler starts afresh for each window), task duration {p.latency_task_s:g} s (so the "
                        "webhook comes after the task id is saved); webhook→succeeded = finished_at − (submit call "
                        "start + task duration): an upper bound, by the submit round trip; procrastinate at the same "
                        "rate, after the same warm-up")
    return [
        Row("e2e", "e2e", "end to end create→succeeded, jobs/s", "/s", ours, [dbos, procr],
            "≥ 10× the DBOS peer", lambda row: row.ratios()[0] >= 10, notes + peer_notes, others),
        Row("e2e_owners", "e2e", f"one owner's e2e against {E2E_OWNERS} owners'", "/s", ours, [spread],
            "≥ 0.8×", lambda row: row.ratios()[0] >= 0.8, spread_notes, spread_others),
        Row("e2e_cpu", "e2e", "CPU per e2e job (ours) against per minimal-endpoint request", "µs", cpu,
            [floor_cpu, bare_cpu], "≤ 10×", lambda row: row.ratios()[0] <= 10, cpu_notes),
        Row("e2e_statements", "e2e", "statements per e2e job", "/job", sent, [nested], "≤ 9 sent",
            lambda row: row.ours.median <= 9,
            ["sent: what longcall's processes send (pg_stat_statements, top level); the baseline column is "
             "PostgreSQL's own foreign-key checks inside them, for scale"]),
        Row("e2e_configured", "e2e", "e2e with a models file and an endpoint, jobs/s", "/s", configured, [ours],
            "(none given)", None, full["notes"][:1] + full["notes"][-1:]),
        Row("e2e_latency", "e2e", "webhook→succeeded at half the e2e capacity", "ms", ours_lat, [procr_lat],
            "p99 ≤ 50 ms", lambda row: row.ours.median <= 50, lat_notes, others_lat),
        Row("e2e_latency_low", "e2e", f"webhook→succeeded at {p.low_rate:g} jobs/s", "ms", low_lat, [procr_low],
            "(none given)", None),
    ]


async def _paced_latency(env: Env, p: Params, rate: float) -> dict:
    """Jobs created at a fixed rate (task duration latency_task_s, 1 KiB
    output, webhooks on); latencies in ms from the database's timestamps.

    The settler starts afresh (the tables are emptied under it), so the
    window comes after latency_warmup_s of the same load, not counted, as
    the throughput rows have their warm-up: it measures the steady state,
    not a cold start's first jobs."""
    env.stop("settler")
    await env.reset()
    await _settler(env, p)
    warm_k = max(1, int(rate * p.latency_warmup_s))
    warm = await env.owner(credits=warm_k, max_active=warm_k, name="warm-up")
    warmed = await env.load(env.port("web"), _create_requests(warm, warm_k, p.latency_task_s), mode="open",
                            rate=rate, connections=p.concurrency, duration_s=p.latency_warmup_s, warmup_s=0)
    _expect(warmed, "202", "warm-up creates")
    await _wait_until(lambda: _count_is(env, warm_k), 60 + warm_k / 10, "every warm-up job to finish", 0.05)
    k = int(rate * p.latency_window_s)
    owner = await env.owner(credits=k, max_active=k)
    since = env.snapshot()
    paced = await env.load(env.port("web"), _create_requests(owner, k, p.latency_task_s), mode="open",
                           rate=rate, connections=p.concurrency, duration_s=p.latency_window_s, warmup_s=0)
    _expect(paced, "202", "paced creates")
    await _wait_until(lambda: _count_is(env, warm_k + k), 60 + k / 10, "every paced job to finish", 0.05)
    lat = await env.pool.fetchrow("""
        select count(*) filter (where status = 'succeeded' and owner_id = $2) as ok,
          percentile_disc(0.5) within group (order by hook) filter (where owner_id = $2) as p50,
          percentile_disc(0.99) within group (order by hook) filter (where owner_id = $2) as p99,
          percentile_disc(0.5) within group (order by whole) filter (where owner_id = $2) as whole50,
          percentile_disc(0.99) within group (order by whole) filter (where owner_id = $2) as whole99,
          percentile_disc(0.5) within group (order by hook) filter (where owner_id = $3) as warm50,
          percentile_disc(0.99) within group (order by hook) filter (where owner_id = $3) as warm99
        from (select status, owner_id,
                extract(epoch from finished_at - provider_call_started_at) * 1000 - $1 as hook,
                extract(epoch from finished_at - created_at) * 1000 - $1 as whole from jobs) j""",
                                  p.latency_task_s * 1000, owner.owner_id, warm.owner_id)
    if lat["ok"] != k:
        raise RuntimeError(f"only {lat['ok']} of {k} paced jobs succeeded")
    result = {name: float(lat[name]) for name in ("p50", "p99", "whole50", "whole99", "warm50", "warm99")}
    result["others_share"] = env.others_share(since)
    result["phases"] = await _latency_phases(env, owner.owner_id, p.latency_task_s)
    return result


# Where webhook→succeeded goes, from the timeline's own timestamps (job_events.at
# is the clock at the line's insert; finished_at is the close's transaction
# start, so the close's commit is outside the figure): the submit (call start →
# task id saved), the webhook (task id saved → webhook accepted, less the task's
# duration) and the settle (webhook accepted → the close begins: claim, status
# call, download, storing the output). Medians of the slowest 1% and of all.
LATENCY_PHASES = f"""
with w as (
  select extract(epoch from j.finished_at - j.provider_call_started_at) * 1000 - $2 as hook,
    extract(epoch from s.at - j.provider_call_started_at) * 1000 as submit,
    extract(epoch from h.at - s.at) * 1000 - $2 as webhook,
    extract(epoch from j.finished_at - h.at) * 1000 as settle
  from jobs j
  join lateral (select min(at) as at from job_events
                where job_id = j.id and type = '{EventType.TASK_SAVED}') s on true
  join lateral (select min(at) as at from job_events
                where job_id = j.id and type = '{EventType.WEBHOOK_ACCEPTED}') h on true
  where j.owner_id = $1 and j.status = '{JobStatus.SUCCEEDED}'),
tail as (select percentile_disc(0.99) within group (order by hook) as p99 from w)
select w.hook >= tail.p99 as slowest, count(*) as n,
  percentile_cont(0.5) within group (order by submit) as submit,
  percentile_cont(0.5) within group (order by webhook) as webhook,
  percentile_cont(0.5) within group (order by settle) as settle
from w, tail group by 1 order by 1 desc"""


async def _latency_phases(env: Env, owner_id: str, task_s: float) -> str:
    rows = {r["slowest"]: r for r in await env.pool.fetch(LATENCY_PHASES, owner_id, task_s * 1000)}

    def said(r) -> str:
        if r is None:
            return "none"
        return (f"submit {r['submit']:.1f}, webhook {r['webhook']:.1f}, settle {r['settle']:.1f} ms "
                f"({r['n']} jobs)")
    return ("medians by phase (submit: call start → task id saved; webhook: → webhook accepted, less the "
            f"task's duration; settle: → the close begins): slowest 1% {said(rows.get(True))}; "
            f"the rest {said(rows.get(False))}")


async def _count_is(env: Env, n: int) -> bool:
    return await _terminal_count(env) >= n


async def bench_idle(env: Env, p: Params) -> list[Row]:
    ours, procr = Measure("ours"), Measure("procrastinate idle worker")
    notes = []
    for r in range(p.rounds):
        say(f"idle round {r + 1}/{p.rounds}")
        env.stop("settler")
        await env.reset()
        await env.start("sim")
        await bench_db.ensure_procrastinate_schema(env.url)
        proc = await env.start("idle-settler", env=env.child_env(
            DATABASE_URL=env.role_url(SETTLER_ROLE), SWEEP_INTERVAL_S=str(p.idle_sweep_s)),
            concurrency=p.concurrency)
        try:
            await env.wait_listening(proc=proc)
            async with bench_db.procrastinate_idle_worker(env.role_url(PROCRASTINATE_ROLE), p.concurrency):
                await asyncio.sleep(1.0)  # both past their start-up statements
                await env.pool.execute("select pg_stat_statements_reset()")
                window_start = time.perf_counter()
                await asyncio.sleep(p.idle_window_s)
                rows = await env.pool.fetch("""
                    select r.rolname, s.calls, s.query from pg_stat_statements s
                    join pg_roles r on r.oid = s.userid
                    where r.rolname = any($1::text[]) order by s.calls desc""",
                                            [SETTLER_ROLE, PROCRASTINATE_ROLE])
                window = time.perf_counter() - window_start
        finally:
            env.stop("idle-settler")
        mine = [(x["calls"], " ".join(x["query"].split())) for x in rows if x["rolname"] == SETTLER_ROLE]
        theirs = sum(x["calls"] for x in rows if x["rolname"] == PROCRASTINATE_ROLE)
        total = sum(c for c, _ in mine)
        sweeps = sum(c for c, q in mine if "with found as" in q)
        if not sweeps:
            raise RuntimeError(f"no sweep ran in the {window:.1f} s idle window")
        # Every statement of an idle settler belongs to a sweep: per sweep,
        # times 12 sweeps an hour at the default SWEEP_INTERVAL_S=300.
        ours.values.append(total / sweeps * 3600 / 300)
        procr.values.append(theirs * 3600 / window)
        if r == 0:
            notes.append(f"settler with SWEEP_INTERVAL_S={p.idle_sweep_s:g} for {window:.1f} s: {sweeps} sweeps, "
                         f"{total} statements; scaled per sweep to the default 300 s (12 sweeps/h)")
            notes += [f"  {c}× {q[:90]}" for c, q in mine]
            notes.append("counted with pg_stat_statements under a dedicated role per process "
                         "(track=all, utility statements included); procrastinate scaled by time")
    return [Row("idle", "idle", "idle cost, statements/hour", "/h", ours, [procr], "≤ 12/h",
                lambda row: row.ours.median <= 12, notes)]


async def bench_sweep(env: Env, p: Params) -> list[Row]:
    import asyncpg

    from app.migrate import migrate
    from outbox.roads.sweep import BATCH, PROBE

    say(f"sweep: {p.sweep_finished_jobs:,} finished jobs in a database of their own")
    await env.pool.execute("drop database if exists bench_sweep")
    await env.pool.execute("create database bench_sweep")
    url = env.db_url("bench_sweep")
    await migrate(url)
    conn = await asyncpg.connect(url)
    ours, empty = Measure("ours"), Measure("same probe, in-flight jobs only")
    notes = []
    try:
        owner_id = "own_" + "b" * 24
        await conn.execute("insert into owners (id, name, granted, reserved, active, max_active) "
                           "values ($1, 'bench', $2::int, $2::int, $2::int, $2::int)", owner_id, p.sweep_in_flight)
        insert = """
            insert into jobs (id, owner_id, request_digest, provider, model, input, status, provider_task_id,
                              webhook_secret, credits_reserved, credits_charged, credits_refunded, deadline_at,
                              finished_at, created_at, updated_at)
            select 'job_' || lpad(to_hex(i), 24, '0'), $1, '\\x00'::bytea, 'sim', 'bench', '{}'::jsonb, $4,
                   'sim_' || i, case when $4 = 'running' then '\\x00'::bytea end, 1,
                   case when $4 = 'succeeded' then 1 else 0 end, 0, now() + interval '2 hours',
                   case when $4 = 'succeeded' then now() end,
                   now() - make_interval(secs => i % 100000000), now() - make_interval(secs => i % 100000000)
            from generate_series($2::bigint, $3::bigint) i"""
        flight_base = 0xF0_0000_0000
        await conn.execute(insert, owner_id, flight_base + 1, flight_base + p.sweep_in_flight, "running")
        await conn.execute("insert into outbox (job_id, kind, not_before) select id, 'settle', now() + "
                           "interval '30 seconds' from jobs where status = 'running'")
        await conn.execute("vacuum analyze jobs")
        await conn.execute("vacuum analyze outbox")

        async def measure(into: Measure) -> tuple[str, float]:
            for _ in range(3):
                await conn.fetchrow(PROBE, BATCH)
            times = []
            for _ in range(p.probe_runs * p.rounds):
                t0 = time.perf_counter()
                row = await conn.fetchrow(PROBE, BATCH)
                times.append((time.perf_counter() - t0) * 1000)
                if row["ids"]:
                    raise RuntimeError("the sweep probe found jobs without intents")
            into.values.append(statistics.median(times))
            plan = "\n".join(r[0] for r in await conn.fetch("explain (analyze, buffers) " + PROBE, BATCH))
            executed = next((line for line in plan.splitlines() if "Execution Time" in line), "").strip()
            return plan, float(executed.split(":")[1].split()[0]) if executed else float("nan")

        _, empty_exec = await measure(empty)
        chunk = 250_000
        for start in range(1, p.sweep_finished_jobs + 1, chunk):
            end = min(p.sweep_finished_jobs, start + chunk - 1)
            await conn.execute(insert, owner_id, start, end, "succeeded")
        await conn.execute("update owners set granted = granted + $2, charged = charged + $2 where id = $1",
                           owner_id, p.sweep_finished_jobs)
        await conn.execute("vacuum analyze jobs")
        plan, exec_ms = await measure(ours)
        uses = "jobs_in_flight" in plan
        size = await conn.fetchval("select pg_size_pretty(pg_relation_size('jobs_in_flight'))")
        notes.append(f"EXPLAIN: plan uses jobs_in_flight: {'yes' if uses else 'NO'} (index {size}); server "
                     f"execution {exec_ms:.2f} ms with {p.sweep_finished_jobs:,} finished, {empty_exec:.2f} ms without")
        notes.append(f"figure: median of {p.probe_runs * p.rounds} probes, client round trip included; "
                     f"{p.sweep_in_flight} running jobs, each with its settle timer (the probe finds none); "
                     "after VACUUM ANALYZE")
        notes += ["  plan: " + line.strip().removeprefix("->  ") for line in plan.splitlines() if "Scan" in line]
    finally:
        await conn.close()
        await env.pool.execute("drop database if exists bench_sweep with (force)")
    return [Row("sweep", "sweep", f"sweep probe, {p.sweep_finished_jobs:,} finished + {p.sweep_in_flight} in flight",
                "ms", ours, [empty], "≤ 5 ms", lambda row: row.ours.median <= 5, notes)]


async def bench_rss(env: Env, p: Params) -> list[Row]:
    await env.start("sim")
    await env.start("web")
    ours, small = Measure("ours"), Measure("same settler, 1 KiB output")
    notes = []
    for r in range(p.rounds):
        say(f"rss round {r + 1}/{p.rounds}: a {p.rss_bytes / 1024**2:,.0f} MiB output")
        env.stop("settler")
        await env.reset()
        proc = await env.start("rss-settler", concurrency=p.concurrency)
        try:
            await env.wait_listening(proc=proc)
            owner = await env.owner(credits=10, max_active=10)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{env.port('web')}", timeout=30,
                                         headers={"authorization": f"Bearer {owner.api_key}"}) as client:
                await _settle_one(env, client, proc, 1024)  # warm: imports, clients, pools
                await asyncio.sleep(0.5)
                small.values.append(await _settle_one(env, client, proc, 1024))
                await asyncio.sleep(0.5)
                started, cpu_before = time.perf_counter(), proc.cpu()
                ours.values.append(await _settle_one(env, client, proc, p.rss_bytes))
                took, cpu_s = time.perf_counter() - started, proc.cpu() - cpu_before
        finally:
            env.stop("rss-settler")
        for path in env.objects.rglob("*"):
            if path.is_file():
                path.unlink()
        if r == 0:
            notes.append("one real settler process; RSS sampled every 10 ms; growth = peak − RSS just before the "
                         "job; the large job's create→succeeded time and settler CPU (download + sha256 + fsync "
                         "and rename into file storage), per round:")
        notes.append(f"  {took:.1f} s, settler CPU {cpu_s:.2f} s")
    return [Row("rss", "rss", f"peak RSS growth settling a {p.rss_bytes / 1024**2:,.0f} MiB output", "MiB", ours,
                [small], "≤ 64 MiB", lambda row: row.ours.median <= 64, notes)]


async def _settle_one(env: Env, client: httpx.AsyncClient, proc, size: int) -> float:
    """Peak RSS growth (MiB) of the settler while one job of `size` bytes settles."""
    base = proc.rss()
    peak = base
    r = await client.post("/v1/jobs", json={"provider": "sim", "model": "bench", "max_credits": 1,
                                            "input": {"duration_s": 0.3, "output_bytes": size}})
    r.raise_for_status()
    job_id = r.json()["id"]
    deadline = time.monotonic() + 600
    last_check = 0.0
    while time.monotonic() < deadline:
        peak = max(peak, proc.rss())
        if time.monotonic() - last_check > 0.1:
            last_check = time.monotonic()
            status = await env.pool.fetchval("select status from jobs where id = $1", job_id)
            if status in TERMINAL:
                if status != "succeeded":
                    raise RuntimeError(f"the {size}-byte job ended {status}")
                return (peak - base) / 1024**2
        await asyncio.sleep(0.01)
    raise RuntimeError(f"the {size}-byte job did not finish")


async def bench_http(env: Env, p: Params) -> list[Row]:
    """The provider HTTP client's CPU per request (lower is better): ours
    (httpx over aiohttp, app/http_transport.py) against httpx's
    default transport (anyio), each in a fresh process, alternating, GETting
    a simulator task's status as the settle step does."""
    await env.start("sim")
    created = (await _sim_request(env, "POST", "/v1/tasks",
                                  json={"model": "bench", "input": {"duration_s": 0}})).json()
    url = f"http://127.0.0.1:{env.port('sim')}/v1/tasks/{created['id']}"
    ours, default = Measure("ours"), Measure("httpx default transport (anyio)")
    ours_rate, default_rate = [], []
    for r in range(p.rounds):
        say(f"http round {r + 1}/{p.rounds}")
        for transport, measure, rates in (("ours", ours, ours_rate), ("httpx", default, default_rate)):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "proof.bench_http", transport, url, str(p.http_requests),
                str(p.concurrency), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"bench_http {transport} failed: {err.decode()[-500:]}")
            result = json.loads(out)
            measure.values.append(result["cpu_us_per_req"])
            rates.append(result["per_s"])
    notes = [f"{p.http_requests:,} GETs per measurement from one client, {p.concurrency} at once (the settler's "
             f"concurrency), keep-alive, to the simulator on loopback; client process CPU only; requests/s: "
             f"ours {statistics.median(ours_rate):,.0f}, httpx default {statistics.median(default_rate):,.0f} "
             "(the simulator's own CPU bounds both)"]
    return [Row("http", "http", "provider HTTP client, CPU per request", "µs", ours, [default],
                "(none given; lower is better)", None, notes)]


BENCHES = {"ingest": bench_ingest, "create": bench_create, "reads": bench_reads, "drain": bench_drain,
           "e2e": bench_e2e, "idle": bench_idle, "sweep": bench_sweep, "rss": bench_rss, "http": bench_http}


async def run(params: Params, groups: list[str], json_path: str | None, quick: bool) -> int:
    env = Env()
    rows: list[Row] = []
    failed: list[str] = []
    started = time.monotonic()
    try:
        say(f"setting up in {env.root}")
        await env.open()
        for group in groups:
            try:
                rows += await BENCHES[group](env, params)
            except Exception as e:
                failed.append(group)
                say(f"{group} failed: {type(e).__name__}: {e}")
                traceback.print_exc(file=sys.stderr)
                for name, proc in env.procs.items():
                    if proc.log_tail():
                        say(f"{name} log tail:\n{proc.log_tail()}")
    finally:
        await env.close()
    mode = "quick (a smoke test: tiny windows and data sets, not a measurement)" if quick else "full"
    print(machine_info())
    print(f"mode: {mode}; medians over {params.rounds} round(s); ratio = ours ÷ each baseline; "
          f"took {time.monotonic() - started:.0f} s")
    print("the load generator, the simulator, our servers and PostgreSQL (durable: fsync on) share this machine\n")
    print(render_table(rows))
    print()
    for r in rows:
        print(f"{r.key}: per round: " + "; ".join(
            f"{m.name} " + ", ".join(fmt(v, r.unit) for v in m.values) for m in [r.ours, *r.baselines]))
        if r.others:
            print("  CPU used by other tenants of the machine during ours, per round: "
                  + ", ".join(f"{x:.0%}" for x in r.others))
        for note in r.notes:
            print(f"  {note}")
    if failed:
        print(f"\nFAILED rows: {', '.join(failed)} (see stderr)")
    if json_path:
        text = json.dumps({"machine": machine_info(), "params": asdict(params), "failed": failed,
                           "rows": [r.as_json() for r in rows]}, indent=2, default=str)
        await asyncio.to_thread(Path(json_path).write_text, text)
    return 1 if failed else 0


def main(*, quick: bool = False, only: list[str] | None = None, rounds: int | None = None,
         json_path: str | None = None) -> int:
    params = QUICK if quick else FULL
    if rounds is not None:
        if rounds < 1:
            print("longcall: --rounds must be at least 1", file=sys.stderr)
            return 2
        params = Params(**{**asdict(params), "rounds": rounds})
    groups = [g for g in GROUPS if not only or g in only]
    return asyncio.run(run(params, groups, json_path, quick))
