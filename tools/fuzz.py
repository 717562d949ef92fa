"""`make fuzz`: schemathesis over /openapi.json, against a throwaway setup.

Starts an embedded PostgreSQL (migrated), `longcall serve` (the real
command, with its header deadline and concurrency limit), an owner with a
key and credits and ADMIN_TOKEN set, and seeds a job with stored outputs
(HTML, SVG, PNG, text) and an `uncertain` job, which the output and admin
routes are pointed at (schemathesis.toml in the work directory); then runs
`schemathesis run` three times, each bounded in examples and in time: with the owner's key, with an
invalid key, and with the admin token. Checks: no 5xx (`not_a_server_error`)
and that every answer conforms to the document (status code, content type,
headers, body schema), plus the 405/Allow checks. Prints one summary line
per run and the server's logged errors; exits 1 if anything failed.

    .venv/bin/python tools/fuzz.py [--max-examples N] [--max-seconds S] [--keep]

Needs the `fuzz` extra (`pip install -e '.[fuzz]'`). Not part of `make test`.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.domain import owners  # noqa: E402
from app.embedded import EmbeddedPostgres, free_port  # noqa: E402
from app.migrate import migrate  # noqa: E402

ADMIN_TOKEN = "fuzz-admin-token-0123456789"
CHECKS = ",".join([
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "unsupported_method",
    "allow_header_conformance",
    "negative_data_rejection",
])
BIN = Path(sys.executable).parent
HOOKS = Path(__file__).resolve().parent / "fuzz_hooks.py"  # valid `?wait=` cut to 1 s


OUTPUTS = [("text/html", b"<html><script>alert(1)</script></html>"),
           ("image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'),
           ("image/png", b"\x89PNG\r\n\x1a\n"),
           ("text/plain; charset=utf-8", b"hello")]
JOB = {"provider": "sim", "model": "fuzz", "input": {"prompt": "seed"}, "max_credits": 10}


async def make_owner(database_url: str) -> tuple[str, str]:
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        new = await owners.create_owner(conn, "fuzz", 10**9, 10_000)
    finally:
        await conn.close()
    return new.owner_id, new.api_key


async def seed_jobs(database_url: str, url: str, api_key: str, owner_id: str, objects: Path) -> tuple[str, str]:
    """(a job with stored outputs, an uncertain job), made through the API
    and then given what a settler would have given them."""
    import asyncpg

    from app.storage import object_key

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"}) as c:
        with_outputs = (await c.post("/v1/jobs", json=JOB)).json()["id"]
        uncertain = (await c.post("/v1/jobs", json=JOB)).json()["id"]
    conn = await asyncpg.connect(database_url)
    try:
        for index, (content_type, data) in enumerate(OUTPUTS):
            key = object_key(owner_id, with_outputs, index)
            (objects / key).parent.mkdir(parents=True, exist_ok=True)
            (objects / key).write_bytes(data)
            await conn.execute("insert into assets (job_id, index, storage_key, bytes, sha256, content_type)"
                               " values ($1, $2, $3, $4, $5, $6)", with_outputs, index, key, len(data),
                               hashlib.sha256(data).hexdigest(), content_type)
        await conn.execute("update jobs set status = 'uncertain' where id = $1", uncertain)
    finally:
        await conn.close()
    return with_outputs, uncertain


def write_config(work: Path, with_outputs: str, uncertain: str) -> Path:
    """Point the routes that need an existing job at the seeded ones (their
    other parameters are still generated)."""
    path = work / "schemathesis.toml"
    path.write_text(f"""
[[operations]]
include-path = "/v1/jobs/{{job_id}}/outputs/{{index}}"
parameters = {{ "path.job_id" = "{with_outputs}" }}

[[operations]]
include-path = "/v1/admin/jobs/{{job_id}}/resolve"
parameters = {{ "path.job_id" = "{uncertain}" }}
""")
    return path


def start_server(env: dict, port: int, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "wb")  # noqa: SIM115 (kept open for the server's life)
    # `python -m app` from the checkout: the code under test is this tree's.
    return subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_until_up(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("fuzz: longcall serve exited at start (see its log)")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("fuzz: longcall serve did not come up in 60 s")


def run_schemathesis(name: str, url: str, authorization: str, args, report_dir: Path, config: Path) -> dict:
    report = report_dir / f"{name}.json"
    command = [str(BIN / "schemathesis"), "--config-file", str(config), "run", f"{url}/openapi.json",
               "--checks", CHECKS, "--max-examples", str(args.max_examples), "--workers", "1",
               "--header", f"Authorization: {authorization}", "--generation-database", "none",
               "--request-timeout", "40", "--no-color", "--seed", str(args.seed),
               "--report", "json", "--report-json-path", str(report)]
    started = time.monotonic()
    try:
        completed = subprocess.run(command, cwd=report_dir, capture_output=True, text=True,
                                   timeout=args.max_seconds, env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})
        output, code, timed_out = completed.stdout + completed.stderr, completed.returncode, False
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, timed_out = None, True
    (report_dir / f"{name}.log").write_text(output)
    return {"name": name, "exit": code, "timed_out": timed_out, "seconds": round(time.monotonic() - started),
            "report": _read_report(report), "output": output}


def _read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary_line(run: dict) -> str:
    state = "TIMED OUT" if run["timed_out"] else ("ok" if run["exit"] == 0 else f"exit {run['exit']}")
    report = run["report"]
    if report is None:
        return f"{run['name']:<12} {state:<9} {run['seconds']:>4} s  (no report)"
    cases, ops = report["test_cases"], report["operations"]
    return (f"{run['name']:<12} {state:<9} {run['seconds']:>4} s  {ops['tested']}/{ops['total']} operations, "
            f"{cases['generated']} test cases, {cases['with_failures']} with failures "
            f"({cases['unique_failures']} unique), {cases['errored']} errored, {len(report['errors'])} errors")


def _record(line: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError:
        return {"level": "error"}  # not one of our JSON log lines: a crash printed raw
    return record if isinstance(record, dict) else {}


def _level(line: str) -> str | None:
    return str(_record(line).get("level", "")).lower() if line.strip() else None


def _access_status(line: str) -> str | None:
    record = _record(line)
    return str(record["status"]) if record.get("logger") == "longcall.access" and "status" in record else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/fuzz.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-examples", type=int, default=100, help="per operation and run (default 100)")
    p.add_argument("--max-seconds", type=int, default=300, help="time bound of each run (default 300)")
    p.add_argument("--seed", type=int, default=1, help="schemathesis seed (default 1: reproducible)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, reports)")
    args = p.parse_args(argv)
    if not (BIN / "schemathesis").exists():
        print("fuzz: schemathesis is not installed: pip install -e '.[fuzz]'", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="longcall-fuzz-"))
    pg = EmbeddedPostgres(work / "pg", durable=False).start()
    server = None
    try:
        asyncio.run(migrate(pg.url))
        owner_id, api_key = asyncio.run(make_owner(pg.url))
        (work / "objects").mkdir()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "DATABASE_URL": pg.url, "SECRET_KEY": "fuzz-secret-key-0123456789abcdef",
               "STORAGE_URL": f"file://{work / 'objects'}", "ADMIN_TOKEN": ADMIN_TOKEN,
               "LOG_LEVEL": "INFO",  # with the access log: one line a request
               # provider `sim` exists only with SIM_URL; the web tier never calls it
               "SIM_URL": f"http://127.0.0.1:{free_port()}"}
        server = start_server(env, port, work / "server.log")
        wait_until_up(server, url)
        with_outputs, uncertain = asyncio.run(seed_jobs(pg.url, url, api_key, owner_id, work / "objects"))
        config = write_config(work, with_outputs, uncertain)
        print(f"fuzz: {url} (owner {owner_id}), {args.max_examples} examples per operation, "
              f"at most {args.max_seconds} s per run; work in {work}")
        runs = [run_schemathesis(name, url, authorization, args, work, config) for name, authorization in (
            ("valid-key", f"Bearer {api_key}"),
            ("invalid-key", "Bearer lc_not-a-real-key-000000000000000000"),
            ("admin-token", f"Bearer {ADMIN_TOKEN}"),
        )]
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
        pg.destroy()

    server_log = (work / "server.log").read_text(errors="replace")
    tracebacks = server_log.count("Traceback")
    errors = sum(1 for line in server_log.splitlines() if _level(line) in ("error", "critical"))
    statuses: dict[str, int] = {}
    for line in server_log.splitlines():
        status = _access_status(line)
        if status is not None:
            statuses[status] = statuses.get(status, 0) + 1
    print("\nfuzz summary")
    for run in runs:
        print("  " + summary_line(run))
    print(f"  server log: {sum(statuses.values())} requests answered "
          f"({', '.join(f'{n} x {s}' for s, n in sorted(statuses.items()))}), "
          f"{tracebacks} tracebacks, {errors} error lines")
    failed = [r for r in runs if r["exit"] != 0 or r["timed_out"]]
    for run in failed:
        print(f"\n---- {run['name']} (last lines; full log {work / (run['name'] + '.log')})")
        print("\n".join(run["output"].splitlines()[-60:]))
    if tracebacks or errors:
        problems = [line for line in server_log.splitlines() if _level(line) in ("error", "critical")]
        print("\n---- server errors\n" + "\n".join(problems[-40:]))
    if not (failed or tracebacks or errors or args.keep):
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed or tracebacks or errors else 0


if __name__ == "__main__":
    sys.exit(main())
