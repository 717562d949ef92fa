"""`longcall status`: one screen from the database. Settlers are counted
from pg_stat_activity by application name (no heartbeat table to keep)."""
from __future__ import annotations

from collections.abc import Mapping

from app import db
from app.capacity import capped_providers
from app.config import Settings
from app.domain import jobs, pauses
from app.vocabulary import ALL_STATUSES, DeliveryStatus, JobError, JobStatus

QUERIES = {
    "jobs": "select status, count(*) as n from jobs group by status order by status",
    "intents": """
        select kind, count(*) as n,
               count(*) filter (where not_before <= now()) as due,
               count(*) filter (where claimed_until > now()) as claimed,
               extract(epoch from now() - min(not_before) filter (where not_before <= now())) as oldest_due_s
        from outbox group by kind order by kind""",
    "uncertain_jobs": f"""
        select id, provider, created_at, last_error from jobs where status = '{JobStatus.UNCERTAIN}'
        order by created_at limit 10""",
    "exhausted": f"select count(*) from jobs where error_code = '{JobError.SETTLE_EXHAUSTED}'",
    # Both counts read small partial indexes (deliveries_endpoint, deliveries_failed).
    "deliveries": f"""
        select (select count(*) from deliveries where status = '{DeliveryStatus.PENDING}') as waiting,
               (select count(*) from deliveries where status = '{DeliveryStatus.FAILED}') as given_up""",
    "settlers": """
        select count(*) filter (where application_name = 'longcall-settler-listen') as settlers,
               count(*) filter (where application_name like 'longcall-web%') as web_connections
        from pg_stat_activity where datname = current_database()""",
}


async def collect(conn, caps: Mapping[str, int | None] | None = None, *, count_all_jobs: bool = True) -> dict:
    """`caps`: every capped provider and its MAX_IN_FLIGHT_<PROVIDER> (app/capacity.py).
    `count_all_jobs=False` leaves out the lifetime count by status, which reads
    the whole jobs table (the console refreshes every few seconds: it counts
    from indexes instead, app/domain/operator.py)."""
    return {
        "caps": dict(caps or {}),
        "submitted": await jobs.submitted_by_provider(conn),
        "pauses": await pauses.active(conn),
        "now": await conn.fetchval("select now()"),
        "jobs": {r["status"]: r["n"] for r in await conn.fetch(QUERIES["jobs"])} if count_all_jobs else {},
        "intents": [dict(r) for r in await conn.fetch(QUERIES["intents"])],
        "uncertain_jobs": [dict(r) for r in await conn.fetch(QUERIES["uncertain_jobs"])],
        "exhausted": await conn.fetchval(QUERIES["exhausted"]),
        "deliveries": dict(await conn.fetchrow(QUERIES["deliveries"])),
        "activity": dict(await conn.fetchrow(QUERIES["settlers"])),
    }


def render(s: dict) -> str:
    jobs = s["jobs"]
    lines = ["jobs:     " + "  ".join(f"{k} {jobs.get(k, 0)}" for k in ALL_STATUSES)]
    if s["intents"]:
        for i in s["intents"]:
            oldest = f", oldest due {i['oldest_due_s']:.0f}s ago" if i["oldest_due_s"] is not None else ""
            lines.append(f"intents:  {i['kind']:<7} {i['n']} open, {i['due']} due, {i['claimed']} claimed{oldest}")
    else:
        lines.append("intents:  none")
    lines.append(f"settlers: {s['activity']['settlers']} connected "
                 f"(web connections: {s['activity']['web_connections']})")
    lines.append(f"settle_exhausted jobs: {s['exhausted']}")
    d = s.get("deliveries") or {"waiting": 0, "given_up": 0}
    lines.append(f"notifications: {d['waiting']} deliveries pending, {d['given_up']} failed"
                 + (" (GET /v1/notifications shows them; redeliver re-queues one)" if d["given_up"] else ""))
    for provider in sorted(set(s.get("caps", {})) | set(s.get("pauses", {}))):
        cap = s["caps"].get(provider)
        line = f"provider: {provider} {s['submitted'].get(provider, 0)} in flight"
        line += f" of {cap}" if cap is not None else (" (capped per model)" if provider in s["caps"] else "")
        until = s["pauses"].get(provider)
        if until is not None:
            line += f", paused {max(0.0, (until - s['now']).total_seconds()):.0f}s more (its 429)"
        lines.append(line)
    resolve = " — resolve with: longcall jobs resolve JOB_ID (--task-id ID | --failed)"
    lines.append(f"uncertain jobs: {jobs.get(JobStatus.UNCERTAIN, 0)}" + (resolve if s["uncertain_jobs"] else ""))
    for u in s["uncertain_jobs"]:
        lines.append(f"  {u['id']} {u['provider']} created {u['created_at']:%Y-%m-%d %H:%M:%S} {u['last_error'] or ''}")
    return "\n".join(lines)


async def status_command(settings: Settings) -> int:
    conn = await db.connect(settings.dsn, role="status")
    try:
        print(render(await collect(conn, capped_providers(settings))))
    finally:
        await conn.close()
    return 0
