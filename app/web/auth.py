"""Who is asking: an owner's API key, or a job's signed read token."""
from __future__ import annotations

import time

from starlette.requests import Request

from app.domain import owners
from app.jobjson import read_token
from app.signing.tokens import check_read_token
from app.vocabulary import ApiErrorCode
from app.web.errors import ApiError


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(ApiErrorCode.UNAUTHENTICATED, "send an API key as 'Authorization: Bearer <key>'")
    return key.strip()


async def require_owner(request: Request) -> str:
    owner_id = await owners.authenticate(request.app.state.pool, bearer_key(request))
    if owner_id is None:
        raise ApiError(ApiErrorCode.UNAUTHENTICATED, "the API key is not valid")
    return owner_id


def has_bearer(request: Request) -> bool:
    return "authorization" in request.headers


def read_token_for(request: Request, job_id: str) -> str:
    return read_token(job_id, request.app.state.settings.secret_key)


def token_allows(request: Request, job_id: str) -> bool:
    token = request.query_params.get("token")
    return check_read_token(token, job_id, request.app.state.settings.secret_keys, time.time())
