"""Storing a job's outputs and closing it: what the settle step (a
finished task) and the sync step (a call's answer) share.

Every output is copied into our storage first (URLs downloaded, the
adapter's files moved, values written), then ONE statement marks the job
succeeded, records the assets and usage, charges (capped at the
reservation), refunds the rest and frees the slot. A failed download or
write moves no money: the intent comes back later.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from app import capacity, media, pricing
from app.domain import jobs
from app.domain.record import JobRecord
from app.download import Downloaded, DownloadError, OutputTooLarge, download_to_file
from app.metrics import DOWNLOAD_BYTES
from app.providers.base import Observation, OutputValue
from app.storage import object_key
from app.vocabulary import JobStatus
from outbox import decide
from outbox.context import Context
from outbox.outcome import DONE, GONE, Outcome

log = logging.getLogger("longcall.settler")


def remove_files(seen: Observation) -> None:
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


async def store_and_close(ctx: Context, job: JobRecord, provider, store: decide.StoreOutputs, attempts: int, *,
                          from_statuses: tuple[JobStatus, ...] | None = None,
                          checked: Mapping[str, Any] | None = None) -> Outcome:
    """Copy every output into storage, then close the job succeeded in one
    statement (from `from_statuses`: a sync job closes from `submitting`),
    with `checked`, the status check's timeline line, if any.
    A download or storage failure moves no money: the intent comes back."""
    downloaded: list[tuple[Downloaded, str | None]] = []  # each output's file and label, in index order
    adapters = {file.path for file in store.files}  # the caller's to remove; the rest are ours
    assets: list[jobs.Asset] = []  # the outputs stored: their files (ours) are the storage's now
    try:
        policy_ = ctx.download_policy(provider)
        for index, url in enumerate(store.urls):
            try:
                got = await download_to_file(url, policy_, ctx.download_dir)
            except DownloadError as e:
                return await after_output_error(ctx, job, decide.after_download_error(index, e, attempts),
                                                checked=checked)
            downloaded.append((got, store.url_label(index)))
            DOWNLOAD_BYTES.observe(got.bytes)
        # The adapter's files are the caller's to remove (a sync step keeps
        # its answer to store it again if the storage fails).
        for file in store.files:
            downloaded.append((Downloaded(file.path, file.bytes, file.sha256, file.content_type), file.label))
        for index, value in enumerate(store.values, start=len(downloaded)):
            try:
                got = await asyncio.to_thread(_spool, value, ctx.download_dir, policy_.max_bytes)
            except DownloadError as e:
                return await after_output_error(ctx, job, decide.after_download_error(index, e, attempts),
                                                checked=checked)
            downloaded.append((got, value.label))
        # Durations for a per-second price are read from the local copies,
        # before the storage may take them.
        charge = await _charge(ctx, job, store, downloaded)
        for index, (got, label) in enumerate(downloaded):
            key = object_key(job.owner_id, job.id, index)
            try:
                # Our own files (downloads, values) are given up to the storage,
                # which renames them into place where it can instead of copying;
                # the adapter's stay its caller's.
                await ctx.storage.put_file(key, got.path, got.content_type, got.sha256, got.bytes,
                                           move=got.path not in adapters)
            except Exception as e:  # storage down: keep the intent, move no money
                log.warning("storage write failed", extra={"job_id": job.id, "error": type(e).__name__})
                return decide.later(decide.after_store_error(index, e, attempts))
            assets.append(jobs.Asset(index, key, got.bytes, got.sha256, got.content_type, label))
    finally:
        for got, _ in downloaded[len(assets):]:
            if got.path in adapters:
                continue
            try:
                os.unlink(got.path)
            except FileNotFoundError:
                pass
    usage = [{"unit": u.unit.value, "amount": u.amount} for u in store.usage] or None
    operation = {"request_id": store.request_id} if store.request_id else None
    async with ctx.pool.acquire() as conn:
        closed = await jobs.close(conn, job.id, JobStatus.SUCCEEDED, charge=charge.credits, assets=assets,
                                  usage=usage, operation=operation, from_statuses=from_statuses,
                                  price_applied=charge.applied, checked=checked,
                                  wake_capacity=capacity.is_capped(ctx.settings, job.provider))
    if closed is not None:
        ctx.metrics.job_finished(provider.name, JobStatus.SUCCEEDED, closed)
        log.info("job succeeded", extra={"job_id": job.id, "owner": job.owner_id, "provider": provider.name,
                                         "charged": closed.charged, "outputs": len(assets)})
        return GONE  # the close dropped the job's intents
    return DONE


async def _charge(ctx: Context, job: JobRecord, store: decide.StoreOutputs,
                  downloaded: list[tuple[Downloaded, str | None]]) -> pricing.Charge:
    """The job's charge by its model's price, on what was measured: the
    stored files' durations are read (from the local copies, in a thread)
    only for a per-second price."""
    entry = ctx.settings.models.match(job.provider, job.model)
    price = entry.price if entry is not None else None
    seconds = None
    if price is not None and price.per == "second":
        seconds = await asyncio.to_thread(media.summed_duration_s,
                                          [(got.path, got.content_type) for got, _ in downloaded])
    measures = pricing.Measures(len(downloaded), seconds=seconds, usage=store.usage, provider_cost=store.cost)
    return pricing.charge(price, job.credits_reserved, measures)


async def after_output_error(ctx: Context, job: JobRecord, decision: decide.Close | decide.Retry | decide.Wait, *,
                             checked: Mapping[str, Any] | None = None) -> Outcome:
    """An output that could not be stored: closed (too large, refused,
    gone) or looked at again later."""
    if isinstance(decision, decide.Close):
        return await close_job(ctx, job, decision, checked=checked)
    return decide.later(decision)


async def close_job(ctx: Context, job: JobRecord, close: decide.Close, *,
                    checked: Mapping[str, Any] | None = None) -> Outcome:
    """`checked`: the status check's timeline line, written by the close."""
    async with ctx.pool.acquire() as conn:
        closed = await jobs.close(conn, job.id, close.status, error_code=close.error_code,
                                  error_message=close.message, cancel_at_provider=close.cancel_at_provider,
                                  wake_capacity=capacity.is_capped(ctx.settings, job.provider), checked=checked)
    if closed is not None:
        ctx.metrics.job_finished(job.provider, close.status, closed)
        log.info("job closed", extra={"job_id": job.id, "owner": job.owner_id, "provider": job.provider,
                                      "status": close.status, "error_code": close.error_code})
        return GONE  # the close dropped the job's intents
    return DONE
