"""Our Standard Webhooks signer and verifier, held to the reference libraries.

The references are `standardwebhooks` (the spec's own Python library) and
`svix` (which wraps it and also reads `svix-*` header names). Replicate and
every Svix-style sender sign the way they do, so where we and they disagree
about a genuine delivery, we are the ones who are wrong.

The reference `verify` reads the real clock (±5 minutes); the cases that run
it sign with the current time, and none of them sits near the window's edge.
"""
from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import standardwebhooks
import svix.webhooks

from app.signing.webhooks import sign_standard_webhooks, verify_standard_webhooks

T = 1_700_000_000  # the fixed `now` of the cases our verifier alone judges


def _b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


# Keys whose base64 needs no padding (24 bytes, as Svix hands out), one "="
# (32 bytes, as our simulator hands out) and two (31 bytes).
KEYS = {
    "no-pad": bytes(range(24)),
    "one-pad": bytes(range(100, 132)),
    "two-pads": bytes(range(200, 231)),
}


def _forms(key: bytes) -> dict[str, str]:
    padded = _b64(key)
    return {
        "whsec-padded": "whsec_" + padded,
        "whsec-unpadded": "whsec_" + padded.rstrip("="),
        "bare-padded": padded,
        "bare-unpadded": padded.rstrip("="),
    }


SECRETS = [
    pytest.param(secret, id=f"{name}-{form}")
    for name, key in KEYS.items()
    for form, secret in _forms(key).items()
]

PAYLOADS = [
    pytest.param(json.dumps({"id": "p_1", "status": "succeeded", "output": ["https://x/y.png"]}), id="json"),
    pytest.param('{"id":"p_1","status":"processing","logs":"step 1/2\\nstep 2/2\\n"}', id="compact-json"),
    pytest.param('{"prompt": "un chat très fâché ✓ 猫"}', id="non-ascii"),
    pytest.param("{\n  \"a\": 1\n}\n", id="newlines"),
    pytest.param("", id="empty"),
    pytest.param(json.dumps({"output": "x" * 200_000}), id="large"),
]
MSG_IDS = ["msg_p5jXN8AQM9LWM0D4loKWxJek", "msg_abc_completed", "2aQz-7.x"]


def _ref_sign(secret: str, msg_id: str, t: int, payload: str) -> str:
    return standardwebhooks.Webhook(secret).sign(msg_id, datetime.fromtimestamp(t, tz=UTC), payload)


def _headers(msg_id: str, t: int, signature: str, prefix: str = "webhook") -> dict[str, str]:
    return {f"{prefix}-id": msg_id, f"{prefix}-timestamp": str(t), f"{prefix}-signature": signature}


def _ref_accepts(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    try:
        # json_parse=False: an empty body is a valid signed payload, not JSON
        standardwebhooks.Webhook(secret).verify(body, headers, json_parse=False)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


def _svix_accepts(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    try:
        svix.webhooks.Webhook(secret).verify(body, headers)
    except svix.webhooks.WebhookVerificationError:
        return False
    return True


# ------------------------------------------------------------ the key itself


@pytest.mark.parametrize("length", range(1, 65))
def test_every_key_length_decodes_as_the_reference(length: int) -> None:
    """Padded or not, prefixed or not: the same key as the reference derives,
    so the same signature (the reference signs with the key it decoded)."""
    key = bytes((7 * i + length) % 256 for i in range(length))
    for secret in _forms(key).values():
        assert sign_standard_webhooks(secret, "msg_1", T, b"{}") == _ref_sign(secret, "msg_1", T, "{}"), secret


def test_a_trailing_newline_is_accepted_on_both_sides() -> None:
    secret = "whsec_" + _b64(KEYS["one-pad"]).rstrip("=")
    assert sign_standard_webhooks(secret + "\n", "m", T, b"") == _ref_sign(secret + "\n", "m", T, "")


# What the reference makes of the forms we refuse: it refuses them too, or it
# derives a key other than the one the string spells, which no sender that
# decodes strictly signs with. Refusing them loses no genuine delivery.
SPELLED = KEYS["no-pad"]
URLSAFE_KEY = b"\xfb\xff" * 16


@pytest.mark.parametrize(
    "secret,spelled",
    [
        pytest.param("whsec_" + base64.urlsafe_b64encode(URLSAFE_KEY).decode(), URLSAFE_KEY, id="url-safe-alphabet"),
        # an "=" that completes a group of four ends the reference's decoding there
        pytest.param("whsec_" + _b64(SPELLED)[:19] + "=" + _b64(SPELLED)[19:], SPELLED, id="inner-pad"),
        pytest.param("whsec_" + _b64(SPELLED) + "A", None, id="length-1-mod-4"),
        pytest.param("whsec_==", None, id="padding-only"),
    ],
)
def test_what_we_refuse_the_reference_refuses_or_misreads(secret: str, spelled: bytes | None) -> None:
    with pytest.raises(ValueError):
        sign_standard_webhooks(secret, "m", T, b"")
    try:
        ref = standardwebhooks.Webhook(secret)
    except Exception:  # binascii.Error (a ValueError), EmptyWebhookSecretError
        return
    assert spelled is not None
    assert ref.sign("m", datetime.fromtimestamp(T, tz=UTC), "") != sign_standard_webhooks(
        "whsec_" + _b64(spelled), "m", T, b"")


# ------------------------------------------------------------ (a) reference signs, we verify


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_reference_signatures_verify_with_ours(secret: str, payload: str) -> None:
    body = payload.encode("utf-8")
    for msg_id in MSG_IDS:
        headers = _headers(msg_id, T, _ref_sign(secret, msg_id, T, payload))
        assert verify_standard_webhooks(headers, body, secret, T)
        assert verify_standard_webhooks(headers, body, secret, T + 299)  # still inside our window
        assert not verify_standard_webhooks(headers, body, secret, T + 301)


# ------------------------------------------------------------ (b) we sign, the references verify


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_our_signatures_verify_with_the_references(secret: str, payload: str) -> None:
    body = payload.encode("utf-8")
    t = int(time.time())
    for msg_id in MSG_IDS:
        signature = sign_standard_webhooks(secret, msg_id, t, body)
        assert signature == _ref_sign(secret, msg_id, t, payload)
        headers = _headers(msg_id, t, signature)
        assert _ref_accepts(secret, body, headers)
        assert _svix_accepts(secret, body, headers)
        # svix also reads its own header names (our verifier reads only
        # webhook-*, the names Replicate sends)
        assert _svix_accepts(secret, body, _headers(msg_id, t, signature, prefix="svix"))


# ------------------------------------------------------------ (c) both sides agree on every case

SECRET = "whsec_" + _b64(KEYS["one-pad"]).rstrip("=")  # unpadded: the form bug 4 was about
OTHER_SECRET = "whsec_" + _b64(KEYS["two-pads"])
BODY = json.dumps({"id": "p_1", "status": "succeeded", "output": ["https://x/y.png"]}).encode()
MSG_ID = "msg_p_1_completed"

Signer = Callable[[str, str, int, bytes], str]


def _our_signer(secret: str, msg_id: str, t: int, body: bytes) -> str:
    return sign_standard_webhooks(secret, msg_id, t, body)


def _reference_signer(secret: str, msg_id: str, t: int, body: bytes) -> str:
    return _ref_sign(secret, msg_id, t, body.decode("utf-8"))


SIGNERS = [pytest.param(_our_signer, id="we-sign"), pytest.param(_reference_signer, id="reference-signs")]


def _flip_last_byte(body: bytes) -> bytes:
    return body[:-1] + bytes([body[-1] ^ 0x01])


# Each case: (sign, t) -> (headers, body, secret the receiver holds), and the
# verdict every verifier must give.
CASES = [
    ("genuine", lambda sign, t: (_headers(MSG_ID, t, sign(SECRET, MSG_ID, t, BODY)), BODY, SECRET), True),
    ("genuine-padded-secret-at-receiver",
     lambda sign, t: (_headers(MSG_ID, t, sign(SECRET, MSG_ID, t, BODY)), BODY, SECRET + "="), True),
    ("rotation-other-signature-first",
     lambda sign, t: (_headers(MSG_ID, t, sign(OTHER_SECRET, MSG_ID, t, BODY) + " " + sign(SECRET, MSG_ID, t, BODY)),
                      BODY, SECRET), True),
    ("tampered-body",
     lambda sign, t: (_headers(MSG_ID, t, sign(SECRET, MSG_ID, t, BODY)), _flip_last_byte(BODY), SECRET), False),
    ("reserialized-body",
     lambda sign, t: (_headers(MSG_ID, t, sign(SECRET, MSG_ID, t, BODY)),
                      json.dumps(json.loads(BODY), separators=(",", ":")).encode(), SECRET), False),
    ("signed-with-another-secret",
     lambda sign, t: (_headers(MSG_ID, t, sign(OTHER_SECRET, MSG_ID, t, BODY)), BODY, SECRET), False),
    ("receiver-holds-another-secret",
     lambda sign, t: (_headers(MSG_ID, t, sign(SECRET, MSG_ID, t, BODY)), BODY, OTHER_SECRET), False),
    ("wrong-id",
     lambda sign, t: (_headers("msg_p_2_completed", t, sign(SECRET, MSG_ID, t, BODY)), BODY, SECRET), False),
    ("wrong-timestamp",
     lambda sign, t: (_headers(MSG_ID, t - 1, sign(SECRET, MSG_ID, t, BODY)), BODY, SECRET), False),
    ("ten-minutes-old",
     lambda sign, t: (_headers(MSG_ID, t - 600, sign(SECRET, MSG_ID, t - 600, BODY)), BODY, SECRET), False),
    ("ten-minutes-ahead",
     lambda sign, t: (_headers(MSG_ID, t + 600, sign(SECRET, MSG_ID, t + 600, BODY)), BODY, SECRET), False),
    ("only-an-unknown-version",
     lambda sign, t: (_headers(MSG_ID, t, sign(SECRET, MSG_ID, t, BODY).replace("v1,", "v1a,")), BODY, SECRET),
     False),
]


@pytest.mark.parametrize("sign", SIGNERS)
@pytest.mark.parametrize("build,expected", [pytest.param(b, e, id=i) for i, b, e in CASES])
def test_we_and_the_references_agree(sign: Signer, build, expected: bool) -> None:
    t = int(time.time())
    headers, body, secret = build(sign, t)
    ours = verify_standard_webhooks(headers, body, secret, time.time())
    assert (ours, _ref_accepts(secret, body, headers), _svix_accepts(secret, body, headers)) == (
        expected, expected, expected)
