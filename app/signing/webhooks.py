"""Webhook signature schemes: t/v1 (our simulator), Standard Webhooks
(Replicate, Svix), fal (Ed25519 + JWKS).

Everything here is pure: no I/O, no clock reads (``now`` is a parameter).
Every ``verify_*`` returns ``False`` for any bad input and never raises;
it never says *why* (the receiver answers one uniform 401).

Rules shared by every verify:
- the raw body is capped (``MAX_SIGNED_BODY``) before it is hashed;
- the timestamp must be within ±tolerance of ``now`` (future too);
- several signatures may be present; any one valid passes (rotation);
- only known versions count (``v1``); unknown entries are ignored, so a
  header with only unknown entries fails (no downgrade);
- comparisons are constant-time (``hmac.compare_digest``).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "TOLERANCE_S",
    "MAX_SIGNED_BODY",
    "sign_tv1",
    "verify_tv1",
    "sign_standard_webhooks",
    "verify_standard_webhooks",
    "sign_fal",
    "verify_fal",
    "jwks_public_keys",
    "jwk_for",
]

TOLERANCE_S = 300
MAX_SIGNED_BODY = 1024 * 1024  # callers cap the body before us; we refuse larger too

# Header values are bounded so a hostile header cannot cost much CPU.
_MAX_HEADER_LEN = 8 * 1024
_MAX_SIGNATURES = 16
# Unix seconds: 1–12 ASCII digits (int() alone would accept "+1", " 1", "1_0", "١").
_TIMESTAMP_RE = re.compile(r"[0-9]{1,12}")
_HEX64_RE = re.compile(r"[0-9a-fA-F]{64}")
_HEX128_RE = re.compile(r"[0-9a-fA-F]{128}")
_B64_RE = re.compile(r"[A-Za-z0-9+/]*={0,2}")


# ---------------------------------------------------------------- helpers


def _body_ok(raw_body: Any) -> bool:
    return isinstance(raw_body, (bytes, bytearray, memoryview)) and len(raw_body) <= MAX_SIGNED_BODY


def _parse_timestamp(value: Any) -> int | None:
    if not isinstance(value, str) or not _TIMESTAMP_RE.fullmatch(value):
        return None
    return int(value)


def _fresh(t: int, now: Any, tolerance: Any) -> bool:
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        return False
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        return False
    if not math.isfinite(now) or not math.isfinite(tolerance) or tolerance < 0:
        return False
    return abs(now - t) <= tolerance


def _header(headers: Any, name: str) -> str | None:
    """Header lookup: exact (lower-case) name first, then case-insensitive."""
    if headers is None:
        return None
    value = headers.get(name)
    if value is None:
        try:
            items = headers.items()
        except AttributeError:
            return None
        for key, val in items:
            if isinstance(key, str) and key.lower() == name:
                value = val
                break
    if isinstance(value, bytes):
        try:
            value = value.decode("latin-1")
        except Exception:
            return None
    if not isinstance(value, str) or len(value) > _MAX_HEADER_LEN:
        return None
    return value


def _hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


# ---------------------------------------------------------------- t/v1


def sign_tv1(secret: str, raw_body: bytes, t: int) -> str:
    """``t=<unix>,v1=<hex>``: HMAC-SHA256 keyed with UTF-8(secret) over
    ``b"{t}." + raw_body``, lowercase hex."""
    t = int(t)
    digest = _hmac_sha256(secret.encode("utf-8"), f"{t}.".encode("ascii"), bytes(raw_body))
    return f"t={t},v1={digest.hex()}"


def verify_tv1(
    header: str | None,
    raw_body: bytes,
    secret: str,
    now: float,
    tolerance: int = TOLERANCE_S,
) -> bool:
    try:
        return _verify_tv1(header, raw_body, secret, now, tolerance)
    except Exception:  # never raise on bad input
        return False


def _verify_tv1(header: Any, raw_body: Any, secret: Any, now: Any, tolerance: Any) -> bool:
    if not isinstance(header, str) or not header or len(header) > _MAX_HEADER_LEN:
        return False
    if not isinstance(secret, str) or not secret or not _body_ok(raw_body):
        return False
    timestamps: list[str] = []
    candidates: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "t":
            timestamps.append(value)
        elif key == "v1":
            candidates.append(value)
        # any other scheme (v0, v2, ...) is ignored: only v1 counts
    if len(timestamps) != 1:  # none, or ambiguous
        return False
    t = _parse_timestamp(timestamps[0])
    if t is None or not _fresh(t, now, tolerance):
        return False
    if not candidates or len(candidates) > _MAX_SIGNATURES:
        return False
    expected = _hmac_sha256(
        secret.encode("utf-8"), timestamps[0].encode("ascii") + b".", bytes(raw_body)
    ).hex()
    ok = False
    for candidate in candidates:
        if _HEX64_RE.fullmatch(candidate):
            # constant-time, and no early exit on the first match
            ok |= hmac.compare_digest(candidate.lower(), expected)
    return ok


# ---------------------------------------------------------------- Standard Webhooks

_WHSEC_PREFIX = "whsec_"


def _standard_key(secret: Any) -> bytes | None:
    """The HMAC key of a ``whsec_<base64>`` secret, decoded as the reference
    libraries (standardwebhooks, svix) decode it; None if it is not base64.

    The prefix is optional and padding may be missing, as there: the
    reference strips ``whsec_`` and decodes ``secret + "=="``, so an unpadded
    secret names the same key as its padded form.

    Where the reference is lax we are strict, because refusing loses no
    genuine delivery: its decoder silently drops characters outside the
    standard alphabet (``-``, ``_``, ``.``, inner spaces), stops at or skips
    an inner ``=`` and ignores a third or later one. No sender hands out
    such a string, and it often names a key other than the one it spells.
    Surrounding ASCII whitespace (a secret file's trailing newline) is the
    exception: the key it spells is unambiguous, the reference accepts a
    trailing one, and refusing it would turn away every delivery.
    """
    if not isinstance(secret, str) or len(secret) > _MAX_HEADER_LEN:
        return None
    secret = secret.strip(" \t\r\n")
    if secret.startswith(_WHSEC_PREFIX):
        secret = secret[len(_WHSEC_PREFIX):]
    if not _B64_RE.fullmatch(secret):
        return None
    data = secret.rstrip("=")
    if len(data) % 4 == 1:  # no base64 string has this length; the reference refuses it too
        return None
    try:
        key = base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return key or None


def sign_standard_webhooks(secret: str, msg_id: str, t: int, raw_body: bytes) -> str:
    """``v1,<base64>``: HMAC-SHA256 keyed with the decoded ``whsec_`` secret
    over ``b"{id}.{t}." + raw_body``."""
    key = _standard_key(secret)
    if key is None:
        raise ValueError("invalid Standard Webhooks secret")
    t = int(t)
    digest = _hmac_sha256(key, f"{msg_id}.{t}.".encode(), bytes(raw_body))
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_standard_webhooks(
    headers: Mapping[str, str],
    raw_body: bytes,
    secret: str,
    now: float,
    tolerance: int = TOLERANCE_S,
) -> bool:
    try:
        return _verify_standard(headers, raw_body, secret, now, tolerance)
    except Exception:  # never raise on bad input
        return False


def _verify_standard(headers: Any, raw_body: Any, secret: Any, now: Any, tolerance: Any) -> bool:
    if not _body_ok(raw_body):
        return False
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signature = _header(headers, "webhook-signature")
    if not msg_id or timestamp is None or not signature:
        return False
    t = _parse_timestamp(timestamp)
    if t is None or not _fresh(t, now, tolerance):
        return False
    key = _standard_key(secret)
    if key is None:
        return False
    entries = signature.split()
    if not entries or len(entries) > _MAX_SIGNATURES:
        return False
    expected = _hmac_sha256(key, f"{msg_id}.{timestamp}.".encode(), bytes(raw_body))
    ok = False
    for entry in entries:
        version, sep, value = entry.partition(",")
        if not sep or version != "v1":  # only v1 counts (v1a, v2, ... ignored)
            continue
        if not _B64_RE.fullmatch(value):
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(given) != len(expected):
            continue
        ok |= hmac.compare_digest(given, expected)
    return ok


# ---------------------------------------------------------------- fal (Ed25519)

FAL_HEADERS = (
    "x-fal-webhook-request-id",
    "x-fal-webhook-user-id",
    "x-fal-webhook-timestamp",
    "x-fal-webhook-signature",
)
_MAX_JWKS_KEYS = 32


def _fal_message(request_id: str, user_id: str, timestamp: str, raw_body: bytes) -> bytes:
    return "\n".join(
        [request_id, user_id, timestamp, hashlib.sha256(bytes(raw_body)).hexdigest()]
    ).encode("utf-8")


def sign_fal(
    private_key: Ed25519PrivateKey,
    request_id: str,
    user_id: str,
    t: int,
    raw_body: bytes,
) -> str:
    """Hex Ed25519 signature over
    ``"\\n".join([request_id, user_id, str(t), sha256(raw_body).hexdigest()])``."""
    return private_key.sign(_fal_message(request_id, user_id, str(int(t)), raw_body)).hex()


def verify_fal(
    headers: Mapping[str, str],
    raw_body: bytes,
    public_keys: Sequence[bytes],
    now: float,
    tolerance: int = TOLERANCE_S,
) -> bool:
    try:
        return _verify_fal(headers, raw_body, public_keys, now, tolerance)
    except Exception:  # never raise on bad input
        return False


def _verify_fal(headers: Any, raw_body: Any, public_keys: Any, now: Any, tolerance: Any) -> bool:
    if not _body_ok(raw_body):
        return False
    request_id, user_id, timestamp, signature = (_header(headers, name) for name in FAL_HEADERS)
    if not request_id or not user_id or timestamp is None or not signature:
        return False
    t = _parse_timestamp(timestamp)
    if t is None or not _fresh(t, now, tolerance):
        return False
    signature = signature.strip()
    if not _HEX128_RE.fullmatch(signature):
        return False
    sig = bytes.fromhex(signature)
    if isinstance(public_keys, (bytes, bytearray, str)) or public_keys is None:
        return False
    message = _fal_message(request_id, user_id, timestamp, raw_body)
    ok = False
    for raw_key in list(public_keys)[:_MAX_JWKS_KEYS]:
        if not isinstance(raw_key, (bytes, bytearray)) or len(raw_key) != 32:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(bytes(raw_key)).verify(sig, message)
        except (InvalidSignature, ValueError):
            continue
        ok = True
    return ok


def _b64url_decode(value: object) -> bytes | None:
    if not isinstance(value, str) or len(value) > 256:
        return None
    value = value.rstrip("=")
    if not re.fullmatch(r"[A-Za-z0-9_-]*", value):
        return None
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None


def jwks_public_keys(jwks: Any) -> list[bytes]:
    """Raw 32-byte Ed25519 public keys from a JWKS document
    (``{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "<b64url>"}, ...]}``).
    Malformed or foreign entries are skipped; never raises."""
    try:
        if not isinstance(jwks, Mapping):
            return []
        keys = jwks.get("keys")
        if not isinstance(keys, list):
            return []
        found: list[bytes] = []
        for entry in keys:
            if not isinstance(entry, Mapping):
                continue
            if entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
                continue
            if entry.get("use") not in (None, "sig"):
                continue
            if entry.get("alg") not in (None, "EdDSA", "Ed25519"):
                continue
            raw = _b64url_decode(entry.get("x"))
            if raw is None or len(raw) != 32:
                continue
            try:
                Ed25519PublicKey.from_public_bytes(raw)
            except ValueError:
                continue
            if raw not in found:
                found.append(raw)
            if len(found) >= _MAX_JWKS_KEYS:
                break
        return found
    except Exception:
        return []


def jwk_for(public_key: Ed25519PublicKey) -> dict:
    """The JWKS entry for a key (the simulator serves these)."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    kid = hashlib.sha256(raw).hexdigest()[:16]
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig", "alg": "EdDSA"}
