"""verify_webhook against the Standard Webhooks reference library
(`standardwebhooks` on PyPI): what it signs, we accept; what we sign
(`sign_webhook`, and an independent signer written here), it accepts; and
both refuse the same forgeries."""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import os
import time

import pytest
import standardwebhooks
from longcall_client import WebhookVerificationError, sign_webhook, verify_webhook

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
BODY = json.dumps({"id": "evt_0123", "type": "job.succeeded", "created_at": "2026-01-01T00:00:00Z",
                   "data": {"id": "job_" + "a" * 24, "status": "succeeded", "note": "café ✓"}}).encode()


def own_signer(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The spec written out independently of both implementations."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def reference_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    signature = standardwebhooks.Webhook(secret).sign(msg_id, dt.datetime.fromtimestamp(timestamp, dt.UTC),
                                                      body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


def reference_accepts(headers: dict[str, str], body: bytes, secret: str = SECRET) -> bool:
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
        return True
    except standardwebhooks.WebhookVerificationError:
        return False
    except ValueError:  # the reference library trips on some malformed signature lists
        return False


def ours_accepts(headers: dict[str, str], body: bytes, secret: str = SECRET) -> bool:
    try:
        verify_webhook(headers, body, secret)
        return True
    except WebhookVerificationError:
        return False


def test_what_the_reference_signs_we_accept():
    now = int(time.time())
    headers = reference_headers(SECRET, "evt_1", now, BODY)
    assert verify_webhook(headers, BODY, SECRET) == json.loads(BODY)
    assert verify_webhook(headers, BODY.decode(), SECRET) == json.loads(BODY)  # a str body is its UTF-8


@pytest.mark.parametrize("signer", [sign_webhook, own_signer], ids=["sign_webhook", "own-signer"])
def test_what_we_sign_the_reference_accepts(signer):
    now = int(time.time())
    headers = {"webhook-id": "evt_2", "webhook-timestamp": str(now),
               "webhook-signature": signer(SECRET, "evt_2", now, BODY)}
    assert reference_accepts(headers, BODY)
    assert ours_accepts(headers, BODY)
    assert headers["webhook-signature"] == reference_headers(SECRET, "evt_2", now, BODY)["webhook-signature"]


def test_header_names_in_any_case():
    now = int(time.time())
    headers = reference_headers(SECRET, "evt_3", now, BODY)
    for spelled in ({k.upper(): v for k, v in headers.items()}, {k.title(): v for k, v in headers.items()}):
        assert ours_accepts(spelled, BODY)
    import httpx

    assert ours_accepts(httpx.Headers(headers), BODY)  # a case-insensitive mapping too


def forgeries() -> list[tuple[str, dict[str, str], bytes, str]]:
    now = int(time.time())
    good = reference_headers(SECRET, "evt_4", now, BODY)
    stale = now - 301 - 60  # past the 5-minute tolerance, with margin for a slow test
    future = now + 301 + 60
    return [
        ("tampered body", good, BODY.replace(b"succeeded", b"failed"), SECRET),
        ("tampered body (one byte appended)", good, BODY + b" ", SECRET),
        ("tampered id", {**good, "webhook-id": "evt_5"}, BODY, SECRET),
        ("tampered timestamp", {**good, "webhook-timestamp": str(now + 1)}, BODY, SECRET),
        ("stale timestamp", reference_headers(SECRET, "evt_4", stale, BODY), BODY, SECRET),
        ("future timestamp", reference_headers(SECRET, "evt_4", future, BODY), BODY, SECRET),
        ("wrong secret", good, BODY, OTHER_SECRET),
        ("missing id", {k: v for k, v in good.items() if k != "webhook-id"}, BODY, SECRET),
        ("missing timestamp", {k: v for k, v in good.items() if k != "webhook-timestamp"}, BODY, SECRET),
        ("missing signature", {k: v for k, v in good.items() if k != "webhook-signature"}, BODY, SECRET),
        ("no headers", {}, BODY, SECRET),
        ("another version only", {**good, "webhook-signature": good["webhook-signature"].replace("v1,", "v2,")},
         BODY, SECRET),
        ("signature of another message", {**good, "webhook-signature": reference_headers(
            SECRET, "evt_other", now, BODY)["webhook-signature"]}, BODY, SECRET),
        ("several signatures, none valid", {**good, "webhook-signature": " ".join(
            reference_headers(OTHER_SECRET, "evt_4", now, BODY)["webhook-signature"] for _ in range(3))},
         BODY, SECRET),
        ("timestamp not a number", {**good, "webhook-timestamp": "soon"}, BODY, SECRET),
    ]


@pytest.mark.parametrize("case", range(len(forgeries())), ids=[f[0] for f in forgeries()])
def test_forgeries_are_refused_by_both(case):
    name, headers, body, secret = forgeries()[case]
    assert not reference_accepts(headers, body, secret), f"the reference accepted: {name}"
    assert not ours_accepts(headers, body, secret), f"we accepted: {name}"


def test_several_signatures_one_valid_is_accepted_by_both():
    """During a secret rotation the sender signs with the old and the new secret."""
    now = int(time.time())
    old = reference_headers(OTHER_SECRET, "evt_6", now, BODY)["webhook-signature"]
    new = reference_headers(SECRET, "evt_6", now, BODY)["webhook-signature"]
    for listed in (f"{old} {new}", f"{new} {old}", f"v1a,{base64.b64encode(b'x' * 64).decode()} {new}"):
        headers = {"webhook-id": "evt_6", "webhook-timestamp": str(now), "webhook-signature": listed}
        assert reference_accepts(headers, BODY) and ours_accepts(headers, BODY), listed


def test_tolerance_and_now():
    at = 1_800_000_000
    headers = reference_headers(SECRET, "evt_7", at, BODY)
    assert verify_webhook(headers, BODY, SECRET, now=at + 300) is not None
    assert verify_webhook(headers, BODY, SECRET, now=at - 300) is not None
    for now in (at + 301, at - 301):
        with pytest.raises(WebhookVerificationError):
            verify_webhook(headers, BODY, SECRET, now=now)
    assert verify_webhook(headers, BODY, SECRET, now=at + 3000, tolerance_s=3600) is not None


@pytest.mark.parametrize("signature", ["v1", "v1,", "v1,not base64!", "", " ", ",abc", "v1,abc v1"])
def test_malformed_signature_lists_are_refused_without_a_crash(signature):
    now = int(time.time())
    headers = {"webhook-id": "evt_8", "webhook-timestamp": str(now), "webhook-signature": signature}
    with pytest.raises(WebhookVerificationError):
        verify_webhook(headers, BODY, SECRET)


def test_a_valid_signature_over_a_body_that_is_not_json_is_refused():
    now = int(time.time())
    body = b"not json"
    headers = {"webhook-id": "evt_9", "webhook-timestamp": str(now),
               "webhook-signature": own_signer(SECRET, "evt_9", now, body)}
    with pytest.raises(WebhookVerificationError, match="JSON"):
        verify_webhook(headers, body, SECRET)


@pytest.mark.parametrize("secret", ["whsec_", "whsec_!!!notbase64", ""])
def test_a_bad_secret_is_refused(secret):
    now = int(time.time())
    with pytest.raises(WebhookVerificationError):
        verify_webhook(reference_headers(SECRET, "evt_10", now, BODY), BODY, secret)


def test_an_unprefixed_secret_works_like_the_reference():
    now = int(time.time())
    raw = SECRET.removeprefix("whsec_")
    headers = reference_headers(SECRET, "evt_11", now, BODY)
    assert ours_accepts(headers, BODY, raw) and reference_accepts(headers, BODY, raw)
