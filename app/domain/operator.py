"""What the operator reads (the console, app/web/console/): any owner's jobs,
money and notifications, across the tables the other domain modules own.
Read-only: every change the console makes is one of those modules'
operations (recovery, owners.operator_grant, notifications.redeliver).

Each statement is served by an index (migrations 001, 006, 008), so a page
costs the same however many jobs have finished. Nothing secret is selected:
no webhook secret, no key hash, no endpoint secret, no provider operation.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

import asyncpg

from app.vocabulary import IN_FLIGHT, NEEDS_A_HUMAN, DeliveryStatus, JobError, JobStatus, LedgerKind, sql_list

# Jobs by status without reading the whole table: in flight now (the
# `jobs_in_flight` index: `finished_at is null`), and finished within the last $1 seconds
# (`jobs_finished`). The lifetime totals are `longcall status`'s, once.
IN_FLIGHT_COUNTS = f"""
select status, count(*) as n from jobs where finished_at is null and status in {sql_list(IN_FLIGHT)}
group by status
"""
FINISHED_COUNTS = """
select status, count(*) as n from jobs
where finished_at is not null and finished_at > now() - make_interval(secs => $1) group by status
"""
RECENTLY_FINISHED = """
select id, owner_id, provider, model, status, finished_at, credits_charged, error_code
from jobs where finished_at is not null order by finished_at desc, id desc limit $1
"""
# The in-flight jobs that changed last (the `jobs_in_flight` index).
IN_FLIGHT_JOBS = f"""
select id, owner_id, provider, model, status, created_at, updated_at, last_error
from jobs where finished_at is null and status in {sql_list(IN_FLIGHT)}
order by updated_at desc limit $1
"""
UNCERTAIN_JOBS = f"""
select id, owner_id, provider, model, status, created_at, updated_at, last_error, submit_attempts,
       provider_call_started_at, deadline_at
from jobs where finished_at is null and status = '{JobStatus.UNCERTAIN}'
order by updated_at limit $1
"""
# One error code's closed jobs, newest first (the `jobs_needs_human` index).
CLOSED_WITH_ERROR = f"""
select id, owner_id, provider, model, status, created_at, finished_at, error_code, error_message
from jobs where error_code in {sql_list(NEEDS_A_HUMAN)} and error_code = $1
order by finished_at desc, id desc limit $2
"""
COUNT_WITH_ERROR = f"""
select error_code, count(*) as n from jobs where error_code in {sql_list(NEEDS_A_HUMAN)} group by error_code
"""
FAILED_DELIVERIES = f"""
select d.id, d.notification_id, d.endpoint_id, d.attempts, d.last_status_code, d.last_attempt_at,
       n.job_id, n.type
from deliveries d join notifications n on n.id = d.notification_id
where d.status = '{DeliveryStatus.FAILED}'
order by d.last_attempt_at desc nulls last, d.id desc limit $1
"""

JOB = """
select j.id, j.owner_id, o.name as owner_name, o.platform_id, j.status, j.provider, j.model, j.input,
       j.metadata, j.created_at, j.updated_at, j.finished_at, j.deadline_at, j.credits_reserved,
       j.credits_charged, j.credits_refunded, j.error_code, j.error_message, j.last_error,
       j.provider_task_id, j.claimed_task_id, j.submit_attempts, j.submit_in_doubt, j.callback_registered,
       j.provider_call_started_at, j.price_applied, j.request_key is not null as keyed
from jobs j join owners o on o.id = j.owner_id
where j.id = $1
"""
JOB_OUTPUTS = """
select index, content_type, bytes, sha256, label, created_at from assets where job_id = $1 order by index
"""
JOB_LEDGER = "select kind, amount, created_at from ledger where job_id = $1 order by id"
JOB_INTENTS = """
select kind, not_before, claimed_until, attempts, delivery_id from outbox where job_id = $1 order by id
"""
# A job's notifications and every delivery of each (any owner's endpoint:
# the operator sees them all). The endpoint's host only: a URL's path or
# query may carry a receiver's own secret.
JOB_NOTIFICATIONS = """
select n.id, n.type, n.created_at, n.owner_id, n.platform_id,
       coalesce((select json_agg(json_build_object(
                  'endpoint_id', d.endpoint_id, 'owner_id', e.owner_id,
                  'host', substring(e.url from '^[a-z]+://([^/?#]+)'),
                  'status', d.status, 'attempts', d.attempts, 'last_status_code', d.last_status_code,
                  'last_attempt_at', d.last_attempt_at, 'last_error', d.last_error) order by d.id)
                 from deliveries d join webhook_endpoints e on e.id = d.endpoint_id
                 where d.notification_id = n.id), '[]'::json) as deliveries
from notifications n where n.job_id = $1
order by n.created_at, n.id
"""
NOTIFICATION_OWNER = "select job_id, owner_id, platform_id from notifications where id = $1"

JOBS_BY_TASK = """
select id, owner_id, provider, model, status, created_at, provider_task_id
from jobs where provider_task_id = $1 order by created_at desc limit $2
"""

_OWNER_COLUMNS = """
o.id, o.name, o.is_platform, o.platform_id, o.granted, o.balance, o.reserved, o.charged, o.active,
o.max_active, o.created_at
"""
OWNERS = f"""
select {_OWNER_COLUMNS} from owners o
where ($1::timestamptz is null or (o.created_at, o.id) < ($1, $2))
order by o.created_at desc, o.id desc limit $3
"""
OWNER = f"""
select {_OWNER_COLUMNS},
       (select count(*) from api_keys k where k.owner_id = o.id and k.revoked_at is null) as active_keys,
       (select count(*) from owners u where u.platform_id = o.id) as owners_under
from owners o where o.id = $1
"""
OWNER_GRANTS = f"""
select amount, reason, created_at from ledger where owner_id = $1 and kind = '{LedgerKind.GRANT}'
order by id desc limit $2
"""


async def in_flight_counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await conn.fetch(IN_FLIGHT_COUNTS)}


async def finished_counts(conn: asyncpg.Connection, within_s: float) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await conn.fetch(FINISHED_COUNTS, within_s)}


async def recently_finished(conn: asyncpg.Connection, limit: int = 10) -> list[asyncpg.Record]:
    return await conn.fetch(RECENTLY_FINISHED, limit)


async def in_flight_jobs(conn: asyncpg.Connection, limit: int = 20) -> list[asyncpg.Record]:
    return await conn.fetch(IN_FLIGHT_JOBS, limit)


async def uncertain_jobs(conn: asyncpg.Connection, limit: int = 100) -> list[asyncpg.Record]:
    return await conn.fetch(UNCERTAIN_JOBS, limit)


async def closed_with_error(conn: asyncpg.Connection, code: JobError, limit: int = 50) -> list[asyncpg.Record]:
    return await conn.fetch(CLOSED_WITH_ERROR, code, limit)


async def count_with_error(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["error_code"]: r["n"] for r in await conn.fetch(COUNT_WITH_ERROR)}


async def failed_deliveries(conn: asyncpg.Connection, limit: int = 10) -> list[asyncpg.Record]:
    return await conn.fetch(FAILED_DELIVERIES, limit)


async def job(conn: asyncpg.Connection, job_id: str) -> dict[str, Any] | None:
    """Everything the job page shows, or None."""
    row = await conn.fetchrow(JOB, job_id)
    if row is None:
        return None
    return {
        "job": row,
        "outputs": await conn.fetch(JOB_OUTPUTS, job_id),
        "ledger": await conn.fetch(JOB_LEDGER, job_id),
        "intents": await conn.fetch(JOB_INTENTS, job_id),
        "notifications": await conn.fetch(JOB_NOTIFICATIONS, job_id),
    }


async def notification_owner(conn: asyncpg.Connection, notification_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(NOTIFICATION_OWNER, notification_id)


async def jobs_by_task(conn: asyncpg.Connection, task_id: str, limit: int = 20) -> list[asyncpg.Record]:
    return await conn.fetch(JOBS_BY_TASK, task_id, limit)


async def owners(conn: asyncpg.Connection, *, limit: int,
                 after: tuple[dt.datetime, str] | None) -> list[asyncpg.Record]:
    created_at, last_id = after if after else (None, None)
    return await conn.fetch(OWNERS, created_at, last_id, limit)


async def owner(conn: asyncpg.Connection, owner_id: str, *, grants: int = 20) -> dict[str, Any] | None:
    """The owner and its latest grants (its jobs: app/domain/jobs.list_jobs)."""
    row = await conn.fetchrow(OWNER, owner_id)
    if row is None:
        return None
    return {"owner": row, "grants": await conn.fetch(OWNER_GRANTS, owner_id, grants) if grants else []}
