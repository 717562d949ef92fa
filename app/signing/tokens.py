"""Signed tokens made from the server's SECRET_KEY.

Read tokens let a browser read ONE job (and its outputs) without the API
key, until they expire. Capability tokens go in every callback URL we register
(CONTRACT.md): a webhook must pass its provider's scheme and ours, and for
KIE, whose own signature does not cover the body, ours is the whole check.
Only we can mint one for a given (provider, job).

The operator's console (app/web/console/) signs its session cookie and its
forms' CSRF tokens the same way.

Each is a single url-safe base64 blob (no padding, no separators):

    read:        0x01 | expires_at (8 bytes, big-endian) | tag (32 bytes)
    capability:  0x02 | tag (32 bytes)
    session:     0x03 | expires_at (8 bytes) | nonce (16 bytes) | tag (32 bytes)
    form:        0x04 | tag (32 bytes), over a purpose and a session's nonce

The tag is HMAC-SHA256 under a purpose key derived from SECRET_KEY with HKDF
(never the raw key), over a domain-separated, length-prefixed message. No
kind of token can pass as another: each has its own version byte, length,
purpose key and prefix. A session's tag also covers a digest of the
ADMIN_TOKEN it was signed in with, so changing ADMIN_TOKEN ends every session.

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
    "make_session_token",
    "check_session_token",
    "make_form_token",
    "check_form_token",
    "SESSION_NONCE_LEN",
    "derive_key",
]

_READ_VERSION = 0x01
_CAP_VERSION = 0x02
_TAG_LEN = 32
_READ_LEN = 1 + 8 + _TAG_LEN
_CAP_LEN = 1 + _TAG_LEN
_SESSION_VERSION = 0x03
_FORM_VERSION = 0x04
SESSION_NONCE_LEN = 16
_SESSION_LEN = 1 + 8 + SESSION_NONCE_LEN + _TAG_LEN
_FORM_LEN = 1 + _TAG_LEN
_MAX_TOKEN_CHARS = 128
_MAX_EXPIRES = 2**63 - 1
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")

_READ_INFO = b"longcall/v1/read-token"
_CAP_INFO = b"longcall/v1/capability-token"
_READ_PREFIX = b"longcall.read-token.v1\x00"
_CAP_PREFIX = b"longcall.capability-token.v1\x00"
_SESSION_INFO = b"longcall/v1/console-session"
_FORM_INFO = b"longcall/v1/console-form"
_SESSION_PREFIX = b"longcall.console-session.v1\x00"
_FORM_PREFIX = b"longcall.console-form.v1\x00"


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
        parts = _read_token_parts(token)
        if parts is None:
            return False
        expires_at, given = parts
        if not isinstance(job_id, str) or not job_id:
            return False
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            return False
        if expires_at > _MAX_EXPIRES or now >= expires_at:
            return False
        ok = False
        for key in _usable_keys(keys):
            ok |= hmac.compare_digest(given, _read_tag(key, job_id, expires_at))
        return ok
    except Exception:
        return False


def _read_token_parts(token: Any) -> tuple[int, bytes] | None:
    """A well-formed read token's expiry and tag, else None (not checked)."""
    raw = _b64d(token, _READ_LEN)
    if raw is None or raw[0] != _READ_VERSION:
        return None
    (expires_at,) = struct.unpack(">Q", raw[1:9])
    return expires_at, raw[9:]


def read_token_expiry(token: str) -> int | None:
    """When a well-formed read token expires (unix seconds), else None. It
    says nothing of whether the token is genuine: check_read_token first."""
    parts = _read_token_parts(token)
    return parts[0] if parts else None


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


# ---------------------------------------------------------------- console sessions


def _session_tag(key: bytes, expires_at: int, nonce: bytes, admin_token: str) -> bytes:
    # The admin token enters as its digest: the tag commits to it without the
    # token itself being part of anything stored or sent.
    msg = _SESSION_PREFIX + struct.pack(">Q", expires_at) + nonce + hashlib.sha256(admin_token.encode()).digest()
    return hmac.new(derive_key(key, _SESSION_INFO), msg, hashlib.sha256).digest()


def make_session_token(key: bytes, admin_token: str, nonce: bytes, expires_at: int) -> str:
    """A console session until ``expires_at`` (unix seconds), for whoever
    signed in with ``admin_token``; ``nonce``: 16 random bytes naming it."""
    key = _check_key(key)
    if not isinstance(admin_token, str) or not admin_token:
        raise ValueError("admin_token must be a non-empty string")
    if not isinstance(nonce, bytes) or len(nonce) != SESSION_NONCE_LEN:
        raise ValueError(f"nonce must be {SESSION_NONCE_LEN} bytes")
    expires_at = int(expires_at)
    if not 0 <= expires_at <= _MAX_EXPIRES:
        raise ValueError("expires_at out of range")
    head = bytes([_SESSION_VERSION]) + struct.pack(">Q", expires_at) + nonce
    return _b64e(head + _session_tag(key, expires_at, nonce, admin_token))


def check_session_token(token: str | None, keys: Sequence[bytes], admin_token: str | None,
                        now: float) -> bytes | None:
    """The session's nonce, for an unexpired session signed by one of
    ``keys`` under this ``admin_token``; else None."""
    try:
        raw = _b64d(token, _SESSION_LEN)
        if raw is None or raw[0] != _SESSION_VERSION:
            return None
        if not isinstance(admin_token, str) or not admin_token:
            return None
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            return None
        (expires_at,) = struct.unpack(">Q", raw[1:9])
        if expires_at > _MAX_EXPIRES or now >= expires_at:
            return None
        nonce, given = raw[9:9 + SESSION_NONCE_LEN], raw[9 + SESSION_NONCE_LEN:]
        ok = False
        for key in _usable_keys(keys):
            ok |= hmac.compare_digest(given, _session_tag(key, expires_at, nonce, admin_token))
        return nonce if ok else None
    except Exception:
        return None


# ---------------------------------------------------------------- console forms (CSRF)


def _form_tag(key: bytes, purpose: str, nonce: bytes) -> bytes:
    msg = _FORM_PREFIX + _lp(purpose) + nonce
    return hmac.new(derive_key(key, _FORM_INFO), msg, hashlib.sha256).digest()


def make_form_token(key: bytes, purpose: str, nonce: bytes) -> str:
    """The token a console form carries: only a page served to the holder of
    the cookie whose nonce this is can have it (synchronizer token)."""
    key = _check_key(key)
    if not isinstance(purpose, str) or not purpose:
        raise ValueError("purpose must be a non-empty string")
    if not isinstance(nonce, bytes) or len(nonce) != SESSION_NONCE_LEN:
        raise ValueError(f"nonce must be {SESSION_NONCE_LEN} bytes")
    return _b64e(bytes([_FORM_VERSION]) + _form_tag(key, purpose, nonce))


def check_form_token(token: str | None, keys: Sequence[bytes], purpose: str, nonce: bytes | None) -> bool:
    try:
        raw = _b64d(token, _FORM_LEN)
        if raw is None or raw[0] != _FORM_VERSION:
            return False
        if not isinstance(purpose, str) or not purpose:
            return False
        if not isinstance(nonce, bytes) or len(nonce) != SESSION_NONCE_LEN:
            return False
        ok = False
        for key in _usable_keys(keys):
            ok |= hmac.compare_digest(raw[1:], _form_tag(key, purpose, nonce))
        return ok
    except Exception:
        return False
