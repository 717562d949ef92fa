"""Fault rates set through `/_sim/faults`, and the dice that apply them.

Every fault is a rate from 0 to 1 (`delay_webhook_s` a number of seconds)
but `max_concurrent`: a whole number from 1 to MAX_CONCURRENT, or null (no
limit, the default). Above it a create or a sync call of a protocol prefix
is refused with that protocol's documented 429 (app/simulator/engine.py
says what is in flight).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, fields
from typing import Any

MAX_WEBHOOK_DELAY_S = 3600.0
MAX_CONCURRENT = 1_000_000


class FaultError(ValueError):
    """The fault settings are malformed (unknown key, value out of range)."""


@dataclass(frozen=True)
class Faults:
    drop_webhook: float = 0.0
    duplicate_webhook: float = 0.0
    delay_webhook_s: float = 0.0
    submit_error: float = 0.0
    submit_timeout_after_create: float = 0.0
    status_error: float = 0.0
    download_error: float = 0.0
    # A create or a status read answered with the protocol's documented 429
    # (and `retry-after: 1`) instead of the work.
    throttle: float = 0.0
    # A sync call answered with Anthropic's documented 529 overloaded_error
    # (and `retry-after: 1`) instead of the work.
    overloaded: float = 0.0
    # At most this many tasks and sync calls of one protocol prefix in
    # flight at once (None: no limit); above it the protocol's 429.
    max_concurrent: int | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


FAULT_NAMES = tuple(f.name for f in fields(Faults))


def parse_faults(body: Any) -> Faults:
    """Faults from a JSON object. Keys left out are 0: a POST states the whole
    configuration, so what a test sees is exactly what it sent."""
    if not isinstance(body, dict):
        raise FaultError("body must be a JSON object")
    unknown = sorted(set(body) - set(FAULT_NAMES))
    if unknown:
        raise FaultError(f"unknown fault {unknown[0]!r}; known: {', '.join(FAULT_NAMES)}")
    values: dict[str, Any] = {}
    for name, value in body.items():
        if name == "max_concurrent":
            values[name] = _max_concurrent(value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise FaultError(f"{name} must be a number")
        high = MAX_WEBHOOK_DELAY_S if name == "delay_webhook_s" else 1.0
        if value < 0 or value > high:
            raise FaultError(f"{name} must be between 0 and {high:g}")
        values[name] = float(value)
    return Faults(**values)


def _max_concurrent(value: Any) -> int | None:
    if value is None:
        return None
    # 3.0 is 3, as the controls read whole numbers.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENT:
        raise FaultError(f"max_concurrent must be a whole number from 1 to {MAX_CONCURRENT}, or null")
    return value


def roll(rng: random.Random, rate: float) -> bool:
    """True with probability `rate` (exactly never at 0, always at 1)."""
    return rate > 0 and (rate >= 1 or rng.random() < rate)


@dataclass(frozen=True)
class WebhookPlan:
    """What the webhook faults decided for one task, drawn when the task is
    created: clearing the faults later does not change a task already made."""

    drop: bool = False
    duplicate: bool = False
    delay_s: float = 0.0


def draw_webhook_plan(faults: Faults, rng: random.Random) -> WebhookPlan:
    return WebhookPlan(
        drop=roll(rng, faults.drop_webhook),
        duplicate=roll(rng, faults.duplicate_webhook),
        delay_s=faults.delay_webhook_s,
    )
