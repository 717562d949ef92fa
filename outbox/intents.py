"""The outbox: durable intents (`submit`, `settle`, `cancel`), at most one
open per job and kind. Owns the `outbox` table; every query on it is here.

Requests coalesce into the open intent, keeping the earliest `not_before`,
and bump its `generation`: a worker that claimed the intent before the
request arrived sees the generation moved when it finishes, and leaves the
intent due instead of deleting it, so the request is not lost.

A claim leases an intent (`claimed_until`) and moves its `not_before` to
the lease's end too, so the intents being worked on leave the front of the
due index: a claim walks past none of them, however many a busy settler
holds. A request that coalesces meanwhile pulls `not_before` back to when
it asked; the lease still keeps other workers off until the claim ends.

NOTIFY (channel longcall_outbox) is sent only when an intent becomes due
sooner than it was: payload '' means "due now", otherwise the due time in
epoch seconds, so sleeping settlers can shorten their sleep. NOTIFY takes a
cluster-wide lock at commit, so a coalesce into an intent that is already due
sends nothing.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import asyncpg

from app.db import OUTBOX_CHANNEL
from app.domain import events, record
from app.vocabulary import IN_FLIGHT, EventType, IntentKind, sql_list

KINDS = tuple(IntentKind)

# $1 job, $2 kind, $3 delay (s). Only for a job still in flight: the job row
# is share-locked, so a concurrent close (whose UPDATE waits for us) cannot
# slip between the check and the insert and leave an intent on a closed job.
# `before` is read first to tell whether this request moved the due time
# earlier (only then is there anyone to wake). $4, when not null, is a line
# for the job's timeline written with the request (an accepted webhook's).
# `:commit` is the first column: the `synchronous_commit` the statement's
# transaction commits under (REQUEST_UNFLUSHED sets it off for itself).
_REQUEST = f"""
with open_job as (
    select id from jobs
    where id = $1 and status in {sql_list(IN_FLIGHT)}
    for share
), before as (
    select not_before from outbox where job_id = $1 and kind = $2
), upsert as (
    insert into outbox (job_id, kind, not_before)
    select id, $2, now() + make_interval(secs => $3) from open_job
    on conflict (job_id, kind, delivery_id) do update
        set not_before = least(outbox.not_before, excluded.not_before),
            generation = outbox.generation + 1
    returning not_before
), line as (
    insert into job_events (job_id, type, detail)
    select id, $4, '{{}}'::jsonb from open_job where $4::text is not null and {events.room_for('$1')}
)
select :commit as synchronous_commit,
       case
         when not exists (select 1 from before)
              or (select not_before from before) > (select not_before from upsert)
                 and (select not_before from before) > now()
         then pg_notify('{OUTBOX_CHANNEL}',
                        case when (select not_before from upsert) <= now() then ''
                             else extract(epoch from (select not_before from upsert))::text end)
       end
from upsert
"""
REQUEST = _REQUEST.replace(":commit", "current_setting('synchronous_commit')")

# The same request committed without waiting for its WAL flush, for a
# request whose loss costs only time: a webhook's. NOTIFY's cluster-wide lock
# is held from before the commit record until the commit returns, so with
# the flush inside it every notifying commit waits for the one before it to
# reach the disk (measured: the webhook write alone 2,543/s waiting, 5,849/s
# not; `longcall bench --only ingest`). If PostgreSQL crashes within an
# asynchronous commit's risk window (at most 3 × wal_writer_delay) an
# accepted webhook's request is lost, which is a lost webhook: the job's own
# durable timer (the lost-webhook check) still settles it, and the settle
# re-asks the provider.
# Local to the statement's transaction: only on an autocommit call.
UNFLUSHED = "set_config('synchronous_commit', 'off', true)"
REQUEST_UNFLUSHED = _REQUEST.replace(":commit", UNFLUSHED)

# The settler's own bookkeeping (claim, finish, retry, renew, release)
# commits without waiting for the flush too: each only moves a lease or a
# due time, and losing one in a crash leaves the outbox in a state it meets
# anyway — an intent claimed or run again (every step is idempotent: a
# transition checks the status it expects), or due sooner than it was put
# back. Any later commit that waits for the flush, such as the step's own,
# makes it durable too (the WAL is written in order). The steps' writes
# (task ids, closes, money) still wait.

# The statements below that write outbox rows they already know (claimed,
# done, held) name them as `o.id = any (…)`, which PostgreSQL answers from
# the primary key. Joined to a CTE or an unnest alone, it planned a hash
# join over a sequential scan of the whole outbox: with a backlog of 20,000
# intents that was half a claim's time and nine tenths of a finish's
# (README, the drain row).

# Claim due intents not held by a live lease. SKIP LOCKED lets several
# settlers claim side by side; the lease returns a crashed worker's claims
# (at its end the intent is due: `not_before` moved there with it).
# Notify intents are claimed from their own limit ($3), by their own partial
# index: deliveries to slow endpoints never take the slots that submits and
# settles need, and finding them never walks the others.
#
# The same round trip loads each claimed intent's job (`select *` of jobs,
# beside the intent's own columns, prefixed `intent_`) — except a notify's
# (a delivery reads its own rows) and, unless $4, a submit's (its first
# statement claims the job row and returns it) — and says when a sleeping
# settler must wake next: the earliest `not_before` (or lease end) among the
# intents it did not claim (the first few in `not_before` order are
# enough: only an intent pulled forward during its lease sorts before its
# true due time). This statement sees the claimed rows as they were
# (unclaimed and due), so they are left out of that minimum by id. Each job
# is loaded by its own primary-key look-up (the lateral `limit 1` keeps the
# planner from a hash join over the whole table, which a generic plan made
# while `jobs` looked small chose: 3,000 rows read per claim).
CLAIM = f"""
with due_work as (
    select id from outbox
    where not_before <= now() and (claimed_until is null or claimed_until <= now())
      and kind <> '{IntentKind.NOTIFY}'
    order by not_before
    limit $1
    for update skip locked
), due_notify as (
    select id from outbox
    where not_before <= now() and (claimed_until is null or claimed_until <= now())
      and kind = '{IntentKind.NOTIFY}'
    order by not_before
    limit $3
    for update skip locked
), due as (
    select id from due_work union all select id from due_notify
), claimed as (
    update outbox o set claimed_until = now() + make_interval(secs => $2),
                        not_before = now() + make_interval(secs => $2), attempts = o.attempts + 1
    where o.id = any (array(select id from due))
    returning o.id, o.job_id, o.kind, o.generation, o.attempts, o.delivery_id
), next_due as (
    select min(greatest(not_before, coalesce(claimed_until, not_before))) as at from (
        select not_before, claimed_until from outbox
        where id not in (select id from due)
        order by not_before limit 16
    ) s
)
select {UNFLUSHED} as unflushed, n.at as next_due,
       c.id as intent_id, c.job_id as intent_job_id, c.kind as intent_kind, c.generation as intent_generation,
       c.attempts as intent_attempts, c.delivery_id as intent_delivery_id, j.*
from next_due n
left join claimed c on true
left join lateral (
    select {", ".join(record.COLUMNS)} from jobs
    where id = c.job_id and c.kind <> '{IntentKind.NOTIFY}' and ($4 or c.kind <> '{IntentKind.SUBMIT}')
    limit 1
) j on true
"""

# Done: delete finished intents, all in one statement (the settler's group
# commit) — except those a request coalesced into meanwhile (generation
# moved): those are released, still due. Returns the ids kept.
FINISH_MANY = f"""
with done as (
    select * from unnest($1::bigint[], $2::int[]) as d(id, generation)
), gone as (
    delete from outbox o using done
    where o.id = any ($1::bigint[]) and o.id = done.id and o.generation = done.generation
    returning o.id
), kept as (
    update outbox o set claimed_until = null
    where o.id = any ($1::bigint[]) and o.id not in (select id from gone)
    returning o.id
)
select {UNFLUSHED} as unflushed, array(select id from kept) as kept
"""

# Put the intent back to run again after a delay. A request that coalesced
# meanwhile keeps it due now. `failed` keeps the attempt count (toward the
# cap); a normal durable wait ("still running, ask later") resets it.
RETRY = f"""
update outbox set
    not_before = case when generation = $2 then now() + make_interval(secs => $3)
                      else least(not_before, now()) end,
    claimed_until = null,
    attempts = case when $4 then attempts else 0 end
where id = $1
returning not_before, generation <> $2 as requested_meanwhile, {UNFLUSHED} as unflushed
"""

# Give the claim back untouched (shutdown): due again at once.
RELEASE = f"""
update outbox set claimed_until = null, not_before = least(not_before, now()), attempts = greatest(attempts - 1, 0)
where id = $1
returning {UNFLUSHED}
"""

# Extend the leases of claims still held ($1 ids, $2 their generations as
# claimed), and their `not_before` with them, unless a request has pulled
# it forward since the claim (the generation moved): that one is kept.
RENEW = f"""
update outbox o set claimed_until = now() + make_interval(secs => $3),
    not_before = case when o.generation = held.generation then now() + make_interval(secs => $3)
                      else o.not_before end
from unnest($1::bigint[], $2::int[]) as held(id, generation)
where o.id = any ($1::bigint[]) and o.id = held.id and o.claimed_until is not null
returning {UNFLUSHED}
"""

@dataclass(frozen=True)
class Intent:
    id: int
    job_id: str
    kind: IntentKind
    generation: int
    attempts: int
    delivery_id: int | None = None  # a notify intent's delivery


async def request(conn, job_id: str, kind: IntentKind, delay_s: float = 0.0, *,
                  line: EventType | None = None, wait_for_flush: bool = True) -> bool:
    """Ask for `kind` on a job still in flight (coalescing into its open
    intent), with `line` added to its timeline. False when the job is closed
    (or unknown): nothing is written. One statement, one round trip.
    `wait_for_flush=False` (REQUEST_UNFLUSHED) is for a pool or a connection
    outside a transaction, where the statement is its own transaction."""
    if kind not in KINDS or kind is IntentKind.NOTIFY:
        raise ValueError(f"not an intent kind a job can ask for: {kind}")
    if not wait_for_flush:
        _outside_transaction(conn)
    sql = REQUEST if wait_for_flush else REQUEST_UNFLUSHED
    return await conn.fetchrow(sql, job_id, kind, float(delay_s), line) is not None


def _outside_transaction(conn) -> None:
    """An unflushed statement's setting covers the transaction it runs in:
    on its own (a pool, or a connection outside a transaction) that is just
    itself."""
    if getattr(conn, "is_in_transaction", lambda: False)():
        raise ValueError("an unflushed statement would make the whole transaction it is in unflushed")


@dataclass(frozen=True)
class Claimed:
    intents: list[Intent]
    jobs: dict[int, asyncpg.Record]  # by intent id: its job's row (record.COLUMNS), where loaded
    next_due: dt.datetime | None  # the earliest not_before (or lease end) among the intents not claimed


async def claim(conn, limit: int, lease_s: float, notify_limit: int = 0, *, load_submits: bool = False) -> Claimed:
    """Up to `limit` due submit/settle/cancel intents and `notify_limit`
    notify ones, with their jobs (a submit's only with `load_submits`)."""
    _outside_transaction(conn)
    rows = await conn.fetch(CLAIM, limit, float(lease_s), notify_limit, load_submits)
    claimed = [r for r in rows if r["intent_id"] is not None]
    return Claimed(
        intents=[Intent(r["intent_id"], r["intent_job_id"], IntentKind(r["intent_kind"]), r["intent_generation"],
                        r["intent_attempts"], r["intent_delivery_id"]) for r in claimed],
        jobs={r["intent_id"]: r for r in claimed if r["id"] is not None},
        next_due=rows[0]["next_due"])


async def finish_many(conn, done: list[Intent]) -> set[int]:
    """Delete done intents; the ids kept because they were asked for again."""
    _outside_transaction(conn)
    return set(await conn.fetchval(FINISH_MANY, [i.id for i in done], [i.generation for i in done], column=1))


async def retry(conn, intent: Intent, delay_s: float, *, failed: bool) -> asyncpg.Record | None:
    _outside_transaction(conn)
    return await conn.fetchrow(RETRY, intent.id, intent.generation, float(delay_s), failed)


async def release(conn, intent: Intent) -> None:
    _outside_transaction(conn)
    await conn.execute(RELEASE, intent.id)


async def renew(conn, held: list[Intent], lease_s: float) -> None:
    _outside_transaction(conn)
    await conn.execute(RENEW, [i.id for i in held], [i.generation for i in held], float(lease_s))
