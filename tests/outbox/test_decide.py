"""The decisions of the submit and settle steps, as tables: every
combination of what the job is, what the provider said (or raised), and the
clock, with the decision written out for each. No database, no network, no
wall clock: a changed rule makes its rows fail.

A row's expected decision is spelled out here (messages and delays as
literals), never computed from the code under test."""
from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import random

import pytest

from app.domain.record import JobRecord
from app.download_errors import DownloadError, HostBusy, OutputGone, OutputTooLarge, Refused
from app.providers.base import (
    Observation,
    OutputValue,
    ProviderFacts,
    ProviderKind,
    Rejected,
    Submitted,
    TaskState,
    Transient,
    Uncertain,
)
from app.vocabulary import ALL_STATUSES, IntentKind, JobError, JobStatus
from outbox import decide
from outbox.decide import (
    LOOK_UP,
    SEND,
    AdoptClaim,
    AskProvider,
    Close,
    ConfirmClaim,
    DropClaim,
    MarkUncertain,
    Save,
    StoreOutputs,
    Wait,
)
from outbox.decide import Retry as R
from outbox.outcome import DONE, Later

S = JobStatus
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
DEADLINES = {"ahead": NOW + dt.timedelta(seconds=100), "passed": NOW - dt.timedelta(seconds=1)}
ATTEMPTS = 3  # the intent's attempt; the job's own submit_attempts is 2 (below)
CALLBACK = "https://longcall.example/webhooks/p/job_000000000000000000000001"
# Poll schedule 2, 3, 5, 10 s (the next check of a task 4 s old is 3 s away);
# the lost-webhook check 30 s after submit.
FACTS = ProviderFacts(name="p", webhook_scheme="t/v1", idempotent_submit=False, can_find=False,
                      stale_after_s=30.0, poll_delays_s=(2.0, 3.0, 5.0, 10.0))


RUNNING_JOB = JobRecord(id="job_000000000000000000000001", owner_id="own_000000000000000000000001",
                        status=S.RUNNING, provider="p", model="m", input={"prompt": "a cat"},
                        created_at=NOW - dt.timedelta(seconds=4), deadline_at=DEADLINES["ahead"],
                        credits_reserved=10, provider_task_id="task-1", callback_registered=False,
                        submit_attempts=2)


def job(status: JobStatus = S.RUNNING, deadline: str = "ahead", **changes) -> JobRecord:
    return dataclasses.replace(RUNNING_JOB, **{"status": status, "deadline_at": DEADLINES[deadline], **changes})


def facts(**changes) -> ProviderFacts:
    return dataclasses.replace(FACTS, **changes)


# --- settle ---------------------------------------------------------------------------

OBSERVATIONS = {
    "not asked": None,
    "running": Observation(TaskState.RUNNING),
    "succeeded 2": Observation(TaskState.SUCCEEDED, ("https://out.example/0", "https://out.example/1"), cost=3),
    "succeeded 0": Observation(TaskState.SUCCEEDED),  # no outputs, no cost reported
    "failed": Observation(TaskState.FAILED, error="the model ran out of memory"),
    "cancelled": Observation(TaskState.CANCELLED),
    "rejected": Rejected("404 no such task"),
    "transient": Transient("503 from status", retry_after=9.0),  # waited out at its hint, counting nothing
    "uncertain": Uncertain("read timeout"),
}

NOT_SUBMITTED = Wait(2.0, "not submitted yet")
EXPIRE_RUNNING = Close(S.EXPIRED, JobError.GIVE_UP, "the provider did not finish before the give-up deadline",
                       cancel_at_provider=True)
EXPIRE_UNCERTAIN = Close(S.EXPIRED, JobError.GIVE_UP, "gave up on an uncertain submit", cancel_at_provider=True)
EXPIRE_UNSUBMITTED = Close(S.EXPIRED, JobError.GIVE_UP, "the give-up deadline passed before the job was submitted",
                           cancel_at_provider=True)
# An uncertain job's intent waits for its deadline (100 s ahead): its give-up timer.
UNTIL_DEADLINE = Wait(100.0, "uncertain: an operator resolves it, or it expires at its give-up deadline")
ASK = AskProvider()
STILL_RUNNING = Wait(3.0, "still running")
STORE_TWO = StoreOutputs(("https://out.example/0", "https://out.example/1"), charge=3, cost=3)
STORE_NONE = StoreOutputs((), charge=10)  # no cost reported: the reservation is charged
PROVIDER_FAILED = Close(S.FAILED, JobError.PROVIDER_FAILED, "the model ran out of memory")
PROVIDER_CANCELLED = Close(S.FAILED, JobError.PROVIDER_FAILED, "the provider reports the task cancelled")
STATUS_REJECTED = R(3, "status: 404 no such task")
STATUS_TRANSIENT = R(3, "status: 503 from status", failed=False, after_s=9.0)
# No hint: the poll schedule at the job's age (4 s: the 3 s step).
STATUS_UNCERTAIN = R(3, "status: read timeout", failed=False, after_s=3.0)

# status, what the provider said, deadline -> decision. Only a running job
# is asked about, at its deadline too: there an answer that the task is
# over is acted on, and one that it goes on (or none) expires the job.
SETTLE_TABLE = [
    # queued: no task id yet (a webhook beat the submit)
    (S.QUEUED,     "not asked",   "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "not asked",   "passed", NOT_SUBMITTED),
    (S.QUEUED,     "running",     "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "running",     "passed", NOT_SUBMITTED),
    (S.QUEUED,     "succeeded 2", "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "succeeded 2", "passed", NOT_SUBMITTED),
    (S.QUEUED,     "succeeded 0", "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "succeeded 0", "passed", NOT_SUBMITTED),
    (S.QUEUED,     "failed",      "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "failed",      "passed", NOT_SUBMITTED),
    (S.QUEUED,     "cancelled",   "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "cancelled",   "passed", NOT_SUBMITTED),
    (S.QUEUED,     "rejected",    "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "rejected",    "passed", NOT_SUBMITTED),
    (S.QUEUED,     "transient",   "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "transient",   "passed", NOT_SUBMITTED),
    (S.QUEUED,     "uncertain",   "ahead",  NOT_SUBMITTED),
    (S.QUEUED,     "uncertain",   "passed", NOT_SUBMITTED),
    # submitting
    (S.SUBMITTING, "not asked",   "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "not asked",   "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "running",     "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "running",     "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "succeeded 2", "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "succeeded 2", "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "succeeded 0", "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "succeeded 0", "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "failed",      "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "failed",      "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "cancelled",   "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "cancelled",   "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "rejected",    "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "rejected",    "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "transient",   "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "transient",   "passed", NOT_SUBMITTED),
    (S.SUBMITTING, "uncertain",   "ahead",  NOT_SUBMITTED),
    (S.SUBMITTING, "uncertain",   "passed", NOT_SUBMITTED),
    # running
    (S.RUNNING,    "not asked",   "ahead",  ASK),
    (S.RUNNING,    "not asked",   "passed", ASK),  # once more: it may have finished
    (S.RUNNING,    "running",     "ahead",  STILL_RUNNING),
    (S.RUNNING,    "running",     "passed", EXPIRE_RUNNING),
    (S.RUNNING,    "succeeded 2", "ahead",  STORE_TWO),
    (S.RUNNING,    "succeeded 2", "passed", STORE_TWO),  # done (and billed) before we looked
    (S.RUNNING,    "succeeded 0", "ahead",  STORE_NONE),
    (S.RUNNING,    "succeeded 0", "passed", STORE_NONE),
    (S.RUNNING,    "failed",      "ahead",  PROVIDER_FAILED),
    (S.RUNNING,    "failed",      "passed", PROVIDER_FAILED),
    (S.RUNNING,    "cancelled",   "ahead",  PROVIDER_CANCELLED),
    (S.RUNNING,    "cancelled",   "passed", PROVIDER_CANCELLED),
    (S.RUNNING,    "rejected",    "ahead",  STATUS_REJECTED),
    (S.RUNNING,    "rejected",    "passed", EXPIRE_RUNNING),
    (S.RUNNING,    "transient",   "ahead",  STATUS_TRANSIENT),
    (S.RUNNING,    "transient",   "passed", EXPIRE_RUNNING),
    (S.RUNNING,    "uncertain",   "ahead",  STATUS_UNCERTAIN),
    (S.RUNNING,    "uncertain",   "passed", EXPIRE_RUNNING),
    # uncertain: no task to ask about; only the deadline closes it here
    (S.UNCERTAIN,  "not asked",   "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "not asked",   "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "running",     "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "running",     "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "succeeded 2", "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "succeeded 2", "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "succeeded 0", "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "succeeded 0", "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "failed",      "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "failed",      "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "cancelled",   "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "cancelled",   "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "rejected",    "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "rejected",    "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "transient",   "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "transient",   "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  "uncertain",   "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  "uncertain",   "passed", EXPIRE_UNCERTAIN),
    # terminal: nothing left to do, whatever anyone says
    (S.SUCCEEDED,  "not asked",   "ahead",  DONE),
    (S.SUCCEEDED,  "not asked",   "passed", DONE),
    (S.SUCCEEDED,  "running",     "ahead",  DONE),
    (S.SUCCEEDED,  "running",     "passed", DONE),
    (S.SUCCEEDED,  "succeeded 2", "ahead",  DONE),
    (S.SUCCEEDED,  "succeeded 2", "passed", DONE),
    (S.SUCCEEDED,  "succeeded 0", "ahead",  DONE),
    (S.SUCCEEDED,  "succeeded 0", "passed", DONE),
    (S.SUCCEEDED,  "failed",      "ahead",  DONE),
    (S.SUCCEEDED,  "failed",      "passed", DONE),
    (S.SUCCEEDED,  "cancelled",   "ahead",  DONE),
    (S.SUCCEEDED,  "cancelled",   "passed", DONE),
    (S.SUCCEEDED,  "rejected",    "ahead",  DONE),
    (S.SUCCEEDED,  "rejected",    "passed", DONE),
    (S.SUCCEEDED,  "transient",   "ahead",  DONE),
    (S.SUCCEEDED,  "transient",   "passed", DONE),
    (S.SUCCEEDED,  "uncertain",   "ahead",  DONE),
    (S.SUCCEEDED,  "uncertain",   "passed", DONE),
    # failed
    (S.FAILED,     "not asked",   "ahead",  DONE),
    (S.FAILED,     "not asked",   "passed", DONE),
    (S.FAILED,     "running",     "ahead",  DONE),
    (S.FAILED,     "running",     "passed", DONE),
    (S.FAILED,     "succeeded 2", "ahead",  DONE),
    (S.FAILED,     "succeeded 2", "passed", DONE),
    (S.FAILED,     "succeeded 0", "ahead",  DONE),
    (S.FAILED,     "succeeded 0", "passed", DONE),
    (S.FAILED,     "failed",      "ahead",  DONE),
    (S.FAILED,     "failed",      "passed", DONE),
    (S.FAILED,     "cancelled",   "ahead",  DONE),
    (S.FAILED,     "cancelled",   "passed", DONE),
    (S.FAILED,     "rejected",    "ahead",  DONE),
    (S.FAILED,     "rejected",    "passed", DONE),
    (S.FAILED,     "transient",   "ahead",  DONE),
    (S.FAILED,     "transient",   "passed", DONE),
    (S.FAILED,     "uncertain",   "ahead",  DONE),
    (S.FAILED,     "uncertain",   "passed", DONE),
    # cancelled
    (S.CANCELLED,  "not asked",   "ahead",  DONE),
    (S.CANCELLED,  "not asked",   "passed", DONE),
    (S.CANCELLED,  "running",     "ahead",  DONE),
    (S.CANCELLED,  "running",     "passed", DONE),
    (S.CANCELLED,  "succeeded 2", "ahead",  DONE),
    (S.CANCELLED,  "succeeded 2", "passed", DONE),
    (S.CANCELLED,  "succeeded 0", "ahead",  DONE),
    (S.CANCELLED,  "succeeded 0", "passed", DONE),
    (S.CANCELLED,  "failed",      "ahead",  DONE),
    (S.CANCELLED,  "failed",      "passed", DONE),
    (S.CANCELLED,  "cancelled",   "ahead",  DONE),
    (S.CANCELLED,  "cancelled",   "passed", DONE),
    (S.CANCELLED,  "rejected",    "ahead",  DONE),
    (S.CANCELLED,  "rejected",    "passed", DONE),
    (S.CANCELLED,  "transient",   "ahead",  DONE),
    (S.CANCELLED,  "transient",   "passed", DONE),
    (S.CANCELLED,  "uncertain",   "ahead",  DONE),
    (S.CANCELLED,  "uncertain",   "passed", DONE),
    # expired
    (S.EXPIRED,    "not asked",   "ahead",  DONE),
    (S.EXPIRED,    "not asked",   "passed", DONE),
    (S.EXPIRED,    "running",     "ahead",  DONE),
    (S.EXPIRED,    "running",     "passed", DONE),
    (S.EXPIRED,    "succeeded 2", "ahead",  DONE),
    (S.EXPIRED,    "succeeded 2", "passed", DONE),
    (S.EXPIRED,    "succeeded 0", "ahead",  DONE),
    (S.EXPIRED,    "succeeded 0", "passed", DONE),
    (S.EXPIRED,    "failed",      "ahead",  DONE),
    (S.EXPIRED,    "failed",      "passed", DONE),
    (S.EXPIRED,    "cancelled",   "ahead",  DONE),
    (S.EXPIRED,    "cancelled",   "passed", DONE),
    (S.EXPIRED,    "rejected",    "ahead",  DONE),
    (S.EXPIRED,    "rejected",    "passed", DONE),
    (S.EXPIRED,    "transient",   "ahead",  DONE),
    (S.EXPIRED,    "transient",   "passed", DONE),
    (S.EXPIRED,    "uncertain",   "ahead",  DONE),
    (S.EXPIRED,    "uncertain",   "passed", DONE),
]


def test_the_settle_table_covers_every_combination():
    rows = [(status, seen, deadline) for status, seen, deadline, _ in SETTLE_TABLE]
    assert sorted(rows) == sorted(itertools.product(ALL_STATUSES, OBSERVATIONS, DEADLINES))


@pytest.mark.parametrize("status,seen,deadline,expected", SETTLE_TABLE,
                         ids=[f"{s}-{o}-{d}" for s, o, d, _ in SETTLE_TABLE])
def test_settle(status, seen, deadline, expected):
    got = decide.settle(job(status, deadline), OBSERVATIONS[seen], now=NOW, attempts=ATTEMPTS, facts=FACTS)
    assert got == expected


# A cancelled task the provider stopped at the deadline it was given
# (Replicate's Cancel-After) is the job's give-up, not a provider failure.
STOPPED = Observation(TaskState.CANCELLED, stopped_at_deadline=True)
STOPPED_AT_DEADLINE = Close(S.EXPIRED, JobError.GIVE_UP, decide.STOPPED_AT_DEADLINE)


@pytest.mark.parametrize("status, deadline, expected", [
    (S.RUNNING,   "ahead",  STOPPED_AT_DEADLINE),
    (S.RUNNING,   "passed", STOPPED_AT_DEADLINE),
    (S.SUCCEEDED, "ahead",  DONE),
    (S.CANCELLED, "ahead",  DONE),
    (S.EXPIRED,   "passed", DONE),
])
def test_settle_of_a_task_stopped_at_its_deadline(status, deadline, expected):
    assert decide.settle(job(status, deadline), STOPPED, now=NOW, attempts=ATTEMPTS, facts=FACTS) == expected


def test_settle_of_a_job_that_is_gone():
    assert decide.settle(None, None, now=NOW, attempts=ATTEMPTS, facts=FACTS) == DONE


# A task id claimed by a verified webhook: only an uncertain job confirms it
# (a job with a task, or not yet submitted, settles as the table above says;
# the deadline still comes first).
CLAIM_TABLE = [
    # status,     claimed,  deadline, expected
    (S.UNCERTAIN,  "task-9", "ahead",  ConfirmClaim("task-9")),
    (S.UNCERTAIN,  "task-9", "passed", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN,  None,     "ahead",  UNTIL_DEADLINE),
    (S.UNCERTAIN,  None,     "passed", EXPIRE_UNCERTAIN),
    (S.SUBMITTING, "task-9", "ahead",  NOT_SUBMITTED),
    (S.RUNNING,    "task-9", "ahead",  AskProvider()),
    (S.SUCCEEDED,  "task-9", "ahead",  DONE),
    (S.EXPIRED,    "task-9", "passed", DONE),
]


@pytest.mark.parametrize("status,claimed,deadline,expected", CLAIM_TABLE,
                         ids=[f"{s}-{c}-{d}" for s, c, d, _ in CLAIM_TABLE])
def test_settle_with_a_claimed_task(status, claimed, deadline, expected):
    record = job(status, deadline, claimed_task_id=claimed,
                 provider_task_id=None if status in (S.UNCERTAIN, S.SUBMITTING) else "task-1")
    assert decide.settle(record, None, now=NOW, attempts=ATTEMPTS, facts=FACTS) == expected


CONFIRMED = Submitted("task-9", operation={"model": "m"})
DENIED = DropClaim("task-9", "the provider does not know the task a webhook named")
AFTER_CONFIRM_TABLE = [
    # what confirm_task said,            expected
    ("confirmed", CONFIRMED,              AdoptClaim(CONFIRMED)),
    ("unknown", None,                     DENIED),
    ("rejected", Rejected("no such task"), DENIED),
    ("transient", Transient("503 from status", retry_after=9.0),
     R(3, "confirm: 503 from status", failed=False, after_s=9.0)),
    ("uncertain", Uncertain("read timeout"), R(3, "confirm: read timeout", failed=False, after_s=3.0)),
]


@pytest.mark.parametrize("said,expected", [(r, e) for _, r, e in AFTER_CONFIRM_TABLE],
                         ids=[name for name, _, _ in AFTER_CONFIRM_TABLE])
def test_after_confirm(said, expected):
    record = job(S.UNCERTAIN, provider_task_id=None, claimed_task_id="task-9")
    assert decide.after_confirm(record, "task-9", said, now=NOW, attempts=ATTEMPTS, facts=FACTS) == expected


# A read the provider did not answer, by the job's age and the time left
# before its deadline: the hint (at least a second), else a tenth of the
# age between the poll schedule's step and 5 min; never past the deadline.
# A definite error answer counts and backs off.
READ_ERROR_TABLE = [
    # error,                                  age s, deadline in s, expected (after_s; None: counted)
    (Transient("503"),                        4,     100,    3.0),
    (Transient("503"),                        600,   3600,   60.0),
    (Transient("503"),                        7000,  3600,   300.0),
    (Transient("503"),                        7000,  40,     40.0),
    (Transient("429", retry_after=9.0),       7000,  3600,   9.0),
    (Transient("429", retry_after=0.001),     4,     3600,   1.0),
    (Transient("429", retry_after=900.0),     4,     3600,   900.0),
    (Uncertain("read timeout"),               600,   3600,   60.0),
    (Rejected("404 no such task"),            600,   3600,   None),
]


@pytest.mark.parametrize("error,age_s,left_s,after_s", READ_ERROR_TABLE)
def test_a_read_the_provider_did_not_answer_is_waited_out_counting_nothing(error, age_s, left_s, after_s):
    record = job(created_at=NOW - dt.timedelta(seconds=age_s), deadline_at=NOW + dt.timedelta(seconds=left_s))
    got = decide.after_read_error("status", error, record, now=NOW, attempts=ATTEMPTS, facts=FACTS)
    expected = R(ATTEMPTS, f"status: {error}") if after_s is None else \
        R(ATTEMPTS, f"status: {error}", failed=False, after_s=after_s)
    assert got == expected


EXHAUSTED_TABLE = [
    # intent kind, job status, submit in doubt, provider kind, expected
    (IntentKind.SETTLE, S.RUNNING, False, ProviderKind.ASYNC, "close"),
    (IntentKind.SETTLE, S.UNCERTAIN, True, ProviderKind.ASYNC, "until deadline"),
    (IntentKind.SUBMIT, S.QUEUED, False, ProviderKind.ASYNC, "close"),
    (IntentKind.SUBMIT, S.SUBMITTING, False, ProviderKind.ASYNC, "close"),  # its last call definitely failed
    (IntentKind.SUBMIT, S.SUBMITTING, True, ProviderKind.ASYNC, "uncertain"),  # the task may exist
    (IntentKind.SUBMIT, S.SUBMITTING, True, ProviderKind.SYNC, "close"),  # a call has its own lost-call rule
    (IntentKind.SETTLE, S.SUCCEEDED, False, ProviderKind.ASYNC, "done"),
]


@pytest.mark.parametrize("kind,status,in_doubt,provider_kind,expected", EXHAUSTED_TABLE)
def test_an_exhausted_intent_fails_its_job_unless_a_task_may_exist(kind, status, in_doubt, provider_kind, expected):
    record = job(status, provider_task_id="task-1" if status == S.RUNNING else None)
    got = decide.exhausted(kind, record, submit_in_doubt=in_doubt, last_error="submit: timed out", attempts=9,
                           now=NOW, facts=facts(kind=provider_kind))
    assert got == {
        "close": Close(S.FAILED, JobError.SETTLE_EXHAUSTED,
                       f"gave up after 8 failed {kind} attempts: submit: timed out", cancel_at_provider=True),
        "uncertain": MarkUncertain(f"{decide.MAY_HAVE_A_TASK} (submit: timed out)"),
        "until deadline": UNTIL_DEADLINE,
        "done": DONE,
    }[expected]
    assert decide.exhausted(kind, None, submit_in_doubt=in_doubt, last_error=None, attempts=9, now=NOW,
                            facts=None) == DONE


# The wait while a task runs: the poll schedule by the task's age, the
# lost-webhook check when a webhook is registered, never past the deadline.
RUNNING_WAITS = [
    # age s, webhook, seconds to deadline, wait
    (0, False, 100, 2.0),
    (4, False, 100, 3.0),
    (12, False, 100, 10.0),
    (3600, False, 100, 10.0),
    (4, True, 100, 30.0),
    (4, False, 2.5, 2.5),
    (4, True, 7, 7.0),
]


@pytest.mark.parametrize("age,webhook,to_deadline,wait", RUNNING_WAITS,
                         ids=[f"age {a}-{'webhook' if w else 'polled'}-deadline in {d}"
                              for a, w, d, _ in RUNNING_WAITS])
def test_a_running_task_is_looked_at_again(age, webhook, to_deadline, wait):
    record = job(created_at=NOW - dt.timedelta(seconds=age), callback_registered=webhook,
                 deadline_at=NOW + dt.timedelta(seconds=to_deadline))
    got = decide.settle(record, OBSERVATIONS["running"], now=NOW, attempts=ATTEMPTS, facts=FACTS)
    assert got == Wait(wait, "still running")


def test_a_cost_over_the_reservation_is_capped():
    seen = Observation(TaskState.SUCCEEDED, ("https://out.example/0",), cost=25)
    assert decide.settle(job(), seen, now=NOW, attempts=ATTEMPTS, facts=FACTS) == \
        StoreOutputs(("https://out.example/0",), charge=10, cost=25)


# A success in each of its forms (a running job asked about it, before its
# deadline or at it): values are stored after the URLs; outputs the provider
# says it removed fail the job with a full refund; a reported completion time dates the outputs' expiry
# (FACTS: the default lifetime, 3600 s).
TEXT = OutputValue(b"hello Alice", "text/plain; charset=utf-8")
JSON = OutputValue(b'["hello"," Alice"]', "application/json")
SUCCESSES = {
    "values only": Observation(TaskState.SUCCEEDED, values=(TEXT, JSON)),
    "urls and values": Observation(TaskState.SUCCEEDED, ("https://out.example/0",), cost=3, values=(TEXT,)),
    "removed": Observation(TaskState.SUCCEEDED, output_removed=True),
    "removed, urls still listed": Observation(TaskState.SUCCEEDED, ("https://out.example/0",), cost=3,
                                              output_removed=True),
}
OUTPUTS_REMOVED = Close(S.FAILED, JobError.OUTPUT_EXPIRED, "the provider removed the outputs before they were copied")
SUCCESS_TABLE = [
    ("values only", "ahead", StoreOutputs((), charge=10, values=(TEXT, JSON))),
    ("values only", "passed", StoreOutputs((), charge=10, values=(TEXT, JSON))),
    ("urls and values", "ahead", StoreOutputs(("https://out.example/0",), charge=3, values=(TEXT,), cost=3)),
    ("urls and values", "passed", StoreOutputs(("https://out.example/0",), charge=3, values=(TEXT,), cost=3)),
    ("removed", "ahead", OUTPUTS_REMOVED),
    ("removed", "passed", OUTPUTS_REMOVED),
    ("removed, urls still listed", "ahead", OUTPUTS_REMOVED),
    ("removed, urls still listed", "passed", OUTPUTS_REMOVED),
]


def test_the_success_table_covers_every_form():
    assert sorted((seen, d) for seen, d, _ in SUCCESS_TABLE) == sorted(itertools.product(SUCCESSES, DEADLINES))


@pytest.mark.parametrize("seen,deadline,expected", SUCCESS_TABLE, ids=[f"{o}-{d}" for o, d, _ in SUCCESS_TABLE])
def test_settle_a_success(seen, deadline, expected):
    got = decide.settle(job(S.RUNNING, deadline), SUCCESSES[seen], now=NOW, attempts=ATTEMPTS, facts=FACTS)
    assert got == expected


class SomeNewDownloadError(DownloadError):
    """A download error class the download layer may add later: it must fall into the backoff."""


DOWNLOAD_ERRORS = [
    ("too large", OutputTooLarge("output is over 1000 bytes"),
     Close(S.FAILED, JobError.OUTPUT_TOO_LARGE, "output is over 1000 bytes")),
    ("refused", Refused("host not allowed: evil.example"),
     Close(S.FAILED, JobError.OUTPUT_REFUSED, "host not allowed: evil.example")),
    ("other", DownloadError("HTTP 503 from out.example"), R(3, "download 1: HTTP 503 from out.example")),
    ("gone 404", OutputGone("HTTP 404 from https://out.example"),
     Close(S.FAILED, JobError.OUTPUT_EXPIRED, "download 1: HTTP 404 from https://out.example")),
    ("gone 410", OutputGone("HTTP 410 from https://out.example"),
     Close(S.FAILED, JobError.OUTPUT_EXPIRED, "download 1: HTTP 410 from https://out.example")),
    ("host busy", HostBusy("out.example has 4 downloads running"),
     Wait(5.0, "download 1: out.example has 4 downloads running")),
    ("new subclass", SomeNewDownloadError("out.example stalled"), R(3, "download 1: out.example stalled")),
]


@pytest.mark.parametrize("error,expected", [(e, x) for _, e, x in DOWNLOAD_ERRORS],
                         ids=[name for name, _, _ in DOWNLOAD_ERRORS])
def test_after_a_download_error(error, expected):
    assert decide.after_download_error(1, error, ATTEMPTS) == expected


def test_after_a_storage_error_only_the_class_is_kept():
    error = OSError("s3://bucket/outputs/own_1/job_1/1?X-Amz-Signature=secret: disk full")
    assert decide.after_store_error(1, error, ATTEMPTS) == R(3, "store 1: OSError")


# --- the one give-up rule ----------------------------------------------------------------

GIVE_UP_DEADLINES = {"ahead": NOW + dt.timedelta(seconds=1), "now": NOW, "passed": NOW - dt.timedelta(seconds=1)}
GIVE_UP_TABLE = [
    (S.QUEUED, "ahead", None),
    (S.QUEUED, "now", EXPIRE_UNSUBMITTED),
    (S.QUEUED, "passed", EXPIRE_UNSUBMITTED),
    (S.SUBMITTING, "ahead", None),
    (S.SUBMITTING, "now", EXPIRE_UNSUBMITTED),
    (S.SUBMITTING, "passed", EXPIRE_UNSUBMITTED),
    (S.RUNNING, "ahead", None),
    (S.RUNNING, "now", EXPIRE_RUNNING),
    (S.RUNNING, "passed", EXPIRE_RUNNING),
    (S.UNCERTAIN, "ahead", None),
    (S.UNCERTAIN, "now", EXPIRE_UNCERTAIN),
    (S.UNCERTAIN, "passed", EXPIRE_UNCERTAIN),
    (S.SUCCEEDED, "ahead", None),
    (S.SUCCEEDED, "now", None),
    (S.SUCCEEDED, "passed", None),
    (S.FAILED, "ahead", None),
    (S.FAILED, "now", None),
    (S.FAILED, "passed", None),
    (S.CANCELLED, "ahead", None),
    (S.CANCELLED, "now", None),
    (S.CANCELLED, "passed", None),
    (S.EXPIRED, "ahead", None),
    (S.EXPIRED, "now", None),
    (S.EXPIRED, "passed", None),
]


def test_the_give_up_table_covers_every_combination():
    assert sorted((s, d) for s, d, _ in GIVE_UP_TABLE) == sorted(itertools.product(ALL_STATUSES, GIVE_UP_DEADLINES))


@pytest.mark.parametrize("status,deadline,expected", GIVE_UP_TABLE, ids=[f"{s}-{d}" for s, d, _ in GIVE_UP_TABLE])
def test_give_up(status, deadline, expected):
    assert decide.give_up(status, GIVE_UP_DEADLINES[deadline], NOW) == expected


# --- submit ---------------------------------------------------------------------------------

SUBMITTED = Submitted(task_id="task-1", operation={"path": "m"}, webhook_secret="whsec_not_logged")
RESULTS = {
    "not sent": None,
    "submitted": SUBMITTED,
    "rejected": Rejected("422 invalid input"),
    "transient": Transient("connection refused"),
    "transient+hint": Transient("429 too many requests", retry_after=7.0),
    "uncertain": Uncertain("read timeout after the request was sent"),
}
IDEMPOTENT = {"idempotent": True, "not idempotent": False}
FINDABLE = {"can find": True, "cannot find": False}
DOUBT = {"in doubt": True, "clear": False}

UNFINDABLE = MarkUncertain("the submit's outcome is unknown and the task could not be looked up")
# A webhook is registered: the first check is the lost-webhook check (30 s),
# at once for a task found again after doubt or with the deadline gone.
SAVE_AT_STALE_CHECK = Save(SUBMITTED, callback_registered=True, first_check_after_s=30.0)
SAVE_NOW = Save(SUBMITTED, callback_registered=True, first_check_after_s=0.0)
REJECTED = Close(S.FAILED, JobError.SUBMIT_REJECTED, "422 invalid input")
RETRY_TRANSIENT = R(3, "connection refused")
# The provider said when: waited out, no failed attempt (the deadline bounds it).
RETRY_AFTER_HINT = R(3, "429 too many requests", failed=False, after_s=7.0)
RETRY_UNCERTAIN = R(3, "read timeout after the request was sent")

# result, provider idempotent, provider can find, was in doubt, deadline ->
# decision. The deadline counts only before the call: a task id, once the
# provider has given one, is always saved.
SUBMIT_TABLE = [
    # not sent
    ("not sent",       "idempotent",     "can find",    "in doubt", "ahead",  SEND),
    ("not sent",       "idempotent",     "can find",    "in doubt", "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "idempotent",     "can find",    "clear",    "ahead",  SEND),
    ("not sent",       "idempotent",     "can find",    "clear",    "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "idempotent",     "cannot find", "in doubt", "ahead",  SEND),
    ("not sent",       "idempotent",     "cannot find", "in doubt", "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "idempotent",     "cannot find", "clear",    "ahead",  SEND),
    ("not sent",       "idempotent",     "cannot find", "clear",    "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "not idempotent", "can find",    "in doubt", "ahead",  LOOK_UP),
    ("not sent",       "not idempotent", "can find",    "in doubt", "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "not idempotent", "can find",    "clear",    "ahead",  SEND),
    ("not sent",       "not idempotent", "can find",    "clear",    "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "not idempotent", "cannot find", "in doubt", "ahead",  UNFINDABLE),
    ("not sent",       "not idempotent", "cannot find", "in doubt", "passed", EXPIRE_UNSUBMITTED),
    ("not sent",       "not idempotent", "cannot find", "clear",    "ahead",  SEND),
    ("not sent",       "not idempotent", "cannot find", "clear",    "passed", EXPIRE_UNSUBMITTED),
    # submitted
    ("submitted",      "idempotent",     "can find",    "in doubt", "ahead",  SAVE_NOW),
    ("submitted",      "idempotent",     "can find",    "in doubt", "passed", SAVE_NOW),
    ("submitted",      "idempotent",     "can find",    "clear",    "ahead",  SAVE_AT_STALE_CHECK),
    ("submitted",      "idempotent",     "can find",    "clear",    "passed", SAVE_NOW),
    ("submitted",      "idempotent",     "cannot find", "in doubt", "ahead",  SAVE_NOW),
    ("submitted",      "idempotent",     "cannot find", "in doubt", "passed", SAVE_NOW),
    ("submitted",      "idempotent",     "cannot find", "clear",    "ahead",  SAVE_AT_STALE_CHECK),
    ("submitted",      "idempotent",     "cannot find", "clear",    "passed", SAVE_NOW),
    ("submitted",      "not idempotent", "can find",    "in doubt", "ahead",  SAVE_NOW),
    ("submitted",      "not idempotent", "can find",    "in doubt", "passed", SAVE_NOW),
    ("submitted",      "not idempotent", "can find",    "clear",    "ahead",  SAVE_AT_STALE_CHECK),
    ("submitted",      "not idempotent", "can find",    "clear",    "passed", SAVE_NOW),
    ("submitted",      "not idempotent", "cannot find", "in doubt", "ahead",  SAVE_NOW),
    ("submitted",      "not idempotent", "cannot find", "in doubt", "passed", SAVE_NOW),
    ("submitted",      "not idempotent", "cannot find", "clear",    "ahead",  SAVE_AT_STALE_CHECK),
    ("submitted",      "not idempotent", "cannot find", "clear",    "passed", SAVE_NOW),
    # rejected
    ("rejected",       "idempotent",     "can find",    "in doubt", "ahead",  REJECTED),
    ("rejected",       "idempotent",     "can find",    "in doubt", "passed", REJECTED),
    ("rejected",       "idempotent",     "can find",    "clear",    "ahead",  REJECTED),
    ("rejected",       "idempotent",     "can find",    "clear",    "passed", REJECTED),
    ("rejected",       "idempotent",     "cannot find", "in doubt", "ahead",  REJECTED),
    ("rejected",       "idempotent",     "cannot find", "in doubt", "passed", REJECTED),
    ("rejected",       "idempotent",     "cannot find", "clear",    "ahead",  REJECTED),
    ("rejected",       "idempotent",     "cannot find", "clear",    "passed", REJECTED),
    ("rejected",       "not idempotent", "can find",    "in doubt", "ahead",  REJECTED),
    ("rejected",       "not idempotent", "can find",    "in doubt", "passed", REJECTED),
    ("rejected",       "not idempotent", "can find",    "clear",    "ahead",  REJECTED),
    ("rejected",       "not idempotent", "can find",    "clear",    "passed", REJECTED),
    ("rejected",       "not idempotent", "cannot find", "in doubt", "ahead",  REJECTED),
    ("rejected",       "not idempotent", "cannot find", "in doubt", "passed", REJECTED),
    ("rejected",       "not idempotent", "cannot find", "clear",    "ahead",  REJECTED),
    ("rejected",       "not idempotent", "cannot find", "clear",    "passed", REJECTED),
    # transient
    ("transient",      "idempotent",     "can find",    "in doubt", "ahead",  RETRY_TRANSIENT),
    ("transient",      "idempotent",     "can find",    "in doubt", "passed", RETRY_TRANSIENT),
    ("transient",      "idempotent",     "can find",    "clear",    "ahead",  RETRY_TRANSIENT),
    ("transient",      "idempotent",     "can find",    "clear",    "passed", RETRY_TRANSIENT),
    ("transient",      "idempotent",     "cannot find", "in doubt", "ahead",  RETRY_TRANSIENT),
    ("transient",      "idempotent",     "cannot find", "in doubt", "passed", RETRY_TRANSIENT),
    ("transient",      "idempotent",     "cannot find", "clear",    "ahead",  RETRY_TRANSIENT),
    ("transient",      "idempotent",     "cannot find", "clear",    "passed", RETRY_TRANSIENT),
    ("transient",      "not idempotent", "can find",    "in doubt", "ahead",  RETRY_TRANSIENT),
    ("transient",      "not idempotent", "can find",    "in doubt", "passed", RETRY_TRANSIENT),
    ("transient",      "not idempotent", "can find",    "clear",    "ahead",  RETRY_TRANSIENT),
    ("transient",      "not idempotent", "can find",    "clear",    "passed", RETRY_TRANSIENT),
    ("transient",      "not idempotent", "cannot find", "in doubt", "ahead",  RETRY_TRANSIENT),
    ("transient",      "not idempotent", "cannot find", "in doubt", "passed", RETRY_TRANSIENT),
    ("transient",      "not idempotent", "cannot find", "clear",    "ahead",  RETRY_TRANSIENT),
    ("transient",      "not idempotent", "cannot find", "clear",    "passed", RETRY_TRANSIENT),
    # transient+hint
    ("transient+hint", "idempotent",     "can find",    "in doubt", "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "can find",    "in doubt", "passed", RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "can find",    "clear",    "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "can find",    "clear",    "passed", RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "cannot find", "in doubt", "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "cannot find", "in doubt", "passed", RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "cannot find", "clear",    "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "idempotent",     "cannot find", "clear",    "passed", RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "can find",    "in doubt", "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "can find",    "in doubt", "passed", RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "can find",    "clear",    "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "can find",    "clear",    "passed", RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "cannot find", "in doubt", "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "cannot find", "in doubt", "passed", RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "cannot find", "clear",    "ahead",  RETRY_AFTER_HINT),
    ("transient+hint", "not idempotent", "cannot find", "clear",    "passed", RETRY_AFTER_HINT),
    # uncertain
    ("uncertain",      "idempotent",     "can find",    "in doubt", "ahead",  RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "can find",    "in doubt", "passed", RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "can find",    "clear",    "ahead",  RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "can find",    "clear",    "passed", RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "cannot find", "in doubt", "ahead",  RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "cannot find", "in doubt", "passed", RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "cannot find", "clear",    "ahead",  RETRY_UNCERTAIN),
    ("uncertain",      "idempotent",     "cannot find", "clear",    "passed", RETRY_UNCERTAIN),
    ("uncertain",      "not idempotent", "can find",    "in doubt", "ahead",  LOOK_UP),
    ("uncertain",      "not idempotent", "can find",    "in doubt", "passed", LOOK_UP),
    ("uncertain",      "not idempotent", "can find",    "clear",    "ahead",  LOOK_UP),
    ("uncertain",      "not idempotent", "can find",    "clear",    "passed", LOOK_UP),
    ("uncertain",      "not idempotent", "cannot find", "in doubt", "ahead",  UNFINDABLE),
    ("uncertain",      "not idempotent", "cannot find", "in doubt", "passed", UNFINDABLE),
    ("uncertain",      "not idempotent", "cannot find", "clear",    "ahead",  UNFINDABLE),
    ("uncertain",      "not idempotent", "cannot find", "clear",    "passed", UNFINDABLE),
]


def test_the_submit_table_covers_every_combination():
    rows = [row[:5] for row in SUBMIT_TABLE]
    assert sorted(rows) == sorted(itertools.product(RESULTS, IDEMPOTENT, FINDABLE, DOUBT, DEADLINES))


@pytest.mark.parametrize("result,idempotent,findable,doubt,deadline,expected", SUBMIT_TABLE,
                         ids=["-".join(row[:5]) for row in SUBMIT_TABLE])
def test_submit(result, idempotent, findable, doubt, deadline, expected):
    record = job(S.SUBMITTING, deadline, provider_task_id=None, was_in_doubt=DOUBT[doubt])
    provider = facts(idempotent_submit=IDEMPOTENT[idempotent], can_find=FINDABLE[findable])
    got = decide.submit(record, RESULTS[result], now=NOW, attempts=ATTEMPTS, facts=provider, callback_url=CALLBACK)
    assert got == expected


def test_a_submit_saved_without_a_webhook_is_polled():
    got = decide.submit(job(S.SUBMITTING, provider_task_id=None), SUBMITTED, now=NOW, attempts=ATTEMPTS,
                        facts=FACTS, callback_url=None)
    assert got == Save(SUBMITTED, callback_registered=False, first_check_after_s=2.0)


def test_a_retry_after_below_a_second_is_waited_a_second():
    got = decide.submit(job(S.SUBMITTING), Transient("429", retry_after=0.001), now=NOW, attempts=ATTEMPTS,
                        facts=FACTS, callback_url=CALLBACK)
    assert got == R(3, "429", failed=False, after_s=1.0)


def test_a_zero_retry_after_is_no_hint():
    got = decide.submit(job(S.SUBMITTING), Transient("429", retry_after=0.0), now=NOW, attempts=ATTEMPTS,
                        facts=FACTS, callback_url=CALLBACK)
    assert got == R(3, "429")


# --- the in-doubt recovery ----------------------------------------------------------------------

# Whether an in-doubt submit can be looked up at all: by our job id, which
# the callback URL carries.
IN_DOUBT_TABLE = [
    (True, LOOK_UP),  # a look-up needs no callback URL (Replicate: model, input, time)
    (False, UNFINDABLE),
]


@pytest.mark.parametrize("can_find,expected", IN_DOUBT_TABLE,
                         ids=[f"{'can' if f else 'cannot'} find" for f, _ in IN_DOUBT_TABLE])
def test_in_doubt(can_find, expected):
    assert decide.in_doubt(facts(can_find=can_find)) == expected


# A submit whose answer was lost while its job was closed (a cancel): sent
# once more only where the key returns the same task and a task can be
# stopped (the native protocol); else nothing (the Gateway's cannot be
# stopped, and a task the first call never made would then run on).
@pytest.mark.parametrize("idempotent,can_cancel,expected", [
    (True, True, decide.SEND),
    (True, False, None),
    (False, True, None),
    (False, False, None),
])
def test_a_lost_answer_on_a_closed_job(idempotent, can_cancel, expected):
    got = decide.answer_lost_on_a_closed_job(facts(idempotent_submit=idempotent, can_cancel=can_cancel))
    assert got == expected


FIND_RESULTS = {"found": SUBMITTED, "not found": None, "find transient": Transient("503 listing tasks")}
# what the look-up answered, the job's submit attempts (the look-ups so far),
# was in doubt before this attempt -> decision. Three look-ups before uncertain.
AFTER_FIND_TABLE = [
    ("found", 1, True, SAVE_NOW),
    ("found", 3, True, SAVE_NOW),
    ("found", 1, False, SAVE_AT_STALE_CHECK),  # this attempt's own submit was uncertain
    ("found", 4, False, SAVE_AT_STALE_CHECK),
    ("not found", 1, True, R(1, "not found yet", failed=False)),
    ("not found", 2, True, R(2, "not found yet", failed=False)),
    ("not found", 2, False, R(2, "not found yet", failed=False)),
    ("not found", 3, True, UNFINDABLE),
    ("not found", 3, False, UNFINDABLE),
    ("not found", 4, True, UNFINDABLE),
    ("find transient", 1, True, R(1, "503 listing tasks")),
    ("find transient", 3, True, R(3, "503 listing tasks")),
    ("find transient", 4, False, R(4, "503 listing tasks")),
]


@pytest.mark.parametrize("found,submit_attempts,doubt,expected", AFTER_FIND_TABLE,
                         ids=[f"{f}-attempt {n}-{'in doubt' if d else 'uncertain now'}"
                              for f, n, d, _ in AFTER_FIND_TABLE])
def test_after_find(found, submit_attempts, doubt, expected):
    record = job(S.SUBMITTING, provider_task_id=None, submit_attempts=submit_attempts, was_in_doubt=doubt)
    got = decide.after_find(record, FIND_RESULTS[found], now=NOW, facts=facts(can_find=True), callback_url=CALLBACK)
    assert got == expected


# --- carrying a wait out ------------------------------------------------------------------------


class TopOfTheRange(random.Random):
    """The backoff's jitter at its top: the full delay."""

    def random(self) -> float:
        return 1.0


LATER_TABLE = [
    ("wait", Wait(5.0, "still running"), Later(5.0, failed=False, reason="still running")),
    ("retry", R(3, "status: boom"), Later(4.0, failed=True, reason="status: boom", error=True)),
    ("retry uncounted", R(2, "not found yet", failed=False),
     Later(2.0, failed=False, reason="not found yet", error=True)),
    ("retry after a hint", R(3, "429", after_s=7.0), Later(7.0, failed=True, reason="429", error=True)),
    ("retry capped", R(20, "down"), Later(300.0, failed=True, reason="down", error=True)),
]


@pytest.mark.parametrize("decision,expected", [(d, x) for _, d, x in LATER_TABLE],
                         ids=[name for name, _, _ in LATER_TABLE])
def test_later(decision, expected):
    assert decide.later(decision, rng=TopOfTheRange()) == expected


# --- the record -----------------------------------------------------------------------------------

ROW = {"id": "job_000000000000000000000001", "owner_id": "own_000000000000000000000001", "status": "running",
       "provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "created_at": NOW,
       "deadline_at": NOW + dt.timedelta(hours=2), "credits_reserved": 10, "credits_charged": 0,
       "provider_task_id": "task-1", "provider_operation": {"path": "m"}, "callback_registered": True,
       "submit_attempts": 1, "submit_in_doubt": False, "provider_call_started_at": NOW,
       "webhook_secret": b"\x00sealed", "last_error": None}


def test_a_record_from_a_row():
    record = JobRecord.from_row(ROW)
    assert record.status is S.RUNNING and record.was_in_doubt is False
    assert record.task.task_id == "task-1" and record.task.model == "image-fast"
    assert record.seconds_to_deadline(NOW) == 7200 and record.age_s(NOW + dt.timedelta(seconds=5)) == 5
    assert JobRecord.from_row({**ROW, "was_in_doubt": True}).was_in_doubt is True  # begin_submit's row
    assert "sealed" not in repr(record)


def test_a_record_carries_its_claimed_task():
    assert JobRecord.from_row(ROW).claimed_task_id is None  # a row from before the column
    assert JobRecord.from_row({**ROW, "claimed_task_id": "task-9"}).claimed_task_id == "task-9"


def test_a_record_has_no_task_before_its_id_is_saved():
    with pytest.raises(ValueError):
        _ = JobRecord.from_row({**ROW, "provider_task_id": None}).task


@pytest.mark.parametrize("scheme, url, secret, registered", [
    ("standard-webhooks", "https://us.example/webhooks/replicate/j", None, True),
    ("standard-webhooks", None, None, False),  # no PUBLIC_URL: no webhook
    ("none", "https://us.example/webhooks/gemini/j", None, False),  # polled providers
    ("t/v1", "https://us.example/webhooks/gateway/j", "s3cret", True),
    ("t/v1", "https://us.example/webhooks/gateway/j", None, False),  # a replayed start without its secret
])
def test_callback_registered(scheme, url, secret, registered):
    facts = dataclasses.replace(FACTS, webhook_scheme=scheme)
    assert decide.callback_registered(facts, url, Submitted("t-1", webhook_secret=secret)) is registered
