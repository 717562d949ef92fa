"""The notify step: one attempt to deliver one notification to one endpoint.

Its intent was written with the job's transition (app/domain/notifications.py),
one per delivery. Each attempt signs the body afresh (Standard Webhooks: a
new timestamp, the same `webhook-id`), POSTs it through app/delivery.py's
guarded sender and records the answer in one statement; a 2xx ends the
delivery, anything else comes back on the NOTIFY_RETRY_S schedule until its
24 h are out, then the delivery is `failed`. A settler killed mid-attempt
leaves the intent claimed; its lease brings it back and the same
notification is sent again with the same id (delivery is at least once).

A slow endpoint holds only its own places: at most PLACES_PER_ENDPOINT
attempts at once go to one endpoint from a settler, and notify intents are
claimed from their own share of the settler's slots (outbox/settler.py), so
settling never waits behind a dead receiver.
"""
from __future__ import annotations

import json
import logging
import time

from app.delivery import (
    EndpointRefused,
    SendFailed,
    is_delivered,
    is_held_past_retries,
    next_attempt_in,
    signed_headers,
)
from app.domain import notifications
from app.download import HostBusy
from app.jobjson import iso, read_token, render_job, row_of_snapshot
from app.vocabulary import DeliveryStatus
from outbox.context import Context
from outbox.outcome import DONE, Later, Outcome

log = logging.getLogger("longcall.settler")

PLACES_PER_ENDPOINT = 4
PLACE_WAIT_S = 1.0
ENDPOINT_BUSY_RETRY_S = 2.0  # no place free at the endpoint: look again (no attempt counted)


def notification_body(row, secret_key: bytes, now: float) -> bytes:
    """The delivery's body: the notification with the job as it was at its
    transition (its `status_url` carrying a read token made now)."""
    job = row_of_snapshot(row["data"])
    body = {"id": row["notification_id"], "type": row["type"], "created_at": iso(row["created_at"]),
            "data": render_job(job, read_token(job["id"], secret_key, now))}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


async def notify(ctx: Context, delivery_id: int) -> Outcome:
    async with ctx.pool.acquire() as conn:
        row = await notifications.load_delivery(conn, delivery_id)
    if row is None or row["status"] != DeliveryStatus.PENDING:
        return DONE  # delivered, ended, or redelivered under another intent
    job_id = row["job_id"]
    now = time.time()
    elapsed = now - row["retry_from"].timestamp()
    if row["deleted_at"] is not None:
        await _end(ctx, delivery_id, job_id, "the endpoint was deleted")
        return DONE
    if is_held_past_retries(elapsed):  # its intent outlived the 24 h (settlers down for a day)
        await _end(ctx, delivery_id, job_id, "not delivered within 24 h")
        return DONE
    secret = ctx.secretbox.decrypt(row["secret"], row["endpoint_id"])
    if secret is None:  # SECRET_KEY rotated away from the key that sealed it
        await _end(ctx, delivery_id, job_id, "the endpoint's secret cannot be read with this SECRET_KEY")
        return DONE
    body = notification_body(row, ctx.settings.secret_key, now)
    headers = signed_headers(secret, row["notification_id"], int(now), body)
    status_code: int | None = None
    error: str | None = None
    try:
        async with ctx.endpoint_places.place(row["endpoint_id"], PLACE_WAIT_S):
            status_code = await ctx.sender.send(row["url"], body, headers)
    except HostBusy:
        return Later(ENDPOINT_BUSY_RETRY_S, failed=False)
    except (EndpointRefused, SendFailed) as e:
        error = str(e)
    if status_code is not None and is_delivered(status_code):
        await _record(ctx, delivery_id, job_id, DeliveryStatus.DELIVERED, status_code, None)
        return DONE
    if error is None:
        error = f"HTTP {status_code}"
    delay = next_attempt_in(row["attempts"] + 1, ctx.settings.notify_retry_s, time.time() - now + elapsed)
    if delay is None:
        await _record(ctx, delivery_id, job_id, DeliveryStatus.FAILED, status_code, error)
        log.warning("notification given up", extra={"job_id": job_id, "endpoint_id": row["endpoint_id"]})
        return DONE
    if await _record(ctx, delivery_id, job_id, DeliveryStatus.PENDING, status_code, error) is None:
        return DONE
    return Later(delay, failed=False)


async def give_up(ctx: Context, delivery_id: int, job_id: str) -> None:
    """The intent failed too often with errors of our own (not the endpoint's)."""
    await _end(ctx, delivery_id, job_id, "gave up after repeated errors")


async def _end(ctx: Context, delivery_id: int, job_id: str, why: str) -> None:
    """Fail the delivery without a request."""
    async with ctx.pool.acquire() as conn:
        await notifications.record_attempt(conn, delivery_id, job_id, DeliveryStatus.FAILED, None, why,
                                           attempted=False)


async def _record(ctx: Context, delivery_id: int, job_id: str, status: DeliveryStatus, status_code: int | None,
                  error: str | None) -> int | None:
    async with ctx.pool.acquire() as conn:
        return await notifications.record_attempt(conn, delivery_id, job_id, status, status_code, error)
