"""Jobs routes: create, read (road 2 to a settle), list, cancel, outputs."""
from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import functools
import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from app import ids
from app.capacity import is_capped
from app.config import PROVIDERS
from app.domain import events, jobs, owners
from app.jobjson import iso, render_job
from app.storage import ObjectNotFound
from app.vocabulary import ALL_STATUSES, TERMINAL, ApiErrorCode, JobStatus
from app.web import outputs
from app.web.auth import (
    acting_for,
    bearer_key,
    has_bearer,
    read_token_again,
    read_token_for,
    require_owner,
    token_allows,
)
from app.web.body import (
    MAX_CREDITS,
    MAX_CURSOR,
    MAX_LIST_LIMIT,
    MAX_METADATA_BYTES,
    MAX_MODEL_LENGTH,
    MAX_WAIT_S,
    idempotency_key,
    invalid,
    parse_output_index,
    query_value,
    read_body,
    read_json_object,
)
from app.web.errors import ApiError, not_found
from outbox.roads import read as read_road

CREATE_FIELDS = ("provider", "model", "input", "max_credits")
OPTIONAL_CREATE_FIELDS = ("metadata",)
CORS = {"Access-Control-Allow-Origin": "*", "Vary": "Origin"}
# What an output response may do once in a browser: nothing. `sandbox` gives
# a document a unique opaque origin with scripts off; nosniff stops a browser
# from guessing a more active type than the one we send.
OUTPUT_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
# The cursors we issue hold a job's created_at; these bounds keep a forged
# one inside what both Python and PostgreSQL can represent after any offset.
CURSOR_EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
CURSOR_LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


def _validate_create(body: dict) -> tuple[str, str, dict, int, dict]:
    """The fields of a create body (already free of NULs, surrogates,
    non-finite numbers and deep nesting: app/web/body.py)."""
    unknown = sorted(set(body) - set(CREATE_FIELDS) - set(OPTIONAL_CREATE_FIELDS))
    if unknown:
        shown = ", ".join(json.dumps(name[:40]) for name in unknown[:5])
        raise invalid(f"unknown field(s): {shown}")
    missing = [f for f in CREATE_FIELDS if f not in body]
    if missing:
        raise invalid(f"missing field(s): {', '.join(missing)}")
    provider, model, input_, max_credits = body["provider"], body["model"], body["input"], body["max_credits"]
    if not isinstance(provider, str):
        raise invalid("provider must be a string")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_LENGTH:
        raise invalid(f"model must be a non-empty string of at most {MAX_MODEL_LENGTH} characters")
    if not isinstance(input_, dict):
        raise invalid("input must be a JSON object")
    if isinstance(max_credits, bool) or not isinstance(max_credits, int):
        raise invalid("max_credits must be a whole number")
    if not 1 <= max_credits <= MAX_CREDITS:
        raise invalid(f"max_credits must be between 1 and {MAX_CREDITS}")
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise invalid("metadata must be a JSON object")
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise invalid(f"metadata is {size} bytes as compact JSON; at most {MAX_METADATA_BYTES} are kept")
    if provider not in PROVIDERS:
        raise ApiError(ApiErrorCode.UNKNOWN_PROVIDER,
                       f"unknown provider {json.dumps(provider[:40])}; known: {', '.join(PROVIDERS)}")
    return provider, model, input_, max_credits, metadata


async def create_job(request: Request) -> Response:
    owner_id = await require_owner(request)
    key = idempotency_key(request)
    provider, model, input_, max_credits, metadata = _validate_create(await read_json_object(request))
    built = request.app.state.providers  # `sim` only with SIM_URL set (app.providers.build_providers)
    if provider not in built:
        raise ApiError(ApiErrorCode.UNKNOWN_PROVIDER,
                       f"unknown provider {json.dumps(provider[:40])}; known: {', '.join(built)}")
    settings = request.app.state.settings
    try:
        created = await jobs.create_job(
            request.app.state.pool, owner_id=owner_id, request_key=key, provider=provider,
            model=model, input=input_, max_credits=max_credits, metadata=metadata,
            give_up_after_s=settings.give_up_after(provider, built[provider].facts_for(model).give_up_after_s,
                                                   model=model))
    except jobs.InsufficientCredits as e:
        raise ApiError(ApiErrorCode.INSUFFICIENT_CREDITS, str(e)) from None
    except jobs.CapacityExhausted as e:
        raise ApiError(ApiErrorCode.CAPACITY_EXHAUSTED, str(e), {"Retry-After": "5"}) from None
    except jobs.IdempotencyConflict as e:
        raise ApiError(ApiErrorCode.IDEMPOTENCY_CONFLICT, str(e)) from None
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
        acting = acting_for(request)
        # A malformed Longcall-Owner names nobody: looked up as an id no owner has.
        row = key_hash and await jobs.get_job_with_key(
            request.app.state.pool, key_hash, job_id,
            None if acting is None else acting if ids.is_owner_id(acting) else "")
        if row and acting is not None and row["acting"] is None:
            raise not_found("owner")  # a Longcall-Owner not under this platform, token or not
        if row and row["id"] is not None:
            return row, False
        # A key that cannot read this job: its read token still does, as
        # it does without a key (a page holding another key, say).
        if "token" not in request.query_params:
            if not row:
                raise ApiError(ApiErrorCode.UNAUTHENTICATED, "the API key is not valid")
            raise not_found()
    if "token" in request.query_params:
        if not token_allows(request, job_id):
            raise not_found()
        row = await jobs.get_job(request.app.state.pool, job_id)
        if row is None:
            raise not_found()
        return row, True
    raise ApiError(ApiErrorCode.UNAUTHENTICATED, "send an API key as 'Authorization: Bearer <key>'")


def _wait_seconds(request: Request) -> float:
    raw = query_value(request, "wait")
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise invalid("wait must be a number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:  # NaN fails this too
        raise invalid(f"wait must be between 0 and {MAX_WAIT_S}")
    return value


def token_readable(route: Callable) -> Callable:
    """A route a read token may use, from a browser page holding a job's
    `status_url`: its errors answer CORS too when no API key was sent (a
    bad `?wait=`, a missing output, a bad token's 404), so the page's script
    reads the error instead of a bare network failure. They say no more
    than they say to anyone."""
    @functools.wraps(route)
    async def answer(request: Request) -> Response:
        try:
            return await route(request)
        except ApiError as exc:
            if not has_bearer(request):
                exc.headers = {**exc.headers, **CORS}
            raise
    return answer


@token_readable
async def read_job(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    wait_s = _wait_seconds(request)
    state = request.app.state
    # A read that may wait watches the job before its first look.
    async with state.job_changes.watch(job_id) if wait_s else contextlib.nullcontext() as changed:
        row, via_token = await _readable_job(request, job_id)
        await _maybe_recheck(request, row)
        if changed is not None and row["status"] not in TERMINAL:
            if await changed.wait(wait_s):
                row = await jobs.get_job(state.pool, job_id)
    token = read_token_again(request, job_id) if via_token else read_token_for(request, job_id)
    body = render_job(row, token, token_in_urls=via_token)
    return JSONResponse(body, headers=CORS if via_token else None)


async def _maybe_recheck(request: Request, row) -> None:
    settings = request.app.state.settings
    now = dt.datetime.now(dt.UTC)
    if read_road.wants_recheck(row["status"], row["created_at"], row["recheck_requested_at"], now,
                               settings.read_recheck_after_s):
        await read_road.ask_for_settle(request.app.state.pool, row["id"], settings.read_recheck_after_s)


def decode_cursor(raw: str, is_id: Callable[[str], bool] = ids.is_job_id) -> tuple[dt.datetime, str]:
    """A `next_cursor` we issued, back as (created_at in UTC, id) — a job's,
    or whatever `is_id` accepts. A forged one is a 400, whatever it holds: it
    never reaches PostgreSQL unbounded."""
    bad = invalid("cursor is not valid")
    if len(raw) > MAX_CURSOR:
        raise bad
    try:
        decoded = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        raise bad from None
    if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(v, str) for v in decoded)):
        raise bad
    created_at, job_id = decoded
    if not is_id(job_id):
        raise bad
    try:
        parsed = dt.datetime.fromisoformat(created_at)
        if parsed.tzinfo is None:
            raise bad
        parsed = parsed.astimezone(dt.UTC)  # an offset near year 1 or 9999 overflows here
    except (ValueError, OverflowError):
        raise bad from None
    if not CURSOR_EARLIEST <= parsed < CURSOR_LATEST:
        raise bad
    return parsed, job_id


def encode_cursor(row) -> str:
    raw = json.dumps([row["created_at"].isoformat(), row["id"]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def refuse_unknown_parameters(request: Request, known: set[str]) -> None:
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        shown = ", ".join(json.dumps(name[:40]) for name in unknown[:5])
        raise invalid(f"unknown parameter(s): {shown}")


def page_limit(request: Request, *, default: int = 20, maximum: int = MAX_LIST_LIMIT) -> int:
    """`?limit=`: a whole number from 1 to `maximum`."""
    raw = query_value(request, "limit")
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit():
        raise invalid("limit must be a whole number")
    limit = int(raw)
    if not 1 <= limit <= maximum:
        raise invalid(f"limit must be between 1 and {maximum}")
    return limit


async def list_jobs(request: Request) -> Response:
    owner_id = await require_owner(request)
    refuse_unknown_parameters(request, {"status", "limit", "cursor"})
    status = query_value(request, "status")
    if status is not None and status not in ALL_STATUSES:
        raise invalid(f"status must be one of {', '.join(ALL_STATUSES)}")
    limit = page_limit(request)
    cursor = query_value(request, "cursor")
    after = decode_cursor(cursor) if cursor else None
    page, more = await jobs.list_jobs(request.app.state.pool, owner_id, status=status, limit=limit, after=after)
    next_cursor = encode_cursor(page[-1]) if more else None
    return JSONResponse({"jobs": [render_job(r, read_token_for(request, r["id"])) for r in page],
                         "next_cursor": next_cursor})


async def cancel_job(request: Request) -> Response:
    owner_id = await require_owner(request)
    await read_body(request)  # none is taken, but one over the cap is refused (413) before the cancel
    job_id = request.path_params["job_id"]
    if not ids.is_job_id(job_id):
        raise not_found()
    pool = request.app.state.pool
    row = await jobs.get_job(pool, job_id)
    if row is None or row["owner_id"] != owner_id:
        raise not_found()
    async with pool.acquire() as conn:
        closed = await jobs.close(conn, job_id, JobStatus.CANCELLED, cancel_at_provider=True,
                                  wake_capacity=is_capped(request.app.state.settings, row["provider"]))
    if closed is None:
        now = await jobs.get_job(pool, job_id)
        raise ApiError(ApiErrorCode.INVALID_STATE, f"the job is already {now['status'] if now else 'gone'}")
    request.app.state.metrics.job_finished(row["provider"], JobStatus.CANCELLED, closed)
    row = await jobs.get_job(pool, job_id)
    return JSONResponse(render_job(row, read_token_for(request, job_id)))


@token_readable
async def read_output(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    row, via_token = await _readable_job(request, job_id)
    return await serve_output(request, job_id, row["outputs"], request.path_params["index"],
                              CORS if via_token else {})


async def serve_output(request: Request, job_id: str, assets: list, index_text: str,
                       extra_headers: dict[str, str]) -> Response:
    """One stored output of a job, as every reader gets it (the owner, a read
    token, the console): its bytes or a presigned redirect, never inline
    unless passive media. `assets`: the job's stored outputs."""
    index = parse_output_index(index_text)
    asset = next((a for a in assets if a["index"] == index), None) if index is not None else None
    if asset is None:
        raise not_found("output")
    storage = request.app.state.storage
    content_type = outputs.served_type(asset["content_type"])
    disposition = outputs.disposition(asset["content_type"], f"{job_id}-{index}")
    headers = {**extra_headers, **OUTPUT_HEADERS}
    url = await storage.presigned_url(asset["storage_key"], 60, content_type=content_type,
                                      content_disposition=disposition)
    if url is not None:
        return RedirectResponse(url, status_code=302, headers=headers)
    try:
        stream = await storage.open_stream(asset["storage_key"])
    except ObjectNotFound:
        raise not_found("output") from None
    headers["Content-Length"] = str(asset["bytes"])
    headers["ETag"] = f'"{asset["sha256"]}"'
    headers["Content-Disposition"] = disposition
    return StreamingResponse(stream, media_type=content_type, headers=headers)


@token_readable
async def read_events(request: Request) -> Response:
    """The job's timeline, oldest first (app/domain/events.py)."""
    job_id = request.path_params["job_id"]
    _, via_token = await _readable_job(request, job_id)
    async with request.app.state.pool.acquire() as conn:
        lines = await events.timeline(conn, job_id)
    body = {"events": [{"at": iso(e["at"]), "type": e["type"], "detail": e["detail"]} for e in lines]}
    return JSONResponse(body, headers=CORS if via_token else None)


async def cors_preflight(request: Request) -> Response:
    return Response(status_code=204, headers={
        **CORS, "Access-Control-Allow-Methods": "GET, OPTIONS", "Access-Control-Max-Age": "600"})
