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
What to do in each case is decided in outbox/decide.py; this is the I/O.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import os
import tempfile
import time

from app.domain import jobs
from app.domain.record import JobRecord
from app.download import Downloaded, DownloadError, OutputTooLarge, download_to_file
from app.metrics import DOWNLOAD_BYTES, SETTLE_SECONDS
from app.providers.base import Observation, OutputValue, ProviderError, SubmitRequest, Submitted
from app.storage import object_key
from app.vocabulary import CallOutcome, JobStatus, ProviderCall
from outbox import decide
from outbox.context import Context
from outbox.outcome import DONE, Done, Outcome
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
    facts = provider.facts_for(record.model)
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
    try:
        decision = decide.settle(record, seen, now=now, attempts=attempts, facts=facts)
        outcome = await _carry_out(ctx, record, provider, decision, attempts)
    finally:
        if isinstance(seen, Observation):
            _remove_files(seen)  # the adapter's files of an answer not stored (or already moved)
    if isinstance(decision, (decide.Close, decide.StoreOutputs)):
        SETTLE_SECONDS.labels(provider.name, type(outcome).__name__.lower()).observe(time.monotonic() - started)
    return outcome


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
    decision = decide.after_confirm(task_id, confirmed, attempts=attempts)
    if isinstance(decision, decide.Retry):
        return decide.later(decision)
    if isinstance(decision, decide.DropClaim):
        async with ctx.pool.acquire() as conn:
            await jobs.drop_claim(conn, job.id, decision.task_id)
        log.warning("claimed task not confirmed", extra={"job_id": job.id, "provider": provider.name})
        return DONE
    saved = await save_submitted(ctx, job.id, decision.submitted, callback_registered=True,
                                 first_check_after_s=0.0, from_statuses=(JobStatus.UNCERTAIN,))
    log.info("uncertain job recovered by its webhook",
             extra={"job_id": job.id, "provider": provider.name, "saved": saved.name.lower()})
    return DONE


async def _carry_out(ctx: Context, job: JobRecord, provider, decision: decide.SettleDecision,
                     attempts: int) -> Outcome:
    if isinstance(decision, Done):
        return decision
    if isinstance(decision, (decide.Wait, decide.Retry)):
        return decide.later(decision)
    if isinstance(decision, decide.Close):
        return await _close(ctx, job, decision)
    if isinstance(decision, decide.StoreOutputs):
        return await _succeed(ctx, job, provider, decision, attempts)
    raise TypeError(f"a settle step cannot carry out {decision!r}")


def _remove_files(seen: Observation) -> None:
    for file in seen.files:
        try:
            os.unlink(file.path)
        except FileNotFoundError:
            pass


def _spool(value: OutputValue, directory: str, max_bytes: int) -> Downloaded:
    """A value output as a file in `directory`, like a download's: the
    storage takes every output the same way, by path, sha256 and size."""
    if len(value.data) > max_bytes:
        raise OutputTooLarge(f"output is larger than the {max_bytes} byte cap")
    try:
        fd, path = tempfile.mkstemp(prefix=".value-", suffix=".part", dir=directory)
    except OSError as exc:
        raise DownloadError(f"could not create a file for the output ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(value.data)
    except OSError as exc:  # the disk: full, gone, read-only
        os.unlink(path)
        raise DownloadError(f"could not write the output ({exc.strerror})") from None
    return Downloaded(path=path, bytes=len(value.data), sha256=hashlib.sha256(value.data).hexdigest(),
                      content_type=value.content_type)


async def _succeed(ctx: Context, job: JobRecord, provider, store: decide.StoreOutputs, attempts: int) -> Outcome:
    downloaded: list[tuple[Downloaded, str | None]] = []  # each output's file and label, in index order
    try:
        policy_ = ctx.download_policy(provider)
        for index, url in enumerate(store.urls):
            try:
                got = await download_to_file(url, policy_, ctx.download_dir)
            except DownloadError as e:
                return await _carry_out(ctx, job, provider, decide.after_download_error(index, e, attempts),
                                        attempts)
            downloaded.append((got, store.url_label(index)))
            DOWNLOAD_BYTES.observe(got.bytes)
        for file in store.files:
            downloaded.append((Downloaded(file.path, file.bytes, file.sha256, file.content_type), file.label))
        for index, value in enumerate(store.values, start=len(downloaded)):
            try:
                got = await asyncio.to_thread(_spool, value, ctx.download_dir, policy_.max_bytes)
            except DownloadError as e:
                return await _carry_out(ctx, job, provider, decide.after_download_error(index, e, attempts),
                                        attempts)
            downloaded.append((got, value.label))
        assets = []
        for index, (got, label) in enumerate(downloaded):
            key = object_key(job.owner_id, job.id, index)
            try:
                await ctx.storage.put_file(key, got.path, got.content_type, got.sha256, got.bytes)
            except Exception as e:  # storage down: keep the intent, move no money
                log.warning("storage write failed", extra={"job_id": job.id, "error": type(e).__name__})
                return decide.later(decide.after_store_error(index, e, attempts))
            assets.append(jobs.Asset(index, key, got.bytes, got.sha256, got.content_type, label))
    finally:
        for got, _ in downloaded:
            try:
                os.unlink(got.path)
            except FileNotFoundError:
                pass
    usage = [{"unit": u.unit.value, "amount": u.amount} for u in store.usage] or None
    async with ctx.pool.acquire() as conn:
        closed = await jobs.close(conn, job.id, JobStatus.SUCCEEDED, charge=store.charge, assets=assets,
                                  usage=usage)
    if closed is not None:
        ctx.metrics.job_finished(provider.name, JobStatus.SUCCEEDED, closed)
        log.info("job succeeded", extra={"job_id": job.id, "owner": job.owner_id, "provider": provider.name,
                                         "charged": closed.charged, "outputs": len(assets)})
    return DONE


async def _close(ctx: Context, job: JobRecord, close: decide.Close) -> Outcome:
    async with ctx.pool.acquire() as conn:
        closed = await jobs.close(conn, job.id, close.status, error_code=close.error_code,
                                  error_message=close.message, cancel_at_provider=close.cancel_at_provider)
    if closed is not None:
        ctx.metrics.job_finished(job.provider, close.status, closed)
        log.info("job closed", extra={"job_id": job.id, "owner": job.owner_id, "provider": job.provider,
                                      "status": close.status, "error_code": close.error_code})
    return DONE
