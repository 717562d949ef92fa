"""The owners routes: a platform owner's key creates, lists and reads the
owners under it and grants them credits (CONTRACT.md: Apps with many
users). The money moves in app/domain/owners.py; acting for an owner is
app/web/auth.py's."""
from __future__ import annotations

import json

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app import ids
from app.domain import owners
from app.domain.owners import MAX_GRANT, MAX_OWNER_ACTIVE, MAX_OWNER_NAME, is_owner_name
from app.jobjson import iso
from app.vocabulary import ApiErrorCode
from app.web.auth import require_platform
from app.web.body import idempotency_key, invalid, query_value, read_json_object
from app.web.errors import ApiError, not_found
from app.web.jobs import decode_cursor, encode_cursor, page_limit, refuse_unknown_parameters

OWNER_FIELDS = ("name", "credits", "max_active")
GRANT_FIELDS = ("credits", "reason")
MAX_GRANT_REASON = 500
DEFAULT_MAX_ACTIVE = 10


def owner_json(owner: owners.Owner) -> dict:
    return {"owner_id": owner.id, "name": owner.name,
            "credits": {"granted": owner.granted, "balance": owner.balance, "reserved": owner.reserved,
                        "charged": owner.charged},
            "active": owner.active, "max_active": owner.max_active, "created_at": iso(owner.created_at)}


def _refuse_unknown_fields(body: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise invalid(f"unknown field(s): {', '.join(json.dumps(n[:40]) for n in unknown[:5])}")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_new_owner(body: dict) -> tuple[str, int, int]:
    """(name, credits, max_active) of a `POST /v1/owners` body (pure)."""
    _refuse_unknown_fields(body, OWNER_FIELDS)
    name = body.get("name")
    if not isinstance(name, str) or not is_owner_name(name):
        raise invalid(f"name must be a string of 1 to {MAX_OWNER_NAME} printable characters, not blank")
    credits = body.get("credits", 0)
    if not _whole(credits) or not 0 <= credits <= MAX_GRANT:
        raise invalid(f"credits must be a whole number from 0 to {MAX_GRANT}")
    max_active = body.get("max_active", DEFAULT_MAX_ACTIVE)
    if not _whole(max_active) or not 0 <= max_active <= MAX_OWNER_ACTIVE:
        raise invalid(f"max_active must be a whole number from 0 to {MAX_OWNER_ACTIVE}")
    return name, credits, max_active


def validate_grant(body: dict) -> tuple[int, str | None]:
    """(credits, reason) of a grant body (pure): credits a whole number, not
    zero; negative takes credits back."""
    _refuse_unknown_fields(body, GRANT_FIELDS)
    if "credits" not in body:
        raise invalid("missing field(s): credits")
    credits = body["credits"]
    if not _whole(credits) or credits == 0 or abs(credits) > MAX_GRANT:
        raise invalid(f"credits must be a whole number from -{MAX_GRANT} to {MAX_GRANT}, not 0 "
                      "(negative takes credits back)")
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_GRANT_REASON):
        raise invalid(f"reason must be a string of at most {MAX_GRANT_REASON} characters")
    return credits, reason


async def create_owner(request: Request) -> Response:
    platform_id = await require_platform(request)
    key = idempotency_key(request)
    name, credits, max_active = validate_new_owner(await read_json_object(request))
    async with request.app.state.pool.acquire() as conn:
        try:
            owner, created = await owners.create_under(conn, platform_id, name=name, credits=credits,
                                                       max_active=max_active, request_key=key)
        except owners.IdempotencyConflict as e:
            raise ApiError(ApiErrorCode.IDEMPOTENCY_CONFLICT, str(e)) from None
    return JSONResponse(owner_json(owner), status_code=201 if created else 200,
                        headers={"Location": f"/v1/owners/{owner.id}"})


async def list_owners(request: Request) -> Response:
    platform_id = await require_platform(request)
    refuse_unknown_parameters(request, {"limit", "cursor"})
    limit = page_limit(request)
    cursor = query_value(request, "cursor")
    after = decode_cursor(cursor, ids.is_owner_id) if cursor else None
    async with request.app.state.pool.acquire() as conn:
        found = await owners.list_under(conn, platform_id, limit=limit + 1, after=after)
    page = found[:limit]
    next_cursor = encode_cursor({"created_at": page[-1].created_at, "id": page[-1].id}) if len(found) > limit else None
    return JSONResponse({"owners": [owner_json(o) for o in page], "next_cursor": next_cursor})


async def read_owner(request: Request) -> Response:
    platform_id = await require_platform(request)
    async with request.app.state.pool.acquire() as conn:
        owner = await owners.get_under(conn, platform_id, request.path_params["owner_id"])
    if owner is None:
        raise not_found("owner")
    return JSONResponse(owner_json(owner))


async def grant_credits(request: Request) -> Response:
    platform_id = await require_platform(request)
    owner_id = request.path_params["owner_id"]
    key = idempotency_key(request)
    if key is None:
        raise invalid("a grant needs an Idempotency-Key header: it moves money, and a retry must not move it twice")
    credits, reason = validate_grant(await read_json_object(request))
    async with request.app.state.pool.acquire() as conn:
        try:
            owner, moved = await owners.grant_under(conn, platform_id, owner_id, credits=credits, reason=reason,
                                                    request_key=key)
        except owners.NotFound:
            raise not_found("owner") from None
        except owners.InsufficientCredits as e:
            raise ApiError(ApiErrorCode.INSUFFICIENT_CREDITS, str(e)) from None
        except owners.IdempotencyConflict as e:
            raise ApiError(ApiErrorCode.IDEMPOTENCY_CONFLICT, str(e)) from None
        except asyncpg.NumericValueOutOfRangeError:
            raise invalid("that grant would take the owner's credits past what can be counted") from None
    return JSONResponse(owner_json(owner), status_code=201 if moved else 200)
