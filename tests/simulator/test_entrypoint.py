"""`python -m app.simulator` and the RunningSimulator test helper."""
from __future__ import annotations

import socket
import subprocess
import sys

import httpx

try:  # however the tests directory ends up on sys.path
    from tests.support.simulator import RunningSimulator, clear_faults, reset, set_faults, stats
except ImportError:
    from support.simulator import RunningSimulator, clear_faults, reset, set_faults, stats


def test_running_simulator_serves_and_its_helpers_work():
    with RunningSimulator() as sim:
        url = sim.url
        task = httpx.post(f"{url}/v1/tasks", json={"model": "m", "input": {"duration_s": 0}}, trust_env=False)
        assert task.status_code == 201
        assert stats(url)["tasks_created"] == 1
        assert set_faults(url, submit_error=1)["submit_error"] == 1.0
        assert httpx.post(f"{url}/v1/tasks", json={"model": "m", "input": {}}, trust_env=False).status_code == 500
        assert clear_faults(url)["submit_error"] == 0.0
        assert reset(url)["tasks_created"] == 0
    try:
        httpx.get(f"{url}/_sim/stats", timeout=1, trust_env=False)
        raise AssertionError("the simulator still answers after stop()")
    except httpx.ConnectError:
        pass


def test_bad_arguments_exit_2_with_one_line():
    result = subprocess.run([sys.executable, "-m", "app.simulator", "--port", "http"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["longcall sim: error: argument --port: not a port number: 'http'"]


def test_a_port_in_use_exits_non_zero():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "app.simulator", "--port", str(port)],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1 and "address already in use" in result.stderr
