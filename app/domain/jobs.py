"""Jobs: creation, reads, and every state transition.

Owns the `jobs`, `ledger` (job entries) and `assets` tables, and the owners'
money/capacity counters that move with them. Every transition is ONE SQL
statement guarded by the expected current status (compare-and-set); its
money, capacity and outbox effects are parts of that same statement, so they
commit together or not at all. A statement that matches no row lost a race
and changed nothing.
"""
from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from app import ids
from app.capacity import NO_CAPS, Caps
from app.db import JOBS_CHANNEL, OUTBOX_CHANNEL
from app.domain import events, notifications, states
from app.vocabulary import (
    CLOSED_BY_CLOSE,
    SUBMITTED,
    TERMINAL,
    EventType,
    IntentKind,
    JobStatus,
    LedgerKind,
    sql_list,
)


class InsufficientCredits(Exception):
    pass


class CapacityExhausted(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


def payload_digest(provider: str, model: str, input: Any, max_credits: int,
                   metadata: Mapping[str, Any] | None = None) -> bytes:
    """A canonical digest of what was asked, to tell a replay from a
    different request under the same idempotency key. Metadata is part of
    it when there is any (so the digests of jobs made without it, before
    metadata existed, are unchanged)."""
    asked: dict[str, Any] = {"provider": provider, "model": model, "input": input, "max_credits": max_credits}
    if metadata:
        asked["metadata"] = metadata
    canonical = json.dumps(asked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).digest()


# --- creation ---------------------------------------------------------------

# One statement: reserve credits and a slot (the owner row lock serializes an
# owner's concurrent creates), insert the job, its ledger `reserve` row, its
# `submit` intent and the first line of its timeline, and wake the settlers.
CREATE = f"""
with owner as (
    update owners set balance = balance - $5, reserved = reserved + $5, active = active + 1
    where id = $2 and balance >= $5 and active < max_active
    returning id
), job as (
    insert into jobs (id, owner_id, request_key, request_digest, provider, model, input,
                      credits_reserved, deadline_at, metadata)
    select $1, owner.id, $3, $4, $6, $7, $8, $5, now() + make_interval(secs => $9), $10 from owner
    returning *
), reserve as (
    insert into ledger (owner_id, job_id, kind, amount)
    select owner_id, id, '{LedgerKind.RESERVE}', credits_reserved from job
), intent as (
    insert into outbox (job_id, kind) select id, '{IntentKind.SUBMIT}' from job
), line as (
    insert into job_events (job_id, type, detail)
    select id, '{EventType.CREATED}', jsonb_build_object('provider', provider, 'model', model,
                                                         'max_credits', credits_reserved, 'metadata', metadata)
    from job
)
select job.id, job.owner_id, job.status, job.provider, job.model, job.input, job.created_at,
       job.updated_at, job.finished_at, job.credits_reserved, job.credits_charged,
       job.credits_refunded, job.error_code, job.error_message, job.recheck_requested_at,
       job.metadata, '[]'::json as outputs, pg_notify('{OUTBOX_CHANNEL}', '')
from job
"""
BY_REQUEST_KEY = "select id, request_digest from jobs where owner_id = $1 and request_key = $2"
WHY_REFUSED = "select balance, active, max_active from owners where id = $1"


@dataclass(frozen=True)
class Created:
    job_id: str
    created: bool  # False: an earlier request with the same key made it
    row: asyncpg.Record | None = None  # the new job as GET renders it (None for a replay)


async def create_job(pool: asyncpg.Pool, *, owner_id: str, request_key: str | None,
                     provider: str, model: str, input: Any, max_credits: int,
                     give_up_after_s: float, metadata: Mapping[str, Any] | None = None) -> Created:
    metadata = dict(metadata or {})
    digest = payload_digest(provider, model, input, max_credits, metadata)
    async with pool.acquire() as conn:
        if request_key is not None:
            existing = await _replay(conn, owner_id, request_key, digest)
            if existing:
                return existing
        job_id = ids.new_job_id()
        try:
            row = await conn.fetchrow(CREATE, job_id, owner_id, request_key, digest, max_credits,
                                      provider, model, input, float(give_up_after_s), metadata)
        except asyncpg.UniqueViolationError:
            # A concurrent request with the same key won the insert.
            assert request_key is not None  # only a keyed insert can collide
            existing = await _replay(conn, owner_id, request_key, digest)
            if existing:
                return existing
            raise
        if row is not None:
            return Created(job_id, True, row)
        why = await conn.fetchrow(WHY_REFUSED, owner_id)
        if why["balance"] < max_credits:
            raise InsufficientCredits(
                f"max_credits {max_credits} is more than the available balance {why['balance']}")
        raise CapacityExhausted(f"{why['active']} of {why['max_active']} active jobs in flight")


async def _replay(conn, owner_id: str, request_key: str, digest: bytes) -> Created | None:
    row = await conn.fetchrow(BY_REQUEST_KEY, owner_id, request_key)
    if row is None:
        return None
    if row["request_digest"] != digest:
        raise IdempotencyConflict("this Idempotency-Key was used with a different request")
    return Created(row["id"], False)


# --- reads --------------------------------------------------------------------

_OUTPUTS = """
coalesce((select json_agg(json_build_object('index', a.index, 'content_type', a.content_type,
                                            'bytes', a.bytes, 'sha256', a.sha256, 'label', a.label,
                                            'storage_key', a.storage_key) order by a.index)
          from assets a where a.job_id = j.id), '[]'::json) as outputs
"""
_JOB_COLUMNS = f"""
j.id, j.owner_id, j.status, j.provider, j.model, j.input, j.created_at, j.updated_at,
j.finished_at, j.credits_reserved, j.credits_charged, j.credits_refunded, j.error_code,
j.error_message, j.recheck_requested_at, j.metadata, {_OUTPUTS}
"""
GET = f"select {_JOB_COLUMNS} from jobs j where j.id = $1"
# Authentication and the read in one round trip (the hot path of polling
# clients): no row = bad key; a row with no job = not this owner's job. With
# a Longcall-Owner ($3) the job must be that owner's, and that owner under
# the key's platform (`acting` is null when it is not).
GET_WITH_KEY = f"""
select k.owner_id as caller, a.id as acting, {_JOB_COLUMNS}
from api_keys k join owners o on o.id = k.owner_id
left join owners a on a.id = $3 and a.platform_id = k.owner_id and o.is_platform
left join jobs j on j.id = $2 and j.owner_id = case when $3::text is null then k.owner_id else a.id end
where k.key_hash = $1 and k.revoked_at is null
"""
# A page of an owner's jobs stops after the job whose input takes it past
# LIST_PAGE_INPUT_BYTES (the first always comes): a job's input may be near
# 1 MiB, so a hundred of them made one request hold over 100 MB, for free
# (created and cancelled). Counted as the text each input is rendered from,
# not its compressed size on disk.
LIST_PAGE_INPUT_BYTES = 8 * 1024 * 1024
LIST = f"""
select * from (
    select {_JOB_COLUMNS}, size.input_bytes,
           sum(size.input_bytes) over (order by j.created_at desc, j.id desc) as page_input_bytes
    from jobs j, lateral (select octet_length(j.input::text) as input_bytes) size
    where j.owner_id = $1 and ($2::text is null or j.status = $2)
      and ($3::timestamptz is null or (j.created_at, j.id) < ($3, $4))
    order by j.created_at desc, j.id desc limit $5
) page where page_input_bytes - input_bytes < {LIST_PAGE_INPUT_BYTES}
order by created_at desc, id desc
"""
# Everything the settler needs, secrets included (never rendered).
LOAD = "select * from jobs where id = $1"


async def get_job(conn, job_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(GET, job_id)


async def get_job_with_key(conn, key_hash: bytes, job_id: str,
                           acting_for: str | None = None) -> asyncpg.Record | None:
    return await conn.fetchrow(GET_WITH_KEY, key_hash, job_id, acting_for)


async def list_jobs(conn, owner_id: str, *, status: str | None, limit: int,
                    after: tuple[dt.datetime, str] | None) -> tuple[list[asyncpg.Record], bool]:
    """Up to `limit` jobs after the cursor, newest first, and whether more
    may follow (a page cut short by its inputs' size may be the last)."""
    created_at, job_id = after if after else (None, None)
    rows = await conn.fetch(LIST, owner_id, status, created_at, job_id, limit + 1)
    more = len(rows) > limit or bool(rows) and rows[-1]["page_input_bytes"] >= LIST_PAGE_INPUT_BYTES
    return rows[:limit], more


async def load(conn, job_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(LOAD, job_id)


# --- closing: the one terminal transition, with its money -----------------------

# $1 job, $2 new status, $3 charge (capped at the reservation here), $4/$5
# error code/message, $6 statuses it may close from, $7 queue a provider cancel
# when a task may exist, $8.. assets (index, key, bytes, sha256, type, label),
# $14 the usage measured (JSON array; null keeps what is there), $15 facts
# to keep with the provider operation (a sync call's request id; null: none),
# $16 how a success's charge was reached (app/pricing.py; null: none),
# $17 wake a job waiting for the provider's capacity, $18 the line of the
# status check that led to this close (null: none; saves the check its own
# statement). The job's timeline gets that line, one per output stored and
# one for the close;
# the owner's endpoints get its notification (app/domain/notifications.py).
# A close wakes the oldest waiting job of at most this many models: one of
# them takes the freed place, the others go back to waiting (no failed
# attempt); beyond them the 60 s safety net (app/capacity.py).
WAKE_MODELS = 8
_NEW_OUTPUTS = """(select coalesce(jsonb_agg(jsonb_build_object(
        'index', a.index, 'content_type', a.content_type, 'bytes', a.bytes, 'sha256', a.sha256,
        'label', a.label) order by a.index), '[]'::jsonb)
    from unnest($8::int[], $9::text[], $10::bigint[], $11::text[], $12::text[], $13::text[])
         as a(index, key, bytes, sha256, content_type, label))"""
CLOSE = f"""
with j as (
    update jobs set status = $2,
        credits_charged = least($3::bigint, credits_reserved),
        credits_refunded = credits_reserved - least($3::bigint, credits_reserved),
        error_code = $4, error_message = $5, webhook_secret = null, claimed_task_id = null,
        usage = coalesce($14::jsonb, usage), price_applied = coalesce($16::jsonb, price_applied),
        provider_operation = case when $15::jsonb is null then provider_operation
                                  else coalesce(provider_operation, '{{}}'::jsonb) || $15::jsonb end,
        finished_at = now(), updated_at = now()
    where id = $1 and status = any($6::text[])
    returning *
), money as (
    insert into ledger (owner_id, job_id, kind, amount)
    select j.owner_id, j.id, e.kind, e.amount
    from j cross join lateral (values ('{LedgerKind.CHARGE}', j.credits_charged),
                                      ('{LedgerKind.REFUND}', j.credits_refunded)) e(kind, amount)
    where e.amount > 0
), owner as (
    update owners o set reserved = o.reserved - j.credits_reserved,
        charged = o.charged + j.credits_charged,
        balance = o.balance + j.credits_refunded,
        active = o.active - 1
    from j where o.id = j.owner_id
), intents_done as (
    delete from outbox where job_id = $1 and kind in {sql_list(CLOSED_BY_CLOSE)}
      and exists (select 1 from j)
), provider_cancel as (
    insert into outbox (job_id, kind)
    select id, '{IntentKind.CANCEL}' from j
    where $7 and (provider_task_id is not null or provider_call_started_at is not null)
    on conflict (job_id, kind, delivery_id) do nothing
    returning 1
), stored as (
    insert into assets (job_id, index, storage_key, bytes, sha256, content_type, label)
    select j.id, a.index, a.key, a.bytes, a.sha256, a.content_type, a.label
    from j cross join unnest($8::int[], $9::text[], $10::bigint[], $11::text[], $12::text[], $13::text[])
         as a(index, key, bytes, sha256, content_type, label)
    on conflict (job_id, index) do update set storage_key = excluded.storage_key,
        bytes = excluded.bytes, sha256 = excluded.sha256, content_type = excluded.content_type,
        label = excluded.label
), candidates as (
    -- $17: the provider is capped, so the place this job held wakes the
    -- oldest queued job of it whose submit waits, of each model (the same
    -- model first, at most {WAKE_MODELS}): a model's jobs share their caps
    -- (its models-file entry), so the oldest job of a model whose entry is
    -- full cannot take the place, and another model's may.
    select id from (
        select distinct on (q.model) o.id, q.model, q.created_at
        from j
        join jobs q on q.provider = j.provider and q.status = '{JobStatus.QUEUED}'
        join outbox o on o.job_id = q.id and o.kind = '{IntentKind.SUBMIT}'
        where $17 and (o.not_before > now() or o.claimed_until is not null)
        order by q.model, q.created_at
    ) oldest
    order by (oldest.model = (select model from j)) desc, oldest.created_at
    limit {WAKE_MODELS}
), waiting as (
    select o.id from outbox o where o.id in (select id from candidates)
    for update skip locked
), woken as (
    update outbox o set not_before = least(o.not_before, now()), generation = o.generation + 1
    from waiting where o.id = waiting.id
    returning 1
), lines as (
    insert into job_events (job_id, type, detail)
    select job_id, type, detail from (
        select j.id as job_id, '{EventType.OUTPUT_STORED}' as type, a.index as n,
               jsonb_build_object('index', a.index, 'bytes', a.bytes, 'sha256', a.sha256,
                                  'content_type', a.content_type, 'label', a.label) as detail
        from j cross join unnest($8::int[], $10::bigint[], $11::text[], $12::text[], $13::text[])
             as a(index, bytes, sha256, content_type, label)
        union all
        select j.id, '{EventType.STATUS_CHECKED}', -1, $18::jsonb
        from j where $18::jsonb is not null and {events.status_changed('j.id', '$18::jsonb')}
        union all
        select j.id, '{EventType.CLOSED}', 2147483647,
               jsonb_build_object('status', j.status, 'charged', j.credits_charged,
                                  'refunded', j.credits_refunded, 'error_code', j.error_code,
                                  'price_applied', j.price_applied)
        from j
    ) l order by n
){notifications.written_with("j", f"case when cardinality($8::int[]) = 0 then {notifications.stored_outputs('j')} "
                                  f"else {_NEW_OUTPUTS} end")}
select j.id, j.owner_id, j.credits_charged, j.credits_refunded,
       pg_notify('{JOBS_CHANNEL}', j.id),
       exists (select 1 from provider_cancel) as cancel_queued,
       case when exists (select 1 from provider_cancel) or exists (select 1 from woken)
                 or {notifications.WAKES_SETTLERS}
            then pg_notify('{OUTBOX_CHANNEL}', '') end
from j
"""


@dataclass(frozen=True)
class Asset:
    index: int
    storage_key: str
    bytes: int
    sha256: str
    content_type: str | None
    label: str | None = None


@dataclass(frozen=True)
class Closed:
    job_id: str
    owner_id: str
    charged: int
    refunded: int
    cancel_queued: bool


async def close(conn, job_id: str, status: JobStatus, *, charge: int = 0, error_code: str | None = None,
                error_message: str | None = None, cancel_at_provider: bool = False,
                assets: Sequence[Asset] = (), from_statuses: Sequence[str] | None = None,
                usage: Sequence[Mapping[str, Any]] | None = None,
                operation: Mapping[str, Any] | None = None,
                price_applied: Mapping[str, Any] | None = None, wake_capacity: bool = False,
                checked: Mapping[str, Any] | None = None) -> Closed | None:
    """Make the job terminal, with its charge/refund, slot release, secret
    erasure and intent cleanup. None when the job was not in a state this
    transition may start from (someone else closed it first).
    `checked`: the status check's timeline line (events.status_checked), written first.
    `wake_capacity`: its provider is capped (app/capacity.py): a job
    waiting for a place is woken."""
    if status not in states.CLOSE_FROM:
        raise ValueError(f"not a terminal status: {status}")
    if status != JobStatus.SUCCEEDED and charge:
        raise ValueError("only a succeeded job is charged")
    if error_message is not None:
        error_message = error_message[:1000]
    row = await conn.fetchrow(
        CLOSE, job_id, status, charge, error_code, error_message,
        list(from_statuses or states.CLOSE_FROM[status]),
        cancel_at_provider,
        [a.index for a in assets], [a.storage_key for a in assets], [a.bytes for a in assets],
        [a.sha256 for a in assets], [a.content_type for a in assets], [a.label for a in assets],
        None if usage is None else list(usage), None if operation is None else dict(operation),
        None if price_applied is None else dict(price_applied), wake_capacity,
        None if checked is None else dict(checked))
    if row is None:
        return None
    return Closed(row["id"], row["owner_id"], row["credits_charged"], row["credits_refunded"],
                  bool(row["cancel_queued"]))


# --- the submit path ----------------------------------------------------------

# queued -> submitting before any paid call. `was_in_doubt` tells whether an
# earlier attempt's call never got a definite answer (then the task may exist).
#
# Not while the provider is paused (its 429). A queued job claims a place
# under its caps ($2: the provider's, $4: its models-file entry's, named $3):
# the count is exact because every capped claim of the provider holds its
# advisory lock (CAPACITY_LOCK, taken first in the same transaction); a job
# already submitting holds its place. Without caps ($2 and $4 null) nothing
# is counted.
_SUBMITTED_OF_PROVIDER = (f"select count(*) from jobs s where s.provider = j.provider "
                          f"and s.status in {sql_list(SUBMITTED)}")
# The claim is the timeline's `submit_sent` (in_doubt: the last attempt's
# answer was lost, so the task is looked up before any new call).
# `j.id = $1` beside the join keeps every plan a primary-key look-up: a
# generic plan made while the table looked small once drove this update from
# every job in flight (the `jobs_in_flight` index), 3,000 rows a call.
_BEGIN_SUBMIT = f"""
with claimed as (
update jobs j set status = '{JobStatus.SUBMITTING}', submit_in_doubt = true,
    provider_call_started_at = coalesce(j.provider_call_started_at, now()),
    submit_attempts = j.submit_attempts + 1, updated_at = now(),
    capacity_entry = case when j.status = '{JobStatus.QUEUED}' then :entry else j.capacity_entry end
from (select id, submit_in_doubt from jobs where id = $1 for update) old
where j.id = $1 and j.id = old.id and j.provider_task_id is null
  and j.status in {sql_list((JobStatus.QUEUED, JobStatus.SUBMITTING))}
  and not exists (select 1 from provider_pauses p where p.provider = j.provider and p.until > now()):caps
returning j.*, old.submit_in_doubt as was_in_doubt
), line as (
    insert into job_events (job_id, type, detail)
    select id, '{EventType.SUBMIT_SENT}', jsonb_build_object('attempt', submit_attempts, 'in_doubt', was_in_doubt)
    from claimed
)
select * from claimed
"""
BEGIN_SUBMIT = _BEGIN_SUBMIT.replace(":entry", "$3").replace(":caps", f"""
  and (j.status = '{JobStatus.SUBMITTING}'
       or (($2::int is null or ({_SUBMITTED_OF_PROVIDER}) < $2)
           and ($4::int is null or ({_SUBMITTED_OF_PROVIDER} and s.capacity_entry = $3::text) < $4)))""")
# The same claim for a provider without caps ($3 is null), as its own
# statement: with the cap counts in it, PostgreSQL prices a generic plan
# above a custom one and plans the statement afresh on every call
# (pg_stat_statements: a plan per call, 0.28 ms each, in `longcall bench`).
BEGIN_SUBMIT_UNCAPPED = _BEGIN_SUBMIT.replace(":entry", "null").replace(":caps", "")
CAPACITY_LOCK = "select pg_advisory_xact_lock(hashtext('longcall-capacity:' || $1))"

# Why a claim took nothing: closed or already submitted, paused, or over a cap.
WHY_NOT_CLAIMED = """
select j.status, j.provider_task_id is not null as has_task,
       (select p.until from provider_pauses p where p.provider = j.provider and p.until > now()) as paused_until,
       now() as now
from jobs j where j.id = $1
"""

# The provider's jobs submitted and not yet closed (longcall status, metrics).
SUBMITTED_BY_PROVIDER = f"""
select provider, count(*) as n from jobs where status in {sql_list(SUBMITTED)} group by provider
"""

# A definite answer (rejected, or refused before anything was created).
SUBMIT_SETTLED = "update jobs set submit_in_doubt = false, last_error = $2, updated_at = now() where id = $1"

# Save the provider's task id, the first thing after a submit. From
# submitting (or uncertain, when an operator resolves it) the job becomes
# running and gets its first status check; if the job was closed meanwhile
# (cancelled while we were submitting) the task id is still saved and the
# provider is asked to cancel it. Either way the timeline says so; a job
# now running is notified, and its submit intent, done, is deleted here
# (the settler then has nothing to delete).
#
# One UPDATE for both cases, so that a close committed while it waited for
# the row lock is seen: PostgreSQL re-checks a locked row's new version
# against the statement's own WHERE only. As two UPDATEs (one for each case)
# the closed case judged the row by the statement's snapshot, where the job
# was still submitting, and the task id was lost with no provider cancel
# (tests/outbox/test_races.py: 46 of 300 saves racing a cancel).
_TAKES_TASK = "status = any($7::text[])"
SAVE_TASK = f"""
with saved as (
    update jobs set status = case when {_TAKES_TASK} then '{JobStatus.RUNNING}' else status end,
        provider_task_id = $2, provider_operation = $3, submit_in_doubt = false, updated_at = now(),
        webhook_secret = case when {_TAKES_TASK} then $4 else webhook_secret end,
        callback_registered = case when {_TAKES_TASK} then $5 else callback_registered end,
        last_error = case when {_TAKES_TASK} then null else last_error end,
        claimed_task_id = case when {_TAKES_TASK} then null else claimed_task_id end
    where id = $1 and ({_TAKES_TASK} or status in {sql_list(TERMINAL)} and provider_task_id is null)
    returning *
), to_running as (
    select * from saved where status = '{JobStatus.RUNNING}'
), closed as (
    select id from saved where status <> '{JobStatus.RUNNING}'
), submit_done as (
    delete from outbox where job_id = $1 and kind = '{IntentKind.SUBMIT}' and exists (select 1 from to_running)
), first_check as (
    insert into outbox (job_id, kind, not_before)
    select id, '{IntentKind.SETTLE}', now() + make_interval(secs => $6) from to_running
    on conflict (job_id, kind, delivery_id) do update
        set not_before = least(outbox.not_before, excluded.not_before),
            generation = outbox.generation + 1
), provider_cancel as (
    insert into outbox (job_id, kind) select id, '{IntentKind.CANCEL}' from closed
    -- A cancel intent already claimed, whose step read the job before this
    -- id was saved, must run again with it: kept due (its generation moves).
    on conflict (job_id, kind, delivery_id) do update
        set not_before = least(outbox.not_before, now()), generation = outbox.generation + 1
    returning 1
), line as (
    insert into job_events (job_id, type, detail)
    select id, '{EventType.TASK_SAVED}', jsonb_build_object('task_id', $2::text, 'job_was_closed', false)
           || case when $8::text is null then '{{}}'::jsonb else jsonb_build_object('by', $8::text) end
    from to_running
    union all
    select id, '{EventType.TASK_SAVED}', jsonb_build_object('task_id', $2::text, 'job_was_closed', true)
    from closed
){notifications.written_with("to_running", notifications.stored_outputs("to_running"))}
select exists (select 1 from to_running) as now_running, exists (select 1 from closed) as on_closed_job,
       pg_notify('{JOBS_CHANNEL}', $1),
       case when exists (select 1 from provider_cancel) or {notifications.WAKES_SETTLERS}
            then pg_notify('{OUTBOX_CHANNEL}', '') end,
       -- a timer: settlers learn when to wake (payload = due time, epoch s)
       case when exists (select 1 from to_running) then pg_notify('{OUTBOX_CHANNEL}',
            extract(epoch from now() + make_interval(secs => $6))::text) end
"""

# A sync call's start, saved before the call (the lost-call threshold and
# a history look-up count from it), only while the job is still ours to call:
# a job cancelled since its claim is never called.
START_CALL = f"""
with started as (
    update jobs set provider_call_started_at = now(), updated_at = now()
    where id = $1 and status = '{JobStatus.SUBMITTING}'
    returning id, provider_call_started_at
), line as (
    insert into job_events (job_id, type, detail)
    select id, '{EventType.CALL_STARTED}', '{{}}'::jsonb from started
)
select provider_call_started_at from started
"""

# Notified (job.uncertain): an operator or the app has something to resolve.
MARK_UNCERTAIN = f"""
with j as (
    update jobs set status = '{JobStatus.UNCERTAIN}', last_error = $2, updated_at = now()
    where id = $1 and status = '{JobStatus.SUBMITTING}'
    returning *
){notifications.written_with("j", notifications.stored_outputs("j"))}
select id, pg_notify('{JOBS_CHANNEL}', id),
       case when {notifications.WAKES_SETTLERS} then pg_notify('{OUTBOX_CHANNEL}', '') end
from j
"""

NOTE_ERROR = "update jobs set last_error = $2, updated_at = now() where id = $1"

# A verified webhook names a task for a job that has none yet (its submit in
# doubt): keep the claim for the settle step to confirm. The latest claim wins.
CLAIM_TASK = f"""
update jobs set claimed_task_id = $2
where id = $1 and provider_task_id is null
  and status in {sql_list((JobStatus.SUBMITTING, JobStatus.UNCERTAIN))}
"""

# The provider denies knowing the claimed task: forget that claim (only that
# one: a newer claim that arrived meanwhile stays).
DROP_CLAIM = "update jobs set claimed_task_id = null where id = $1 and claimed_task_id = $2"


class Saved(enum.Enum):
    """What saving a task id did."""

    RUNNING = enum.auto()  # the job is running with this task
    ON_CLOSED_JOB = enum.auto()  # the job had closed meanwhile: id saved, provider cancel queued
    LOST = enum.auto()  # the job is in no state to take it


async def begin_submit(conn, job_id: str, caps: Caps = NO_CAPS) -> asyncpg.Record | None:
    """queued (or an in-doubt submitting) -> submitting, under the caps;
    None when it took nothing (jobs.why_not_claimed says why)."""
    if not caps.capped:
        return await conn.fetchrow(BEGIN_SUBMIT_UNCAPPED, job_id)
    async with conn.transaction():
        provider = await conn.fetchval("select provider from jobs where id = $1", job_id)
        if provider is None:
            return None
        await conn.execute(CAPACITY_LOCK, provider)
        return await conn.fetchrow(BEGIN_SUBMIT, job_id, caps.provider_cap, caps.entry, caps.entry_cap)


async def why_not_claimed(conn, job_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(WHY_NOT_CLAIMED, job_id)


async def submitted_by_provider(conn) -> dict[str, int]:
    return {r["provider"]: r["n"] for r in await conn.fetch(SUBMITTED_BY_PROVIDER)}


async def save_task(conn, job_id: str, *, task_id: str, operation: Any, webhook_secret: bytes | None,
                    callback_registered: bool, first_check_after_s: float,
                    from_statuses: Sequence[str] = (JobStatus.SUBMITTING,), by: str | None = None) -> Saved:
    """`by`: who gave the task id when it was not the provider's answer (an
    operator's resolve), said in the timeline's `task_saved` line."""
    row = await conn.fetchrow(SAVE_TASK, job_id, task_id, operation, webhook_secret,
                              callback_registered, float(first_check_after_s), list(from_statuses), by)
    if row["now_running"]:
        return Saved.RUNNING
    if row["on_closed_job"]:
        return Saved.ON_CLOSED_JOB
    return Saved.LOST


async def start_call(conn, job_id: str) -> dt.datetime | None:
    """The call's start as saved; None when the job is no longer submitting."""
    return await conn.fetchval(START_CALL, job_id)


async def submit_settled(conn, job_id: str, error: str | None) -> None:
    await conn.execute(SUBMIT_SETTLED, job_id, error[:1000] if error else None)


async def mark_uncertain(conn, job_id: str, reason: str) -> bool:
    return await conn.fetchrow(MARK_UNCERTAIN, job_id, reason[:1000]) is not None


STATUS_OF = "select status from jobs where id = $1"


async def status_of(conn, job_id: str) -> JobStatus | None:
    status = await conn.fetchval(STATUS_OF, job_id)
    return None if status is None else JobStatus(status)


async def note_error(conn, job_id: str, message: str) -> None:
    await conn.execute(NOTE_ERROR, job_id, message[:1000])


async def claim_task(conn, job_id: str, task_id: str) -> None:
    await conn.execute(CLAIM_TASK, job_id, task_id)


async def drop_claim(conn, job_id: str, task_id: str) -> None:
    await conn.execute(DROP_CLAIM, job_id, task_id)


# What only the database knows about the provider's candidates for an
# in-doubt submit ($2, task ids; outbox/decide.adopt narrows them): which are
# saved on another job of the provider, and how many other jobs sent the
# same model and input with their outcome unknown (each may own a candidate).
# One that closed well before this job's first call made nothing since (a
# call outlives its job by at most its timeout: the margin).
OTHER_JOBS_TASKS = """
select coalesce(array_agg(o.provider_task_id) filter (where o.provider_task_id is not null), '{}') as taken,
       count(*) filter (where o.provider_task_id is null) as rivals
from jobs me join jobs o on o.provider = me.provider and o.id <> me.id
where me.id = $1
  and (o.provider_task_id = any($2::text[])
       or (o.provider_task_id is null and o.submit_in_doubt and o.model = me.model and o.input = me.input
           and (o.finished_at is null
                or o.finished_at >= me.provider_call_started_at - interval '10 minutes')))
"""


async def other_jobs_tasks(conn, job_id: str, task_ids: Sequence[str]) -> tuple[frozenset[str], int]:
    """(the task ids among `task_ids` saved on another job, the other jobs
    whose submit of the same model and input may have made one of them)."""
    row = await conn.fetchrow(OTHER_JOBS_TASKS, job_id, list(task_ids))
    return frozenset(row["taken"]), int(row["rivals"])

