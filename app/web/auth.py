"""Who is asking: an owner's API key (a platform's, perhaps acting for one
of its owners with `Longcall-Owner`), or a job's signed read token."""
from __future__ import annotations

import time

from starlette.requests import Request

from app.domain import owners
from app.jobjson import read_token
from app.signing.tokens import check_read_token, make_read_token, read_token_expiry
from app.vocabulary import ApiErrorCode
from app.web.body import invalid
from app.web.errors import ApiError, not_found

ACTING_HEADER = "longcall-owner"


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(ApiErrorCode.UNAUTHENTICATED, "send an API key as 'Authorization: Bearer <key>'")
    return key.strip()


def acting_for(request: Request) -> str | None:
    """The owner a Longcall-Owner header names (None without one)."""
    return request.headers.get(ACTING_HEADER)


async def caller(request: Request) -> owners.Caller:
    try:
        found = await owners.authenticate(request.app.state.pool, bearer_key(request), acting_for(request))
    except owners.NotFound:
        raise not_found("owner") from None
    if found is None:
        raise ApiError(ApiErrorCode.UNAUTHENTICATED, "the API key is not valid")
    return found


async def require_owner(request: Request) -> str:
    """The owner this request is: the key's, or the one it acts for."""
    return (await caller(request)).owner_id


async def require_platform(request: Request) -> str:
    """The platform owner whose key this is, acting for nobody (the owners
    routes). A key that is no platform's finds no such route's owners: 404."""
    if acting_for(request) is not None:
        raise invalid("the owners routes take the platform's own key, without Longcall-Owner")
    found = await caller(request)
    if not found.is_platform:
        raise not_found("owner")
    return found.owner_id


def has_bearer(request: Request) -> bool:
    return "authorization" in request.headers


def read_token_for(request: Request, job_id: str) -> str:
    return read_token(job_id, request.app.state.settings.secret_key)


def read_token_again(request: Request, job_id: str) -> str:
    """The token a token read hands back: signed with the current key (a
    rotation moves it over) and expiring when the one it came with does.
    A fresh day each read would let a leaked token renew itself for ever."""
    token = request.query_params["token"]
    expires_at = read_token_expiry(token)
    assert expires_at is not None  # token_allows checked it
    return make_read_token(job_id, request.app.state.settings.secret_key, expires_at)


def token_allows(request: Request, job_id: str) -> bool:
    token = request.query_params.get("token")
    return check_read_token(token, job_id, request.app.state.settings.secret_keys, time.time())
