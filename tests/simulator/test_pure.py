"""The simulator's pure parts: controls, faults, a task's clock, output bytes."""
from __future__ import annotations

import hashlib
import random

import pytest

from app.simulator import output_bytes_iter, output_sha256
from app.simulator.controls import ControlError, Controls, parse_controls
from app.simulator.faults import FaultError, Faults, draw_webhook_plan, parse_faults, roll
from app.simulator.outputs import _base_block
from app.simulator.state import Phase, Task
from app.simulator.wire import sleep_until


def test_controls_default_when_absent_and_other_input_keys_are_ignored():
    assert parse_controls({"prompt": "a cat", "seed": 3}) == Controls()
    assert Controls() == Controls(1.0, "succeeded", 1024, 1, 1, 3600.0, "image/png")


def test_controls_are_read_and_whole_floats_accepted():
    controls = parse_controls({
        "duration_s": 2, "outcome": "failed", "output_bytes": 5.0, "outputs": 3, "cost": 9,
        "output_ttl_s": 0.5, "content_type": "Video/MP4",
    })
    assert controls == Controls(2.0, "failed", 5, 3, 9, 0.5, "video/mp4")
    assert parse_controls({"output_bytes": 5 * 1024**3}).output_bytes == 5 * 1024**3


@pytest.mark.parametrize("field, value", [
    ("duration_s", None), ("duration_s", "1"), ("duration_s", -0.1), ("duration_s", float("inf")),
    ("duration_s", 10**9), ("outcome", "ok"), ("outcome", None), ("output_bytes", True),
    ("output_bytes", 2.5), ("output_bytes", 65 * 1024**3), ("outputs", -1), ("outputs", 101),
    ("cost", -1), ("cost", "5"), ("output_ttl_s", 0), ("output_ttl_s", -5), ("content_type", ""),
    ("content_type", "image"), ("content_type", "image/png; x"), ("content_type", 5),
])
def test_bad_controls_name_the_field(field, value):
    with pytest.raises(ControlError) as caught:
        parse_controls({field: value})
    assert caught.value.field == field
    assert f"input.{field}" in str(caught.value)


def test_faults_are_validated_and_missing_ones_are_zero():
    faults = parse_faults({"drop_webhook": 1, "delay_webhook_s": 2.5})
    assert faults == Faults(drop_webhook=1.0, delay_webhook_s=2.5)
    assert parse_faults({}) == Faults()
    for bad in ({"drop_webhooks": 1}, {"submit_error": 1.1}, {"status_error": -0.1},
                {"download_error": True}, {"delay_webhook_s": -1}, {"delay_webhook_s": "1"}, [1]):
        with pytest.raises(FaultError):
            parse_faults(bad)


def test_roll_is_exact_at_zero_and_one_and_random_between():
    rng = random.Random(7)
    assert not any(roll(rng, 0.0) for _ in range(1000))
    assert all(roll(rng, 1.0) for _ in range(1000))
    hits = sum(roll(rng, 0.3) for _ in range(10_000))
    assert 2500 < hits < 3500
    plan = draw_webhook_plan(Faults(drop_webhook=1, duplicate_webhook=0, delay_webhook_s=3), rng)
    assert plan.drop and not plan.duplicate and plan.delay_s == 3


def _task(duration: float, outcome: str = "succeeded") -> Task:
    return Task(id="t", protocol="sim", model="m", input={}, controls=Controls(duration_s=duration, outcome=outcome),
                created_at=1000.0, base_url="http://sim", seq=1)


def test_phase_comes_from_the_clock():
    task = _task(10.0)
    assert task.phase(1000.0) is Phase.QUEUED
    assert task.phase(1000.99) is Phase.QUEUED
    assert task.phase(1001.0) is Phase.RUNNING
    assert task.phase(1009.99) is Phase.RUNNING
    assert task.phase(1010.0) is Phase.SUCCEEDED
    assert _task(10.0, "failed").phase(1010.0) is Phase.FAILED
    assert _task(0.0).phase(1000.0) is Phase.SUCCEEDED


def test_cancel_only_before_the_end():
    task = _task(10.0)
    assert task.cancel(1005.0)
    assert task.phase(1005.0) is Phase.CANCELLED and task.phase(2000.0) is Phase.CANCELLED
    assert task.finished_at == 1005.0
    done = _task(10.0)
    assert not done.cancel(1010.0)
    assert done.phase(1010.0) is Phase.SUCCEEDED


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 65_537, 1024 * 1024, 1024 * 1024 + 3, 3 * 1024 * 1024 + 1])
def test_output_bytes_have_the_exact_size_and_sha256(size):
    data = b"".join(output_bytes_iter("sim_abc", 0, size))
    assert len(data) == size
    assert output_sha256("sim_abc", 0, size) == hashlib.sha256(data).hexdigest()
    assert all(len(chunk) <= 1024 * 1024 for chunk in output_bytes_iter("sim_abc", 0, size))


def test_output_bytes_are_deterministic_distinct_and_non_repeating():
    size = 300_000
    a = b"".join(output_bytes_iter("sim_abc", 0, size))
    assert a == b"".join(output_bytes_iter("sim_abc", 0, size))
    assert a != b"".join(output_bytes_iter("sim_abc", 1, size))
    assert a != b"".join(output_bytes_iter("sim_abd", 0, size))
    assert a[:1000] == b"".join(output_bytes_iter("sim_abc", 0, 1000))  # a shorter file is a prefix
    assert a[:65536] != a[65536:131072]  # blocks differ


def test_output_bytes_hash_once_per_output_and_come_in_mib_chunks():
    # What keeps a 1 GiB output cheap to serve (its speed is `longcall bench`'s
    # to measure, not a unit test's): one hash per output, not per block, and
    # few large chunks for the socket.
    size = 64 * 1024 * 1024 + 5
    misses = _base_block.cache_info().misses
    chunks = [len(chunk) for chunk in output_bytes_iter("sim_once", 0, size)]
    assert _base_block.cache_info().misses == misses + 1
    assert chunks == [1024 * 1024] * 64 + [5]


async def test_sleep_until_sleeps_again_when_a_timer_fires_before_the_deadline():
    # A clock that reads just short of the deadline after the first sleep (an
    # early timer), then past it: two sleeps, and it returns only then.
    readings = iter([0.0, 0.0019, 0.002, 0.002])
    reads: list[float] = []

    def clock() -> float:
        reads.append(next(readings))
        return reads[-1]

    await sleep_until(0.002, clock)
    assert reads == [0.0, 0.0019, 0.002]
