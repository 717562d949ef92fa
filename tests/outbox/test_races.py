"""Races that really race: many settle requests and steps at once, two
settler processes, and a settler killed between storing outputs and
committing."""
from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.simulator.outputs import output_sha256
from outbox import intents
from outbox.context import Context
from outbox.outcome import Done
from outbox.settle import settle
from tests.outbox.conftest import assert_money_balances, server_now, wait_for_settlers, wait_for_status

REPO = Path(__file__).resolve().parents[2]


def job(**input):
    return {"provider": "sim", "model": "m", "input": {"duration_s": 0.3, **input}, "max_credits": 10}


def settler_process(settings_env: dict) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **settings_env}
    return subprocess.Popen([sys.executable, "-m", "app", "settler", "--concurrency", "8"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def env_of(make_settings, sim, tmp_objects, **extra) -> dict:
    s = make_settings(SIM_URL=sim.url)
    return {"DATABASE_URL": s.database_url, "SECRET_KEY": "test-secret-key-0123456789",
            "STORAGE_URL": f"file://{tmp_objects}", "SIM_URL": sim.url, "SWEEP_INTERVAL_S": "0",
            "LOG_LEVEL": "WARNING", **{k: str(v) for k, v in extra.items()}}


async def test_concurrent_settle_steps_close_once(web, make_owner, db, sim, make_settings, start_settler):
    """Twenty settle steps for one finished task at the same moment (as the
    webhook, read and timer roads may ask): one closes, all others see a
    closed job; one charge, one asset set."""
    settings = make_settings(SIM_URL=sim.url)
    server = await web(SIM_URL=sim.url)
    settler = await start_settler(settings)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(duration_s=0.5, outputs=2, cost=4))).json()
    await wait_for_status(db, created["id"], "running")
    settler.stop()  # the test drives the steps itself from here
    await asyncio.sleep(0.8)  # the task is done at the provider
    ctx = await Context.open(settings, provider_timeout_s=5)
    try:
        outcomes = await asyncio.gather(*[settle(ctx, created["id"], 1) for _ in range(20)])
    finally:
        await ctx.close()
    assert all(isinstance(o, Done) for o in outcomes)
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == "succeeded" and row["credits_charged"] == 4
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", row["id"]) == 1
    assert await db.fetchval("select count(*) from assets where job_id = $1", row["id"]) == 2
    await assert_money_balances(db)


async def test_settle_requests_storm_with_two_settler_processes(web, make_owner, db, sim, make_settings,
                                                                tmp_objects):
    server = await web(SIM_URL=sim.url)
    owner = await make_owner(credits=1000, max_active=50)
    since = await server_now(db)
    procs = [settler_process(env_of(make_settings, sim, tmp_objects)) for _ in range(2)]
    try:
        await wait_for_settlers(db, 2, started_after=since)
        async with server.client(owner.api_key) as c:
            ids = [(await c.post("/v1/jobs", json=job(duration_s=0.5, cost=3))).json()["id"] for _ in range(20)]

        async def storm(job_id):
            for _ in range(30):
                async with db.acquire() as conn:
                    await intents.request(conn, job_id, "settle")
                await asyncio.sleep(0.01)

        await asyncio.gather(*[storm(j) for j in ids for _ in range(3)])
        for job_id in ids:
            await wait_for_status(db, job_id, "succeeded", timeout=30)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(30) == 0  # SIGTERM: finish or release, then exit cleanly
    charges = await db.fetch("select job_id, count(*) from ledger where kind = 'charge' group by job_id")
    assert len(charges) == 20 and all(r["count"] == 1 for r in charges)
    assert await db.fetchval("select count(*) from assets") == 20
    assert await db.fetchval("select count(*) from outbox") == 0
    stats = __import__("tests.support.simulator", fromlist=["stats"]).stats(sim.url)
    assert stats["tasks_created"] == 20
    await assert_money_balances(db)


async def test_settler_killed_after_storing_before_commit(web, make_owner, db, sim, make_settings,
                                                          tmp_objects):
    """SIGKILL a settler once it has written the first output to storage and
    before it commits; another settler finishes after the lease: the same
    keys are overwritten, money moves once."""
    server = await web(SIM_URL=sim.url)
    owner = await make_owner(credits=100)
    size = 24 * 1024 * 1024
    env = env_of(make_settings, sim, tmp_objects, SETTLER_LEASE_S=3)
    first = settler_process(env)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(duration_s=0.2, outputs=3, output_bytes=size))).json()
    job_dir = Path(tmp_objects) / "outputs" / owner.owner_id / created["id"]
    deadline = time.monotonic() + 30
    while not (job_dir.exists() and any(p.name == "0" for p in job_dir.iterdir())):
        assert time.monotonic() < deadline, "the first output never reached storage"
        await asyncio.sleep(0.002)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == "running", "killed too late: the job had already committed"
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == 0

    second = settler_process(env)
    try:
        row = await wait_for_status(db, created["id"], "succeeded", timeout=30)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == 1
    objects = sorted(p.name for p in job_dir.iterdir() if not p.name.startswith("."))
    assert objects == ["0", "1", "2"]
    for index in range(3):
        digest = hashlib.sha256((job_dir / str(index)).read_bytes()).hexdigest()
        assert digest == output_sha256(row["provider_task_id"], index, size)
    await assert_money_balances(db)
