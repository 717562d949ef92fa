"""Identifiers and API keys."""
from __future__ import annotations

import hashlib
import re
import secrets

JOB_ID = re.compile(r"^job_[0-9a-f]{24}$")
OWNER_ID = re.compile(r"^own_[0-9a-f]{24}$")
ENDPOINT_ID = re.compile(r"^we_[0-9a-f]{24}$")
NOTIFICATION_ID = re.compile(r"^evt_[0-9a-f]{32}$")  # made in SQL (app/domain/notifications.py)
KEY_PREFIX_LEN = 12  # "lc_" + 9 characters: enough to name a key, useless to guess it


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def new_owner_id() -> str:
    return "own_" + secrets.token_hex(12)


def new_endpoint_id() -> str:
    return "we_" + secrets.token_hex(12)


def new_api_key() -> str:
    return "lc_" + secrets.token_urlsafe(32)


def api_key_prefix(key: str) -> str:
    return key[:KEY_PREFIX_LEN]


def api_key_hash(key: str) -> bytes:
    # Keys are 256-bit random strings, so a fast hash is enough (no password
    # stretching needed) and keeps authentication to one indexed lookup.
    return hashlib.sha256(key.encode()).digest()


def is_job_id(value: str) -> bool:
    # fullmatch: `$` alone would also accept a trailing newline.
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def is_endpoint_id(value: str) -> bool:
    return isinstance(value, str) and ENDPOINT_ID.fullmatch(value) is not None


def is_notification_id(value: str) -> bool:
    return isinstance(value, str) and NOTIFICATION_ID.fullmatch(value) is not None


def is_owner_id(value: str) -> bool:
    return isinstance(value, str) and OWNER_ID.fullmatch(value) is not None
