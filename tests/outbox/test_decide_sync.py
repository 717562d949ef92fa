"""The decisions of the sync step, as tables: what the job is (a first
claim, or a claim after an earlier call left no answer), what the call or
the look-up returned or raised, and the clock. No database, no network, no
wall clock. Expected decisions are written out as literals."""
from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from app.domain.record import JobRecord
from app.providers.base import (
    Observation,
    OutputFile,
    ProviderFacts,
    ProviderKind,
    Rejected,
    TaskState,
    Transient,
    Uncertain,
    Usage,
    UsageUnit,
)
from app.vocabulary import JobError, JobStatus
from outbox import decide
from outbox.decide import CALL, RECOVER, Close, StoreOutputs, Wait
from outbox.decide import Retry as R

S = JobStatus
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
# The call started 100 s ago; its threshold is 900 s (600 s timeout + 5 min).
STARTED = NOW - dt.timedelta(seconds=100)
FACTS = ProviderFacts(name="llm", webhook_scheme="none", idempotent_submit=False, can_find=False,
                      stale_after_s=900.0, kind=ProviderKind.SYNC, call_timeout_s=600.0, can_cancel=False)
RECOVERABLE = dataclasses.replace(FACTS, can_recover=True)
ANSWER_FILE = OutputFile(path="/tmp/answer.part", bytes=12, sha256="ab" * 32, content_type="application/json")
ANSWER = Observation(TaskState.SUCCEEDED, files=(ANSWER_FILE,),
                     usage=(Usage(UsageUnit.INPUT_TOKENS, 7), Usage(UsageUnit.OUTPUT_TOKENS, 5)),
                     request_id="req_1")
STORE = StoreOutputs((), 10, files=(ANSWER_FILE,),
                     usage=(Usage(UsageUnit.INPUT_TOKENS, 7), Usage(UsageUnit.OUTPUT_TOKENS, 5)), request_id="req_1")
ATTEMPTS = 2


def job(*, in_doubt: bool = False, deadline_s: float = 3600.0, started: dt.datetime | None = STARTED) -> JobRecord:
    return JobRecord(id="job_000000000000000000000001", owner_id="own_000000000000000000000001",
                     status=S.SUBMITTING, provider="llm", model="m", input={"messages": []},
                     created_at=NOW - dt.timedelta(seconds=200), deadline_at=NOW + dt.timedelta(seconds=deadline_s),
                     credits_reserved=10, submit_attempts=1, was_in_doubt=in_doubt,
                     provider_call_started_at=started)


LOST = "the call's answer was lost and cannot be found"
EXPIRE_UNSENT = Close(S.EXPIRED, JobError.GIVE_UP, "the give-up deadline passed before the job was submitted",
                      cancel_at_provider=True)


@pytest.mark.parametrize(("name", "record", "facts", "result", "expected"), [
    # Before anything is sent.
    ("first claim: call", job(), FACTS, None, CALL),
    ("first claim past the deadline: expire", job(deadline_s=-1), FACTS, None, EXPIRE_UNSENT),
    ("earlier call without answer, 100 s in: wait out the 900 s threshold", job(in_doubt=True), FACTS, None,
     Wait(800.0, "the call may still be running in a worker that lost its claim")),
    ("earlier call without answer, past the threshold: call_lost",
     job(in_doubt=True, started=NOW - dt.timedelta(seconds=900)), FACTS, None,
     Close(S.FAILED, JobError.CALL_LOST, LOST)),
    ("earlier call without answer, provider keeps records: look it up", job(in_doubt=True), RECOVERABLE, None,
     RECOVER),
    ("earlier call without answer, past the deadline: expire", job(in_doubt=True, deadline_s=-1), FACTS, None,
     EXPIRE_UNSENT),
    ("earlier call without answer, past the deadline, provider keeps records: look it up first",
     job(in_doubt=True, deadline_s=-1), RECOVERABLE, None, RECOVER),
    # What the call said.
    ("answered: store it, charged the reservation", job(), FACTS, ANSWER, STORE),
    ("rejected (4xx): fail, refunded", job(), FACTS, Rejected("llm: call rejected (HTTP 400)"),
     Close(S.FAILED, JobError.SUBMIT_REJECTED, "llm: call rejected (HTTP 400)")),
    ("529 before any byte: after its retry-after, no failed attempt", job(), FACTS,
     Transient("llm: not now (HTTP 529)", 1.0), R(ATTEMPTS, "llm: not now (HTTP 529)", failed=False, after_s=1.0)),
    ("429 without a hint: back off", job(), FACTS, Transient("llm: not now (HTTP 429)", 0.0),
     R(ATTEMPTS, "llm: not now (HTTP 429)")),
    ("lost (5xx, reset, timeout): call_lost at once", job(), FACTS, Uncertain("llm: call answered HTTP 500"),
     Close(S.FAILED, JobError.CALL_LOST, f"{LOST}: llm: call answered HTTP 500")),
    ("lost, provider keeps records: look it up", job(), RECOVERABLE, Uncertain("llm: the answer broke off"),
     RECOVER),
])
def test_sync_call(name, record, facts, result, expected):
    assert decide.sync_call(record, result, now=NOW, attempts=ATTEMPTS, facts=facts) == expected


@pytest.mark.parametrize(("name", "record", "found", "expected"), [
    ("found: store it", job(in_doubt=True), ANSWER, STORE),
    ("several match: never adopted, call_lost", job(in_doubt=True), Rejected("elevenlabs: 2 history items match"),
     Close(S.FAILED, JobError.CALL_LOST, f"{LOST}: elevenlabs: 2 history items match")),
    ("not there yet, 100 s in: look again in 10 s", job(in_doubt=True), None,
     Wait(10.0, "the lost call is not in the provider's records yet")),
    ("not there yet, 5 s before the threshold: look again then", job(in_doubt=True,
                                                                     started=NOW - dt.timedelta(seconds=895)),
     None, Wait(5.0, "the lost call is not in the provider's records yet")),
    ("not there past the threshold: call_lost", job(in_doubt=True, started=NOW - dt.timedelta(seconds=901)), None,
     Close(S.FAILED, JobError.CALL_LOST, LOST)),
    ("look-up failed: back off", job(in_doubt=True), Transient("elevenlabs: HTTP 500"),
     R(ATTEMPTS, "recover: elevenlabs: HTTP 500")),
    ("look-up failed past the threshold: call_lost", job(in_doubt=True, started=NOW - dt.timedelta(seconds=901)),
     Transient("elevenlabs: HTTP 500"), Close(S.FAILED, JobError.CALL_LOST, LOST)),
    # Past the give-up deadline: what the records hold is still the job's;
    # nothing found (or no answer) expires it.
    ("found past the deadline: store it", job(in_doubt=True, deadline_s=-1), ANSWER, STORE),
    ("not there yet past the deadline: look again, the call may still finish",
     job(in_doubt=True, deadline_s=-1), None, Wait(10.0, "the lost call is not in the provider's records yet")),
    ("look-up failed past the deadline: back off", job(in_doubt=True, deadline_s=-1),
     Transient("elevenlabs: HTTP 500"), R(ATTEMPTS, "recover: elevenlabs: HTTP 500")),
    ("not there past the threshold and the deadline: expire",
     job(in_doubt=True, deadline_s=-1, started=NOW - dt.timedelta(seconds=901)), None, EXPIRE_UNSENT),
    ("look-up failed past the threshold and the deadline: expire",
     job(in_doubt=True, deadline_s=-1, started=NOW - dt.timedelta(seconds=901)),
     Transient("elevenlabs: HTTP 500"), EXPIRE_UNSENT),
])
def test_after_recover(name, record, found, expected):
    assert decide.after_recover(record, found, now=NOW, attempts=ATTEMPTS, facts=RECOVERABLE) == expected


def test_a_call_without_a_saved_start_counts_from_the_job_creation():
    # Never true of a claimed sync job (begin_submit saves a start); the
    # rule still has an answer: the job's age, the earliest the call began.
    record = job(in_doubt=True, started=None)  # created 200 s ago
    assert decide.lost_call(record, now=NOW, facts=FACTS) == Wait(700.0, decide.CALL_MAY_RUN)


@pytest.mark.parametrize("status", [S.QUEUED, S.SUBMITTING])
def test_a_settle_of_a_sync_job_in_its_call_does_nothing(status):
    # Its submit intent owns it: the call, or the lost-call rule.
    record = dataclasses.replace(job(), status=status)
    assert decide.settle(record, None, now=NOW, attempts=1, facts=FACTS) == decide.DONE
