"""Liveness, readiness and metrics."""
from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


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
    gauges = getattr(request.app.state, "collect_gauges", None)
    if gauges is not None:
        await gauges()
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
