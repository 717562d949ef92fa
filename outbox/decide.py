"""What the submit and settle steps decide, as plain functions with no I/O.

Each function takes the job (a JobRecord), what the provider said (or the
error class it raised), the clock and the provider's facts, and returns one
small decision. The steps (outbox/submit.py, outbox/settle.py) are the I/O
around them: load or claim the job, call the provider, ask here what to do,
carry it out. tests/outbox/test_decide.py holds every rule to a table.

Waits that back off carry the attempt, not a delay: the jitter is drawn only
when a step carries the decision out (`later`), so the decisions are exact.
"""
from __future__ import annotations

import datetime as dt
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from app.domain import states
from app.domain.record import JobRecord
from app.download_errors import DownloadError, HostBusy, OutputGone, OutputTooLarge, Refused
from app.providers.base import (
    Observation,
    OutputFile,
    OutputValue,
    ProviderError,
    ProviderFacts,
    ProviderKind,
    Rejected,
    Submitted,
    TaskState,
    Transient,
    Uncertain,
    Usage,
)
from app.vocabulary import TERMINAL, IntentKind, JobError, JobStatus
from outbox import policy
from outbox.outcome import DONE, Done, Later
from outbox.roads import timers

# --- the decisions ----------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """Look again after `delay_s`: a normal durable wait, not a failure."""

    delay_s: float
    reason: str


@dataclass(frozen=True)
class Retry:
    """Try again after the exponential backoff of try number `attempt`, or
    after the provider's own hint `after_s`. `failed` counts toward the
    intent's attempt cap."""

    attempt: int
    reason: str
    failed: bool = True
    after_s: float | None = None


@dataclass(frozen=True)
class Close:
    """Make the job terminal (jobs.close), refunding all but a success's charge."""

    status: JobStatus
    error_code: JobError
    message: str
    cancel_at_provider: bool = False


@dataclass(frozen=True)
class AskProvider:
    """Settle: ask the provider for the task's status, then decide again with its answer."""


@dataclass(frozen=True)
class StoreOutputs:
    """Settle: the task succeeded. Copy every output into our storage (the
    URLs downloaded, then the files the adapter wrote, then the values as
    they are, indexed in that order), then close the job succeeded, charged
    `charge` (the provider's cost capped, or the reservation) unless its
    model has a price (app/pricing.py, on what was measured), with the
    usage measured."""

    urls: tuple[str, ...]
    charge: int
    values: tuple[OutputValue, ...] = ()
    url_labels: tuple[str | None, ...] = ()
    files: tuple[OutputFile, ...] = ()
    usage: tuple[Usage, ...] = ()
    request_id: str | None = None  # a sync call's id at the provider, kept on the job
    cost: int | None = None  # the provider's own cost, in credits, when it reports one (a price may use it)

    def url_label(self, index: int) -> str | None:
        return self.url_labels[index] if index < len(self.url_labels) else None


@dataclass(frozen=True)
class Send:
    """Submit: send the submit to the provider (idempotency key = job id)."""


@dataclass(frozen=True)
class LookUp:
    """Submit: an earlier call may have created the task; look it up by our job id."""


@dataclass(frozen=True)
class Save:
    """Submit: save the provider's task id (the job runs) with its first status check."""

    submitted: Submitted
    callback_registered: bool
    first_check_after_s: float


@dataclass(frozen=True)
class MarkUncertain:
    """Submit: the outcome is unknown and cannot be looked up: keep the
    reservation and the identity, for a webhook or an operator to resolve."""

    reason: str


@dataclass(frozen=True)
class ConfirmClaim:
    """Settle, uncertain job: a verified webhook named `task_id`; ask the
    provider, with our own credentials, whether it is this job's task."""

    task_id: str


@dataclass(frozen=True)
class AdoptClaim:
    """Settle, uncertain job: the provider confirmed the claimed task. Save
    it (the job runs, its webhook registered) and settle it as usual, now."""

    submitted: Submitted


@dataclass(frozen=True)
class DropClaim:
    """Settle, uncertain job: the provider denies the claimed task. Forget
    the claim; nothing else changes (the job stays uncertain, its hold kept)."""

    task_id: str
    reason: str


@dataclass(frozen=True)
class Call:
    """Sync: make the one call (its start saved first)."""


@dataclass(frozen=True)
class Recover:
    """Sync: the call may have been made and its answer lost; look it up
    at the provider (ElevenLabs' speech history)."""


SettleDecision = Done | Wait | Retry | Close | AskProvider | StoreOutputs | ConfirmClaim
SyncDecision = Close | Call | Recover | Wait | Retry | StoreOutputs
ClaimDecision = AdoptClaim | DropClaim | Retry
SubmitDecision = Close | Send | LookUp | Save | Retry | MarkUncertain
FoundDecision = Save | Retry | MarkUncertain

ASK_PROVIDER = AskProvider()
SEND = Send()
LOOK_UP = LookUp()
CALL = Call()
RECOVER = Recover()


# --- the one give-up rule ---------------------------------------------------------

# One rule, one message per situation the job is in when it is given up.
GIVE_UP_MESSAGES: dict[JobStatus, str] = {
    JobStatus.QUEUED: "the give-up deadline passed before the job was submitted",
    JobStatus.SUBMITTING: "the give-up deadline passed before the job was submitted",
    JobStatus.RUNNING: "the provider did not finish before the give-up deadline",
    JobStatus.UNCERTAIN: "gave up on an uncertain submit",
}


def give_up(status: JobStatus, deadline_at: dt.datetime, now: dt.datetime) -> Close | None:
    """At its deadline (`deadline_at <= now`) a job in flight expires with a
    full refund, and the provider is asked to stop any task it may have.
    None: not yet (or the job is no longer in flight)."""
    if status not in GIVE_UP_MESSAGES or deadline_at > now:
        return None
    return Close(JobStatus.EXPIRED, JobError.GIVE_UP, GIVE_UP_MESSAGES[status], cancel_at_provider=True)


UNCERTAIN_UNTIL_DEADLINE = "uncertain: an operator resolves it, or it expires at its give-up deadline"


def until_deadline(job: JobRecord, now: dt.datetime) -> Wait:
    """An uncertain job's durable give-up timer: look again at its deadline."""
    return Wait(max(0.0, job.seconds_to_deadline(now)), UNCERTAIN_UNTIL_DEADLINE)


# --- settle -------------------------------------------------------------------------

OUTPUTS_REMOVED = "the provider removed the outputs before they were copied"
STOPPED_AT_DEADLINE = "the provider stopped the task at the job's give-up deadline"


def settle(job: JobRecord | None, seen: Observation | ProviderError | None, *, now: dt.datetime,
           attempts: int, facts: ProviderFacts) -> SettleDecision:
    """`seen`: the provider's answer to a status call (or the error it
    raised); None before the provider was asked."""
    if job is None or job.status in TERMINAL:
        return DONE
    if job.status in (JobStatus.QUEUED, JobStatus.SUBMITTING) and facts.kind is ProviderKind.SYNC:
        # A sync job is closed by its own call (the submit intent): no task to ask about.
        return DONE
    if job.status in (JobStatus.QUEUED, JobStatus.SUBMITTING):
        # A webhook can beat the saved task id: ask again in a moment.
        return Wait(policy.NOT_YET_SUBMITTED_RETRY_S, "not submitted yet")
    expired = give_up(job.status, job.deadline_at, now)
    if job.status == JobStatus.UNCERTAIN:
        # No task to ask about: the deadline closes it, an operator resolves
        # it, or a task its own verified webhook named is confirmed. Until
        # then the intent waits for the deadline: the job's give-up timer,
        # which must outlive any settle a webhook or a read asks for.
        if expired:
            return expired
        if job.claimed_task_id:
            return ConfirmClaim(job.claimed_task_id)
        return until_deadline(job, now)
    if seen is None:
        # At the deadline too: a task that finished just before it (its
        # webhook lost, or the timer late) was done and billed, and its
        # outputs are the user's. Only an answer that the task goes on (or
        # no answer) expires the job.
        return ASK_PROVIDER
    if isinstance(seen, ProviderError):
        return expired or after_read_error("status", seen, job, now=now, attempts=attempts, facts=facts)
    if seen.state == TaskState.RUNNING:
        return expired or Wait(
            timers.next_check_delay(facts, callback_registered=job.callback_registered, age_s=job.age_s(now),
                                    seconds_to_deadline=job.seconds_to_deadline(now)),
            "still running")
    if seen.state == TaskState.CANCELLED and seen.stopped_at_deadline:
        return Close(JobStatus.EXPIRED, JobError.GIVE_UP, STOPPED_AT_DEADLINE)
    if seen.state in (TaskState.FAILED, TaskState.CANCELLED):
        return Close(JobStatus.FAILED, JobError.PROVIDER_FAILED,
                     seen.error or f"the provider reports the task {seen.state.value}")
    if seen.output_removed:
        # A success whose outputs are gone is not a success: nothing to deliver, nothing to charge.
        return Close(JobStatus.FAILED, JobError.OUTPUT_EXPIRED, OUTPUTS_REMOVED)
    return _store(job, seen)


def _store(job: JobRecord, seen: Observation) -> StoreOutputs:
    return StoreOutputs(tuple(seen.output_urls), states.charge_for(job.credits_reserved, seen.cost),
                        values=tuple(seen.values), url_labels=tuple(seen.url_labels), files=tuple(seen.files),
                        usage=tuple(seen.usage), request_id=seen.request_id, cost=seen.cost)


def after_read_error(what: str, error: ProviderError, job: JobRecord, *, now: dt.datetime, attempts: int,
                     facts: ProviderFacts) -> Retry:
    """A read about a task (its status, or a claim's confirm) that did not
    work says nothing of the task, which may still run and be billed: a
    provider's status endpoint down for ten minutes must not fail its
    jobs. One the provider did not answer (no answer, a 5xx, a 429, an
    answer we could not read) is asked again counting no failed attempt,
    at the provider's hint or on a schedule that stretches with the job's
    age (a tenth of it, from the poll schedule up to
    policy.OUTAGE_WAIT_MAX_S: a job is asked about a dozen times through an
    hour's outage, not every 30 s), the give-up deadline bounding it. A
    definite answer that is an error (Rejected: a 404, no such task) backs
    off and counts."""
    if isinstance(error, Rejected):
        return Retry(attempts, f"{what}: {error}")
    if isinstance(error, Transient) and error.retry_after:
        wait = asked_wait(error.retry_after)
    else:
        age_s = job.age_s(now)
        wait = min(policy.OUTAGE_WAIT_MAX_S, max(facts.poll_delay(age_s), age_s / 10))
    return Retry(attempts, f"{what}: {error}", failed=False,
                 after_s=max(0.0, min(wait, job.seconds_to_deadline(now))))


def after_confirm(job: JobRecord, task_id: str, confirmed: Submitted | ProviderError | None, *,
                  now: dt.datetime, attempts: int, facts: ProviderFacts) -> ClaimDecision:
    """`confirmed`: what the provider's confirm_task said of the claimed
    task. Only a task the provider confirms is adopted; one it does not
    know (None, or Rejected: no such task) is dropped; a read that did not
    work is asked again (after_read_error)."""
    if isinstance(confirmed, Submitted):
        return AdoptClaim(confirmed)
    if confirmed is None or isinstance(confirmed, Rejected):
        return DropClaim(task_id, "the provider does not know the task a webhook named")
    return after_read_error("confirm", confirmed, job, now=now, attempts=attempts, facts=facts)


def after_download_error(index: int, error: DownloadError, attempts: int) -> Close | Retry | Wait:
    """By class: too large or refused by policy can never succeed if asked
    again; a 404 or 410 is the output gone at the provider (CONTRACT.md:
    removed or expired, the job fails `output_expired` at once, refunded);
    a host already serving its share of downloads is a wait that counts as
    no failure (a stalled host must not exhaust its jobs' attempts); any
    other download error (a 5xx, a timeout, a new subclass) is luck: back off."""
    if isinstance(error, OutputTooLarge):
        return Close(JobStatus.FAILED, JobError.OUTPUT_TOO_LARGE, str(error))
    if isinstance(error, Refused):
        return Close(JobStatus.FAILED, JobError.OUTPUT_REFUSED, str(error))
    if isinstance(error, OutputGone):
        return Close(JobStatus.FAILED, JobError.OUTPUT_EXPIRED, f"download {index}: {error}")
    if isinstance(error, HostBusy):
        return Wait(policy.HOST_BUSY_RETRY_S, f"download {index}: {error}")
    return Retry(attempts, f"download {index}: {error}")


def after_store_error(index: int, error: Exception, attempts: int) -> Retry:
    """Storage down: keep the intent, move no money. Only the class name is
    kept: a storage error's text may carry a signed URL or a key."""
    return Retry(attempts, f"store {index}: {type(error).__name__}")


# --- submit -------------------------------------------------------------------------


def submit(job: JobRecord, result: Submitted | ProviderError | None, *, now: dt.datetime, attempts: int,
           facts: ProviderFacts, callback_url: str | None) -> SubmitDecision:
    """`job`: as begin_submit claimed it. `result`: what the submit call
    returned or raised; None before anything was sent."""
    if result is None:
        expired = give_up(job.status, job.deadline_at, now)
        if expired:
            return expired
        if job.was_in_doubt and not facts.idempotent_submit:
            # An earlier call never got an answer (the settler died, or the
            # provider timed out): the task may exist. Look, don't submit.
            return in_doubt(facts)
        return SEND
    if isinstance(result, Submitted):
        return _save(job, result, now=now, facts=facts, callback_url=callback_url)
    if isinstance(result, Rejected):
        return Close(JobStatus.FAILED, JobError.SUBMIT_REJECTED, str(result))
    if isinstance(result, Transient):
        return transient(result, attempts)
    if isinstance(result, Uncertain):
        if facts.idempotent_submit:
            # The same key returns the same task: asking again is safe.
            return Retry(attempts, str(result))
        return in_doubt(facts)
    raise TypeError(f"not a submit result: {type(result).__name__}")


def transient(result: Transient, attempts: int) -> Retry:
    """A submit or call that did not happen: asked again. Without a hint it
    backs off and counts toward the intent's attempt cap. With the
    provider's own Retry-After (its 429, a 503 or 529 that says when) it is
    waited out and counts as no failed attempt: a rate limit delays jobs and
    never fails them, the job's give-up deadline bounding the wait. A zero
    hint is no hint."""
    if result.retry_after:
        return Retry(attempts, str(result), failed=False, after_s=asked_wait(result.retry_after))
    return Retry(attempts, str(result))


def answer_lost_on_a_closed_job(facts: ProviderFacts) -> Send | None:
    """A submit whose answer was lost (Uncertain) while its job was closed
    meanwhile (its owner cancelled it): the task may exist, and run and be
    billed with nothing to stop it, the submit's retry having gone with the
    job's intents. Where the provider's key returns the task an earlier call
    made and a task can be stopped, send once more with the key: the task
    comes back, is saved on the closed job and cancelled (one the first
    call never made is made now, and cancelled at once). Otherwise None:
    nothing can find it (a look-up, where there is one, runs in the step)."""
    return SEND if facts.idempotent_submit and facts.can_cancel else None


def asked_wait(retry_after: float) -> float:
    """A wait the provider asked for, at least policy.MIN_ASKED_WAIT_S."""
    return max(retry_after, policy.MIN_ASKED_WAIT_S)


UNFINDABLE = "the submit's outcome is unknown and the task could not be looked up"


def in_doubt(facts: ProviderFacts) -> LookUp | MarkUncertain:
    """A submit that may have created its task: look it up (Replicate: by the
    model and input we sent, since our first attempt — no callback URL
    needed), or, when the provider offers no look-up, uncertain (its own
    webhook may still recover it)."""
    if facts.can_find:
        return LOOK_UP
    return MarkUncertain(UNFINDABLE)


def after_find(job: JobRecord, found: Submitted | Transient | None, *, now: dt.datetime, facts: ProviderFacts,
               callback_url: str | None) -> FoundDecision:
    """`found`: what the look-up returned (None: no such task) or raised.
    Counted in submit attempts, so each look-up is one claim of the job."""
    if isinstance(found, Transient):
        return Retry(job.submit_attempts, str(found))
    if found is not None:
        return _save(job, found, now=now, facts=facts, callback_url=callback_url)
    if job.submit_attempts < policy.IN_DOUBT_FIND_ATTEMPTS:
        # Not listed yet may only mean not listed *yet*: look again.
        return Retry(job.submit_attempts, "not found yet", failed=False)
    return MarkUncertain(UNFINDABLE)


def adopt(candidates: Sequence[Submitted], taken: Collection[str], rivals: int) -> Submitted | None:
    """Of the provider's candidates for an in-doubt submit, the task to adopt
    (pure). Those saved on another job (`taken`) are theirs. One left is
    ours only if no other job's submit of the same model and input has an
    unknown outcome (`rivals`: that one could be theirs and ours never made).
    Several left, or a rival: None, so the job is looked up again and then
    becomes `uncertain`, keeping its reservation, for an operator."""
    left = [c for c in candidates if c.task_id not in taken]
    return left[0] if len(left) == 1 and rivals == 0 else None


def callback_registered(facts: ProviderFacts, callback_url: str | None, submitted: Submitted) -> bool:
    """Whether a webhook can close this job (so its timers are only the
    lost-webhook check): a callback URL was sent, the provider sends
    webhooks at all (Gemini and ElevenLabs dubbing are polled), and a
    per-job secret scheme got its secret (the Gateway's replayed start
    carries none: no webhook of it can verify)."""
    if callback_url is None or not facts.takes_webhooks:
        return False
    return facts.webhook_scheme != "t/v1" or submitted.webhook_secret is not None


def _save(job: JobRecord, submitted: Submitted, *, now: dt.datetime, facts: ProviderFacts,
          callback_url: str | None) -> Save:
    registered = callback_registered(facts, callback_url, submitted)
    # A task found again after an in-doubt submit may have finished long
    # ago, its webhook refused while we had no task id: look now.
    first = 0.0 if job.was_in_doubt else timers.first_check_delay(
        facts, callback_registered=registered, seconds_to_deadline=job.seconds_to_deadline(now))
    return Save(submitted, registered, first)


# --- a claim that took nothing --------------------------------------------------------

PAUSED = "the provider asked us to wait (its 429): submits to it are paused"
WAITING_FOR_CAPACITY = "waiting for a place under the provider's cap"


def not_claimed(status: JobStatus, has_task: bool, paused_until: dt.datetime | None, *, now: dt.datetime,
                backstop_s: float) -> Done | Wait:
    """Why a submit's claim of its job took nothing, and what its intent
    does: nothing left to send (closed, or its task saved) is done; a
    paused provider is waited out; otherwise the job is over a cap and waits
    to be woken when a place frees (`backstop_s`: in case the wake is
    lost). Neither wait counts as a failed attempt."""
    if status not in (JobStatus.QUEUED, JobStatus.SUBMITTING) or has_task:
        return DONE
    if paused_until is not None and paused_until > now:
        return Wait(max(0.0, (paused_until - now).total_seconds()), PAUSED)
    return Wait(backstop_s, WAITING_FOR_CAPACITY)


# --- sync calls ---------------------------------------------------------------------

LOST_CALL = "the call's answer was lost and cannot be found"
CALL_MAY_RUN = "the call may still be running in a worker that lost its claim"
NOT_FOUND_YET = "the lost call is not in the provider's records yet"
RECOVER_AGAIN_S = 10.0  # look a lost call up again this often until its threshold


def sync_call(job: JobRecord, result: Observation | ProviderError | None, *, now: dt.datetime, attempts: int,
              facts: ProviderFacts) -> SyncDecision:
    """A sync job, as begin_submit claimed it. `result`: what the call
    returned or raised; None before anything was sent. A claim that finds
    an earlier claim's call without a definite answer (`was_in_doubt`: its
    worker died, or lost its claim mid-call) never calls again."""
    if result is None:
        if job.was_in_doubt and facts.can_recover:
            # At the deadline too: a lost call found in the provider's
            # records was done, and billed; only one not found expires.
            return RECOVER
        expired = give_up(job.status, job.deadline_at, now)
        if expired:
            return expired
        if job.was_in_doubt:
            return lost_call(job, now=now, facts=facts)
        return CALL
    if isinstance(result, Observation):
        return _store(job, result)
    if isinstance(result, Rejected):
        return Close(JobStatus.FAILED, JobError.SUBMIT_REJECTED, str(result))
    if isinstance(result, Transient):
        return transient(result, attempts)
    if isinstance(result, Uncertain):
        # Sent, and no answer: the provider may have done (and billed) the work.
        if facts.can_recover:
            return RECOVER
        return Close(JobStatus.FAILED, JobError.CALL_LOST, f"{LOST_CALL}: {result}")
    raise TypeError(f"not a call result: {type(result).__name__}")


def lost_call(job: JobRecord, *, now: dt.datetime, facts: ProviderFacts) -> Close | Wait:
    """A call started at `provider_call_started_at` whose answer was never
    saved. Until the model's threshold (`stale_after_s`, never shorter than
    the call's own timeout) it may still be running in a worker that lost
    its claim, and may still close the job: wait. After it, no worker can
    still hold it: `call_lost`, fully refunded (seed 000's sync sweep)."""
    started = job.provider_call_started_at or job.created_at
    left = (started - now).total_seconds() + facts.stale_after_s
    if left <= 0:
        return Close(JobStatus.FAILED, JobError.CALL_LOST, LOST_CALL)
    return Wait(left, CALL_MAY_RUN)


def after_recover(job: JobRecord, found: Observation | ProviderError | None, *, now: dt.datetime, attempts: int,
                  facts: ProviderFacts) -> SyncDecision:
    """`found`: what the provider's records hold of the lost call. Only an
    unambiguous answer is adopted; several candidates (Rejected) are none;
    until the threshold a call not found yet may still finish there — past
    the give-up deadline too: it is made, and billed, all the same."""
    if isinstance(found, Observation):
        return _store(job, found)
    if isinstance(found, Rejected):
        return Close(JobStatus.FAILED, JobError.CALL_LOST, f"{LOST_CALL}: {found}")
    lost = lost_call(job, now=now, facts=facts)
    if isinstance(lost, Close):
        # Past its deadline as well, the job expires rather than fail.
        return give_up(job.status, job.deadline_at, now) or lost
    if isinstance(found, ProviderError):
        return Retry(attempts, f"recover: {found}")
    return Wait(min(lost.delay_s, RECOVER_AGAIN_S), NOT_FOUND_YET)


# --- an intent that failed too often -------------------------------------------------

MAY_HAVE_A_TASK = "the submit's outcome is unknown after its last attempts: the task may exist"


def exhausted(kind: IntentKind, job: JobRecord | None, *, submit_in_doubt: bool, last_error: str | None,
              attempts: int, now: dt.datetime, facts: ProviderFacts | None) -> Close | MarkUncertain | Wait | Done:
    """An intent that failed `attempts - 1` times in a row (policy.exhausted):
    its job fails with a refund (settle_exhausted), never a silent drop —
    except where a task may exist that nothing would then find or stop. An
    async submit whose last call had no answer (`submit_in_doubt`: timed
    out, or its look-up kept failing) becomes uncertain, as an unfindable
    submit does; an uncertain job stays uncertain, its intent again the
    give-up timer. (A cancel intent is simply dropped, a notify's delivery
    given up: the settler's.)"""
    if job is None or job.status in TERMINAL:
        return DONE
    if job.status == JobStatus.UNCERTAIN:
        return until_deadline(job, now)
    if kind is IntentKind.SUBMIT and job.status == JobStatus.SUBMITTING and submit_in_doubt \
            and facts is not None and facts.kind is ProviderKind.ASYNC:
        return MarkUncertain(f"{MAY_HAVE_A_TASK} ({last_error or 'errors'})")
    return Close(JobStatus.FAILED, JobError.SETTLE_EXHAUSTED,
                 f"gave up after {attempts - 1} failed {kind} attempts: {last_error or 'errors'}",
                 cancel_at_provider=True)


# --- carrying a wait out ------------------------------------------------------------


def later(decision: Wait | Retry, rng: random.Random | None = None) -> Later:
    """The drain loop's outcome for a wait: here the backoff's jitter is drawn."""
    if isinstance(decision, Wait):
        return Later(decision.delay_s, failed=False, reason=decision.reason)
    delay = decision.after_s if decision.after_s is not None else policy.backoff(decision.attempt, rng=rng)
    return Later(delay, failed=decision.failed, reason=decision.reason, error=True)
