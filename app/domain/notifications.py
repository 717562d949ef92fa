"""Notifications to the client: endpoints, notifications, deliveries.

Owns the `webhook_endpoints`, `notifications`, `deliveries` and
`delivery_attempts` tables.

A notification is never written on its own: `written_with` gives the CTEs
that the statement moving a job (app/domain/jobs.py: running, uncertain,
every close) appends to itself, so the notification, its deliveries and
their `notify` intents commit with the transition or not at all. A
transition is *notified* when at least one of the owner's endpoints asks
for its event; otherwise nothing is written (no endpoint, no cost). The
endpoints of a platform receive its owners' notifications too.

Who sees a delivery: the owner of its endpoint, and the platform of the
notification's job owner (which may act for that owner anyway). A
notification is listed for whoever sees one of its deliveries.

Delivery (outbox/notify.py) records each attempt here with one statement,
which also appends the job's timeline line when the delivery ends.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from app.db import OUTBOX_CHANNEL
from app.vocabulary import DeliveryStatus, EventType, IntentKind


# The job as the API shows it, from CTE `j` (its new row) and an outputs
# expression: app/jobjson.row_of_snapshot reads it back. No secret column.
def snapshot(j: str, outputs: str) -> str:
    return f"""jsonb_build_object(
    'id', {j}.id, 'owner_id', {j}.owner_id, 'status', {j}.status, 'provider', {j}.provider,
    'model', {j}.model, 'input', {j}.input, 'created_at', {j}.created_at, 'updated_at', {j}.updated_at,
    'finished_at', {j}.finished_at, 'credits_reserved', {j}.credits_reserved,
    'credits_charged', {j}.credits_charged, 'credits_refunded', {j}.credits_refunded,
    'error_code', {j}.error_code, 'error_message', {j}.error_message, 'metadata', {j}.metadata,
    'outputs', {outputs})"""


def stored_outputs(j: str) -> str:
    """The outputs already in `assets` (rows written by an earlier statement)."""
    return f"""coalesce((select jsonb_agg(jsonb_build_object(
        'index', a.index, 'content_type', a.content_type, 'bytes', a.bytes, 'sha256', a.sha256,
        'label', a.label) order by a.index) from assets a where a.job_id = {j}.id), '[]'::jsonb)"""


def written_with(j: str, outputs: str) -> str:
    """CTEs (each starting with a comma) that write the notification of the
    transition CTE `j` made — `j` returns the job's new row, one job — for
    each endpoint of its owner, or of its owner's platform, that asks for
    the event. The statement's final
    select must wake the settlers when `n_intents` wrote anything
    (`wakes_settlers`)."""
    return f""",
n_owner as (
    select o.platform_id from {j} join owners o on o.id = {j}.owner_id
), n_endpoints as (
    select e.id as endpoint_id, {j}.id as job_id
    from {j} join webhook_endpoints e
      on e.owner_id in ({j}.owner_id, (select platform_id from n_owner)) and e.deleted_at is null
    where 'job.' || {j}.status = any(e.events)
), n_notification as (
    insert into notifications (id, owner_id, platform_id, job_id, type, data)
    select 'evt_' || replace(gen_random_uuid()::text, '-', ''), {j}.owner_id, (select platform_id from n_owner),
           {j}.id, 'job.' || {j}.status, {snapshot(j, outputs)}
    from {j} where exists (select 1 from n_endpoints)
    returning id, job_id
), n_deliveries as (
    insert into deliveries (notification_id, endpoint_id)
    select n.id, e.endpoint_id from n_notification n join n_endpoints e on e.job_id = n.job_id
    returning id, notification_id
), n_intents as (
    insert into outbox (job_id, kind, delivery_id)
    select n.job_id, '{IntentKind.NOTIFY}', d.id
    from n_deliveries d join n_notification n on n.id = d.notification_id
    returning 1
)"""


WAKES_SETTLERS = "exists (select 1 from n_intents)"


# --- endpoints -----------------------------------------------------------------

CREATE_ENDPOINT = """
insert into webhook_endpoints (id, owner_id, url, events, secret) values ($1, $2, $3, $4, $5)
returning id, url, events, created_at
"""
LIST_ENDPOINTS = """
select id, url, events, created_at from webhook_endpoints
where owner_id = $1 and deleted_at is null order by created_at, id
"""
# The endpoint's pending deliveries end with it (failed: nothing more is
# sent), each with its line in its job's timeline.
DELETE_ENDPOINT = f"""
with gone as (
    update webhook_endpoints set deleted_at = now()
    where id = $1 and owner_id = $2 and deleted_at is null
    returning id
), ended as (
    update deliveries set status = '{DeliveryStatus.FAILED}', last_error = 'the endpoint was deleted'
    where endpoint_id in (select id from gone) and status = '{DeliveryStatus.PENDING}'
    returning notification_id, endpoint_id, attempts
), lines as (
    insert into job_events (job_id, type, detail)
    select n.job_id, '{EventType.NOTIFICATION_FAILED}',
           jsonb_build_object('notification_id', e.notification_id, 'endpoint_id', e.endpoint_id,
                              'attempts', e.attempts, 'status_code', null::int)
    from ended e join notifications n on n.id = e.notification_id
)
select id from gone
"""
MAX_ENDPOINTS_PER_OWNER = 20
# Under the owner's row lock (taken first, in the creating transaction): the
# count then sees every endpoint committed before it, so concurrent creates
# cannot pass the limit together.
LOCK_OWNER = "select 1 from owners where id = $1 for update"
COUNT_ENDPOINTS = "select count(*) from webhook_endpoints where owner_id = $1 and deleted_at is null"


@dataclass(frozen=True)
class Endpoint:
    id: str
    url: str
    events: list[str]
    created_at: dt.datetime


async def create_endpoint(conn, *, endpoint_id: str, owner_id: str, url: str, events: Sequence[str],
                          encrypted_secret: bytes) -> Endpoint:
    row = await conn.fetchrow(CREATE_ENDPOINT, endpoint_id, owner_id, url, list(events), encrypted_secret)
    return Endpoint(row["id"], row["url"], list(row["events"]), row["created_at"])


async def count_endpoints_locked(conn, owner_id: str) -> int:
    """The owner's endpoints, its row locked until the caller's transaction ends."""
    await conn.execute(LOCK_OWNER, owner_id)
    return int(await conn.fetchval(COUNT_ENDPOINTS, owner_id))


async def list_endpoints(conn, owner_id: str) -> list[Endpoint]:
    return [Endpoint(r["id"], r["url"], list(r["events"]), r["created_at"])
            for r in await conn.fetch(LIST_ENDPOINTS, owner_id)]


async def delete_endpoint(conn, endpoint_id: str, owner_id: str) -> bool:
    return await conn.fetchval(DELETE_ENDPOINT, endpoint_id, owner_id) is not None


# --- notifications, as the owner reads them --------------------------------------

# The deliveries of notification `n` that owner $1 sees.
_SEEN = """
from deliveries d join webhook_endpoints e on e.id = d.endpoint_id
where d.notification_id = n.id and (e.owner_id = $1 or n.platform_id = $1)
"""
LIST_NOTIFICATIONS = f"""
select n.id, n.type, n.job_id, n.created_at,
       (select json_agg(json_build_object(
                  'endpoint_id', d.endpoint_id, 'status', d.status, 'attempts', d.attempts,
                  'last_status_code', d.last_status_code, 'last_attempt_at', d.last_attempt_at)
                  order by d.id) {_SEEN}) as deliveries
from notifications n
where (n.owner_id = $1 or n.platform_id = $1) and exists (select 1 {_SEEN})
  and ($2::text is null or n.job_id = $2) and ($6::text is null or n.id = $6)
  and ($3::timestamptz is null or (n.created_at, n.id) < ($3, $4))
order by n.created_at desc, n.id desc limit $5
"""

# Queue a notification again: each of its deliveries that the owner sees, is
# not pending and whose endpoint still exists goes back to pending, with a new 24 h counted
# from now and its attempt count restarted, and a notify intent due now.
REDELIVER = f"""
with n as (
    select id, job_id, platform_id from notifications n
    where id = $1 and (owner_id = $2 or platform_id = $2)
      and exists (select 1 {_SEEN.replace("$1", "$2")})
), again as (
    update deliveries d set status = '{DeliveryStatus.PENDING}', attempts = 0, last_error = null,
        retry_from = now()
    from n, webhook_endpoints e
    where d.notification_id = n.id and e.id = d.endpoint_id and e.deleted_at is null
      and (e.owner_id = $2 or n.platform_id = $2)
      and d.status <> '{DeliveryStatus.PENDING}'
    returning d.id
), intents as (
    insert into outbox (job_id, kind, delivery_id)
    select n.job_id, '{IntentKind.NOTIFY}', again.id from n, again
    on conflict (job_id, kind, delivery_id) do update set not_before = now(), generation = outbox.generation + 1
    returning 1
)
select (select count(*) from n) as found, (select count(*) from again) as requeued,
       case when exists (select 1 from intents) then pg_notify('{OUTBOX_CHANNEL}', '') end
"""


async def list_notifications(conn, owner_id: str, *, job_id: str | None, limit: int,
                             after: tuple[dt.datetime, str] | None) -> list[asyncpg.Record]:
    created_at, last_id = after if after else (None, None)
    return await conn.fetch(LIST_NOTIFICATIONS, owner_id, job_id, created_at, last_id, limit, None)


async def get_notification(conn, owner_id: str, notification_id: str) -> asyncpg.Record | None:
    rows = await conn.fetch(LIST_NOTIFICATIONS, owner_id, None, None, None, 1, notification_id)
    return rows[0] if rows else None


async def redeliver(conn, notification_id: str, owner_id: str) -> int | None:
    """How many deliveries were queued again (0: each is still pending or
    its endpoint is gone); None when the owner has no such notification."""
    row = await conn.fetchrow(REDELIVER, notification_id, owner_id)
    return int(row["requeued"]) if row["found"] else None


# --- delivery (the settler's notify step) ------------------------------------------

# Everything one attempt needs, the endpoint's secret included (never rendered).
LOAD_DELIVERY = """
select d.id, d.status, d.attempts, d.retry_from, d.notification_id, n.type, n.data, n.created_at,
       n.job_id, e.id as endpoint_id, e.url, e.secret, e.deleted_at
from deliveries d join notifications n on n.id = d.notification_id
join webhook_endpoints e on e.id = d.endpoint_id
where d.id = $1
"""

# One attempt's result. $3 the new status, $4 status code (null: no answer),
# $5 a short error, $6 whether a request was made (false: the delivery ends
# without one — its endpoint deleted, its 24 h out). The attempt is kept in `delivery_attempts`; a delivery
# that ends (delivered or failed) adds its line to the job's timeline, all in
# the same statement.
RECORD_ATTEMPT = f"""
with d as (
    update deliveries set status = $3, attempts = attempts + case when $6::boolean then 1 else 0 end,
        last_error = $5,
        last_status_code = case when $6 then $4 else last_status_code end,
        last_attempt_at = case when $6 then now() else last_attempt_at end
    where id = $1 and status = '{DeliveryStatus.PENDING}'
    returning id, notification_id, endpoint_id, status, attempts
), attempt as (
    insert into delivery_attempts (delivery_id, status_code, error)
    select id, $4, $5 from d where $6
), line as (
    insert into job_events (job_id, type, detail)
    select $2, case d.status when '{DeliveryStatus.DELIVERED}' then '{EventType.NOTIFICATION_DELIVERED}'
                             else '{EventType.NOTIFICATION_FAILED}' end,
           jsonb_build_object('notification_id', d.notification_id, 'endpoint_id', d.endpoint_id,
                              'attempts', d.attempts, 'status_code', $4::int)
    from d where d.status <> '{DeliveryStatus.PENDING}'
)
select attempts from d
"""


async def load_delivery(conn, delivery_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow(LOAD_DELIVERY, delivery_id)


async def record_attempt(conn, delivery_id: int, job_id: str, status: DeliveryStatus, status_code: int | None,
                         error: str | None, *, attempted: bool = True) -> int | None:
    """The delivery's attempt count after this one; None when it was no
    longer pending (delivered or ended by another worker meanwhile)."""
    return await conn.fetchval(RECORD_ATTEMPT, delivery_id, job_id, status, status_code,
                               error[:300] if error else None, attempted)
