"""The settle step: the ONE place a running job is closed.

Reached by three roads that only ever ask for it (outbox/roads/: a webhook, a
status read, a timer or the sweep). Whatever asked, it re-asks the provider,
and acts on what the provider says now:

- still running: look again later (a durable wait), or give up at the deadline;
- failed or cancelled at the provider: fail the job, refund everything;
- succeeded: copy every output into our storage first, then in ONE
  transaction mark the job succeeded, record the assets, charge the cost
  (capped at the reservation), refund the rest, free the slot, erase the
  secret and drop the intent (outbox/store.py, shared with the sync step,
  outbox/sync.py, which closes a sync call's job with its answer).

A failed download or write moves no money: the intent comes back later.
What to do in each case is decided in outbox/decide.py; this is the I/O.
"""
from __future__ import annotations

import datetime as dt
import logging
import time

from app.domain import events, jobs
from app.domain.record import JobRecord
from app.download import OutputTooLarge
from app.metrics import SETTLE_SECONDS
from app.providers.base import Observation, ProviderError, SubmitRequest, Submitted
from app.vocabulary import CallOutcome, JobStatus, ProviderCall
from outbox import decide
from outbox.context import Context
from outbox.outcome import DONE, Done, Later, Outcome
from outbox.store import close_job, remove_files, store_and_close
from outbox.submit import save_submitted

log = logging.getLogger("longcall.settler")


async def settle(ctx: Context, job_id: str, attempts: int, job=None) -> Outcome:
    """`job`: the row as the settler loaded it with its claim, or None to load it here."""
    started = time.monotonic()
    if job is None:
        async with ctx.pool.acquire() as conn:
            job = await jobs.load(conn, job_id)
    record = JobRecord.from_row(job) if job is not None else None
    if record is None:
        return DONE
    provider = ctx.providers[record.provider]
    facts = ctx.facts_for(provider, record.model)
    now = dt.datetime.now(dt.UTC)
    decision = decide.settle(record, None, now=now, attempts=attempts, facts=facts)
    if isinstance(decision, decide.ConfirmClaim):
        return await _confirm_claim(ctx, record, provider, decision.task_id, attempts)
    if not isinstance(decision, decide.AskProvider):
        return await _carry_out(ctx, record, provider, decision, attempts)

    seen: Observation | ProviderError
    try:
        seen = await provider.status(record.task)
    except ProviderError as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.ERROR)
        seen = e
    except OutputTooLarge as e:
        # An output inline in the answer, over the cap before it was written
        # out (the Gateway's base64 videos): as a download over the cap is.
        ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.OK)
        return await _carry_out(ctx, record, provider, decide.after_download_error(0, e, attempts), attempts)
    else:
        ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.OK)
    checked = _what_was_said(seen)
    try:
        decision = decide.settle(record, seen, now=now, attempts=attempts, facts=facts)
        closes = isinstance(decision, (decide.Close, decide.StoreOutputs))
        # A close writes the check's line itself (one statement fewer per job).
        outcome = await _carry_out(ctx, record, provider, decision, attempts, checked=checked if closes else None)
        if not closes or isinstance(outcome, Later):  # no close, or one that did not happen (to retry)
            async with ctx.pool.acquire() as conn:
                await events.status_checked(conn, job_id, checked)
    finally:
        if isinstance(seen, Observation):
            remove_files(seen)  # the adapter's files of an answer not stored (or already moved)
    if isinstance(decision, (decide.Close, decide.StoreOutputs)):
        SETTLE_SECONDS.labels(provider.name, type(outcome).__name__.lower()).observe(time.monotonic() - started)
    return outcome


def _what_was_said(seen: Observation | ProviderError) -> dict[str, str | None]:
    """A status check's line in the timeline: the provider's answer, bounded."""
    if isinstance(seen, Observation):
        return {"state": seen.state, "error": events.short(seen.error)}
    return {"state": None, "error": events.short(f"{type(seen).__name__}: {seen}")}


async def _confirm_claim(ctx: Context, job: JobRecord, provider, task_id: str, attempts: int) -> Outcome:
    """An uncertain job whose own verified webhook named `task_id`: adopt
    the task only once the provider, asked with our credentials, confirms it
    is this job's. The save asks for a settle at once (the intent stays due),
    so the job then settles like any running job."""
    request = SubmitRequest(job_id=job.id, model=job.model, input=job.input,
                            callback_url=ctx.settings.callback_url(provider.name, job.id))
    confirmed: Submitted | ProviderError | None
    try:
        confirmed = await provider.confirm_task(task_id, request)
    except ProviderError as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.ERROR)
        confirmed = e
    else:
        ctx.metrics.provider_call(provider.name, ProviderCall.STATUS, CallOutcome.OK)
    decision = decide.after_confirm(job, task_id, confirmed, now=dt.datetime.now(dt.UTC), attempts=attempts,
                                    facts=ctx.facts_for(provider, job.model))
    if isinstance(decision, decide.Retry):
        return decide.later(decision)
    if isinstance(decision, decide.DropClaim):
        async with ctx.pool.acquire() as conn:
            await jobs.drop_claim(conn, job.id, decision.task_id)
        log.warning("claimed task not confirmed", extra={"job_id": job.id, "provider": provider.name})
        # Still uncertain: its give-up timer goes on.
        return decide.later(decide.until_deadline(job, dt.datetime.now(dt.UTC)))
    saved = await save_submitted(ctx, job.id, decision.submitted, callback_registered=True,
                                 first_check_after_s=0.0, from_statuses=(JobStatus.UNCERTAIN,))
    log.info("uncertain job recovered by its webhook",
             extra={"job_id": job.id, "provider": provider.name, "saved": saved.name.lower()})
    return DONE


async def _carry_out(ctx: Context, job: JobRecord, provider, decision: decide.SettleDecision,
                     attempts: int, *, checked: dict[str, str | None] | None = None) -> Outcome:
    if isinstance(decision, Done):
        return decision
    if isinstance(decision, (decide.Wait, decide.Retry)):
        return decide.later(decision)
    if isinstance(decision, decide.Close):
        return await close_job(ctx, job, decision, checked=checked)
    if isinstance(decision, decide.StoreOutputs):
        return await store_and_close(ctx, job, provider, decision, attempts, checked=checked)
    raise TypeError(f"a settle step cannot carry out {decision!r}")
