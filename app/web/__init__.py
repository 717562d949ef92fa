"""The web tier: a Starlette app. Stateless; scale it out behind a load
balancer."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from app import db, migrate
from app.capacity import capped_providers
from app.config import Settings
from app.domain import owners as owners_domain
from app.download import system_resolver
from app.metrics import Metrics
from app.providers import build_providers, close_providers
from app.signing.secretbox import SecretBox
from app.storage import open_storage
from app.vocabulary import ApiErrorCode
from app.web import admin, console, health, jobs, models, notifications, openapi, owners, webhooks
from app.web.access_log import AccessLog
from app.web.auth import require_owner
from app.web.errors import ApiError, error_response
from app.web.waiters import JobChanges

log = logging.getLogger("longcall.web")


async def account(request: Request) -> JSONResponse:
    owner_id = await require_owner(request)
    return JSONResponse(await owners_domain.account(request.app.state.pool, owner_id))


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.code, exc.message, exc.headers)


def allowed_methods(routes: list[BaseRoute], path: str) -> str:
    """The Allow header for a path: the methods of every route on it (one
    path may have several Route entries, one per method)."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    return ", ".join(sorted(methods))


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 405:
        return error_response(ApiErrorCode.METHOD_NOT_ALLOWED, "method not allowed on this route",
                              {"Allow": allowed_methods(request.app.routes, request.url.path)})
    if exc.status_code == 404:
        return error_response(ApiErrorCode.NOT_FOUND, "no such route")
    return JSONResponse({"error": {"code": ApiErrorCode.INVALID_REQUEST, "message": str(exc.detail)}},
                        status_code=exc.status_code)


# The database is restarting or out of reach: a temporary condition, said so.
# PostgresConnectionError is SQLSTATE class 08 (among them "connection does not
# exist": cut in the middle of a statement); OperatorInterventionError is class
# 57 (admin/crash shutdown, cannot connect now, a cancelled statement).
# asyncpg raises InternalClientError when a connection's protocol state breaks
# under it — seen when the server shuts down between two statements ("cannot
# switch to state 12; another operation (2) is in progress").
DATABASE_DOWN = (OSError, asyncio.TimeoutError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                 asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError)


NOT_MIGRATED = (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError)


async def _database_away(request: Request, exc: Exception) -> JSONResponse:
    # Registered per class (not under Exception) so Starlette answers without
    # re-raising: an expected outage is one warning line, not a traceback.
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(ApiErrorCode.UNAVAILABLE, "the database is unavailable; try again shortly",
                          {"Retry-After": "1"})


async def _not_migrated(request: Request, exc: Exception) -> JSONResponse:
    # Our own tables or columns missing: the database is behind this code.
    # Not a bug nor the client's fault: unavailable until `longcall migrate`.
    log.warning("database not migrated on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(ApiErrorCode.UNAVAILABLE, "the database is not migrated yet; try again shortly",
                          {"Retry-After": "5"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Never echo the exception: it may carry anything.
    log.error("unhandled error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error_response(ApiErrorCode.INTERNAL, "internal error")


# Starlette tries the routes in order, a regex each. The providers' webhooks
# come first: they are the busiest route, and no other path overlaps theirs
# (routing one at the 22nd place took 11.3 µs, at the first 1.5 µs).
ROUTES = [
    Route("/webhooks/{provider}/{job_id}", webhooks.receive_webhook, methods=["POST"]),
    Route("/v1/jobs", jobs.create_job, methods=["POST"]),
    Route("/v1/jobs", jobs.list_jobs, methods=["GET"]),
    Route("/v1/jobs/{job_id}", jobs.read_job, methods=["GET"]),
    Route("/v1/jobs/{job_id}", jobs.cors_preflight, methods=["OPTIONS"]),
    Route("/v1/jobs/{job_id}/cancel", jobs.cancel_job, methods=["POST"]),
    Route("/v1/jobs/{job_id}/outputs/{index}", jobs.read_output, methods=["GET"]),
    Route("/v1/jobs/{job_id}/outputs/{index}", jobs.cors_preflight, methods=["OPTIONS"]),
    Route("/v1/jobs/{job_id}/events", jobs.read_events, methods=["GET"]),
    Route("/v1/jobs/{job_id}/events", jobs.cors_preflight, methods=["OPTIONS"]),
    Route("/v1/webhook-endpoints", notifications.create_endpoint, methods=["POST"]),
    Route("/v1/webhook-endpoints", notifications.list_endpoints, methods=["GET"]),
    Route("/v1/webhook-endpoints/{endpoint_id}", notifications.delete_endpoint, methods=["DELETE"]),
    Route("/v1/notifications", notifications.list_notifications, methods=["GET"]),
    Route("/v1/notifications/{notification_id}/redeliver", notifications.redeliver, methods=["POST"]),
    Route("/v1/account", account, methods=["GET"]),
    Route("/v1/owners", owners.create_owner, methods=["POST"]),
    Route("/v1/owners", owners.list_owners, methods=["GET"]),
    Route("/v1/owners/{owner_id}", owners.read_owner, methods=["GET"]),
    Route("/v1/owners/{owner_id}/grants", owners.grant_credits, methods=["POST"]),
    Route("/v1/models", models.list_models, methods=["GET"]),
    Route("/healthz", health.healthz, methods=["GET"]),
    Route("/readyz", health.readyz, methods=["GET"]),
    Route("/metrics", health.metrics, methods=["GET"]),
    Route("/openapi.json", openapi.openapi, methods=["GET"]),
]
# Behind ADMIN_TOKEN: while it is unset these routes do not exist, so any
# method on their paths is the same 404 as an unknown path (not a 405 that
# tells the route is there).
ADMIN_ROUTES = [
    Route("/v1/admin/jobs/{job_id}/resolve", admin.resolve_job, methods=["POST"]),
    *console.ROUTES,
]


def create_app(settings: Settings, *, pool_size: int = 20, endpoint_resolver=system_resolver) -> Starlette:
    """`endpoint_resolver`: how a registered endpoint's name is looked up (tests give a fake DNS)."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state = app.state
        database_url = settings.dsn
        state.settings = settings
        state.schema_version = migrate.latest_version()  # what /readyz expects the database at
        state.metrics = Metrics()
        state.caps = capped_providers(settings)  # for the gauges of /metrics
        state.secretbox = SecretBox(settings.secret_keys)
        state.endpoint_resolver = endpoint_resolver
        state.pool = await db.create_pool(database_url, role="web", min_size=2,
                                          max_size=pool_size)
        state.providers = build_providers(settings, timeout_s=settings.provider_timeout_s)
        state.storage = open_storage(settings.storage_url, s3_endpoint_url=settings.s3_endpoint_url)
        state.job_changes = JobChanges(database_url)
        await state.job_changes.start()
        try:
            yield
        finally:
            await state.job_changes.stop()
            await close_providers(state.providers)
            await state.storage.aclose()
            await state.pool.close()

    handlers: dict[Any, Callable] = {ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected,
                                     **{kind: _database_away for kind in DATABASE_DOWN},
                                     **{kind: _not_migrated for kind in NOT_MIGRATED}}
    routes = ROUTES + ADMIN_ROUTES if settings.admin_token else ROUTES
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    # No redirect from `/v1/jobs/` to `/v1/jobs`: Starlette builds that Location
    # from the request's Host header, which the client chooses. A 404 instead.
    app.router.redirect_slashes = False
    app.add_middleware(AccessLog)
    return app


def create_app_from_env() -> Starlette:
    """For `longcall serve --workers N` (uvicorn imports it in each worker)."""
    from app.config import load_settings
    from app.logs import configure_logging

    settings = load_settings()
    configure_logging(settings.log_level)
    return create_app(settings)
