"""What the client's tests share: the launcher of a real longcall, owners
made with `longcall owners create`, the simulated jobs, and `Api` (one test
body for both clients)."""
from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[3]
LAUNCHER = REPO_ROOT / "clients" / "testing" / "serve_longcall.py"
START_TIMEOUT_S = 180  # generous: a loaded 2-core machine starts a cluster and four Python processes
STOP_TIMEOUT_S = 60

# A simulated job that succeeds in about a second, and one that fails.
FAST = {"prompt": "a lighthouse", "duration_s": 0.5}
FAILS = {"prompt": "x", "outcome": "failed", "duration_s": 0.2}
# Long enough to still be running whenever a test looks (cancelled by the test).
SLOW = {"prompt": "a slow one", "duration_s": 600}
POOL_CREDITS, POOL_MAX_ACTIVE = 1000, 10  # what make_owner() without arguments gives
WAIT_S = 120  # a simulated job takes about a second; the rest is margin for a loaded machine


@dataclass(frozen=True)
class Longcall:
    base_url: str
    api_key: str
    owner_id: str
    sim_url: str
    database_url: str
    # A platform owner's (the launcher's --platform): its key manages owners under it.
    platform_api_key: str = ""
    platform_owner_id: str = ""


@dataclass(frozen=True)
class Owner:
    owner_id: str
    api_key: str


class Launched:
    """A running launcher: its ready line, its process, its stderr (in a file)."""

    def __init__(self, proc: subprocess.Popen[bytes], stderr_path: str, ready: dict[str, Any]):
        self.proc = proc
        self.stderr_path = stderr_path
        self.ready = ready

    def stderr(self) -> str:
        return Path(self.stderr_path).read_text(errors="replace")

    def discard(self) -> None:
        """Remove the stderr file (once it has been read)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.stderr_path)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Close its stdin (the documented way to stop it) and wait."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def launch(*args: str) -> Launched:
    """Start the launcher and wait for its JSON line (or fail with its stderr)."""
    fd, stderr_path = tempfile.mkstemp(prefix="serve-longcall-", suffix=".log")
    with os.fdopen(fd, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(LAUNCHER), *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr)
    line: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(START_TIMEOUT_S)
    if not line or not line[0].strip():
        proc.kill()
        proc.wait()
        stderr_text = Path(stderr_path).read_text(errors="replace")
        os.unlink(stderr_path)
        raise RuntimeError(f"the launcher did not get ready: {stderr_text}")
    return Launched(proc, stderr_path, json.loads(line[0]))


def create_owners(database_url: str, count: int, *, credits: int, max_active: int = 10,
                  platform: bool = False) -> list[Owner]:
    """`count` new owners by `longcall owners create` (`--platform` with `platform`), the commands
    run side by side (each is mostly start-up)."""
    env = {**os.environ, "DATABASE_URL": database_url}
    command = [sys.executable, "-m", "app", "owners", "create", "client-test", "--credits", str(credits),
               "--max-active", str(max_active), "--json", *(["--platform"] if platform else [])]
    procs = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(count)]
    owners = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        data = json.loads(stdout)
        owners.append(Owner(data["owner_id"], data["api_key"]))
    return owners


class OwnerPool:
    """Owners with POOL_CREDITS and POOL_MAX_ACTIVE, made a batch at a time: a test
    that only needs an owner to itself takes one."""

    BATCH = 6

    def __init__(self, database_url: str):
        self.database_url = database_url
        self.ready: list[Owner] = []

    def take(self) -> Owner:
        if not self.ready:
            self.ready = create_owners(self.database_url, self.BATCH, credits=POOL_CREDITS, max_active=POOL_MAX_ACTIVE)
        return self.ready.pop()


class Api:
    """One test body for both clients: `await api.jobs.create(...)` awaits the
    AsyncClient's call, or runs the Client's in a worker thread."""

    def __init__(self, target: Any, is_async: bool):
        self._target = target
        self.is_async = is_async

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return Api(attr, self.is_async)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.is_async:
                return await attr(*args, **kwargs)
            return await asyncio.to_thread(attr, *args, **kwargs)
        return call

    async def all_jobs(self, **kwargs: Any) -> list[Any]:
        """Everything `jobs.iterate(**kwargs)` yields."""
        if self.is_async:
            return [job async for job in self._target.jobs.iterate(**kwargs)]
        return await asyncio.to_thread(lambda: list(self._target.jobs.iterate(**kwargs)))

    async def all_owners(self, **kwargs: Any) -> list[Any]:
        """Everything `owners.iterate(**kwargs)` yields."""
        if self.is_async:
            return [owner async for owner in self._target.owners.iterate(**kwargs)]
        return await asyncio.to_thread(lambda: list(self._target.owners.iterate(**kwargs)))

    async def aclose(self) -> None:
        if self.is_async:
            await self._target.close()
        else:
            self._target.close()


# ------------------------------------------------ a loopback server of our own

@dataclass
class Seen:
    """One request the loopback server received."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] | None = None


DROP = "drop"            # close the connection without answering
FORWARD = "forward"      # pass it to the upstream (the real longcall) and answer what it answered
FORWARD_THEN_DROP = "forward-then-drop"  # pass it on, then lose the answer: the server acted, the client never knows


class Loopback:
    """A real HTTP server on 127.0.0.1 in a thread: `decide(seen)` says what to do with each request
    (a Reply, DROP, FORWARD or FORWARD_THEN_DROP). Every request is kept in `seen`."""

    def __init__(self, decide, upstream: str | None = None):
        self.decide = decide
        self.upstream = httpx.Client(base_url=upstream, timeout=60) if upstream else None
        self.seen: list[Seen] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                            self.rfile.read(length) if length else b"")
                outer.seen.append(seen)
                action = outer.decide(seen)
                if action in (FORWARD, FORWARD_THEN_DROP):
                    answer = outer.forward(seen)
                    if action == FORWARD_THEN_DROP:
                        return self._drop()
                    return self._reply(answer)
                if action == DROP:
                    return self._drop()
                return self._reply(action)

            def _drop(self) -> None:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def _reply(self, reply: Reply) -> None:
                self.send_response(reply.status)
                headers = {"content-type": "application/json", **(reply.headers or {})}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_DELETE = _any

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that hangs up first (a test's dropped stream) is expected; anything else is kept.
                error = sys.exc_info()[1]
                if not isinstance(error, ConnectionError):
                    outer.errors.append(error)
                    super().handle_error(request, client_address)

        self.errors: list[BaseException | None] = []
        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval: shutdown() waits for one, and every test's teardown calls it.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def forward(self, seen: Seen) -> Reply:
        assert self.upstream is not None
        keep = {k: v for k, v in seen.headers.items() if k not in ("host", "content-length", "connection")}
        answer = self.upstream.request(seen.method, seen.path, headers=keep, content=seen.body)
        passed = {k: v for k, v in answer.headers.items()
                  if k.lower() in ("content-type", "retry-after", "location", "etag")}
        return Reply(answer.status_code, answer.content, passed)

    def requests_to(self, method: str, path_prefix: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path.startswith(path_prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.upstream is not None:
            self.upstream.close()
