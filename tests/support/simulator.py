"""The provider simulator as a subprocess, for tests that need one.

    with RunningSimulator() as sim:
        set_faults(sim.url, drop_webhook=1)
        ...
        assert stats(sim.url)["tasks_created"] == 1
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class RunningSimulator:
    """`python -m app.simulator` on a free port; `url` is its base URL."""

    def __init__(self, host: str = "127.0.0.1", startup_timeout: float = 20.0):
        self.host = host
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the simulator is not running")
        return f"http://{self.host}:{self.port}"

    def start(self) -> RunningSimulator:
        if self._proc is not None:
            return self
        # The port is picked, released, then bound by the child: another
        # process may grab it in between, so try a few.
        for _ in range(3):
            if self._spawn(_free_port(self.host)):
                return self
        raise RuntimeError(f"the simulator did not start: {self._log_tail()}")

    def _spawn(self, port: int) -> bool:
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "app.simulator", "--host", self.host, "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.port = port
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/_sim/faults", timeout=1.0, trust_env=False).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self._kill()
        return False

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = self._log.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else "no output"

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.port = None

    def stop(self) -> None:
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> RunningSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _call(method: str, url: str, **kwargs: Any) -> dict:
    response = httpx.request(method, url, timeout=10.0, trust_env=False, **kwargs)
    response.raise_for_status()
    return response.json()


def set_faults(url: str, **rates: float) -> dict:
    """Replace the fault rates (those not named are 0); returns them."""
    return _call("POST", f"{url}/_sim/faults", json=rates)


def clear_faults(url: str) -> dict:
    return _call("DELETE", f"{url}/_sim/faults")


def stats(url: str) -> dict:
    return _call("GET", f"{url}/_sim/stats")


def reset(url: str) -> dict:
    """Forget every task, counter, fault and pending webhook."""
    return _call("POST", f"{url}/_sim/reset")
