"""The settler's pure decisions."""
from __future__ import annotations

import random

import pytest

from app.providers.base import ProviderFacts
from outbox import policy
from outbox.roads import timers

FACTS = ProviderFacts(name="p", webhook_scheme="t/v1", idempotent_submit=True, can_find=False,
                      stale_after_s=30.0, poll_delays_s=(2.0, 3.0, 5.0, 10.0))


@pytest.mark.parametrize("age,delay", [(0, 2), (1.9, 2), (2, 3), (4.9, 3), (5, 5), (9.9, 5), (10, 10),
                                       (19.9, 10), (20, 10), (3600, 10)])
def test_poll_schedule_follows_the_tasks_age(age, delay):
    assert FACTS.poll_delay(age) == delay


def test_next_check_with_and_without_a_webhook_and_never_past_the_deadline():
    assert timers.next_check_delay(FACTS, callback_registered=False, age_s=0, seconds_to_deadline=100) == 2
    assert timers.next_check_delay(FACTS, callback_registered=True, age_s=0, seconds_to_deadline=100) == 30
    assert timers.next_check_delay(FACTS, callback_registered=True, age_s=0, seconds_to_deadline=7) == 7
    assert timers.next_check_delay(FACTS, callback_registered=False, age_s=50, seconds_to_deadline=-5) == 0
    assert timers.first_check_delay(FACTS, callback_registered=True, seconds_to_deadline=3) == 3


def test_backoff_doubles_with_jitter_and_is_capped():
    rng = random.Random(7)
    for attempt in range(1, 15):
        full = min(300.0, 2 ** (attempt - 1))
        for _ in range(20):
            assert full / 2 <= policy.backoff(attempt, rng=rng) <= full
    assert policy.backoff(0) <= 1.0  # nonsense attempts are treated as the first


def test_attempt_caps():
    assert not policy.exhausted("settle", policy.MAX_ATTEMPTS["settle"])
    assert policy.exhausted("settle", policy.MAX_ATTEMPTS["settle"] + 1)
    assert policy.exhausted("cancel", policy.MAX_ATTEMPTS["cancel"] + 1)


@pytest.mark.parametrize(("concurrency", "mean", "room"), [
    (16, None, 0),        # nothing finished yet: claim only what can start
    (16, 0.001, 240),     # no-op steps: a batch of 16 x the slots
    (16, 0.05, 240),      # at the limit
    (16, 0.051, 0),       # longer steps: nothing waits (another settler may start them now)
    (16, 30.0, 0),        # a provider call
    (1, 0.01, 15),
])
def test_waiting_room(concurrency, mean, room):
    assert policy.waiting_room(concurrency, mean) == room


def test_mean_step_follows_the_recent_steps():
    assert policy.mean_step_s(None, 2.0) == 2.0
    mean = 2.0
    for _ in range(60):
        mean = policy.mean_step_s(mean, 0.001)
    assert mean < policy.SHORT_STEP_S  # a settler whose steps became short gets its waiting room
    assert policy.mean_step_s(0.01, 0.02) == pytest.approx(0.011)


@pytest.mark.parametrize(("asked", "got", "asked_notify", "got_notify", "again"), [
    (112, 112, 4, 0, True),  # a full batch of work, no deliveries due: more work may be due
    (112, 40, 4, 0, False),  # fewer than asked: nothing more is due now
    (112, 40, 4, 4, True),  # the deliveries' batch came back full
    (0, 0, 4, 0, False),  # no room for work, no delivery due: never a loop of empty claims
    (0, 0, 4, 4, True),
    (16, 16, 0, 0, True),
    (0, 0, 0, 0, False),
])
def test_claim_again_after_a_full_batch_of_either_kind(asked, got, asked_notify, got_notify, again):
    assert policy.claim_again(asked, got, asked_notify, got_notify) is again
