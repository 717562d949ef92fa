"""What a request may carry, checked in one place before any of it reaches
PostgreSQL: bodies (capped, strict JSON), query values, the Idempotency-Key
header and path indexes.

PostgreSQL refuses some things JSON allows — `\\u0000` (in jsonb and text), a
lone UTF-16 surrogate (not encodable as UTF-8), a non-finite number (`1e999`
parses as infinity) — and deep nesting makes Python's own JSON encoder
recurse past its limit. Each of those is the client's mistake, so each is a
400 `invalid_request` naming where it is, never a 500. The limits are the
constants below; app/web/openapi.py documents them from the same names.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.requests import Request

from app.vocabulary import ApiErrorCode
from app.web.errors import ApiError

MAX_BODY = 1024 * 1024          # bytes of any request body
MAX_JSON_DEPTH = 64             # the body object itself is level 1
MAX_IDEMPOTENCY_KEY = 255       # characters, after stripping surrounding whitespace
MAX_CREDITS = 10**12            # the most one job may reserve
MAX_MODEL_LENGTH = 200
MAX_METADATA_BYTES = 4096       # a job's metadata, as compact UTF-8 JSON
MAX_PROVIDER_TASK_ID = 500      # an operator's `provider_task_id` (app/domain/recovery.py holds the same)
MAX_WAIT_S = 30                 # `?wait=` on a job read
MAX_LIST_LIMIT = 100            # `?limit=` on a list
MAX_QUERY_VALUE = 1024          # characters of a query value we parse (cursor, status, ...)
MAX_CURSOR = 200                # characters of a `?cursor=` (ours are about 80)
MAX_OUTPUT_INDEX_DIGITS = 9     # more outputs than that is no job of ours

# Printable ASCII (space to tilde: RFC 9110 field values without obs-text),
# not blank. The OpenAPI document publishes this same pattern.
IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$"
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]{1,40}")
_INDEX = re.compile(r"0|[1-9][0-9]*")  # ASCII digits only: no sign, no leading zero, no other scripts


class TooLarge(Exception):
    pass


def invalid(message: str) -> ApiError:
    return ApiError(ApiErrorCode.INVALID_REQUEST, message)


# ----------------------------------------------------------------- pure checks

def text_problem(text: str) -> str | None:
    """Why PostgreSQL would refuse this string, or None."""
    if "\x00" in text:
        return "must not contain NUL characters"
    if _SURROGATE.search(text):
        return "must not contain lone UTF-16 surrogates"
    return None


def _render_path(node: tuple | None) -> str:
    """`input.a[3]["odd key"]` from a (parent, key) chain; ASCII only (keys
    are escaped), so a message never carries what it complains about."""
    parts: list[str] = []
    while node is not None:
        node, key = node
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif _PLAIN_KEY.fullmatch(key):
            parts.append(f".{key}")
        else:
            parts.append(f"[{json.dumps(key[:40])}]")
    path = "".join(reversed(parts)).lstrip(".")
    return path if len(path) <= 120 else path[:117] + "..."


def json_problem(value: Any, *, what: str = "the request body") -> str | None:
    """The first part of a parsed JSON value that PostgreSQL (or our own
    encoder) would choke on, as a message naming where it is; None when the
    value is clean. Iterative, so hostile nesting cannot exhaust the stack."""
    stack: list[tuple[Any, tuple | None, int]] = [(value, None, 1)]
    while stack:
        item, node, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"{_where(node, what)} {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{_where(node, what)} must be a finite number"
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"{_where(node, what)} nests deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(item, list):
                stack.extend((child, (node, index), depth + 1) for index, child in enumerate(item))
                continue
            for key, child in item.items():
                problem = text_problem(key)
                if problem:
                    return f"a field name in {_where(node, what)} {problem}"
                stack.append((child, (node, key), depth + 1))
    return None


def _where(node: tuple | None, what: str) -> str:
    return what if node is None else _render_path(node)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match else i


def _field_too_deep(text: str) -> str | None:
    """Which top-level field of an object too deep for the parser holds the
    deep part: each top-level value is parsed on its own until one fails.
    Only reached after a RecursionError, and costs one more parse."""
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    i = _skip_ws(text, 0)
    if text[i:i + 1] != "{":
        return None
    i = _skip_ws(text, i + 1)
    try:
        while text[i:i + 1] == '"':
            key, i = decoder.raw_decode(text, i)
            i = _skip_ws(text, i)
            if text[i:i + 1] != ":":
                return None
            i = _skip_ws(text, i + 1)
            try:
                _, i = decoder.raw_decode(text, i)
            except RecursionError:
                return key
            i = _skip_ws(text, i)
            if text[i:i + 1] != ",":
                return None
            i = _skip_ws(text, i + 1)
    except ValueError:
        return None
    return None


def parse_json_object(raw: bytes) -> dict:
    """A request body as a JSON object every part of which PostgreSQL can
    store; ApiError (400) otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("the request body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:  # ~1,000 levels: the parser itself gives up
        field = _field_too_deep(text)
        where = _render_path((None, field)) if field is not None else "the request body"
        raise invalid(f"{where} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        if not isinstance(exc, json.JSONDecodeError) and "integer string conversion" in str(exc):
            # Valid JSON, but an integer longer than Python converts
            # (sys.get_int_max_str_digits, 4,300 digits).
            raise invalid("the request body holds an integer with too many digits") from None
        raise invalid("the request body is not valid JSON (NaN and Infinity are not JSON)") from None
    if not isinstance(value, dict):
        raise invalid("the request body must be a JSON object")
    problem = json_problem(value)
    if problem:
        raise invalid(problem)
    return value


def parse_idempotency_key(raw: str | None) -> str | None:
    """The header's key, surrounding whitespace stripped (RFC 9110 field
    values carry none); None when absent."""
    if raw is None:
        return None
    key = raw.strip(" \t")
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not _IDEMPOTENCY_KEY.fullmatch(key):
        raise invalid(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters")
    return key


def parse_output_index(raw: str) -> int | None:
    """`n` of `/outputs/{n}`: ASCII digits without sign or leading zeros, so
    one output has one URL (`+0`, `01`, `٠` are not 0). None: no such output."""
    if len(raw) > MAX_OUTPUT_INDEX_DIGITS or not _INDEX.fullmatch(raw):
        return None
    return int(raw)


# ----------------------------------------------------------------- request edges

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


async def read_body(request: Request) -> bytes:
    """The raw body under the cap every request body has (CONTRACT: 1 MiB);
    ApiError 413 over it. A route that takes no body reads it too, so an
    oversized one is refused there as well, before anything changes."""
    try:
        return await read_capped(request)
    except TooLarge:
        raise ApiError(ApiErrorCode.PAYLOAD_TOO_LARGE, f"the request body is over {MAX_BODY} bytes") from None


async def read_json_object(request: Request) -> dict:
    return parse_json_object(await read_body(request))


def query_value(request: Request, name: str) -> str | None:
    """A query value we are about to parse, bounded and free of what
    PostgreSQL refuses; None when absent."""
    value = request.query_params.get(name)
    if value is None:
        return None
    if len(value) > MAX_QUERY_VALUE:
        raise invalid(f"{name} is longer than {MAX_QUERY_VALUE} characters")
    problem = text_problem(value)
    if problem:
        raise invalid(f"{name} {problem}")
    return value


def idempotency_key(request: Request) -> str | None:
    sent = request.headers.getlist("idempotency-key")
    if len(sent) > 1:  # which one the client meant is not ours to guess
        raise invalid("send one Idempotency-Key header, not several")
    return parse_idempotency_key(sent[0] if sent else None)
