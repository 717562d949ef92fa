"""clients/testing/serve_longcall.py keeps its promises: it stops everything it
started (SIGTERM here; stdin's EOF is how the session fixture stops its own),
and a child that dies makes it exit non-zero with one line on stderr."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import psutil
import pytest
from client_support import LAUNCHER, launch

GONE_WITHIN_S = 60  # the launcher allows its children 10 s, then kills; the rest is margin


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_gone(pids: list[int]) -> list[int]:
    """The pids still alive after GONE_WITHIN_S (zombies count as gone)."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def started_by(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@pytest.fixture
def launched_here():
    """launch() for one test; its stderr file removed afterwards, the launcher stopped if still running."""
    started = []

    def start(*args: str):
        started.append(launch(*args))
        return started[-1]

    yield start
    for running in started:
        if running.proc.poll() is None:
            running.stop()
        running.discard()


def test_sigterm_stops_everything(launched_here):
    running = launched_here()
    ready = running.ready
    children = started_by(running.proc.pid)
    names = " ".join(" ".join(c.cmdline()) for c in children)
    for command in ("app sim", "app serve", "app settler"):
        assert command in names
    # The embedded cluster runs as its own daemon (pg_ctl): its port says whether it stopped.
    ports = [port_of(ready["base_url"]), port_of(ready["sim_url"]), port_of(ready["database_url"])]
    assert all(listening(p) for p in ports)
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(GONE_WITHIN_S) == 0, running.stderr()
    assert wait_gone([c.pid for c in children]) == []
    assert not any(listening(p) for p in ports)


def test_a_child_that_dies_is_one_line_and_a_non_zero_exit(launched_here):
    running = launched_here()
    children = started_by(running.proc.pid)
    serve = next(c for c in children if "serve" in c.cmdline())
    serve.kill()
    code = running.proc.wait(GONE_WITHIN_S)
    assert code != 0
    lines = running.stderr().strip().splitlines()
    assert len(lines) == 1 and "longcall serve" in lines[0] and "exited" in lines[0], lines
    assert wait_gone([c.pid for c in children]) == []
    assert not listening(port_of(running.ready["database_url"]))


def test_a_child_that_cannot_start_is_one_line_and_a_non_zero_exit():
    # stdin stays open (its EOF would be a request to stop): the child's death alone must end it.
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "--env", "MODELS_FILE=/nonexistent/models.toml"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        code = proc.wait(300)
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout.read(), proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert code != 0 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve_longcall: `longcall "), lines


@pytest.mark.parametrize("args", [["--env", "NO_EQUALS_SIGN"], ["--credits", "many"]])
def test_bad_arguments(args):
    proc = subprocess.run([sys.executable, str(LAUNCHER), *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
