"""The bench's DBOS Transact peer (proof/peer_dbos.py) end to end, small:
its own process on the bench's embedded PostgreSQL, the simulator with
webhooks on, 20 jobs created by the load generator, every one succeeded with
its output stored and the money exact. The figures are not judged here."""
from __future__ import annotations

import importlib.util
import time

import pytest

from proof.bench_env import Env

MISSING = [name for name in ("dbos", "fastapi") if importlib.util.find_spec(name) is None]
# One skip for the module, so `pytest -rs` names it in one line.
if MISSING:
    pytest.skip(f"the DBOS peer needs {' and '.join(MISSING)} (pip install dbos fastapi)", allow_module_level=True)

from proof.bench_peer import peer_e2e  # noqa: E402 (after the skip: it names the peer's packages)

JOBS = 20


@pytest.mark.timeout(120)
async def test_the_dbos_peer_settles_every_job_with_exact_money():
    env = Env(log=lambda _: None)
    started = time.monotonic()
    try:
        await env.open()
        result = await peer_e2e(env, None, JOBS)
    finally:
        await env.close()
    ledger = result["ledger"]
    # The warm-up job is one more, outside the measured window.
    jobs = JOBS + 1
    assert ledger["succeeded"] == jobs, ledger
    assert ledger["charged"] == jobs * 1, ledger  # the simulator's cost: 1 credit a job
    assert ledger["refunded"] == 0 and ledger["jobs_reserved"] == jobs, ledger
    assert ledger["balance"] == ledger["granted"] - ledger["charged"] == 0, ledger
    assert ledger["reserved"] == 0 and ledger["active"] == 0, ledger
    assert ledger["assets"] == jobs, ledger
    assert result["sim_stats"]["tasks_created"] == JOBS, result["sim_stats"]  # counted after the warm-up
    assert result["jobs_per_s"] > 0
    assert set(result["cpu_us_per_job"]) == {"peer", "sim", "postgres", "loadgen"}
    assert all(v >= 0 for v in result["cpu_us_per_job"].values()), result["cpu_us_per_job"]
    assert time.monotonic() - started < 60
