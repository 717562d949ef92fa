"""Signed tokens made from the server's SECRET_KEY.

Read tokens let a browser read ONE job (and its outputs) without the API
key, until they expire. Capability tokens go in every callback URL we register
(CONTRACT.md): a webhook must pass its provider's scheme and ours, and for
KIE, whose own signature does not cover the body, ours is the whole check.
Only we can mint one for a given (provider, job).

Both are a single url-safe base64 blob (no padding, no separators):

    read:        0x01 | expires_at (8 bytes, big-endian) | tag (32 bytes)
    capability:  0x02 | tag (32 bytes)

The tag is HMAC-SHA256 under a purpose key derived from SECRET_KEY with HKDF
(never the raw key), over a domain-separated, length-prefixed message. A read
token can never pass as a capability token or the other way round: different
version byte, different length, different purpose key, different prefix.

Rotation: the first key signs, every key is accepted.
"""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import math
import re
import struct
from collections.abc import Sequence
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "make_read_token",
    "check_read_token",
    "make_capability_token",
    "check_capability_token",
    "derive_key",
]

_READ_VERSION = 0x01
_CAP_VERSION = 0x02
_TAG_LEN = 32
_READ_LEN = 1 + 8 + _TAG_LEN
_CAP_LEN = 1 + _TAG_LEN
_MAX_TOKEN_CHARS = 128
_MAX_EXPIRES = 2**63 - 1
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")

_READ_INFO = b"longcall/v1/read-token"
_CAP_INFO = b"longcall/v1/capability-token"
_READ_PREFIX = b"longcall.read-token.v1\x00"
_CAP_PREFIX = b"longcall.capability-token.v1\x00"


@functools.lru_cache(maxsize=64)
def derive_key(secret: bytes, info: bytes) -> bytes:
    """A 32-byte purpose key: HKDF-SHA256(SECRET_KEY, info)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def _lp(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">I", len(raw)) + raw


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64d(token: Any, expected_len: int) -> bytes | None:
    if not isinstance(token, str) or not token or len(token) > _MAX_TOKEN_CHARS:
        return None
    if not _TOKEN_RE.fullmatch(token):
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != expected_len or _b64e(raw) != token:  # one canonical spelling
        return None
    return raw


def _usable_keys(keys: Any) -> list[bytes]:
    if keys is None or isinstance(keys, (bytes, bytearray, str)):
        return []
    return [bytes(k) for k in keys if isinstance(k, (bytes, bytearray)) and k]


def _check_key(key: Any) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise ValueError("a signing key must be non-empty bytes")
    return bytes(key)


# ---------------------------------------------------------------- read tokens


def _read_tag(key: bytes, job_id: str, expires_at: int) -> bytes:
    msg = _READ_PREFIX + _lp(job_id) + struct.pack(">Q", expires_at)
    return hmac.new(derive_key(key, _READ_INFO), msg, hashlib.sha256).digest()


def make_read_token(job_id: str, key: bytes, expires_at: int) -> str:
    """A token that reads ``job_id`` until ``expires_at`` (unix seconds)."""
    key = _check_key(key)
    if not isinstance(job_id, str) or not job_id:
        raise ValueError("job_id must be a non-empty string")
    expires_at = int(expires_at)
    if not 0 <= expires_at <= _MAX_EXPIRES:
        raise ValueError("expires_at out of range")
    head = bytes([_READ_VERSION]) + struct.pack(">Q", expires_at)
    return _b64e(head + _read_tag(key, job_id, expires_at))


def check_read_token(token: str | None, job_id: str, keys: Sequence[bytes], now: float) -> bool:
    """True only for an unexpired token minted for this job by one of ``keys``."""
    try:
        raw = _b64d(token, _READ_LEN)
        if raw is None or raw[0] != _READ_VERSION:
            return False
        if not isinstance(job_id, str) or not job_id:
            return False
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            return False
        (expires_at,) = struct.unpack(">Q", raw[1:9])
        if expires_at > _MAX_EXPIRES or now >= expires_at:
            return False
        given = raw[9:]
        ok = False
        for key in _usable_keys(keys):
            ok |= hmac.compare_digest(given, _read_tag(key, job_id, expires_at))
        return ok
    except Exception:
        return False


# ---------------------------------------------------------------- capability tokens


def _cap_tag(key: bytes, provider: str, job_id: str) -> bytes:
    msg = _CAP_PREFIX + _lp(provider) + _lp(job_id)
    return hmac.new(derive_key(key, _CAP_INFO), msg, hashlib.sha256).digest()


def make_capability_token(provider: str, job_id: str, key: bytes) -> str:
    """Our own HMAC for a callback URL: proves the caller got the URL from us."""
    key = _check_key(key)
    if not isinstance(provider, str) or not provider or not isinstance(job_id, str) or not job_id:
        raise ValueError("provider and job_id must be non-empty strings")
    return _b64e(bytes([_CAP_VERSION]) + _cap_tag(key, provider, job_id))


def check_capability_token(
    token: str | None, provider: str, job_id: str, keys: Sequence[bytes]
) -> bool:
    try:
        raw = _b64d(token, _CAP_LEN)
        if raw is None or raw[0] != _CAP_VERSION:
            return False
        if not isinstance(provider, str) or not provider or not isinstance(job_id, str) or not job_id:
            return False
        given = raw[1:]
        ok = False
        for key in _usable_keys(keys):
            ok |= hmac.compare_digest(given, _cap_tag(key, provider, job_id))
        return ok
    except Exception:
        return False
