"""`longcall dev` on a fresh directory: embedded PostgreSQL, simulator, web,
settler, the demo batch, then serving until Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from app.embedded import EmbeddedPostgres, free_port

REPO = Path(__file__).resolve().parents[1]


def test_dev_runs_the_demo_and_serves_until_ctrl_c(tmp_path):
    port, sim_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY", "PUBLIC_URL", "ADMIN_TOKEN")}
    env.update(PORT=str(port), SIM_URL=f"http://127.0.0.1:{sim_port}", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "app", "dev"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("Ctrl-C to stop" in line for line in list(out)):
            assert proc.poll() is None, "".join(out)
            assert time.monotonic() < deadline, "".join(out)
            time.sleep(0.2)
        text = "".join(out)
        assert "sim       succeeded" in text and "error: provider_failed" in text, text
        for provider in ("replicate", "fal", "kie", "gateway", "gemini", "elevenlabs", "anthropic", "openai"):
            assert f"{provider:<9} succeeded" in text, text
        assert text.count("elevenlabs succeeded") == 2, text  # a dub, and speech (a sync call)
        key = json.loads((tmp_path / ".longcall" / "demo.json").read_text())["api_key"]
        assert key in text  # printed once, for the user's curl line
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {key}"}
        job = httpx.post(f"{base}/v1/jobs", headers=headers, json={
            "provider": "sim", "model": "m", "input": {"duration_s": 0.2}, "max_credits": 5}).json()
        for _ in range(100):
            got = httpx.get(f"{base}/v1/jobs/{job['id']}", headers=headers).json()
            if got["status"] == "succeeded":
                break
            time.sleep(0.1)
        assert got["status"] == "succeeded"
        # The console, signed in with the admin token dev made (and said where it is).
        assert f"{base}/console   (sign in with the admin token in .longcall/admin_token)" in text, text
        admin_token = (tmp_path / ".longcall" / "admin_token").read_text().strip()
        assert oct((tmp_path / ".longcall" / "admin_token").stat().st_mode & 0o777) == "0o600"
        with httpx.Client(base_url=base) as browser:
            form = browser.get("/console/sign-in").text
            csrf = form.split('name="csrf" value="')[1].split('"')[0]
            signed_in = browser.post("/console/sign-in", data={"csrf": csrf, "token": admin_token, "next": "/console"})
            assert signed_in.status_code == 303, signed_in.text
            assert "<h1>Fleet</h1>" in browser.get("/console").text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, "".join(out)
    # The embedded server was stopped with it. (Once, on a loaded machine, the
    # pid file was still there at this point; pg_ctl stop -w should have waited
    # for it. Give it a bounded moment and, if it stays, say everything we know.)
    pg_dir = tmp_path / ".longcall" / "pg"
    deadline = time.monotonic() + 10
    while (pg_dir / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if (pg_dir / "postmaster.pid").exists():
        still = EmbeddedPostgres(pg_dir).running()
        log = (pg_dir / "server.log").read_text()[-3000:] if (pg_dir / "server.log").exists() else ""
        raise AssertionError(f"postmaster.pid left behind (server running: {still})\n"
                             f"--- dev said:\n{''.join(out)}\n--- server.log:\n{log}")
