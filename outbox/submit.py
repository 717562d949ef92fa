"""The submit step: one provider task per job.

The job is claimed (queued -> submitting) before any paid call. The submit
carries the job id as idempotency key; the task id is saved (with `running`)
before anything else happens. A call whose outcome is unknown is never
repeated blindly: an idempotent provider is simply asked again; otherwise the
task is looked up by our job id (`find`), and failing that the job becomes
`uncertain`, keeping its reservation, for an operator to resolve.
What to do in each case is decided in outbox/decide.py; this is the I/O.
"""
from __future__ import annotations

import datetime as dt
import logging

from app import capacity
from app.capacity import NO_CAPS
from app.domain import jobs, pauses
from app.domain.record import JobRecord
from app.providers.base import ProviderError, Rejected, SubmitRequest, Submitted, Transient, Uncertain
from app.vocabulary import TERMINAL, CallOutcome, IntentKind, JobStatus, ProviderCall, ProviderKind
from outbox import decide, intents, sync
from outbox.context import Context
from outbox.outcome import DONE, GONE, Done, Outcome

log = logging.getLogger("longcall.settler")


async def submit(ctx: Context, job_id: str, attempts: int, job=None) -> Outcome:
    # `job`: the row as loaded with the claim, or None. The claim of the job
    # (queued -> submitting) reads it afresh; only a provider's caps need it before.
    caps = NO_CAPS
    if ctx.capacity_limited:
        if job is None:
            async with ctx.pool.acquire() as conn:
                job = await jobs.load(conn, job_id)
        if job is not None:
            caps = capacity.caps_for(ctx.settings, job["provider"], job["model"])
    async with ctx.pool.acquire() as conn:
        row = await jobs.begin_submit(conn, job_id, caps)
        if row is None:
            why = await jobs.why_not_claimed(conn, job_id)
    if row is None:
        if why is None:  # gone
            return DONE
        # Cancelled or already submitted (nothing to send), paused, or over a cap.
        waited = decide.not_claimed(why["status"], why["has_task"], why["paused_until"], now=why["now"],
                                    backstop_s=capacity.CAPACITY_BACKSTOP_S)
        return waited if isinstance(waited, Done) else decide.later(waited)
    record = JobRecord.from_row(row)
    provider = ctx.providers[record.provider]
    facts = ctx.facts_for(provider, record.model)
    if facts.kind is ProviderKind.SYNC:
        return await sync.call(ctx, record, provider, facts, attempts)
    request = SubmitRequest(job_id=job_id, model=record.model, input=record.input,
                            callback_url=ctx.settings.callback_url(provider.name, job_id),
                            first_attempt_at=record.provider_call_started_at, deadline_at=record.deadline_at)
    callback_url = request.callback_url

    decision: decide.SubmitDecision = decide.submit(record, None, now=_now(), attempts=attempts, facts=facts,
                                                    callback_url=callback_url)
    if isinstance(decision, decide.Send):
        result = await _send(ctx, record, provider, request)
        decision = decide.submit(record, result, now=_now(), attempts=attempts, facts=facts,
                                 callback_url=callback_url)
        if isinstance(result, Uncertain) and await _closed_meanwhile(ctx, job_id) \
                and decide.answer_lost_on_a_closed_job(facts) is decide.SEND:
            result = await _send(ctx, record, provider, request)
            decision = decide.submit(record, result, now=_now(), attempts=attempts, facts=facts,
                                     callback_url=callback_url)
    if isinstance(decision, decide.LookUp):
        found: Submitted | Transient | None
        try:
            found = await _find(ctx, record, provider, request)
        except Transient as e:
            found = e
        decision = decide.after_find(record, found, now=_now(), facts=facts, callback_url=callback_url)
    return await _carry_out(ctx, record, provider, decision)


async def _closed_meanwhile(ctx: Context, job_id: str) -> bool:
    """Whether the job was closed while its submit was out (a cancel); then
    its intents are gone, a retry of this submit with them."""
    async with ctx.pool.acquire() as conn:
        status = await jobs.status_of(conn, job_id)
    if status in TERMINAL:
        log.warning("a submit's answer was lost while its job was closed: its task may run at the provider",
                    extra={"job_id": job_id})
        return True
    return False


async def _find(ctx: Context, job: JobRecord, provider, request: SubmitRequest) -> Submitted | None:
    """The provider's candidates narrowed by what the database knows: the
    tasks other jobs hold, and other jobs whose own submit is in doubt."""
    candidates = await provider.find_candidates(request)
    if not candidates:
        return None
    async with ctx.pool.acquire() as conn:
        taken, rivals = await jobs.other_jobs_tasks(conn, job.id, [c.task_id for c in candidates])
    return decide.adopt(candidates, taken, rivals)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def _send(ctx: Context, job: JobRecord, provider, request: SubmitRequest) -> Submitted | ProviderError:
    """The paid call, and what its answer means for the job's record of
    doubt: a definite refusal clears it; an unknown outcome keeps it."""
    try:
        submitted = await provider.submit(request, idempotency_key=job.id)
    except Rejected as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.SUBMIT, CallOutcome.REJECTED)
        return e
    except Transient as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.SUBMIT, CallOutcome.TRANSIENT)
        async with ctx.pool.acquire() as conn:
            await jobs.submit_settled(conn, job.id, f"submit: {e}")
            await pauses.pause_if_asked(conn, provider.name, e)
        return e
    except Uncertain as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.SUBMIT, CallOutcome.UNCERTAIN)
        async with ctx.pool.acquire() as conn:
            await jobs.note_error(conn, job.id, f"submit outcome unknown: {e}")
        return e
    ctx.metrics.provider_call(provider.name, ProviderCall.SUBMIT, CallOutcome.OK)
    return submitted


async def _carry_out(ctx: Context, job: JobRecord, provider, decision: decide.SubmitDecision) -> Outcome:
    if isinstance(decision, decide.Close):
        async with ctx.pool.acquire() as conn:
            closed = await jobs.close(conn, job.id, decision.status, error_code=decision.error_code,
                                      error_message=decision.message,
                                      cancel_at_provider=decision.cancel_at_provider,
                                      wake_capacity=capacity.is_capped(ctx.settings, job.provider))
        ctx.metrics.job_finished(provider.name, decision.status, closed)
        return DONE if closed is None else GONE  # a close drops the job's intents
    if isinstance(decision, decide.Retry):
        return decide.later(decision)
    if isinstance(decision, decide.Save):
        return await _save(ctx, job, provider, decision)
    if isinstance(decision, decide.MarkUncertain):
        return await mark_uncertain(ctx, job, decision)
    raise TypeError(f"a submit step cannot carry out {decision!r}")


async def mark_uncertain(ctx: Context, job: JobRecord, decision: decide.MarkUncertain) -> Outcome:
    """submitting -> uncertain, with its give-up timer written with it: the
    settle step expires it at its deadline (the sweep is only the backstop).
    The submit intent is then done."""
    async with ctx.pool.acquire() as conn, conn.transaction():
        if await jobs.mark_uncertain(conn, job.id, decision.reason):
            timer = decide.until_deadline(job, _now())
            await intents.request(conn, job.id, IntentKind.SETTLE, timer.delay_s)
    log.warning("job uncertain", extra={"job_id": job.id, "provider": job.provider})
    return DONE


async def save_submitted(ctx: Context, job_id: str, submitted: Submitted, *, callback_registered: bool,
                         first_check_after_s: float,
                         from_statuses: tuple[JobStatus, ...] = (JobStatus.SUBMITTING,)) -> jobs.Saved:
    """Save a provider's task on its job, its per-task secret encrypted: the
    one way a task id is saved by a step (a submit's answer, a look-up, or a
    confirmed webhook claim for an uncertain job)."""
    secret = ctx.secretbox.encrypt(submitted.webhook_secret, job_id) if submitted.webhook_secret else None
    async with ctx.pool.acquire() as conn:
        return await jobs.save_task(
            conn, job_id, task_id=submitted.task_id,
            operation=dict(submitted.operation) if submitted.operation else None,
            webhook_secret=secret, callback_registered=callback_registered,
            first_check_after_s=first_check_after_s, from_statuses=from_statuses)


# A submit's own answer (or the look-up's find) is the job's task: taken
# also by a job gone uncertain meanwhile (another settler, after this one's
# lease lapsed, could not find the task and gave up looking).
TAKES_ITS_ANSWER = (JobStatus.SUBMITTING, JobStatus.UNCERTAIN)


async def _save(ctx: Context, job: JobRecord, provider, save: decide.Save) -> Outcome:
    result = await save_submitted(ctx, job.id, save.submitted, callback_registered=save.callback_registered,
                                  first_check_after_s=save.first_check_after_s, from_statuses=TAKES_ITS_ANSWER)
    if result is jobs.Saved.ON_CLOSED_JOB:
        log.info("task saved on a closed job; provider cancel queued",
                 extra={"job_id": job.id, "provider": provider.name})
    elif result is jobs.Saved.LOST:
        # Running with another task (an operator's resolve): this one is
        # named for an operator to stop (a task id is no secret).
        log.warning("a second task for a running job was not saved",
                    extra={"job_id": job.id, "provider": provider.name, "task_id": save.submitted.task_id})
    # The save dropped the submit intent (as the close of a closed job had).
    return DONE if result is jobs.Saved.LOST else GONE
