"""Reading request bodies with a cap, and strict JSON validation."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from app.web.errors import ApiError

MAX_BODY = 1024 * 1024


class TooLarge(Exception):
    pass


async def read_capped(request: Request, cap: int = MAX_BODY) -> bytes:
    """The raw body, refused as soon as it passes `cap` (Content-Length is a
    hint for an early answer, not trusted)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > cap:
                raise TooLarge()
        except ValueError:
            pass
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json_object(request: Request) -> dict:
    try:
        raw = await read_capped(request)
    except TooLarge:
        raise ApiError("payload_too_large", f"the request body is over {MAX_BODY} bytes") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_request", "the request body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        raise ApiError("invalid_request", "the request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    return value
