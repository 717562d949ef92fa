"""Road 2 to a settle: a client reads a job that has been running a while.

Polling clients close jobs even with no webhook at all (no PUBLIC_URL, or
webhooks lost). Many clients may poll one job; the request is written at most
once per RECHECK_EVERY_S per job, and coalesces into the job's settle intent.
"""
from __future__ import annotations

import datetime as dt

from app.vocabulary import IntentKind, JobStatus
from outbox import intents

RECHECK_EVERY_S = 5.0

MARK = f"""
update jobs set recheck_requested_at = now()
where id = $1 and status = '{JobStatus.RUNNING}'
  and created_at < now() - make_interval(secs => $2)
  and (recheck_requested_at is null or recheck_requested_at < now() - make_interval(secs => $3))
returning id
"""


def wants_recheck(status: str, created_at: dt.datetime, last_asked: dt.datetime | None,
                  now: dt.datetime, threshold_s: float) -> bool:
    """Pure pre-check on the row just read, so most reads write nothing."""
    if status != JobStatus.RUNNING or (now - created_at).total_seconds() <= threshold_s:
        return False
    return last_asked is None or (now - last_asked).total_seconds() >= RECHECK_EVERY_S


async def ask_for_settle(pool, job_id: str, threshold_s: float) -> bool:
    async with pool.acquire() as conn, conn.transaction():
        if await conn.fetchval(MARK, job_id, float(threshold_s), RECHECK_EVERY_S) is None:
            return False
        await intents.request(conn, job_id, IntentKind.SETTLE)
        return True
