"""Operations: metrics move as jobs run, and no secret ever reaches a log
line or an error response across whole job lifecycles, failures included.
Web and settler run as real processes with LOG_LEVEL=DEBUG."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.embedded import free_port
from app.signing.webhooks import sign_tv1
from tests.outbox.conftest import sim, sim_server, wait_for_status  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
SECRET_KEY = "ops-secret-key-do-not-log-0123456789"
ADMIN_TOKEN = "ops-admin-token-do-not-log"
REPLICATE_TOKEN = "r8_ops_token_do_not_log_12345"
KIE_KEY = "kie-ops-key-do-not-log"
FAL_KEY = "fal-ops-key-do-not-log"


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if found == {k: str(v) for k, v in labels.items()}:
            return float(m.group(3))
    return 0.0


@pytest.fixture
def stack(migrated, db, sim, tmp_path):
    """web + settler processes, with logs captured to files."""
    port, metrics_port = free_port(), free_port()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "DATABASE_URL": migrated,
           "SECRET_KEY": SECRET_KEY, "ADMIN_TOKEN": ADMIN_TOKEN, "STORAGE_URL": f"file://{tmp_path}/objects",
           "SIM_URL": sim.url, "PUBLIC_URL": f"http://127.0.0.1:{port}", "LOG_LEVEL": "DEBUG",
           "REPLICATE_API_TOKEN": REPLICATE_TOKEN, "REPLICATE_BASE_URL": f"{sim.url}/replicate",
           "KIE_API_KEY": KIE_KEY, "KIE_BASE_URL": f"{sim.url}/kie", "FAL_KEY": FAL_KEY,
           "FAL_BASE_URL": f"{sim.url}/fal", "FAL_JWKS_URL": f"{sim.url}/fal/.well-known/jwks.json",
           "SWEEP_INTERVAL_S": "0", "PROVIDER_TIMEOUT_S": "2"}
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("web", "settler")}
    procs = [
        subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                         cwd=REPO, env=env, stdout=logs["web"], stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, "-m", "app", "settler", "--metrics-port", str(metrics_port)],
                         cwd=REPO, env=env, stdout=logs["settler"], stderr=subprocess.STDOUT),
    ]
    base = f"http://127.0.0.1:{port}"
    for url in (f"{base}/healthz", f"http://127.0.0.1:{metrics_port}/metrics"):
        for _ in range(200):
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
    yield {"url": base, "metrics": f"http://127.0.0.1:{metrics_port}/metrics", "logs": logs, "procs": procs}
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(30)


async def test_metrics_move_as_jobs_run(stack, make_owner, db):
    owner = await make_owner(credits=100)
    web = lambda: httpx.get(f"{stack['url']}/metrics").text  # noqa: E731
    before = web()
    assert "# TYPE longcall_jobs_created_total counter" in before
    assert "# TYPE longcall_outbox_oldest_due_seconds gauge" in before
    async with httpx.AsyncClient(base_url=stack["url"], headers={"Authorization": f"Bearer {owner.api_key}"}) as c:
        job = (await c.post("/v1/jobs", json={"provider": "sim", "model": "m", "input": {"duration_s": 0.2},
                                               "max_credits": 5})).json()
        await c.post(f"/webhooks/sim/{job['id']}", content=b"{}", headers={"X-Signature": "t=1,v1=00"})
        await wait_for_status(db, job["id"], "succeeded")
    after = web()
    assert metric(after, "longcall_jobs_created_total", provider="sim") == \
        metric(before, "longcall_jobs_created_total", provider="sim") + 1
    assert metric(after, "longcall_webhook_requests_total", provider="sim", result="unauthorized") >= 1
    assert metric(after, "longcall_webhook_requests_total", provider="sim", result="accepted") >= 1
    settler = httpx.get(stack["metrics"]).text
    assert metric(settler, "longcall_jobs_finished_total", provider="sim", status="succeeded") == 1
    assert metric(settler, "longcall_provider_calls_total", provider="sim", operation="submit", outcome="ok") == 1
    assert metric(settler, "longcall_credits_charged_total") == 1
    assert metric(settler, "longcall_settle_duration_seconds_count", provider="sim", outcome="done") >= 1
    assert "longcall_outbox_intents" in settler


async def test_no_secret_in_any_log_line_or_error_response(stack, make_owner, db, sim):
    owner = await make_owner(credits=1000, max_active=20)
    auth = {"Authorization": f"Bearer {owner.api_key}"}
    responses = []
    secrets = {SECRET_KEY, ADMIN_TOKEN, REPLICATE_TOKEN, KIE_KEY, FAL_KEY, owner.api_key}
    async with httpx.AsyncClient(base_url=stack["url"]) as c:
        async def call(method, url, **kw):
            r = await c.request(method, url, **kw)
            responses.append(r)
            return r
        ids = []
        for provider, extra in (("sim", {}), ("sim", {"outcome": "failed"}), ("replicate", {}), ("kie", {}),
                                ("fal", {}), ("sim", {"output_bytes": 10})):
            r = await call("POST", "/v1/jobs", headers=auth, json={
                "provider": provider, "model": "owner/model", "max_credits": 5,
                "input": {"duration_s": 0.3, **extra}})
            ids.append(r.json()["id"])
        cancelled = (await call("POST", "/v1/jobs", headers=auth, json={
            "provider": "sim", "model": "m", "input": {"duration_s": 30}, "max_credits": 5})).json()["id"]
        await wait_for_status(db, cancelled, "running")
        await call("POST", f"/v1/jobs/{cancelled}/cancel", headers=auth)
        # the per-task webhook secret, as the simulator hands it out for this job's key
        task_secret = httpx.post(f"{sim.url}/v1/tasks", headers={"Idempotency-Key": ids[0]},
                                 json={"model": "owner/model", "input": {}}).json()["webhook_secret"]
        secrets.add(task_secret)
        # failures: bad keys, forged and replayed webhooks, bad tokens, bad bodies
        await call("GET", "/v1/account", headers={"Authorization": f"Bearer {owner.api_key}x"})
        await call("POST", f"/webhooks/sim/{ids[0]}", content=b'{"status":"succeeded"}',
                   headers={"X-Signature": sign_tv1(task_secret + "x", b"{}", int(time.time()))})
        await call("POST", f"/webhooks/kie/{ids[3]}?token=forged", content=b"{}")
        await call("POST", "/v1/jobs", headers=auth, content=b"{bad json")
        await call("POST", "/v1/admin/jobs/" + ids[0] + "/resolve", json={"outcome": "failed"},
                   headers={"Authorization": "Bearer wrong-admin"})
        await call("POST", "/v1/admin/jobs/" + ids[0] + "/resolve", json={"outcome": "failed"},
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        for job_id in ids:
            row = await wait_for_status(db, job_id, ("succeeded", "failed"), timeout=30)
            job = (await call("GET", f"/v1/jobs/{job_id}", headers=auth)).json()
            token = job["status_url"].split("token=")[1]
            secrets.add(token)
            await call("GET", job["status_url"])
            await call("GET", f"/v1/jobs/{job_id}?token={token}x")
            if row["status"] == "succeeded":
                await call("GET", f"/v1/jobs/{job_id}/outputs/0?token={token}")
        await call("GET", f"/v1/jobs/{ids[0]}?wait=abc", headers=auth)
    time.sleep(0.5)
    for p in stack["procs"]:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    lines = []
    for f in stack["logs"].values():
        f.seek(0)
        lines += [line for line in f.read().splitlines() if line.strip()]
    assert len(lines) > 20
    for line in lines:
        json.loads(line)  # one JSON object per line
        for secret in secrets:
            assert secret not in line, f"a secret leaked into the log: {line}"
    for r in responses:
        if r.status_code >= 400:
            for secret in secrets:
                assert secret not in r.text, f"a secret leaked into an error response: {r.text}"
    assert any('"path": "/v1/jobs/' in line for line in lines)  # the access log is there, without queries
    assert not any("token=" in line for line in lines)
