"""The backstop sweep: only a safety net, every SWEEP_INTERVAL_S (300 s).

Every in-flight job normally has an open intent (its submit, or its settle
timer). One indexed query over the in-flight jobs finds those that have none
(a bug, a manual edit, a lost row) and gives them one; an `uncertain` job
past its give-up deadline is expired with a refund. With nothing in flight it
costs one probe of a small partial index, and it also tells the settler when
its next timer is due.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from app.capacity import is_capped
from app.config import Settings
from app.domain import jobs
from app.metrics import SWEEP_FOUND, SWEEPS
from app.vocabulary import CLOSED_BY_CLOSE, IN_FLIGHT, IntentKind, JobStatus, sql_list
from outbox import decide, intents

log = logging.getLogger("longcall.sweep")

# `finished_at is null` is the partial index jobs_in_flight (the status
# filter alone names the same jobs, but no longer the index); the NOT EXISTS
# probes the outbox's (job_id, kind) unique index. The deadline test on
# `uncertain` only selects: expiring is decided by outbox/decide.give_up (the
# one give-up rule), on the same clock, the statement's now(). (Arrays of
# anything but text cost asyncpg a type introspection: deadlines are read
# with the few jobs found, not returned here.)
PROBE = f"""
with found as (
    select j.id, j.status from jobs j
    where j.finished_at is null and j.status in {sql_list(IN_FLIGHT)}
      and case when j.status = '{JobStatus.UNCERTAIN}' then j.deadline_at <= now()
               else not exists (select 1 from outbox o
                                where o.job_id = j.id and o.kind in {sql_list(CLOSED_BY_CLOSE)}) end
    limit $1
)
select (select min(not_before) from outbox) as next_due, now() as now,
       array(select id from found) as ids, array(select status from found) as statuses
"""
BATCH = 1000


@dataclass
class SweepReport:
    queued_submit: list[str] = field(default_factory=list)
    queued_settle: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    next_due: object = None

    def summary(self) -> str:
        return (f"sweep: {len(self.queued_submit)} submit and {len(self.queued_settle)} settle intents "
                f"queued for jobs that had none, {len(self.expired)} uncertain jobs expired")


async def sweep_once(pool, settings: Settings) -> SweepReport:
    """`settings`: which providers are capped, so that an expired job's
    place wakes a job waiting for it."""
    report = SweepReport()
    SWEEPS.inc()
    probe = await pool.fetchrow(PROBE, BATCH)
    report.next_due = probe["next_due"]
    if not probe["ids"]:
        return report
    async with pool.acquire() as conn:
        for job_id, status in zip(probe["ids"], probe["statuses"], strict=True):
            if status == JobStatus.UNCERTAIN:
                row = await jobs.load(conn, job_id)
                if row is None:
                    continue
                expire = decide.give_up(JobStatus.UNCERTAIN, row["deadline_at"], probe["now"])
                if expire is None:
                    continue
                closed = await jobs.close(conn, job_id, expire.status, error_code=expire.error_code,
                                          error_message=expire.message,
                                          cancel_at_provider=expire.cancel_at_provider,
                                          wake_capacity=is_capped(settings, row["provider"]))
                if closed:
                    report.expired.append(job_id)
            elif status in (JobStatus.QUEUED, JobStatus.SUBMITTING):
                # A submitting job without its intent was abandoned mid-submit:
                # the submit step sees the call in doubt and looks it up.
                await intents.request(conn, job_id, IntentKind.SUBMIT)
                report.queued_submit.append(job_id)
            else:
                await intents.request(conn, job_id, IntentKind.SETTLE)
                report.queued_settle.append(job_id)
    SWEEP_FOUND.labels("missing_submit").inc(len(report.queued_submit))
    SWEEP_FOUND.labels("missing_settle").inc(len(report.queued_settle))
    SWEEP_FOUND.labels("uncertain_expired").inc(len(report.expired))
    log.info(report.summary())
    return report


async def sweep_once_command(settings: Settings) -> int:
    from app import db

    pool = await db.create_pool(settings.dsn, role="sweep", min_size=1, max_size=2)
    try:
        report = await sweep_once(pool, settings)
    finally:
        await pool.close()
    print(report.summary())
    for label, ids in ((IntentKind.SUBMIT, report.queued_submit), (IntentKind.SETTLE, report.queued_settle),
                       (JobStatus.EXPIRED, report.expired)):
        for job_id in ids:
            print(f"  {label}: {job_id}")
    return 0
