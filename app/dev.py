"""`longcall dev` (what `make dev` runs): everything on one machine.

An embedded PostgreSQL under .longcall/ (unless DATABASE_URL is set), the
migrations, the provider simulator, the web server and a settler; then a demo
owner and a small batch of demo jobs with a progress display; then it keeps
serving until Ctrl-C. Every provider with no key of its own is pointed at
the simulator's emulation of its wire protocol (its prefix under SIM_URL).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.config import load_settings
from app.origins import host_port
from app.vocabulary import TERMINAL, ProviderName

STATE_DIR = Path(".longcall")
# Where `dev` starts the simulator unless SIM_URL says otherwise. Only `dev`
# has a simulator by default: elsewhere SIM_URL unset means no provider `sim`.
DEV_SIM_URL = "http://127.0.0.1:8787"
DEMO_JOBS = [
    {"provider": ProviderName.SIM, "model": "image-fast", "input": {"prompt": "a lighthouse", "duration_s": 1.0}},
    {"provider": ProviderName.SIM, "model": "video-slow",
     "input": {"prompt": "waves", "duration_s": 3.0, "outputs": 2, "output_bytes": 200_000, "cost": 4}},
    {"provider": ProviderName.SIM, "model": "image-fast", "input": {"prompt": "will fail", "outcome": "failed"}},
    {"provider": ProviderName.REPLICATE, "model": "black-forest-labs/flux-schnell",
     "input": {"prompt": "a fox", "duration_s": 1.5}},
    {"provider": ProviderName.FAL, "model": "fal-ai/flux/dev", "input": {"prompt": "a heron", "duration_s": 1.5}},
    {"provider": ProviderName.KIE, "model": "veo3_fast", "input": {"prompt": "rain", "duration_s": 2.0}},
    {"provider": ProviderName.KIE, "model": "flux-kontext/flux-kontext-pro",
     "input": {"prompt": "a red door", "duration_s": 1.5}},
    {"provider": ProviderName.REPLICATE, "model": f"train:acme/trainer:{'0' * 64}",
     "input": {"destination": "demo/fine-tuned", "steps": 100, "duration_s": 2.0}},
    {"provider": ProviderName.GATEWAY, "model": "klingai/kling-v3.0-t2v",
     "input": {"prompt": "a paper boat", "duration": 5, "duration_s": 2.0}},
    {"provider": ProviderName.GEMINI, "model": "veo-3.1-generate-preview",
     "input": {"instances": [{"prompt": "tide pools"}], "parameters": {"duration_s": 2.0}}},
    {"provider": ProviderName.ELEVENLABS, "model": "dubbing",
     "input": {"source_url": "https://media.example.com/talk.mp4", "target_lang": "es", "duration_s": 2.0}},
    # Sync calls: the answer is the result (an LLM message, speech).
    {"provider": ProviderName.ANTHROPIC, "model": "claude-sonnet-4-5",
     "input": {"max_tokens": 128, "stream": True, "metadata": {"duration_s": 1.5},
               "messages": [{"role": "user", "content": "A haiku about calls that are never paid twice."}]}},
    {"provider": ProviderName.OPENAI, "model": "gpt-4o-mini",
     "input": {"messages": [{"role": "user", "content": "Say hello."}], "metadata": {"duration_s": "1"}}},
    {"provider": ProviderName.ELEVENLABS, "model": "text-to-speech/JBFqnCBsd6RMkjVDRZzb",
     "input": {"text": "Hello from longcall.", "model_id": "eleven_multilingual_v2", "duration_s": 1.0,
               "output_duration_s": 2.0}},
]


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def _say(line: str) -> None:
    print(line, flush=True)


def _prepare_environment():
    """Fill in what a local run may lack, in os.environ so that every
    process started from here sees the same settings."""
    STATE_DIR.mkdir(exist_ok=True)
    pg = None
    # SECRET_KEY, and ADMIN_TOKEN for the console and the admin routes: made
    # up once for this machine, kept in files only its user can read.
    for name, file_name, nbytes in (("SECRET_KEY", "secret_key", 32), ("ADMIN_TOKEN", "admin_token", 24)):
        if not os.environ.get(name):
            os.environ[name] = _local_secret(STATE_DIR / file_name, nbytes)
    if not os.environ.get("DATABASE_URL"):
        from app.embedded import EmbeddedPostgres

        _say("starting the embedded PostgreSQL (data in .longcall/pg) ...")
        pg = EmbeddedPostgres(STATE_DIR / "pg").start()
        os.environ["DATABASE_URL"] = pg.url
    os.environ.setdefault("STORAGE_URL", "file://" + str((STATE_DIR / "objects").resolve()))
    sim_url = (os.environ.get("SIM_URL") or DEV_SIM_URL).rstrip("/")
    os.environ["SIM_URL"] = sim_url
    for provider, key_var, base_var, path in (
            (ProviderName.REPLICATE, "REPLICATE_API_TOKEN", "REPLICATE_BASE_URL", "/replicate"),
            (ProviderName.FAL, "FAL_KEY", "FAL_BASE_URL", "/fal"),
            (ProviderName.KIE, "KIE_API_KEY", "KIE_BASE_URL", "/kie"),
            (ProviderName.GATEWAY, "AI_GATEWAY_API_KEY", "AI_GATEWAY_BASE_URL", "/gateway/v4/ai"),
            (ProviderName.GEMINI, "GEMINI_API_KEY", "GEMINI_BASE_URL", "/gemini"),
            (ProviderName.ELEVENLABS, "ELEVENLABS_API_KEY", "ELEVENLABS_BASE_URL", "/elevenlabs"),
            (ProviderName.ANTHROPIC, "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "/anthropic"),
            (ProviderName.OPENAI, "OPENAI_API_KEY", "OPENAI_BASE_URL", "/openai/v1")):
        if not os.environ.get(key_var):
            os.environ[key_var] = "simulated"
            os.environ[base_var] = sim_url + path
            if provider == ProviderName.FAL:
                os.environ["FAL_JWKS_URL"] = f"{sim_url}/fal/.well-known/jwks.json"
    return pg


def _local_secret(path: Path, nbytes: int) -> str:
    if not path.exists():
        path.touch(mode=0o600)  # made unreadable to others before the secret is in it
        path.write_text(secrets.token_urlsafe(nbytes))
    return path.read_text().strip()


def _admin_token_hint() -> str:
    token_file = STATE_DIR / "admin_token"
    made_here = token_file.exists() and token_file.read_text().strip() == os.environ.get("ADMIN_TOKEN")
    return "the admin token in .longcall/admin_token" if made_here else "your ADMIN_TOKEN"


def _start_simulator(sim_url: str) -> subprocess.Popen | None:
    host, port = host_port(sim_url)
    if _port_open(host, port):
        _say(f"using the simulator already running at {sim_url}")
        return None
    proc = subprocess.Popen([sys.executable, "-m", "app.simulator", "--host", host, "--port", str(port)],
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not _port_open(host, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"longcall: the simulator did not start on {sim_url}")
        time.sleep(0.05)
    return proc


async def _demo_owner(settings) -> tuple[str, str]:
    from app import db
    from app.domain import owners

    saved = STATE_DIR / "demo.json"
    conn = await db.connect(settings.database_url, role="dev")
    try:
        if saved.exists():
            demo = json.loads(saved.read_text())
            caller = await owners.authenticate(conn, demo["api_key"])
            if caller is not None and caller.owner_id == demo["owner_id"]:
                await owners.grant(conn, demo["owner_id"], 100)
                return demo["owner_id"], demo["api_key"]
        new = await owners.create_owner(conn, "demo", credits=1000, max_active=20)
    finally:
        await conn.close()
    saved.write_text(json.dumps({"owner_id": new.owner_id, "api_key": new.api_key}))
    saved.chmod(0o600)
    return new.owner_id, new.api_key


async def _run_demo(base_url: str, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as client:
        ids = []
        for spec in DEMO_JOBS:
            r = await client.post("/v1/jobs", json={**spec, "max_credits": 10})
            r.raise_for_status()
            ids.append((spec["provider"], r.json()["id"]))
        _say(f"submitted {len(ids)} demo jobs (every provider, through the simulator):")
        last = None
        deadline = time.monotonic() + 90
        while True:
            jobs = [(await client.get(f"/v1/jobs/{job_id}")).json() for _, job_id in ids]
            line = "  " + "  ".join(f"{p}:{j['status']}" for (p, _), j in zip(ids, jobs, strict=True))
            if line != last:
                _say(line)
                last = line
            if all(j["status"] in TERMINAL for j in jobs) \
                    or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        metrics = (await client.get("/metrics")).text
        accepted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                       if line.startswith("longcall_webhook_requests_total{") and 'result="accepted"' in line)
        _say(f"  signed webhooks accepted: {accepted:.0f}"
             + ("" if accepted else " (no PUBLIC_URL: the settler's timers and these reads closed the jobs)"))
        for j in jobs:
            outs = ", ".join(f"{o['url']} ({o['bytes']} bytes)" for o in j["outputs"]) or "-"
            err = f"  error: {j['error']['code']}" if j["error"] else ""
            _say(f"  {j['id']} {j['provider']:<9} {j['status']:<9} charged {j['credits']['charged']}"
                 f"  outputs: {outs}{err}")


async def _serve(settings, port: int) -> None:
    import uvicorn

    from app.embedded_server import EmbeddedServer  # Ctrl-C is handled below
    from app.web import create_app
    from app.web import server as web_server
    from outbox.context import Context
    from outbox.settler import Settler

    app = create_app(settings)
    server = EmbeddedServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on",
                                           http=web_server.protocol_with_header_timeout(
                                               web_server.DEFAULT_HEADER_TIMEOUT_S),
                                           limit_concurrency=web_server.DEFAULT_LIMIT_CONCURRENCY))
    web_task = asyncio.create_task(server.serve())
    ctx = await Context.open(settings)
    settler = Settler(ctx, concurrency=16)
    settler_task = asyncio.create_task(settler.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not server.started:
        if web_task.done():
            web_task.result()
            raise SystemExit(f"longcall: the web server could not start on port {port}")
        await asyncio.sleep(0.05)
    base_url = f"http://127.0.0.1:{port}"
    owner_id, api_key = await _demo_owner(settings)
    demo = asyncio.create_task(_run_demo(base_url, api_key))
    await asyncio.wait([demo, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if demo.done() and demo.exception() is None:
        webhooks = (f"webhooks go to {settings.public_url}" if settings.public_url else
                    f"no PUBLIC_URL: jobs close through reads and timers (try PUBLIC_URL={base_url} make dev)")
        _say(f"""
longcall is running at {base_url}   ({webhooks})
demo owner {owner_id}, API key: {api_key}
the operator's console: {base_url}/console   (sign in with {_admin_token_hint()})

  curl -s -X POST {base_url}/v1/jobs -H 'Authorization: Bearer {api_key}' \\
       -H 'Content-Type: application/json' \\
       -d '{{"provider": "sim", "model": "image-fast", "input": {{"duration_s": 2}}, "max_credits": 10}}'

Ctrl-C to stop.""")
    elif demo.done():
        _say(f"longcall: the demo failed: {type(demo.exception()).__name__}: {demo.exception()}")
    await stop.wait()
    demo.cancel()
    settler.stop()
    await settler_task
    await ctx.close()
    server.should_exit = True
    await web_task


def run_dev() -> int:
    pg = _prepare_environment()
    try:
        return _run(load_settings(dev=True))
    finally:
        if pg is not None:
            pg.stop()


def _run(settings) -> int:
    from app.logs import configure_logging
    from app.migrate import migrate
    from app.web import server as web_server

    configure_logging("WARNING")
    problem = web_server.listen_problem("127.0.0.1", settings.port)
    if problem:
        raise SystemExit(f"longcall: the web server {problem}")
    applied = asyncio.run(migrate(settings.database_url))
    if applied:
        _say(f"applied {len(applied)} migration(s)")
    assert settings.sim_url, "_prepare_environment sets SIM_URL"
    sim = _start_simulator(settings.sim_url)
    try:
        asyncio.run(_serve(settings, settings.port))
    finally:
        if sim is not None:
            sim.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sim.wait(5)
    return 0
