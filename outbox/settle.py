"""The settle step: the ONE place a running job is closed.

Reached by three roads that only ever ask for it (outbox/roads/: a webhook, a
status read, a timer or the sweep). Whatever asked, it re-asks the provider,
and acts on what the provider says now:

- still running: look again later (a durable wait), or give up at the deadline;
- failed or cancelled at the provider: fail the job, refund everything;
- succeeded: copy every output into our storage first, then in ONE
  transaction mark the job succeeded, record the assets, charge the cost
  (capped at the reservation), refund the rest, free the slot, erase the
  secret and drop the intent.

A failed download or write moves no money: the intent comes back later.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import time

from app.domain import jobs, states
from app.download import DownloadError, OutputTooLarge, Refused, download_to_file
from app.metrics import DOWNLOAD_BYTES, SETTLE_SECONDS
from app.providers.base import Observation, ProviderError, Task, TaskState
from app.storage import object_key
from app.vocabulary import TERMINAL, JobError, JobStatus
from outbox import policy
from outbox.context import Context
from outbox.outcome import DONE, Later, Outcome
from outbox.roads import timers

log = logging.getLogger("longcall.settler")


async def settle(ctx: Context, job_id: str, attempts: int, job=None) -> Outcome:
    """`job`: the row as the settler loaded it with its claim, or None to load it here."""
    started = time.monotonic()
    if job is None:
        async with ctx.pool.acquire() as conn:
            job = await jobs.load(conn, job_id)
    if job is None or job["status"] in TERMINAL:
        return DONE
    if job["status"] in (JobStatus.QUEUED, JobStatus.SUBMITTING):
        # A webhook can beat the saved task id: ask again in a moment.
        return Later(policy.NOT_YET_SUBMITTED_RETRY_S, failed=False, reason="not submitted yet")
    provider = ctx.providers[job["provider"]]
    now = dt.datetime.now(dt.UTC)
    if job["status"] == JobStatus.UNCERTAIN:
        # No task to ask about; only the deadline (or an operator) closes it.
        if job["deadline_at"] <= now:
            return await _close(ctx, job, JobStatus.EXPIRED, error_code=JobError.GIVE_UP,
                                error_message="gave up on an uncertain submit", cancel=True)
        return DONE
    if job["deadline_at"] <= now:
        return await _close(ctx, job, JobStatus.EXPIRED, error_code=JobError.GIVE_UP,
                            error_message="the provider did not finish before the give-up deadline",
                            cancel=True)

    task = Task(task_id=job["provider_task_id"], operation=job["provider_operation"], model=job["model"])
    try:
        seen = await provider.status(task)
    except ProviderError as e:
        ctx.metrics.provider_call(provider.name, "status", "error")
        return Later(policy.backoff(attempts), failed=True, reason=f"status: {e}")
    ctx.metrics.provider_call(provider.name, "status", "ok")

    if seen.state == TaskState.RUNNING:
        delay = timers.next_check_delay(provider.facts, callback_registered=job["callback_registered"],
                                        age_s=(now - job["created_at"]).total_seconds(),
                                        seconds_to_deadline=(job["deadline_at"] - now).total_seconds())
        return Later(delay, failed=False, reason="still running")
    if seen.state in (TaskState.FAILED, TaskState.CANCELLED):
        outcome = await _close(ctx, job, JobStatus.FAILED, error_code=JobError.PROVIDER_FAILED,
                               error_message=seen.error or f"the provider reports the task {seen.state.value}")
    else:
        outcome = await _succeed(ctx, job, provider, seen, attempts)
    SETTLE_SECONDS.labels(provider.name, type(outcome).__name__.lower()).observe(time.monotonic() - started)
    return outcome


async def _succeed(ctx: Context, job, provider, seen: Observation, attempts: int) -> Outcome:
    job_id, owner_id = job["id"], job["owner_id"]
    downloaded = []
    try:
        policy_ = ctx.download_policy(provider)
        for index, url in enumerate(seen.output_urls):
            try:
                got = await download_to_file(url, policy_, ctx.download_dir)
            except OutputTooLarge as e:
                return await _close(ctx, job, JobStatus.FAILED, error_code=JobError.OUTPUT_TOO_LARGE,
                                    error_message=str(e))
            except Refused as e:
                # Policy, not luck: asking again can never succeed.
                return await _close(ctx, job, JobStatus.FAILED, error_code=JobError.OUTPUT_REFUSED,
                                    error_message=str(e))
            except DownloadError as e:
                return Later(policy.backoff(attempts), failed=True, reason=f"download {index}: {e}")
            downloaded.append(got)
            DOWNLOAD_BYTES.observe(got.bytes)
        assets = []
        for index, got in enumerate(downloaded):
            key = object_key(owner_id, job_id, index)
            try:
                await ctx.storage.put_file(key, got.path, got.content_type, got.sha256, got.bytes)
            except Exception as e:  # storage down: keep the intent, move no money
                log.warning("storage write failed", extra={"job_id": job_id, "error": type(e).__name__})
                return Later(policy.backoff(attempts), failed=True, reason=f"store {index}: {type(e).__name__}")
            assets.append(jobs.Asset(index, key, got.bytes, got.sha256, got.content_type))
    finally:
        for got in downloaded:
            try:
                os.unlink(got.path)
            except FileNotFoundError:
                pass
    charge = states.charge_for(job["credits_reserved"], seen.cost)
    async with ctx.pool.acquire() as conn:
        closed = await jobs.close(conn, job_id, JobStatus.SUCCEEDED, charge=charge, assets=assets)
    if closed is not None:
        ctx.metrics.job_finished(provider.name, JobStatus.SUCCEEDED, closed)
        log.info("job succeeded", extra={"job_id": job_id, "owner": owner_id, "provider": provider.name,
                                         "charged": closed.charged, "outputs": len(assets)})
    return DONE


async def _close(ctx: Context, job, status: str, *, error_code: str, error_message: str,
                 cancel: bool = False) -> Outcome:
    async with ctx.pool.acquire() as conn:
        closed = await jobs.close(conn, job["id"], status, error_code=error_code,
                                  error_message=error_message, cancel_at_provider=cancel)
    if closed is not None:
        ctx.metrics.job_finished(job["provider"], status, closed)
        log.info("job closed", extra={"job_id": job["id"], "owner": job["owner_id"],
                                      "provider": job["provider"], "status": status, "error_code": error_code})
    return DONE
