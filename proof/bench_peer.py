"""The e2e row's workload against the DBOS Transact peer (proof/peer_dbos.py):
the same create requests from the same load generator, the same simulator
(duration_s=0, 1 KiB output, webhooks on), the same PostgreSQL server, and
jobs/s from the peer's own timestamps exactly as bench.py's e2e row takes
them from longcall's.

The peer gets two databases of its own on the bench's server (its
application database and DBOS's system database), made here and dropped at
the end, and runs as its own process, stopped by its pid.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
import time
from typing import TYPE_CHECKING

import asyncpg
import httpx

from proof.bench_env import Env, Proc, http_request

if TYPE_CHECKING:
    from proof.bench import Params

APP_DB = "peer"
SYSTEM_DB = "peer_dbos_sys"
CONNECTIONS = 16  # as the e2e row: the settler's default concurrency


def _create_requests(api_key: str, n: int) -> list[bytes]:
    body = json.dumps({"provider": "sim", "model": "bench", "max_credits": 1,
                       "input": {"duration_s": 0, "output_bytes": 1024}}).encode()
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
    return [http_request("POST", "/v1/jobs", headers, body) for _ in range(n)]


async def _sim_request(env: Env, method: str, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{env.port('sim')}", timeout=10) as client:
        return await client.request(method, path)


async def _drop_databases(env: Env) -> None:
    for name in (APP_DB, SYSTEM_DB):
        await env.pool.execute(f"drop database if exists {name} with (force)")


async def _start_peer(env: Env) -> Proc:
    port = env.port("peer")
    child = env.child_env(
        DATABASE_URL=env.db_url(APP_DB),
        DBOS_SYSTEM_DATABASE_URL=env.db_url(SYSTEM_DB),
        PUBLIC_URL=f"http://127.0.0.1:{port}",
        PEER_STORAGE_DIR=str(env.root / "peer-objects"),
    )
    (env.root / "peer-objects").mkdir(exist_ok=True)
    proc = Proc("peer", [sys.executable, "-m", "proof.peer_dbos", "--port", str(port)], child, env.logs)
    env.procs["peer"] = proc  # so Env.close stops it if we fail midway
    await proc.wait_port(port, timeout=60)
    return proc


async def _wait_finished(conn: asyncpg.Connection, proc: Proc, m: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = await conn.fetchval("select count(*) from peer_jobs where finished_at is not null")
        if done >= m:
            return
        if not proc.alive():
            raise RuntimeError(f"the peer died: {proc.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {done} of {m} peer jobs finished")
        await asyncio.sleep(0.05)


async def peer_e2e(env: Env, p: Params | None = None, m: int | None = None) -> dict:
    """jobs/s and CPU µs per job by process for `m` jobs (default
    p.e2e_jobs) created closed-loop over 16 connections against the peer."""
    if m is None:
        assert p is not None, "give m or the bench's Params"
        m = p.e2e_jobs
    sim = await env.start("sim")
    (await _sim_request(env, "POST", "/_sim/reset")).raise_for_status()
    await _drop_databases(env)
    for name in (APP_DB, SYSTEM_DB):
        await env.pool.execute(f"create database {name}")
    conn = None
    try:
        peer = await _start_peer(env)
        conn = await asyncpg.connect(env.db_url(APP_DB))
        api_key = "peer_" + secrets.token_hex(16)
        owner_id = "own_" + secrets.token_hex(12)
        # m credits and slots for the measured jobs, one more for the warm-up job.
        await conn.execute("insert into peer_owners (id, api_key_hash, balance, max_active) values ($1, $2, $3, $4)",
                           owner_id, hashlib.sha256(api_key.encode()).hexdigest(), m + 1, m + 1)
        requests = _create_requests(api_key, m)
        # One job first, outside the clock: imports, pools and DBOS's first
        # statements, as longcall's servers are warm when its row starts.
        warm_id = await _warm(env, conn, peer, api_key)
        (await _sim_request(env, "DELETE", "/_sim/stats")).raise_for_status()  # count the measured jobs only
        await env.pool.execute("select pg_stat_statements_reset()")
        cpu0 = {"peer": peer.cpu(), "sim": sim.cpu()}
        pg0 = env.postgres_cpu()
        created = await env.load(env.port("peer"), requests, mode="closed", connections=CONNECTIONS,
                                 duration_s=600, warmup_s=0)
        if created["statuses"] != {"202": m}:
            raise RuntimeError(f"peer creates: expected {m}× 202, got {created['statuses']}")
        await _wait_finished(conn, peer, m + 1, 120 + m / 10)
        cpu = {"peer": (peer.cpu() - cpu0["peer"]) / m * 1e6, "sim": (sim.cpu() - cpu0["sim"]) / m * 1e6,
               "postgres": (env.postgres_cpu() - pg0) / m * 1e6, "loadgen": created["cpu_s"] / m * 1e6}
        span = await conn.fetchrow("""
            select count(*) filter (where status = 'succeeded') as ok, count(*) as n,
              extract(epoch from max(finished_at) - min(created_at)) as s from peer_jobs where id <> $1""",
                                   warm_id)
        if span["ok"] != m or span["n"] != m:
            raise RuntimeError(f"only {span['ok']} of {m} peer jobs succeeded ({span['n']} rows)")
        ledger = await _ledger(conn, owner_id, m + 1)
        if (ledger["charged"], ledger["balance"], ledger["reserved"], ledger["active"], ledger["assets"]) != \
                (m + 1, 0, 0, 0, m + 1):
            raise RuntimeError(f"the peer's money does not add up: {ledger}")
        stats = {k: v for k, v in (await _sim_request(env, "GET", "/_sim/stats")).json().items()
                 if isinstance(v, int)}
        statements = await env.pool.fetch("""
            select d.datname, sum(s.calls)::bigint as calls from pg_stat_statements s
            join pg_database d on d.oid = s.dbid where d.datname = any($1::text[]) group by d.datname""",
                                          [APP_DB, SYSTEM_DB])
        per_db = {r["datname"]: r["calls"] / m for r in statements}
        notes = [
            "CPU per job: " + ", ".join(f"{k} {v:.0f} µs" for k, v in cpu.items()),
            f"simulator webhooks: {stats['webhooks_sent']} attempts, {stats['webhooks_delivered']} accepted for "
            f"{m} jobs (a webhook that beats the saved task id gets 409, retried 1 s later); "
            f"status calls {stats['status_calls']}",
            f"creates: {created['rate']:.0f}/s, p50 {created['p50_ms']:.1f} ms, p99 {created['p99_ms']:.1f} ms",
            "statements per job: " + ", ".join(f"{db} {n:.1f}" for db, n in sorted(per_db.items())),
            f"{m:,} jobs of one owner, {CONNECTIONS} connections, closed loop; DBOS Transact peer "
            "(proof/peer_dbos.py): FastAPI + one workflow per job, datasource transactions, recv/send webhooks",
        ]
        return {"jobs_per_s": m / float(span["s"]), "cpu_us_per_job": cpu, "notes": notes, "ledger": ledger,
                "others_share": created["others_share"],
                "sim_stats": stats, "statements_per_job": per_db}
    finally:
        if conn is not None:
            await conn.close()
        env.stop("peer")
        await _drop_databases(env)


async def _warm(env: Env, conn: asyncpg.Connection, peer: Proc, api_key: str) -> str:
    """One job through every step before the clock starts; its id."""
    auth = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{env.port('peer')}", timeout=30) as client:
        r = await client.post("/v1/jobs", headers=auth, json={
            "provider": "sim", "model": "bench", "max_credits": 1, "input": {"duration_s": 0, "output_bytes": 1024}})
        if r.status_code != 202:
            raise RuntimeError(f"the peer's warm-up create answered {r.status_code}: {r.text[:200]}")
        job_id = r.json()["id"]
        await _wait_finished(conn, peer, 1, 60)
        r = await client.get(f"/v1/jobs/{job_id}", headers=auth)
        if r.status_code != 200 or r.json()["status"] != "succeeded":
            raise RuntimeError(f"the peer's warm-up job: {r.status_code} {r.text[:200]}")
    return job_id


async def _ledger(conn: asyncpg.Connection, owner_id: str, jobs: int) -> dict:
    """The owner's money and the jobs' sums once every job is settled."""
    owner = await conn.fetchrow("select balance, reserved, active from peer_owners where id = $1", owner_id)
    sums = await conn.fetchrow("""
        select coalesce(sum(credits_charged), 0)::bigint as charged,
               coalesce(sum(credits_refunded), 0)::bigint as refunded,
               coalesce(sum(credits_reserved), 0)::bigint as reserved,
               count(*) filter (where status = 'succeeded') as succeeded from peer_jobs""")
    assets = await conn.fetchval("select count(*) from peer_assets where bytes = 1024")
    return {"granted": jobs, "jobs_reserved": sums["reserved"], "succeeded": sums["succeeded"],
            "charged": sums["charged"], "refunded": sums["refunded"], "balance": owner["balance"],
            "reserved": owner["reserved"], "active": owner["active"], "assets": assets}
