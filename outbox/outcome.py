"""What a step tells the drain loop to do with its intent."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Done:
    """The intent is finished: delete it (unless asked again meanwhile)."""


@dataclass(frozen=True)
class Later:
    """Run the intent again after `delay_s`. `failed` counts toward the
    attempt cap; a normal durable wait ("still running") does not."""

    delay_s: float
    failed: bool
    reason: str = ""


DONE = Done()
Outcome = Done | Later
