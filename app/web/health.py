"""Liveness, readiness and metrics."""
from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

# The web's /metrics is the one endpoint the settler also serves, alone.
from app.metrics import scrape as metrics  # noqa: F401


async def healthz(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def readyz(request: Request) -> Response:
    try:
        async with asyncio.timeout(2):
            await request.app.state.pool.fetchval("select 1")
    except Exception:
        return JSONResponse({"ok": False, "database": "unreachable"}, status_code=503)
    return JSONResponse({"ok": True})
