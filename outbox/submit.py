"""The submit step: one provider task per job.

The job is claimed (queued -> submitting) before any paid call. The submit
carries the job id as idempotency key; the task id is saved (with `running`)
before anything else happens. A call whose outcome is unknown is never
repeated blindly: an idempotent provider is simply asked again; otherwise the
task is looked up by our job id (`find`), and failing that the job becomes
`uncertain`, keeping its reservation, for an operator to resolve.
"""
from __future__ import annotations

import datetime as dt
import logging

from app.domain import jobs
from app.providers.base import Rejected, SubmitRequest, Submitted, Transient, Uncertain
from app.vocabulary import JobError, JobStatus
from outbox import policy
from outbox.context import Context
from outbox.outcome import DONE, Later, Outcome
from outbox.roads import timers

log = logging.getLogger("longcall.settler")


async def submit(ctx: Context, job_id: str, attempts: int, job=None) -> Outcome:
    # `job` is not used: the claim of the job (queued -> submitting) reads it.
    async with ctx.pool.acquire() as conn:
        job = await jobs.begin_submit(conn, job_id)
    if job is None:  # cancelled, already submitted, or gone: nothing to send
        return DONE
    provider = ctx.providers[job["provider"]]
    if job["deadline_at"] <= dt.datetime.now(dt.UTC):
        async with ctx.pool.acquire() as conn:
            closed = await jobs.close(conn, job_id, JobStatus.EXPIRED, error_code=JobError.GIVE_UP,
                                      error_message="the give-up deadline passed before the job was submitted",
                                      cancel_at_provider=True)
        ctx.metrics.job_finished(provider.name, JobStatus.EXPIRED, closed)
        return DONE
    request = SubmitRequest(job_id=job_id, model=job["model"], input=job["input"],
                            callback_url=ctx.settings.callback_url(provider.name, job_id))

    if job["was_in_doubt"] and not provider.facts.idempotent_submit:
        # An earlier call never got an answer (the settler died, or the
        # provider timed out): the task may exist. Look, don't submit.
        return await _recover_in_doubt(ctx, job, provider, request)

    try:
        submitted = await provider.submit(request, idempotency_key=job_id)
    except Rejected as e:
        ctx.metrics.provider_call(provider.name, "submit", "rejected")
        async with ctx.pool.acquire() as conn:
            closed = await jobs.close(conn, job_id, JobStatus.FAILED, error_code=JobError.SUBMIT_REJECTED,
                                      error_message=str(e))
        ctx.metrics.job_finished(provider.name, JobStatus.FAILED, closed)
        return DONE
    except Transient as e:
        ctx.metrics.provider_call(provider.name, "submit", "transient")
        async with ctx.pool.acquire() as conn:
            await jobs.submit_settled(conn, job_id, f"submit: {e}")
        return Later(e.retry_after or policy.backoff(attempts), failed=True, reason=str(e))
    except Uncertain as e:
        ctx.metrics.provider_call(provider.name, "submit", "uncertain")
        async with ctx.pool.acquire() as conn:
            await jobs.note_error(conn, job_id, f"submit outcome unknown: {e}")
        if provider.facts.idempotent_submit:
            # The same key returns the same task: asking again is safe.
            return Later(policy.backoff(attempts), failed=True, reason=str(e))
        return await _recover_in_doubt(ctx, job, provider, request)
    ctx.metrics.provider_call(provider.name, "submit", "ok")
    return await _save(ctx, job, provider, request, submitted)


async def _recover_in_doubt(ctx: Context, job, provider, request: SubmitRequest) -> Outcome:
    job_id = job["id"]
    if provider.facts.can_find and request.callback_url:
        try:
            found = await provider.find(request)
        except Transient as e:
            return Later(policy.backoff(job["submit_attempts"]), failed=True, reason=str(e))
        if found is not None:
            return await _save(ctx, job, provider, request, found)
        if job["submit_attempts"] < policy.IN_DOUBT_FIND_ATTEMPTS:
            # Not listed yet may only mean not listed *yet*: look again.
            return Later(policy.backoff(job["submit_attempts"]), failed=False, reason="not found yet")
    async with ctx.pool.acquire() as conn:
        await jobs.mark_uncertain(conn, job_id, "the submit's outcome is unknown and the task could not be looked up")
    log.warning("job uncertain", extra={"job_id": job_id, "provider": provider.name})
    return DONE


async def _save(ctx: Context, job, provider, request: SubmitRequest, submitted: Submitted) -> Outcome:
    job_id = job["id"]
    secret = ctx.secretbox.encrypt(submitted.webhook_secret, job_id) if submitted.webhook_secret else None
    registered = request.callback_url is not None
    async with ctx.pool.acquire() as conn:
        result = await jobs.save_task(
            conn, job_id, task_id=submitted.task_id,
            operation=dict(submitted.operation) if submitted.operation else None,
            webhook_secret=secret, callback_registered=registered,
            # A task found again after an in-doubt submit may have finished
            # long ago, its webhook refused while we had no task id: look now.
            first_check_after_s=0.0 if job["was_in_doubt"] else timers.first_check_delay(
                provider.facts, callback_registered=registered,
                seconds_to_deadline=(job["deadline_at"] - dt.datetime.now(dt.UTC)).total_seconds()))
    if result == "closed":
        log.info("task saved on a closed job; provider cancel queued",
                 extra={"job_id": job_id, "provider": provider.name})
    return DONE
