"""Liveness, readiness and metrics."""
from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.metrics import collect_gauges


async def healthz(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def readyz(request: Request) -> Response:
    try:
        async with asyncio.timeout(2):
            await request.app.state.pool.fetchval("select 1")
    except Exception:
        return JSONResponse({"ok": False, "database": "unreachable"}, status_code=503)
    return JSONResponse({"ok": True})


async def metrics(request: Request) -> Response:
    try:
        async with asyncio.timeout(5):
            await collect_gauges(request.app.state.pool)
    except Exception:  # the counters are still worth serving
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def metrics_app(pool) -> Starlette:
    """The settler's own /metrics endpoint (`--metrics-port`)."""
    app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
    app.state.pool = pool
    return app
