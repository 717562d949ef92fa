"""Jobs routes: create, read (road 2 to a settle), list, cancel, outputs."""
from __future__ import annotations

import base64
import datetime as dt
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from app import ids
from app.config import PROVIDERS
from app.domain import jobs, owners
from app.storage import ObjectNotFound
from app.vocabulary import ALL_STATUSES, TERMINAL, JobStatus
from app.web.auth import bearer_key, has_bearer, read_token_for, require_owner, token_allows
from app.web.body import read_json_object
from app.web.errors import ApiError, not_found
from app.web.render import render_job
from outbox.roads import read as read_road

CREATE_FIELDS = {"provider", "model", "input", "max_credits"}
MAX_CREDITS = 10**12
MAX_WAIT_S = 30
CORS = {"Access-Control-Allow-Origin": "*", "Vary": "Origin"}


def _validate_create(body: dict) -> tuple[str, str, dict, int]:
    unknown = set(body) - CREATE_FIELDS
    if unknown:
        raise ApiError("invalid_request", f"unknown field(s): {', '.join(sorted(unknown))}")
    missing = [f for f in ("provider", "model", "input", "max_credits") if f not in body]
    if missing:
        raise ApiError("invalid_request", f"missing field(s): {', '.join(missing)}")
    provider, model, input_, max_credits = body["provider"], body["model"], body["input"], body["max_credits"]
    if not isinstance(provider, str):
        raise ApiError("invalid_request", "provider must be a string")
    if not isinstance(model, str) or not model.strip() or len(model) > 200:
        raise ApiError("invalid_request", "model must be a non-empty string of at most 200 characters")
    if not isinstance(input_, dict):
        raise ApiError("invalid_request", "input must be a JSON object")
    if isinstance(max_credits, bool) or not isinstance(max_credits, int):
        raise ApiError("invalid_request", "max_credits must be a whole number")
    if not 1 <= max_credits <= MAX_CREDITS:
        raise ApiError("invalid_request", f"max_credits must be between 1 and {MAX_CREDITS}")
    if provider not in PROVIDERS:
        raise ApiError("unknown_provider", f"unknown provider {provider!r}; known: {', '.join(PROVIDERS)}")
    if "\x00" in json.dumps(input_):
        raise ApiError("invalid_request", "input must not contain NUL characters")
    return provider, model, input_, max_credits


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not 1 <= len(key) <= 255 or not key.isprintable():
        raise ApiError("invalid_request", "Idempotency-Key must be 1 to 255 printable characters")
    return key


async def create_job(request: Request) -> Response:
    owner_id = await require_owner(request)
    key = _idempotency_key(request)
    provider, model, input_, max_credits = _validate_create(await read_json_object(request))
    settings = request.app.state.settings
    try:
        created = await jobs.create_job(
            request.app.state.pool, owner_id=owner_id, request_key=key, provider=provider,
            model=model, input=input_, max_credits=max_credits,
            give_up_after_s=settings.give_up_after(provider))
    except jobs.InsufficientCredits as e:
        raise ApiError("insufficient_credits", str(e)) from None
    except jobs.CapacityExhausted as e:
        raise ApiError("capacity_exhausted", str(e), {"Retry-After": "5"}) from None
    except jobs.IdempotencyConflict as e:
        raise ApiError("idempotency_conflict", str(e)) from None
    row = created.row or await jobs.get_job(request.app.state.pool, created.job_id)
    body = render_job(row, read_token_for(request, created.job_id))
    if created.created:
        request.app.state.metrics.job_created(provider)
        return JSONResponse(body, status_code=202, headers={"Location": f"/v1/jobs/{created.job_id}"})
    return JSONResponse(body, status_code=200, headers={"Location": f"/v1/jobs/{created.job_id}"})


async def _readable_job(request: Request, job_id: str):
    """(row, via_token). Owner by API key, or anyone with this job's token."""
    if not ids.is_job_id(job_id):
        raise not_found()
    if has_bearer(request):
        key_hash = owners.lookup_hash(bearer_key(request))
        row = key_hash and await jobs.get_job_with_key(request.app.state.pool, key_hash, job_id)
        if not row:
            raise ApiError("unauthenticated", "the API key is not valid")
        if row["id"] is None:
            raise not_found()
        return row, False
    if "token" in request.query_params:
        if not token_allows(request, job_id):
            raise not_found()
        row = await jobs.get_job(request.app.state.pool, job_id)
        if row is None:
            raise not_found()
        return row, True
    raise ApiError("unauthenticated", "send an API key as 'Authorization: Bearer <key>'")


def _wait_seconds(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ApiError("invalid_request", "wait must be a number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise ApiError("invalid_request", f"wait must be between 0 and {MAX_WAIT_S}")
    return value


async def read_job(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    wait_s = _wait_seconds(request)
    state = request.app.state
    with state.job_changes.watch(job_id) as changed:
        row, via_token = await _readable_job(request, job_id)
        await _maybe_recheck(request, row)
        if wait_s and row["status"] not in TERMINAL:
            if await changed.wait(wait_s):
                row = await jobs.get_job(state.pool, job_id)
    body = render_job(row, read_token_for(request, job_id), token_in_urls=via_token)
    return JSONResponse(body, headers=CORS if via_token else None)


async def _maybe_recheck(request: Request, row) -> None:
    settings = request.app.state.settings
    now = dt.datetime.now(dt.UTC)
    if read_road.wants_recheck(row["status"], row["created_at"], row["recheck_requested_at"], now,
                               settings.read_recheck_after_s):
        await read_road.ask_for_settle(request.app.state.pool, row["id"], settings.read_recheck_after_s)


def _decode_cursor(raw: str) -> tuple[dt.datetime, str]:
    try:
        created_at, job_id = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        parsed = dt.datetime.fromisoformat(created_at)
        if not ids.is_job_id(job_id) or parsed.tzinfo is None:
            raise ValueError
        return parsed, job_id
    except Exception:
        raise ApiError("invalid_request", "cursor is not valid") from None


def _encode_cursor(row) -> str:
    raw = json.dumps([row["created_at"].isoformat(), row["id"]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def list_jobs(request: Request) -> Response:
    owner_id = await require_owner(request)
    q = request.query_params
    unknown = set(q.keys()) - {"status", "limit", "cursor"}
    if unknown:
        raise ApiError("invalid_request", f"unknown parameter(s): {', '.join(sorted(unknown))}")
    status = q.get("status")
    if status is not None and status not in ALL_STATUSES:
        raise ApiError("invalid_request", f"status must be one of {', '.join(ALL_STATUSES)}")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise ApiError("invalid_request", "limit must be a whole number") from None
    if not 1 <= limit <= 100:
        raise ApiError("invalid_request", "limit must be between 1 and 100")
    after = _decode_cursor(q["cursor"]) if q.get("cursor") else None
    rows = await jobs.list_jobs(request.app.state.pool, owner_id, status=status, limit=limit + 1,
                                after=after)
    page = rows[:limit]
    next_cursor = _encode_cursor(page[-1]) if len(rows) > limit else None
    return JSONResponse({"jobs": [render_job(r, read_token_for(request, r["id"])) for r in page],
                         "next_cursor": next_cursor})


async def cancel_job(request: Request) -> Response:
    owner_id = await require_owner(request)
    job_id = request.path_params["job_id"]
    if not ids.is_job_id(job_id):
        raise not_found()
    pool = request.app.state.pool
    row = await jobs.get_job(pool, job_id)
    if row is None or row["owner_id"] != owner_id:
        raise not_found()
    async with pool.acquire() as conn:
        closed = await jobs.close(conn, job_id, JobStatus.CANCELLED, cancel_at_provider=True)
    if closed is None:
        raise ApiError("invalid_state", f"the job is already {(await jobs.get_job(pool, job_id))['status']}")
    request.app.state.metrics.job_finished(row["provider"], JobStatus.CANCELLED, closed)
    row = await jobs.get_job(pool, job_id)
    return JSONResponse(render_job(row, read_token_for(request, job_id)))


async def read_output(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    row, via_token = await _readable_job(request, job_id)
    try:
        index = int(request.path_params["index"])
    except ValueError:
        raise not_found("output") from None
    asset = next((a for a in row["outputs"] if a["index"] == index), None)
    if asset is None:
        raise not_found("output")
    storage = request.app.state.storage
    headers = dict(CORS) if via_token else {}
    url = await storage.presigned_url(asset["storage_key"], 60)
    if url is not None:
        return RedirectResponse(url, status_code=302, headers=headers)
    try:
        stream = await storage.open_stream(asset["storage_key"])
    except ObjectNotFound:
        raise not_found("output") from None
    headers["Content-Length"] = str(asset["bytes"])
    headers["ETag"] = f'"{asset["sha256"]}"'
    return StreamingResponse(stream,
                             media_type=asset["content_type"] or "application/octet-stream",
                             headers=headers)


async def cors_preflight(request: Request) -> Response:
    return Response(status_code=204, headers={
        **CORS, "Access-Control-Allow-Methods": "GET, OPTIONS", "Access-Control-Max-Age": "600"})
