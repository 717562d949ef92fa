"""Verify a notification from longcall: Standard Webhooks (https://www.standardwebhooks.com/),
implemented here so receivers need no other dependency.

    payload = verify_webhook(request.headers, raw_body, "whsec_...")

The signed content is `{webhook-id}.{webhook-timestamp}.{body}` (the body's
raw bytes, exactly as received), signed with HMAC-SHA256 under the bytes the
secret's base64 (after `whsec_`) decodes to. `webhook-signature` is a
space-separated list of `v1,<base64>` entries (several during a secret
rotation); one valid entry is enough. Deliveries are at least once:
deduplicate on `webhook-id`.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300
MAX_TIMESTAMP_DIGITS = 12  # far past any real time; keeps int() and the arithmetic small


class WebhookVerificationError(Exception):
    """The request is not a genuine, fresh notification: refuse it (e.g. answer 400)."""


def _secret_bytes(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        key = secret
    else:
        encoded = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise WebhookVerificationError("the webhook secret is not whsec_<base64>") from None
    if not key:
        raise WebhookVerificationError("the webhook secret is empty")
    return key


def _header(headers: Mapping[str, str], name: str) -> str:
    # Header names are case-insensitive; a plain dict may spell them any way.
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"missing header {name}")


def sign_webhook(secret: str | bytes, msg_id: str, timestamp: int | str, body: bytes | str) -> str:
    """The `v1,<base64>` signature of one message (what the sender puts in `webhook-signature`)."""
    raw = body.encode() if isinstance(body, str) else body
    content = f"{msg_id}.{timestamp}.".encode() + raw
    digest = hmac.new(_secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def _signatures(header: str) -> list[bytes]:
    """The v1 signatures of the header, decoded; entries of other versions or malformed ones are skipped."""
    found = []
    for entry in header.split(" "):
        version, sep, encoded = entry.partition(",")
        if version != "v1" or not sep:
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def verify_webhook(headers: Mapping[str, str], body: bytes | str, secret: str | bytes, *,
                   tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None) -> Any:
    """Check a notification's Standard Webhooks signature and freshness; return its JSON body.

    `headers`: any mapping (a dict with names in any case, Starlette's or
    httpx's headers). `body`: the raw body as received (bytes; a str is taken
    as its UTF-8). `secret`: the endpoint's `whsec_...`. The timestamp must be
    within `tolerance_s` of `now` (Unix seconds, default: the clock) in either
    direction. Raises `WebhookVerificationError` for a missing or malformed
    header, a stale or future timestamp, no matching signature, or a body
    that is not JSON.
    """
    msg_id = _header(headers, "webhook-id")
    timestamp_text = _header(headers, "webhook-timestamp").strip()
    signature_header = _header(headers, "webhook-signature")
    if not msg_id:
        raise WebhookVerificationError("empty webhook-id")
    if not timestamp_text.isascii() or not timestamp_text.isdigit() or len(timestamp_text) > MAX_TIMESTAMP_DIGITS:
        raise WebhookVerificationError("webhook-timestamp is not a Unix time in seconds")
    timestamp = int(timestamp_text)
    current = time.time() if now is None else now
    if timestamp < current - tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is too old")
    if timestamp > current + tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is in the future")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    # Signed as sent: the header's own digits, not our re-formatting of them.
    expected = base64.b64decode(sign_webhook(secret, msg_id, timestamp_text, raw)[3:])
    # Compare against every entry (no early exit on a mismatch), each in constant time.
    matched = False
    for candidate in _signatures(signature_header):
        matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise WebhookVerificationError("no matching signature")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise WebhookVerificationError("the body is not JSON") from None
