"""A job's timeline (`GET /v1/jobs/{id}/events`). Owns the `job_events` table.

Lines are appended by the statements that do the work they record: the
create, the submit claim, the task save, the call start and every close in
app/domain/jobs.py; an accepted webhook's settle request (outbox/intents.py);
a delivery's end (app/domain/notifications.py). The one line with a
statement of its own is `status_checked`, after a status call that changed
nothing else (the line of a check that closes the job is written by the
close). Rows stay small: every detail is a few bounded fields (the
table refuses one over 8 KiB), and the lines that can repeat stop at
MAX_REPEATED_LINES per job.
"""
from __future__ import annotations

from typing import Any

import asyncpg

from app.vocabulary import EventType

# Webhooks and status checks can come many times for one job (a provider's
# progress webhooks, a long poll schedule): the timeline keeps the first ones.
MAX_REPEATED_LINES = 100
DETAIL_TEXT_CHARS = 200  # a provider's words (a status, an error) kept in a line


def room_for(job_id_sql: str) -> str:
    """SQL true while the job's timeline has room for one more repeated line."""
    return (f"(select count(*) from (select 1 from job_events where job_id = {job_id_sql} "
            f"limit {MAX_REPEATED_LINES}) c) < {MAX_REPEATED_LINES}")


TIMELINE = "select at, type, detail from job_events where job_id = $1 order by id"

# What the provider said, unless it said the same at the last check (a job
# polled for an hour is one line per change, not one per poll).
def status_changed(job_id_sql: str, detail_sql: str) -> str:
    """SQL true when a status check's line is to be written: there is room,
    and the provider said something other than at the last check."""
    return (f"{room_for(job_id_sql)} and (select e.detail from job_events e where e.job_id = {job_id_sql} "
            f"and e.type = '{EventType.STATUS_CHECKED}' order by e.id desc limit 1) "
            f"is distinct from {detail_sql}")


# (From the job's row, as every line is: the timeline has no foreign key.)
STATUS_CHECKED = f"""
insert into job_events (job_id, type, detail)
select id, '{EventType.STATUS_CHECKED}', $2::jsonb from jobs
where id = $1 and {status_changed('$1', '$2::jsonb')}
"""


def short(text: str | None) -> str | None:
    return text[:DETAIL_TEXT_CHARS] if text else text


async def timeline(conn, job_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(TIMELINE, job_id)


async def status_checked(conn, job_id: str, detail: dict[str, Any]) -> None:
    await conn.execute(STATUS_CHECKED, job_id, detail)
