"""`/v1/admin/*`, behind ADMIN_TOKEN (unset: these routes do not exist)."""
from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app import ids
from app.domain import jobs, recovery
from app.jobjson import render_job
from app.vocabulary import ApiErrorCode, JobStatus
from app.web.auth import read_token_for
from app.web.body import read_json_object
from app.web.errors import ApiError, not_found


def _require_admin(request: Request) -> None:
    token = request.app.state.settings.admin_token
    if not token:  # not mounted then (create_app); kept so an empty token never matches
        raise ApiError(ApiErrorCode.NOT_FOUND, "no such route")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(ApiErrorCode.UNAUTHENTICATED, "admin routes need 'Authorization: Bearer <ADMIN_TOKEN>'")


async def resolve_job(request: Request) -> Response:
    _require_admin(request)
    job_id = request.path_params["job_id"]
    if not ids.is_job_id(job_id):
        raise not_found()
    body = await read_json_object(request)
    if set(body) == {"provider_task_id"} and isinstance(body["provider_task_id"], str) \
            and recovery.is_task_id(body["provider_task_id"]):
        action = "task"
    elif body == {"outcome": JobStatus.FAILED}:
        action = "fail"
    else:
        raise ApiError(ApiErrorCode.INVALID_REQUEST,
                       'body must be {"provider_task_id": "..."} or {"outcome": "failed"}')
    pool = request.app.state.pool
    try:
        async with pool.acquire() as conn:
            if action == "task":
                await recovery.resolve_with_task(conn, job_id, body["provider_task_id"])
            else:
                await recovery.resolve_failed(conn, job_id, request.app.state.settings)
    except LookupError:
        raise not_found() from None
    except recovery.InvalidState as e:
        raise ApiError(ApiErrorCode.INVALID_STATE,
                       f"only an uncertain job can be resolved; this one is {e}") from None
    row = await jobs.get_job(pool, job_id)
    return JSONResponse(render_job(row, read_token_for(request, job_id)))
