"""What a step tells the drain loop to do with its intent."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Done:
    """The intent is finished: delete it (unless asked again meanwhile).
    `deleted`: the step's own statement already deleted it (a close drops
    the job's submit and settle intents, a task save its submit intent),
    so there is nothing left to delete."""

    deleted: bool = False


@dataclass(frozen=True)
class Later:
    """Run the intent again after `delay_s`. `failed` counts toward the
    attempt cap; a normal durable wait ("still running") does not. `error`:
    `reason` is an error an operator should see on the job (its
    `last_error`), counted or not (a provider's outage waited out)."""

    delay_s: float
    failed: bool
    reason: str = ""
    error: bool = False


DONE = Done()
GONE = Done(deleted=True)
Outcome = Done | Later
