"""Liveness, readiness and metrics."""
from __future__ import annotations

import asyncio

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app import migrate

# The web's /metrics is the one endpoint the settler also serves, alone.
from app.metrics import scrape as metrics  # noqa: F401


async def healthz(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def readyz(request: Request) -> Response:
    """Ready: the database answers, and it is migrated as far as this code
    expects (before `longcall migrate`, every authenticated request would
    fail). One primary-key read of a small table."""
    state = request.app.state
    try:
        async with asyncio.timeout(2):
            current = await state.pool.fetchval(migrate.IS_CURRENT, state.schema_version)
    except asyncpg.UndefinedTableError:
        current = False
    except Exception:
        return JSONResponse({"ok": False, "database": "unreachable"}, status_code=503)
    if not current:
        return JSONResponse({"ok": False, "database": "not migrated (run longcall migrate)"}, status_code=503)
    return JSONResponse({"ok": True})
