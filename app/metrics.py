"""Prometheus metrics. Counters where things count; gauges (outbox depth,
oldest due intent) are computed only when scraped, so an idle system issues
no queries for them.

`scrape` is the one /metrics endpoint: the web app routes to it, and the
settler serves it alone (`metrics_app`, `--metrics-port`) without pulling in
the web edge."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.vocabulary import IN_FLIGHT, SUBMITTED, IntentKind, sql_list

JOBS_CREATED = Counter("longcall_jobs_created_total", "Jobs created", ["provider"])
JOBS_FINISHED = Counter("longcall_jobs_finished_total", "Jobs that reached a terminal state",
                        ["provider", "status"])
PROVIDER_CALLS = Counter("longcall_provider_calls_total", "Calls to providers",
                         ["provider", "operation", "outcome"])
WEBHOOKS = Counter("longcall_webhook_requests_total", "Webhook requests by result",
                   ["provider", "result"])
CREDITS_CHARGED = Counter("longcall_credits_charged_total", "Credits charged")
CREDITS_REFUNDED = Counter("longcall_credits_refunded_total", "Credits refunded")
SETTLE_SECONDS = Histogram("longcall_settle_duration_seconds", "Time of one settle step",
                           ["provider", "outcome"],
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
DOWNLOAD_BYTES = Histogram("longcall_download_bytes", "Bytes per downloaded output",
                           buckets=(1024, 16384, 262144, 1 << 20, 16 << 20, 128 << 20, 1 << 30, 4 << 30))
INTENTS = Counter("longcall_intents_total", "Outbox intents processed", ["kind", "outcome"])
SWEEPS = Counter("longcall_sweeps_total", "Backstop sweep passes")
SWEEP_FOUND = Counter("longcall_sweep_found_total", "What the sweep found", ["what"])


# Bounded labels only (app/web/access_log.py): `route` is the matched route's
# template or `other`, never a raw path a client could make unique.
HTTP_REQUESTS = Counter("longcall_http_requests_total", "HTTP requests by method, route template and status",
                        ["method", "route", "status"])

# Levels, read from the database only when /metrics is scraped.
OUTBOX_INTENTS = Gauge("longcall_outbox_intents", "Open outbox intents", ["kind"])
OUTBOX_DUE = Gauge("longcall_outbox_due_intents", "Outbox intents due now", ["kind"])
OUTBOX_OLDEST_DUE = Gauge("longcall_outbox_oldest_due_seconds",
                          "Age of the oldest due, unclaimed intent (0 when none)")
JOBS_IN_FLIGHT = Gauge("longcall_jobs_in_flight", "Jobs not yet terminal", ["status"])
PROVIDER_SUBMITTED = Gauge("longcall_provider_submitted_jobs",
                           "Jobs submitted and not yet closed, by provider (what MAX_IN_FLIGHT_<PROVIDER> counts)",
                           ["provider"])
PROVIDER_CAP = Gauge("longcall_provider_max_in_flight", "MAX_IN_FLIGHT_<PROVIDER>, where set", ["provider"])
PROVIDER_PAUSED = Gauge("longcall_provider_paused_seconds",
                        "Seconds left of a provider's pause (its 429's Retry-After); 0 when none", ["provider"])

GAUGES_QUERY = f"""
select 'outbox' as what, kind as label, count(*) as n,
       count(*) filter (where not_before <= now()) as due,
       coalesce(extract(epoch from now() - min(not_before)
                filter (where not_before <= now() and (claimed_until is null or claimed_until <= now()))), 0) as oldest
from outbox group by kind
union all
select 'jobs', status, count(*), 0, 0 from jobs
where finished_at is null and status in {sql_list(IN_FLIGHT)} group by status
union all
select 'submitted', provider, count(*), 0, 0 from jobs
where status in {sql_list(SUBMITTED)} group by provider
union all
select 'paused', provider, 0, 0, extract(epoch from until - now()) from provider_pauses where until > now()
"""


async def collect_gauges(pool, caps: Mapping[str, int | None] | None = None) -> None:
    """`caps`: MAX_IN_FLIGHT_<PROVIDER> of every capped provider (app/capacity.py capped_providers)."""
    rows = await pool.fetch(GAUGES_QUERY)
    oldest = 0.0
    for kind in IntentKind:
        OUTBOX_INTENTS.labels(kind).set(0)
        OUTBOX_DUE.labels(kind).set(0)
    for status in IN_FLIGHT:
        JOBS_IN_FLIGHT.labels(status).set(0)
    for provider, cap in (caps or {}).items():
        PROVIDER_SUBMITTED.labels(provider).set(0)
        PROVIDER_PAUSED.labels(provider).set(0)
        if cap is not None:
            PROVIDER_CAP.labels(provider).set(cap)
    for r in rows:
        if r["what"] == "outbox":
            OUTBOX_INTENTS.labels(r["label"]).set(r["n"])
            OUTBOX_DUE.labels(r["label"]).set(r["due"])
            oldest = max(oldest, float(r["oldest"]))
        elif r["what"] == "submitted":
            PROVIDER_SUBMITTED.labels(r["label"]).set(r["n"])
        elif r["what"] == "paused":
            PROVIDER_PAUSED.labels(r["label"]).set(float(r["oldest"]))
        else:
            JOBS_IN_FLIGHT.labels(r["label"]).set(r["n"])
    OUTBOX_OLDEST_DUE.set(oldest)


async def scrape(request: Request) -> Response:
    """GET /metrics; the app's state holds the database pool."""
    # The counters are still worth serving when the gauges cannot be read.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5):
            await collect_gauges(request.app.state.pool, getattr(request.app.state, "caps", None))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def metrics_app(pool, caps: Mapping[str, int | None] | None = None) -> Starlette:
    """The settler's own /metrics endpoint (`--metrics-port`)."""
    app = Starlette(routes=[Route("/metrics", scrape, methods=["GET"])])
    app.state.pool = pool
    app.state.caps = caps or {}
    return app


class Metrics:
    """The few calls the code makes, so call sites stay one line."""

    def job_created(self, provider: str) -> None:
        JOBS_CREATED.labels(provider).inc()

    def job_finished(self, provider: str, status: str, closed) -> None:
        JOBS_FINISHED.labels(provider, status).inc()
        if closed is not None:
            CREDITS_CHARGED.inc(closed.charged)
            CREDITS_REFUNDED.inc(closed.refunded)

    def provider_call(self, provider: str, operation: str, outcome: str) -> None:
        PROVIDER_CALLS.labels(provider, operation, outcome).inc()

    def webhook(self, provider: str, result: str) -> None:
        WEBHOOKS.labels(provider, result).inc()
