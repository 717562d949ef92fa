"""The sync step: one paid call whose answer is the result (LLM messages,
speech), for a job of a sync model. Reached from the submit step once it
has claimed the job (queued -> submitting).

The call's start is saved before the call; the call runs under the submit
intent's lease (the drain loop renews it while the step runs) and no
transaction is open across it. Its answer, written to a file by the
adapter with the byte cap and sha256, is stored as output 0 and the job
closes in one statement with its usage and charge. A call that may have
been made without its answer being saved is never made again: it is looked
up where the provider keeps a record (ElevenLabs' speech history), else the
job fails `call_lost`, refunded, once no worker can still hold the call.
What to do in each case is decided in outbox/decide.py; this is the I/O.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging

from app.domain import jobs, pauses
from app.domain.record import JobRecord
from app.download_errors import OutputTooLarge
from app.providers.base import (
    Observation,
    ProviderError,
    ProviderFacts,
    Rejected,
    SubmitRequest,
    Transient,
    Uncertain,
)
from app.vocabulary import CallOutcome, JobError, JobStatus, ProviderCall
from outbox import decide, policy
from outbox.context import Context
from outbox.outcome import DONE, Later, Outcome
from outbox.store import after_output_error, close_job, remove_files, store_and_close

log = logging.getLogger("longcall.settler")

CallResult = Observation | ProviderError | OutputTooLarge


async def call(ctx: Context, job: JobRecord, provider, facts: ProviderFacts, attempts: int) -> Outcome:
    """`job`: as begin_submit claimed it (`was_in_doubt` says whether an
    earlier claim's call may have been made)."""
    request = SubmitRequest(job_id=job.id, model=job.model, input=job.input, callback_url=None,
                            first_attempt_at=job.provider_call_started_at, deadline_at=job.deadline_at,
                            call_timeout_s=facts.call_timeout_s)
    decision: decide.SyncDecision = decide.sync_call(job, None, now=_now(), attempts=attempts, facts=facts)
    result: CallResult | None = None
    try:
        if isinstance(decision, decide.Call):
            async with ctx.pool.acquire() as conn:
                started = await jobs.start_call(conn, job.id)
            if started is None:  # cancelled since the claim: nothing is called
                return DONE
            request = _started(request, started)
            result = await _call(ctx, provider, request, facts)
            if isinstance(result, OutputTooLarge):
                return await after_output_error(ctx, job, decide.after_download_error(0, result, attempts))
            if isinstance(result, Transient):
                async with ctx.pool.acquire() as conn:
                    await jobs.submit_settled(conn, job.id, f"call: {result}")
                    await pauses.pause_if_asked(conn, provider.name, result)
            decision = decide.sync_call(job, result, now=_now(), attempts=attempts, facts=facts)
        if isinstance(decision, decide.Recover):
            found = await _recover(ctx, provider, request)
            if isinstance(found, OutputTooLarge):
                return await after_output_error(ctx, job, decide.after_download_error(0, found, attempts))
            if isinstance(found, Observation):
                result = found
            decision = decide.after_recover(job, found, now=_now(), attempts=attempts, facts=facts)
        return await _carry_out(ctx, job, provider, decision, attempts)
    finally:
        if isinstance(result, Observation):
            remove_files(result)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _started(request: SubmitRequest, started: dt.datetime) -> SubmitRequest:
    return SubmitRequest(job_id=request.job_id, model=request.model, input=request.input, callback_url=None,
                         first_attempt_at=started, deadline_at=request.deadline_at,
                         call_timeout_s=request.call_timeout_s)


async def _call(ctx: Context, provider, request: SubmitRequest, facts: ProviderFacts) -> CallResult:
    """The one call, bounded as a whole by the model's timeout (the
    adapter's own timeouts bound each read)."""
    try:
        async with asyncio.timeout(facts.call_timeout_s):
            answer = await provider.call(request)
    except TimeoutError:
        answer = Uncertain(f"{provider.name}: no whole answer within the call's {facts.call_timeout_s:g} s timeout")
    except (ProviderError, OutputTooLarge) as e:
        answer = e
    ctx.metrics.provider_call(provider.name, ProviderCall.CALL, _outcome(answer))
    return answer


async def _recover(ctx: Context, provider, request: SubmitRequest) -> Observation | ProviderError | \
        OutputTooLarge | None:
    try:
        found = await provider.recover(request)
    except (ProviderError, OutputTooLarge) as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.ERROR)
        return e
    ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.OK)
    if found is not None:
        log.info("lost call recovered from the provider's records",
                 extra={"job_id": request.job_id, "provider": provider.name})
    return found


def _outcome(answer: CallResult) -> CallOutcome:
    if isinstance(answer, Rejected):
        return CallOutcome.REJECTED
    if isinstance(answer, Transient):
        return CallOutcome.TRANSIENT
    if isinstance(answer, Uncertain):
        return CallOutcome.UNCERTAIN
    return CallOutcome.ERROR if isinstance(answer, ProviderError) else CallOutcome.OK


async def _carry_out(ctx: Context, job: JobRecord, provider, decision: decide.SyncDecision,
                     attempts: int) -> Outcome:
    if isinstance(decision, decide.Close):
        if decision.error_code == JobError.CALL_LOST:
            log.warning("sync call lost", extra={"job_id": job.id, "provider": provider.name})
        return await close_job(ctx, job, decision)
    if isinstance(decision, (decide.Wait, decide.Retry)):
        return decide.later(decision)
    if isinstance(decision, decide.StoreOutputs):
        return await _store(ctx, job, provider, decision, attempts)
    raise TypeError(f"a sync step cannot carry out {decision!r}")


async def _store(ctx: Context, job: JobRecord, provider, store: decide.StoreOutputs, attempts: int) -> Outcome:
    """Store the answer and close the job. The answer exists only in this
    worker's file: a storage failure is tried again here, with backoff,
    while the lease holds, before the answer is given up (the job is then
    a lost call, never called again)."""
    outcome: Outcome = DONE
    for attempt in range(1, policy.SYNC_STORE_ATTEMPTS + 1):
        outcome = await store_and_close(ctx, job, provider, store, attempts, from_statuses=(JobStatus.SUBMITTING,))
        if not isinstance(outcome, Later) or not outcome.failed:
            return outcome
        if attempt < policy.SYNC_STORE_ATTEMPTS:
            await asyncio.sleep(policy.backoff(attempt))
    log.warning("could not store a sync call's answer", extra={"job_id": job.id, "provider": provider.name})
    return outcome
