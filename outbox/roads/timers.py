"""Road 3 to a settle: durable timers.

Every in-flight job carries its next status check as its settle intent's
`not_before` — a row, not a sleeping coroutine, so it survives restarts. With
a webhook registered the timer is the lost-webhook check; without, the
provider's poll schedule. No timer ever runs past the give-up deadline, so
the deadline is a timer too (what happens when it fires is the one give-up
rule, outbox/decide.give_up). The backstop sweep (sweep.py beside this file)
gives a timer to any in-flight job that lost its own.
"""
from __future__ import annotations

from app.providers.base import ProviderFacts


def next_check_delay(facts: ProviderFacts, *, callback_registered: bool, age_s: float,
                     seconds_to_deadline: float) -> float:
    """When to ask the provider again about a running task: with a webhook
    registered, only the lost-webhook check; without, the provider's poll
    schedule. Never past the give-up deadline, so the deadline is a timer
    too."""
    delay = facts.stale_after_s if callback_registered else facts.poll_delay(age_s)
    return max(0.0, min(delay, seconds_to_deadline))


def first_check_delay(facts: ProviderFacts, *, callback_registered: bool,
                      seconds_to_deadline: float = float("inf")) -> float:
    """The first check after submit; like every check, never past the
    give-up deadline."""
    delay = facts.stale_after_s if callback_registered else facts.poll_delay(0)
    return max(0.0, min(delay, seconds_to_deadline))
