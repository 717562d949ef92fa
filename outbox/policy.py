"""Pure decisions of the settler: backoff and attempt caps (when to look
again at a running task is in outbox/roads/timers.py; what each step does
with what the provider said is in outbox/decide.py).
No I/O here; tests call these directly."""
from __future__ import annotations

import random

from app.vocabulary import IntentKind

# Consecutive failed attempts (errors, not normal "ask later" waits) before
# an intent gives up: the job then fails with a refund (settle_exhausted).
# A notify intent counts only errors of our own (an endpoint's failures are
# its delivery's schedule, outbox/notify.py): exhausted, the delivery fails.
MAX_ATTEMPTS = {IntentKind.SUBMIT: 8, IntentKind.SETTLE: 10, IntentKind.CANCEL: 5, IntentKind.NOTIFY: 10}
NOT_YET_SUBMITTED_RETRY_S = 2.0  # settle asked before the task id is saved
# A provider's Retry-After is waited out without counting a failed attempt
# (outbox/decide.transient), so a hint below this (a fraction of a second)
# would have us ask it again and again: the floor of such a wait.
MIN_ASKED_WAIT_S = 1.0
# A status read the provider did not answer is asked again at most this far
# apart (outbox/decide.after_read_error), counting no failed attempt.
OUTAGE_WAIT_MAX_S = 300.0
HOST_BUSY_RETRY_S = 5.0  # an output's host had no download place free: look again (no failure)
IN_DOUBT_FIND_ATTEMPTS = 3
# A sync call's answer lives only in its worker's file: storing it is tried
# this often (with backoff) before the answer is given up as lost.
SYNC_STORE_ATTEMPTS = 5  # look an in-doubt submit up this often before `uncertain`


def backoff(attempt: int, *, base_s: float = 1.0, cap_s: float = 300.0,
            rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: attempt 1 waits ~base, each next one
    twice as long, capped; the delay is drawn from [half, full] so many
    retries started together spread out."""
    attempt = max(1, attempt)
    full = min(cap_s, base_s * (2 ** min(attempt - 1, 30)))
    return full * (0.5 + 0.5 * (rng or random).random())


def exhausted(kind: IntentKind, attempts: int) -> bool:
    return attempts > MAX_ATTEMPTS[kind]


# Claimed intents may wait in a settler for a free slot (a claim is a round
# trip and a commit: fewer, larger claims drain short steps faster) only
# while its steps are short. A long step (a provider call of seconds) would
# hold the waiting ones from another settler that could start them now.
# At 15 per slot (a claim of 256 at the default 16 slots) a drain of 20,000
# no-op intents went 20.5-26.3k -> 30.5-33.8k intents/s against 7 per slot
# (README, the drain row); the last waiting one starts within 15 steps (0.75 s).
SHORT_STEP_S = 0.05
WAITING_PER_SLOT = 15


def waiting_room(concurrency: int, mean_step_s: float | None) -> int:
    """How many claimed intents may wait for a slot, given the settler's
    recent mean step time (None: no step has finished yet)."""
    if mean_step_s is None or mean_step_s > SHORT_STEP_S:
        return 0
    return WAITING_PER_SLOT * concurrency


def claim_again(asked: int, got: int, asked_notify: int, got_notify: int) -> bool:
    """Whether a drain claims again at once: a batch of either kind came
    back full, so more may be due. It claims while the batch just claimed
    runs; waiting instead for a quarter of the slots to free up left the
    settler idle during every claim (a drain of 20,000 no-op intents: 13.4–14.1k
    intents/s waiting, 15.6–17.0k claiming again; README, the drain row)."""
    return 0 < asked == got or 0 < asked_notify == got_notify


def mean_step_s(mean: float | None, took_s: float) -> float:
    """The recent mean step time, an exponential moving average over about
    the last twenty steps."""
    return took_s if mean is None else 0.9 * mean + 0.1 * took_s
