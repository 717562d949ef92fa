"""The benchmark's world: a temp dir with its own durable embedded
PostgreSQL, our real processes (`longcall serve`, `longcall settler`, the
simulator), the baseline server, the load generator, and bulk fixtures
written straight into the database.

Everything started here is stopped by `Env.close()`; processes are ended by
their own pid, never by name.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psutil

from app import db as app_db
from app import ids
from app.domain import owners
from app.embedded import EmbeddedPostgres, free_port
from app.migrate import migrate
from app.signing.secretbox import SecretBox
from proof.bench_load import write_requests

REPO_ROOT = Path(__file__).resolve().parents[1]  # holds app/ and proof/
SECRET_KEY = "bench-secret-key-" + "0" * 16
WEBHOOK_SECRET = "bench-webhook-secret-0123456789"  # every bench job's t/v1 secret (encrypted per job)
SETTLER_ROLE = "bench_settler"  # pg_stat_statements has no application name: a role tells statements apart
PROCRASTINATE_ROLE = "bench_procrastinate"
# The floor's two processes (proof/bench_baseline.py): as a minimal endpoint
# is written with asyncpg's defaults (a session reset on each release), and
# without the reset (one round trip a request, as longcall's pools).
BASELINES = {"baseline": [], "baseline-bare": ["--no-pool-reset"]}
TABLES = "outbox, assets, ledger, jobs, api_keys, owners, provider_pauses"


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def cpu_seconds(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict, log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.popen.pid)

    def cpu(self) -> float:
        return cpu_seconds(self.ps)

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    async def wait_port(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not _port_open(port):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {self.log_tail()}")
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


@dataclass
class Owner:
    owner_id: str
    api_key: str


class Env:
    def __init__(self, log=print):
        self.say = log
        self.root = Path(tempfile.mkdtemp(prefix="longcall-bench-"))
        self.pg = EmbeddedPostgres(self.root / "pg", durable=True)
        self.url = ""
        self.pool: asyncpg.Pool | None = None
        self.secretbox = SecretBox((SECRET_KEY.encode(),))
        self.procs: dict[str, Proc] = {}
        self.ports: dict[str, int] = {}
        self.logs = self.root / "logs"
        self.objects = self.root / "objects"
        self._procrastinate_schema = False
        self.extra_env: dict[str, str] = {}  # settings the web tier runs with now (bench.py's configured e2e row)

    # -- lifecycle ---------------------------------------------------------------
    async def open(self) -> None:
        self.logs.mkdir()
        self.objects.mkdir()
        await asyncio.to_thread(self.pg.start)
        self.url = self.pg.url
        await migrate(self.url)
        self.pool = await app_db.create_pool(self.url, role="bench", min_size=2, max_size=40)
        async with self.pool.acquire() as conn:
            await conn.execute("create extension if not exists pg_stat_statements")
            for role in (SETTLER_ROLE, PROCRASTINATE_ROLE):
                # A throwaway cluster: superuser spares grants on tables made later.
                await conn.execute(f"create role {role} login superuser")

    async def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        if self.pool is not None:
            await self.pool.close()
        await asyncio.to_thread(self.pg.destroy)
        shutil.rmtree(self.root, ignore_errors=True)

    def role_url(self, role: str, database: str = "postgres") -> str:
        return f"postgresql://{role}@127.0.0.1:{self.pg.port}/{database}"

    def db_url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg.port}/{database}"

    def _server_processes(self) -> tuple[psutil.Process | None, list[psutil.Process]]:
        """The postmaster and every process it runs now (None, [] when it is down)."""
        try:
            pid = int((self.pg.data_dir / "postmaster.pid").read_text().split()[0])
            master = psutil.Process(pid)
            return master, master.children(recursive=True)
        except (OSError, ValueError, psutil.Error):
            return None, []

    def postgres_cpu(self) -> float:
        """CPU seconds of the server: postmaster and every backend now alive
        (our pools keep their backends for the whole run)."""
        master, children = self._server_processes()
        return 0.0 if master is None else cpu_seconds(master) + sum(cpu_seconds(c) for c in children)

    async def postgres_backends(self) -> dict[int, tuple[str, float]]:
        """Each server process's pid -> (what it serves, CPU seconds): a
        client connection by its application_name (longcall-web,
        longcall-settler, longcall-settler-listen, bench), a server process
        by its backend type (walwriter, checkpointer, autovacuum worker...),
        the postmaster by itself. `by_backend` diffs two of these."""
        master, children = self._server_processes()
        if master is None:
            return {}
        rows = await self.pool.fetch(
            "select pid, coalesce(nullif(application_name, ''), backend_type) as name from pg_stat_activity")
        names = {r["pid"]: r["name"] for r in rows}
        procs = {master.pid: ("postmaster", cpu_seconds(master))}
        procs.update({c.pid: (names.get(c.pid, "other"), cpu_seconds(c)) for c in children})
        return procs

    def snapshot(self) -> tuple[float, float, float]:
        """(wall, machine busy CPU s, our CPU s): ours is this process, all
        its children (servers, settlers, the load generator) and PostgreSQL."""
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + \
            getattr(t, "steal", 0)
        me = psutil.Process()
        mine = me.cpu_times()
        ours = mine.user + mine.system + mine.children_user + mine.children_system
        ours += sum(cpu_seconds(c) for c in me.children(recursive=True))
        return time.monotonic(), busy, ours + self.postgres_cpu()

    def others_share(self, since: tuple[float, float, float]) -> float:
        """Share of the machine's CPU that was not ours since `since`: other
        tenants of a shared machine (0 on a quiet one)."""
        wall, busy, ours = self.snapshot()
        elapsed = (wall - since[0]) * (os.cpu_count() or 1)
        return max(0.0, ((busy - since[1]) - (ours - since[2])) / elapsed) if elapsed > 0 else 0.0

    # -- processes ---------------------------------------------------------------
    def child_env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SWEEP_", "PUBLIC_URL", "MAX_OUTPUT"))}
        env.update({
            "DATABASE_URL": self.url,
            "SECRET_KEY": SECRET_KEY,
            "STORAGE_URL": f"file://{self.objects}",
            "SIM_URL": f"http://127.0.0.1:{self.port('sim')}",
            "PUBLIC_URL": f"http://127.0.0.1:{self.port('web')}",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "BENCH_WEBHOOK_SECRET": WEBHOOK_SECRET,
        })
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.update(extra)
        return env

    def port(self, name: str) -> int:
        if name not in self.ports:
            self.ports[name] = free_port()
        return self.ports[name]

    async def start(self, name: str, *, env: dict | None = None, **kw) -> Proc:
        """web, sim, a baseline (ports), or a settler under any name (no port)."""
        if name in self.procs and self.procs[name].alive():
            return self.procs[name]
        py = sys.executable
        if name == "web":
            argv = [py, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(self.port(name))]
        elif name == "sim":
            argv = [py, "-m", "app.simulator", "--host", "127.0.0.1", "--port", str(self.port(name))]
        elif name in BASELINES:
            argv = [py, "-m", "proof.bench_baseline", "--port", str(self.port(name)), *BASELINES[name]]
        else:
            argv = [py, "-m", "app", "settler", "--concurrency", str(kw.get("concurrency", 16))]
        proc = Proc(name, argv, env or self.child_env(), self.logs)
        self.procs[name] = proc
        if name in ("web", "sim", *BASELINES):
            await proc.wait_port(self.port(name))
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.stop()

    async def wait_listening(self, role_app_name: str = "longcall-settler-listen", timeout: float = 30.0,
                             proc: Proc | None = None) -> None:
        """Until a settler's LISTEN connection is up (it drains once on start)."""
        deadline = time.monotonic() + timeout
        while not await self.pool.fetchval(
                "select count(*) from pg_stat_activity where application_name = $1", role_app_name):
            if time.monotonic() > deadline or (proc is not None and not proc.alive()):
                raise RuntimeError(f"the settler did not start: {proc.log_tail() if proc else ''}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)

    async def load(self, port: int, requests: list[bytes], *, mode: str, connections: int,
                   duration_s: float, warmup_s: float, rate: float | None = None,
                   watch: tuple[str, ...] = ()) -> dict:
        """Run the load generator (its own process) against 127.0.0.1:port;
        adds CPU seconds per request of the watched processes and PostgreSQL."""
        path = self.root / "requests.bin"
        write_requests(str(path), requests)
        spec = {"host": "127.0.0.1", "port": port, "requests_file": str(path), "mode": mode,
                "connections": connections, "duration_s": duration_s, "warmup_s": warmup_s, "rate": rate}
        spec_path = self.root / "load.json"
        spec_path.write_text(json.dumps(spec))
        before = {n: self.procs[n].cpu() for n in watch}
        pg_before = self.postgres_cpu()
        since = self.snapshot()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proof.bench_load", str(spec_path), cwd=REPO_ROOT,
            env=self.child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), duration_s + warmup_s + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"the load generator failed: {err.decode(errors='replace')[-500:]}")
        result = json.loads(out.decode().strip().splitlines()[-1])
        result["others_share"] = self.others_share(since)
        sent = max(1, result["total_sent"])
        result["cpu_ms_per_req"] = {n: (self.procs[n].cpu() - before[n]) * 1000 / sent for n in watch}
        result["cpu_ms_per_req"]["postgres"] = (self.postgres_cpu() - pg_before) * 1000 / sent
        result["cpu_ms_per_req"]["loadgen"] = result["cpu_s"] * 1000 / sent
        return result

    # -- fixtures ----------------------------------------------------------------
    async def reset(self) -> None:
        """An empty schema for the next row (a settler must not be running)."""
        await self.pool.execute(f"truncate {TABLES} restart identity cascade")
        await self.pool.execute("drop table if exists bench_hook, bench_queue")

    async def owner(self, *, credits: int = 0, max_active: int = 10, name: str = "bench") -> Owner:
        async with self.pool.acquire() as conn:
            new = await owners.create_owner(conn, name, credits, max_active)
        return Owner(new.owner_id, new.api_key)

    async def insert_jobs(self, owner: Owner, n: int, status: str, *, with_secret: bool = False,
                          with_task: bool = True, intent: str | None = None, intent_delay_s: float = 0.0,
                          with_asset: bool = False) -> list[str]:
        """n jobs written directly, money consistent with their status
        (reserve 1 credit each; terminal ones refunded, succeeded charged),
        optionally with an open intent and one asset row."""
        now = dt.datetime.now(dt.UTC)
        job_ids = [ids.new_job_id() for _ in range(n)]
        terminal = status in ("succeeded", "failed", "cancelled", "expired")
        charged = 1 if status == "succeeded" else 0
        refunded = 1 if terminal and not charged else 0
        digest = b"\0" * 32
        records = []
        for job_id in job_ids:
            secret = self.secretbox.encrypt(WEBHOOK_SECRET, job_id) if with_secret else None
            records.append((
                job_id, owner.owner_id, digest, "sim", "bench", '{"duration_s": 0}', status,
                "sim_" + secrets.token_hex(12) if with_task else None, secret, with_secret,
                1, charged, refunded, now + dt.timedelta(hours=2), now if terminal else None, now, now))
        # A plain connection: binary COPY needs asyncpg's own jsonb codec (text in).
        conn = await asyncpg.connect(self.url)
        try:
            async with conn.transaction():
                await conn.copy_records_to_table("jobs", records=records, columns=[
                    "id", "owner_id", "request_digest", "provider", "model", "input", "status",
                    "provider_task_id", "webhook_secret", "callback_registered", "credits_reserved",
                    "credits_charged", "credits_refunded", "deadline_at", "finished_at", "created_at",
                    "updated_at"])
                if terminal:
                    await conn.execute("update owners set granted = granted + $2, balance = balance + $3, "
                                       "charged = charged + $4 where id = $1",
                                       owner.owner_id, n, n * refunded, n * charged)
                else:
                    await conn.execute("update owners set granted = granted + $2, reserved = reserved + $2, "
                                       "active = active + $2, max_active = max_active + $2 where id = $1",
                                       owner.owner_id, n)
                if intent:
                    not_before = now + dt.timedelta(seconds=intent_delay_s)
                    await conn.copy_records_to_table("outbox", records=[(j, intent, not_before) for j in job_ids],
                                                     columns=["job_id", "kind", "not_before"])
                if with_asset:
                    await conn.copy_records_to_table("assets", records=[
                        (j, 0, f"outputs/{owner.owner_id}/{j}/0", 1024, "0" * 64, "image/png") for j in job_ids],
                        columns=["job_id", "index", "storage_key", "bytes", "sha256", "content_type"])
            await conn.execute("analyze jobs; analyze outbox")
        finally:
            await conn.close()
        return job_ids


# --- raw requests (built before the clock starts) --------------------------------------

def http_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def webhook_requests(job_ids: list[str]) -> list[bytes]:
    """Valid t/v1 webhooks, one per job, as the simulator signs them, each
    to the job's callback URL with our capability token."""
    from app.signing.tokens import make_capability_token
    from app.signing.webhooks import sign_tv1

    t = int(time.time())
    out = []
    for job_id in job_ids:
        body = json.dumps({"id": "sim_" + job_id[4:], "status": "succeeded", "outputs": [], "cost": 1,
                           "error": None}).encode()
        token = make_capability_token("sim", job_id, SECRET_KEY.encode())
        out.append(http_request("POST", f"/webhooks/sim/{job_id}?token={token}", {
            "content-type": "application/json", "x-signature": sign_tv1(WEBHOOK_SECRET, body, t)}, body))
    return out


def by_backend(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two `Env.postgres_backends()` readings,
    summed by what each process serves, largest first. A process started
    between them counts from zero; one that ended between them is missing
    (our pools keep their connections for a whole run)."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        was = before.get(pid)
        spent[name] = spent.get(name, 0.0) + cpu - (was[1] if was and was[0] == name else 0.0)
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))
