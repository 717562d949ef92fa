"""Fixtures for the three roads to a settle (webhook, read, timers/sweep)
and the recovery path: the simulator, settlers that a test can stop and
start again, and helpers to sign webhooks and to snapshot the tables a
failed request must not touch."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest

from app.signing.secretbox import SecretBox
from app.signing.webhooks import sign_tv1
from outbox.context import Context
from outbox.settler import Settler
from tests.outbox.conftest import (  # noqa: F401  (fixtures and helpers re-exported for tests/roads)
    assert_money_balances,
    sim,
    sim_server,
    wait_for_status,
)
from tests.support.simulator import REPO_ROOT

SIM_JOB = {"provider": "sim", "model": "image-fast", "max_credits": 10}


def sim_job(**input) -> dict:
    return {**SIM_JOB, "input": {"duration_s": 0.2, **input}}


def provider_env(sim_url: str, **extra) -> dict:
    """Every provider pointed at the one simulator (its wire protocols live
    under fixed prefixes)."""
    return {
        "SIM_URL": sim_url,
        "REPLICATE_BASE_URL": f"{sim_url}/replicate",
        "REPLICATE_API_TOKEN": "r8_roads_test_token",
        "FAL_BASE_URL": f"{sim_url}/fal",
        "FAL_KEY": "fal-roads-test-key",
        "FAL_JWKS_URL": f"{sim_url}/fal/.well-known/jwks.json",
        "KIE_BASE_URL": f"{sim_url}/kie",
        "KIE_API_KEY": "kie-roads-test-key",
        **extra,
    }


class RunningSettler:
    """An in-process settler a test may stop (and start another later)."""

    def __init__(self, settler: Settler, task: asyncio.Task, ctx: Context):
        self.settler, self.task, self.ctx = settler, task, ctx

    async def stop(self) -> None:
        if self.task is None:
            return
        self.settler.stop()
        await asyncio.wait_for(self.task, 30)
        await self.ctx.close()
        self.task = None


@pytest.fixture
async def settlers():
    started: list[RunningSettler] = []

    async def start(settings, *, concurrency: int = 8, sweep_interval_s: float = 0,
                    provider_timeout_s: float = 2.0) -> RunningSettler:
        ctx = await Context.open(settings, provider_timeout_s=provider_timeout_s)
        settler = Settler(ctx, concurrency, sweep_interval_s=sweep_interval_s)
        running = RunningSettler(settler, asyncio.create_task(settler.run()), ctx)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.stop()


async def snapshot(pool) -> dict:
    """Every row a webhook, a read or a refused request could change."""
    out = {}
    for table, order in (("jobs", "id"), ("outbox", "id"), ("ledger", "id"), ("assets", "job_id, index"),
                         ("owners", "id")):
        out[table] = [dict(r) for r in await pool.fetch(f"select * from {table} order by {order}")]
    return out


def job_secret(settings, row) -> str:
    """The job's per-task webhook secret, decrypted as the receiver does."""
    return SecretBox(settings.secret_keys).decrypt(row["webhook_secret"], row["id"])


def tv1_headers(secret: str, body: bytes, t: int | None = None) -> dict:
    return {"content-type": "application/json",
            "x-signature": sign_tv1(secret, body, int(time.time()) if t is None else t)}


def hook_path(settings, provider: str, job_id: str) -> str:
    """The path and query of the job's callback URL, as longcall registers
    it (Settings.callback_url: our capability token in the query)."""
    url = urlsplit(settings.callback_url(provider, job_id))
    return f"{url.path}?{url.query}"


def sim_task(sim_url: str, task_id: str) -> dict:
    return httpx.get(f"{sim_url}/v1/tasks/{task_id}", timeout=5, trust_env=False).json()


async def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll an async predicate until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met after {timeout}s")
        await asyncio.sleep(interval)


def longcall(database_url: str, *args: str) -> subprocess.CompletedProcess:
    """The real `longcall` command (as `python -m app`) against the test
    database, as an operator would run it."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(DATABASE_URL=database_url, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
