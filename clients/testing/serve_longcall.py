"""Start a real longcall for the client libraries' tests, from its public commands only.

    python clients/testing/serve_longcall.py [--credits N] [--max-active N] [--platform] [--env KEY=VALUE ...]
                                             [--logs DIR]

In a fresh temporary directory, on free loopback ports: a PostgreSQL (a fresh
database in TEST_DATABASE_URL's server, else an embedded throwaway cluster),
then `longcall migrate`, `sim`, `serve`, `settler` and `owners create`. Once
/readyz answers 200 it prints ONE JSON line to stdout

    {"base_url", "api_key", "owner_id", "sim_url", "database_url"}

(with --platform also "platform_api_key" and "platform_owner_id": a second
owner, made by `owners create --platform` with the same --credits and
--max-active, whose key manages owners under it; the first stays an ordinary
one) and keeps running until its stdin reaches EOF or it gets SIGTERM/SIGINT;
then it stops everything it started and removes the directory (exit 0; also when
that happens before the line was printed). A child that dies early is one
line on stderr and exit 1; bad arguments exit 2. Children's output goes to
log files (kept under --logs DIR when given, else removed with the rest).
On Linux the children get SIGTERM from the kernel even if the launcher is
killed outright; the embedded cluster (a pg_ctl daemon) does not, so stop
the launcher by EOF or a signal.
"""
from __future__ import annotations

import _thread
import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 120  # a loaded 2-core machine starts four Python processes and a cluster
STOP_GRACE_S = 10


class LauncherError(Exception):
    """One line for stderr; exit 1."""


class Stop(BaseException):
    """SIGTERM, SIGINT or stdin's EOF: unwind to the cleanup. A BaseException so
    no `except Exception` on the way swallows it."""


def _on_signal(signum, frame):
    raise Stop()


def _watch_stdin() -> None:
    """EOF on stdin means whoever started us is gone or done: stop as on SIGTERM."""
    # os.read on the descriptor, not sys.stdin: a daemon thread blocked inside
    # the buffered reader holds its lock, and Python aborts at exit over it.
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    _thread.interrupt_main(signal.SIGTERM)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_prctl():
    # Looked up once here: the function below runs in the forked child, where
    # loading a library could wait on a lock another thread held at fork time.
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


_PRCTL = _load_prctl()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in each child before exec: on Linux the kernel sends it SIGTERM if
    the launcher dies, even by SIGKILL, so no child outlives it."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


class Children:
    """The processes we started, by name, each with its own log file."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, IO[bytes]] = {}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "app", *args]

    def run(self, name: str, *args: str, timeout: float = 300) -> str:
        """A command that finishes: its stdout, or LauncherError naming its last stderr line."""
        done = subprocess.run(self.command(*args), cwd=REPO_ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        (self.log_dir / f"{name}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise LauncherError(f"`longcall {' '.join(args[:2])}` exited with code {done.returncode}: "
                                f"{_last_line(done.stderr)}")
        return done.stdout

    def start(self, name: str, *args: str) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # closed in stop()
        self.logs[name] = log
        # Own session: a Ctrl-C in a terminal reaches the launcher only, which
        # then stops the children in order.
        self.procs[name] = subprocess.Popen(self.command(*args), cwd=REPO_ROOT, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=_die_with_parent)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                text = (self.log_dir / f"{name}.log").read_text(errors="replace")
                raise LauncherError(f"`longcall {name}` exited with code {code}: {_last_line(text)}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs.values():
            log.close()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _get_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _wait_until_ok(url: str, children: Children, deadline: float) -> None:
    while _get_status(url) != 200:
        children.check_alive()
        if time.monotonic() > deadline:
            raise LauncherError(f"{url} did not answer 200 within {READY_TIMEOUT_S} s")
        time.sleep(0.1)


class Database:
    """A fresh database: in TEST_DATABASE_URL's server, or an embedded cluster under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.server_url = os.environ.get("TEST_DATABASE_URL") or ""
        self.name = ""
        self.embedded: Any = None  # an app.embedded.EmbeddedPostgres, imported only when needed
        self.url = ""

    def start(self) -> str:
        if self.server_url:
            self.name = "longcall_client_" + secrets.token_hex(6)
            self._admin(f'create database "{self.name}"')
            self.url = urllib.parse.urlsplit(self.server_url)._replace(path="/" + self.name).geturl()
        else:
            sys.path.insert(0, str(REPO_ROOT))
            from app.embedded import EmbeddedPostgres

            # Kept before start(): a stop signal during start still finds it to destroy.
            self.embedded = EmbeddedPostgres(self.root / "pg", durable=False)
            self.embedded.start()
            self.url = self.embedded.url
        return self.url

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.destroy()
        elif self.name:
            self._admin(f'drop database if exists "{self.name}" with (force)')

    def _admin(self, sql: str) -> None:
        import asyncio

        import asyncpg

        async def run() -> None:
            conn = await asyncpg.connect(self.server_url, timeout=30)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(run())


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Start a real longcall on loopback for client tests.")
    p.add_argument("--credits", type=int, default=1_000_000)
    p.add_argument("--max-active", type=int, default=10)
    p.add_argument("--platform", action="store_true",
                   help="also make a platform owner (platform_api_key, platform_owner_id in the ready line)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra environment variable for every longcall process (repeatable)")
    p.add_argument("--logs", metavar="DIR", default=None, help="keep the processes' logs in DIR")
    args = p.parse_args(argv)
    for pair in args.env:
        if "=" not in pair or not pair.split("=", 1)[0]:
            p.error(f"--env wants KEY=VALUE, got {pair!r}")
    return args


def _environment(root: Path, database_url: str, sim_url: str, extra: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    # An inherited PUBLIC_URL would make the server register webhooks we never receive.
    env.pop("PUBLIC_URL", None)
    env.update({
        "DATABASE_URL": database_url,
        "SECRET_KEY": secrets.token_hex(32),
        "STORAGE_URL": f"file://{root / 'objects'}",
        "SIM_URL": sim_url,
        "SWEEP_INTERVAL_S": "5",
        "READ_RECHECK_AFTER_S": "1",
        "PYTHONUNBUFFERED": "1",
    })
    for pair in extra:
        name, value = pair.split("=", 1)
        env[name] = value
    return env


def serve(args: argparse.Namespace, root: Path, children_out: list[Children], database: Database) -> dict:
    """Everything up to the ready line; `children_out` gets the Children so the
    caller stops them whatever happens."""
    log_dir = Path(args.logs).resolve() if args.logs else root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    (root / "objects").mkdir()
    deadline = time.monotonic() + READY_TIMEOUT_S
    database_url = database.start()
    sim_port, web_port = _free_port(), _free_port()
    sim_url, base_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{web_port}"
    children = Children(_environment(root, database_url, sim_url, args.env), log_dir)
    children_out.append(children)
    children.run("migrate", "migrate")
    children.start("sim", "sim", "--host", "127.0.0.1", "--port", str(sim_port))
    children.start("serve", "serve", "--host", "127.0.0.1", "--port", str(web_port))
    children.start("settler", "settler")
    owner = json.loads(children.run("owners", "owners", "create", "client-tests", "--credits", str(args.credits),
                                    "--max-active", str(args.max_active), "--json"))
    ready = {"base_url": base_url, "api_key": owner["api_key"], "owner_id": owner["owner_id"],
             "sim_url": sim_url, "database_url": database_url}
    if args.platform:
        platform = json.loads(children.run("owners-platform", "owners", "create", "client-tests-platform",
                                           "--platform", "--credits", str(args.credits),
                                           "--max-active", str(args.max_active), "--json"))
        ready.update(platform_api_key=platform["api_key"], platform_owner_id=platform["owner_id"])
    _wait_until_ok(f"{sim_url}/_sim/stats", children, deadline)
    _wait_until_ok(f"{base_url}/readyz", children, deadline)
    return ready


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    root = Path(tempfile.mkdtemp(prefix="longcall-client-"))
    database = Database(root)
    children: list[Children] = []
    code = 0
    try:
        threading.Thread(target=_watch_stdin, daemon=True).start()
        ready = serve(args, root, children, database)
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        while True:
            children[0].check_alive()
            time.sleep(0.2)
    except Stop:
        pass
    except LauncherError as e:
        print(f"serve_longcall: {e}", file=sys.stderr)
        code = 1
    except Exception as e:  # a bug or an unexpected failure: still one line, still a full cleanup
        print(f"serve_longcall: {type(e).__name__}: {_last_line(str(e))}", file=sys.stderr)
        code = 1
    finally:
        # A second signal must not cut the cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for group in children:
            group.stop()
        with contextlib.suppress(Exception):
            database.stop()
        shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
