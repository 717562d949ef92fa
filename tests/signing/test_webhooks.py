"""Table tests for the webhook signature schemes (pure, no I/O)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from app.signing.webhooks import (
    MAX_SIGNED_BODY,
    TOLERANCE_S,
    jwk_for,
    jwks_public_keys,
    sign_fal,
    sign_standard_webhooks,
    sign_tv1,
    verify_fal,
    verify_standard_webhooks,
    verify_tv1,
)

T = 1_700_000_000
BODY = json.dumps({"id": "task_1", "status": "succeeded", "outputs": ["https://x/y.mp4"]}).encode()
# the same data, different bytes (what a parse + re-serialize does)
RESERIALIZED = json.dumps(json.loads(BODY), separators=(",", ":"), sort_keys=True).encode()
assert RESERIALIZED != BODY and json.loads(RESERIALIZED) == json.loads(BODY)


def _raw(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _flip_last_byte(body: bytes) -> bytes:
    return body[:-1] + bytes([body[-1] ^ 0x01])


FAL_KEY = Ed25519PrivateKey.generate()
FAL_OTHER = Ed25519PrivateKey.generate()
FAL_OLD = Ed25519PrivateKey.generate()
WHSEC = "whsec_" + base64.b64encode(b"k" * 24).decode()
WHSEC_OTHER = "whsec_" + base64.b64encode(b"o" * 24).decode()


# ------------------------------------------------------------ scheme adapters
#
# Each adapter turns (body, t, key) into a header mapping and back into a
# verdict, so the cross-scheme table below runs unchanged on all three.


@dataclass
class Scheme:
    name: str
    key: Any            # what the receiver verifies with
    wrong_key: Any      # an unrelated secret / public key
    other_job_key: Any  # the secret another job (or account) would have
    sign: Callable[[bytes, int, Any], dict]
    verify: Callable[[dict, bytes, Any, float], bool]
    set_timestamp: Callable[[dict, str | None], dict]  # None removes it
    set_signature: Callable[[dict, str | None], dict]  # None removes it


def _tv1_set_timestamp(h: dict, value: str | None) -> dict:
    items = [p for p in h["x-signature"].split(",") if not p.startswith("t=")]
    if value is not None:
        items.insert(0, f"t={value}")
    return {"x-signature": ",".join(items)}


def _set(name: str) -> Callable[[dict, str | None], dict]:
    def setter(h: dict, value: str | None) -> dict:
        h = dict(h)
        if value is None:
            h.pop(name, None)
        else:
            h[name] = value
        return h
    return setter


TV1 = Scheme(
    name="tv1",
    key="sim-secret-job-a",
    wrong_key="not-the-secret",
    other_job_key="sim-secret-job-b",
    sign=lambda body, t, key: {"x-signature": sign_tv1(key, body, t)},
    verify=lambda h, body, key, now: verify_tv1(h.get("x-signature"), body, key, now),
    set_timestamp=_tv1_set_timestamp,
    set_signature=_set("x-signature"),
)

STANDARD = Scheme(
    name="standard",
    key=WHSEC,
    wrong_key=WHSEC_OTHER,
    other_job_key="whsec_" + base64.b64encode(b"job-b-secret").decode(),
    sign=lambda body, t, key: {
        "webhook-id": "msg_2abc",
        "webhook-timestamp": str(t),
        "webhook-signature": sign_standard_webhooks(key, "msg_2abc", t, body),
    },
    verify=lambda h, body, key, now: verify_standard_webhooks(h, body, key, now),
    set_timestamp=_set("webhook-timestamp"),
    set_signature=_set("webhook-signature"),
)

FAL = Scheme(
    name="fal",
    key=[_raw(FAL_KEY)],
    wrong_key=[_raw(FAL_OTHER)],
    other_job_key=[_raw(FAL_OLD)],
    sign=lambda body, t, key: {
        "x-fal-webhook-request-id": "req-1",
        "x-fal-webhook-user-id": "user-1",
        "x-fal-webhook-timestamp": str(t),
        "x-fal-webhook-signature": sign_fal(FAL_KEY, "req-1", "user-1", t, body),
    },
    verify=lambda h, body, key, now: verify_fal(h, body, key, now),
    set_timestamp=_set("x-fal-webhook-timestamp"),
    set_signature=_set("x-fal-webhook-signature"),
)

SCHEMES = [pytest.param(s, id=s.name) for s in (TV1, STANDARD, FAL)]


# ------------------------------------------------------------ the shared table
#
# Each case: (id, mutate(scheme, headers, body) -> (headers, body, key, now), expected)

def _same(s, h, b):
    return h, b, s.key, T


CASES = [
    ("valid", _same, True),
    ("body-one-byte-changed", lambda s, h, b: (h, _flip_last_byte(b), s.key, T), False),
    ("body-reserialized-json", lambda s, h, b: (h, RESERIALIZED, s.key, T), False),
    ("body-empty", lambda s, h, b: (h, b"", s.key, T), False),
    ("wrong-secret", lambda s, h, b: (h, b, s.wrong_key, T), False),
    ("another-jobs-secret", lambda s, h, b: (h, b, s.other_job_key, T), False),
    ("299s-old", lambda s, h, b: (h, b, s.key, T + 299), True),
    ("299s-future", lambda s, h, b: (h, b, s.key, T - 299), True),
    ("300s-old-edge", lambda s, h, b: (h, b, s.key, T + 300), True),
    ("300s-future-edge", lambda s, h, b: (h, b, s.key, T - 300), True),
    ("300.5s-old", lambda s, h, b: (h, b, s.key, T + 300.5), False),
    ("301s-old", lambda s, h, b: (h, b, s.key, T + 301), False),
    ("301s-future", lambda s, h, b: (h, b, s.key, T - 301), False),
    ("a-day-old", lambda s, h, b: (h, b, s.key, T + 86400), False),
    ("now-is-nan", lambda s, h, b: (h, b, s.key, float("nan")), False),
    ("now-is-inf", lambda s, h, b: (h, b, s.key, float("inf")), False),
    ("timestamp-non-numeric", lambda s, h, b: (s.set_timestamp(h, "abc"), b, s.key, T), False),
    ("timestamp-float", lambda s, h, b: (s.set_timestamp(h, f"{T}.0"), b, s.key, T), False),
    ("timestamp-negative", lambda s, h, b: (s.set_timestamp(h, f"-{T}"), b, s.key, T), False),
    ("timestamp-plus-sign", lambda s, h, b: (s.set_timestamp(h, f"+{T}"), b, s.key, T), False),
    ("timestamp-underscore", lambda s, h, b: (s.set_timestamp(h, "1_700_000_000"), b, s.key, T), False),
    ("timestamp-arabic-digits", lambda s, h, b: (s.set_timestamp(h, "١٧٠٠٠٠٠٠٠٠"), b, s.key, T), False),
    ("timestamp-huge", lambda s, h, b: (s.set_timestamp(h, "9" * 400), b, s.key, T), False),
    ("timestamp-empty", lambda s, h, b: (s.set_timestamp(h, ""), b, s.key, T), False),
    ("timestamp-missing", lambda s, h, b: (s.set_timestamp(h, None), b, s.key, T), False),
    ("timestamp-other-but-fresh", lambda s, h, b: (s.set_timestamp(h, str(T + 1)), b, s.key, T), False),
    ("signature-header-missing", lambda s, h, b: (s.set_signature(h, None), b, s.key, T), False),
    ("signature-header-empty", lambda s, h, b: (s.set_signature(h, ""), b, s.key, T), False),
    ("signature-header-junk", lambda s, h, b: (s.set_signature(h, "\x00\u2603💥,,=,"), b, s.key, T), False),
    ("signature-header-huge", lambda s, h, b: (s.set_signature(h, "v1=" + "a" * 100_000), b, s.key, T), False),
    ("no-headers-at-all", lambda s, h, b: ({}, b, s.key, T), False),
]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("mutate,expected", [pytest.param(m, e, id=i) for i, m, e in CASES])
def test_scheme_table(scheme: Scheme, mutate, expected: bool) -> None:
    headers = scheme.sign(BODY, T, scheme.key)
    headers, body, key, now = mutate(scheme, headers, BODY)
    assert scheme.verify(headers, body, key, now) is expected


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    "size,expected",
    [
        pytest.param(MAX_SIGNED_BODY, True, id="exactly-the-cap"),
        pytest.param(MAX_SIGNED_BODY + 1, False, id="one-byte-over"),
        pytest.param(8 * MAX_SIGNED_BODY, False, id="far-over"),
    ],
)
def test_body_cap(scheme: Scheme, size: int, expected: bool) -> None:
    body = b"x" * size  # correctly signed, but over the cap is refused anyway
    headers = scheme.sign(body, T, scheme.key)
    assert scheme.verify(headers, body, scheme.key, T) is expected


def test_tolerance_constant() -> None:
    assert TOLERANCE_S == 300


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tolerance,expected", [(0, False), (59, False), (60, True), (-1, False)])
def test_custom_tolerance(scheme: Scheme, tolerance: int, expected: bool) -> None:
    headers = scheme.sign(BODY, T, scheme.key)
    verdict = {
        "tv1": lambda: verify_tv1(headers["x-signature"], BODY, scheme.key, T + 60, tolerance),
        "standard": lambda: verify_standard_webhooks(headers, BODY, scheme.key, T + 60, tolerance),
        "fal": lambda: verify_fal(headers, BODY, scheme.key, T + 60, tolerance),
    }[scheme.name]()
    assert verdict is expected


# ------------------------------------------------------------ t/v1 specifics

SECRET = "sim-secret-job-a"
GOOD_HEX = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
OTHER_HEX = hmac.new(b"old-secret", f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()


def test_tv1_format() -> None:
    assert sign_tv1(SECRET, BODY, T) == f"t={T},v1={GOOD_HEX}"


@pytest.mark.parametrize(
    "header,expected",
    [
        pytest.param(f"t={T},v1={GOOD_HEX}", True, id="canonical"),
        pytest.param(f"t={T}, v1={GOOD_HEX}", True, id="space-after-comma"),
        pytest.param(f" t={T} ,  v1={GOOD_HEX} ", True, id="spaces-everywhere"),
        pytest.param(f"t = {T}, v1 = {GOOD_HEX}", True, id="spaces-around-equals"),
        pytest.param(f"v1={GOOD_HEX},t={T}", True, id="order-swapped"),
        pytest.param(f"t={T},v1={GOOD_HEX.upper()}", True, id="uppercase-hex"),
        pytest.param(f"t={T},v1={OTHER_HEX},v1={GOOD_HEX}", True, id="rotation-second-valid"),
        pytest.param(f"t={T},v1={GOOD_HEX},v1={OTHER_HEX}", True, id="rotation-first-valid"),
        pytest.param(f"t={T},v0={GOOD_HEX},v1={GOOD_HEX}", True, id="unknown-version-ignored"),
        pytest.param(f"t={T},v1={OTHER_HEX},v1={OTHER_HEX}", False, id="rotation-none-valid"),
        pytest.param(f"t={T},v2={GOOD_HEX}", False, id="downgrade-only-v2"),
        pytest.param(f"t={T},v0={GOOD_HEX}", False, id="downgrade-only-v0"),
        pytest.param(f"t={T},V1={GOOD_HEX}", False, id="version-name-is-case-sensitive"),
        pytest.param(f"t={T}", False, id="no-signature"),
        pytest.param(f"t={T},v1=", False, id="empty-signature"),
        pytest.param(f"v1={GOOD_HEX}", False, id="no-timestamp"),
        pytest.param(f"t=,v1={GOOD_HEX}", False, id="empty-timestamp"),
        pytest.param(f"t={T},t={T},v1={GOOD_HEX}", False, id="duplicate-timestamp"),
        pytest.param(f"t={T},t={T + 1},v1={GOOD_HEX}", False, id="conflicting-timestamps"),
        pytest.param(f"t={T},v1={GOOD_HEX[:-2]}", False, id="hex-too-short"),
        pytest.param(f"t={T},v1={GOOD_HEX}00", False, id="hex-too-long"),
        pytest.param(f"t={T},v1={GOOD_HEX[:-1]}g", False, id="non-hex"),
        pytest.param(f"t={T},v1=" + base64.b64encode(bytes.fromhex(GOOD_HEX)).decode(), False, id="base64-not-hex"),
        pytest.param(f"t={T};v1={GOOD_HEX}", False, id="semicolon-separator"),
        pytest.param(f"t={T}v1={GOOD_HEX}", False, id="missing-comma"),
        pytest.param(f"t={T},v1={GOOD_HEX}" + ",v1=" + "0" * 64 * 1000, False, id="oversized-header"),
        pytest.param(",".join([f"t={T}"] + [f"v1={OTHER_HEX}"] * 40 + [f"v1={GOOD_HEX}"]), False, id="too-many-signatures"),
        pytest.param("", False, id="empty"),
        pytest.param(None, False, id="none"),
        pytest.param("💥", False, id="unicode-junk"),
        pytest.param(f"t={T},v1={GOOD_HEX[:-1]}\u0661", False, id="unicode-digit-in-hex"),
    ],
)
def test_tv1_header_forms(header, expected: bool) -> None:
    assert verify_tv1(header, BODY, SECRET, T) is expected


@pytest.mark.parametrize(
    "secret",
    [pytest.param("", id="empty"), pytest.param(None, id="none"), pytest.param(b"bytes", id="bytes"),
     pytest.param("\ud800", id="lone-surrogate")],
)
def test_tv1_bad_secret(secret) -> None:
    assert verify_tv1(f"t={T},v1={GOOD_HEX}", BODY, secret, T) is False


def test_tv1_unicode_secret_is_utf8() -> None:
    secret = "sécret-✓"
    expected = hmac.new(secret.encode("utf-8"), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign_tv1(secret, BODY, T) == f"t={T},v1={expected}"
    assert verify_tv1(sign_tv1(secret, BODY, T), BODY, secret, T)


# ------------------------------------------------------------ Standard Webhooks specifics

# Published test vector (standard-webhooks spec and its reference libraries).
VEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VEC_TS = 1614265330
VEC_BODY = b'{"test": 2432232314}'
VEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def _vec_headers(**over: str) -> dict:
    h = {"webhook-id": VEC_ID, "webhook-timestamp": str(VEC_TS), "webhook-signature": VEC_SIG}
    h.update({k.replace("_", "-"): v for k, v in over.items()})
    return h


def test_standard_webhooks_published_vector_sign() -> None:
    assert sign_standard_webhooks(VEC_SECRET, VEC_ID, VEC_TS, VEC_BODY) == VEC_SIG


OTHER_SIG = sign_standard_webhooks(WHSEC_OTHER, VEC_ID, VEC_TS, VEC_BODY)
VEC_B64 = VEC_SIG.split(",", 1)[1]


@pytest.mark.parametrize(
    "headers,body,secret,now,expected",
    [
        pytest.param(_vec_headers(), VEC_BODY, VEC_SECRET, VEC_TS, True, id="vector-valid"),
        pytest.param(_vec_headers(), VEC_BODY, VEC_SECRET[len("whsec_"):], VEC_TS, True, id="secret-without-prefix"),
        pytest.param(_vec_headers(), VEC_BODY, VEC_SECRET, VEC_TS + 299, True, id="vector-299s-later"),
        pytest.param(_vec_headers(), VEC_BODY, VEC_SECRET, VEC_TS + 301, False, id="vector-301s-later"),
        pytest.param(_vec_headers(), VEC_BODY, VEC_SECRET, VEC_TS - 301, False, id="vector-301s-earlier"),
        pytest.param(_vec_headers(), b'{"test":2432232314}', VEC_SECRET, VEC_TS, False, id="vector-reserialized"),
        pytest.param(_vec_headers(), b'{"test": 2432232315}', VEC_SECRET, VEC_TS, False, id="vector-body-one-byte"),
        pytest.param(_vec_headers(webhook_id="msg_other"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="other-msg-id"),
        pytest.param(_vec_headers(webhook_id=""), VEC_BODY, VEC_SECRET, VEC_TS, False, id="empty-msg-id"),
        pytest.param({k: v for k, v in _vec_headers().items() if k != "webhook-id"}, VEC_BODY, VEC_SECRET, VEC_TS, False, id="missing-msg-id"),
        pytest.param({k.title(): v for k, v in _vec_headers().items()}, VEC_BODY, VEC_SECRET, VEC_TS, True, id="mixed-case-header-names"),
        pytest.param(_vec_headers(webhook_signature=f"{OTHER_SIG} {VEC_SIG}"), VEC_BODY, VEC_SECRET, VEC_TS, True, id="rotation-second-valid"),
        pytest.param(_vec_headers(webhook_signature=f"{VEC_SIG} {OTHER_SIG}"), VEC_BODY, VEC_SECRET, VEC_TS, True, id="rotation-first-valid"),
        pytest.param(_vec_headers(webhook_signature=f"  {OTHER_SIG}   {VEC_SIG}  "), VEC_BODY, VEC_SECRET, VEC_TS, True, id="extra-whitespace"),
        pytest.param(_vec_headers(webhook_signature=f"v1a,{VEC_B64} {VEC_SIG}"), VEC_BODY, VEC_SECRET, VEC_TS, True, id="unknown-version-ignored"),
        pytest.param(_vec_headers(webhook_signature=f"{OTHER_SIG} {OTHER_SIG}"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="rotation-none-valid"),
        pytest.param(_vec_headers(webhook_signature=f"v2,{VEC_B64}"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="downgrade-only-v2"),
        pytest.param(_vec_headers(webhook_signature=f"v1a,{VEC_B64}"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="downgrade-only-v1a"),
        pytest.param(_vec_headers(webhook_signature=f"V1,{VEC_B64}"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="version-case-sensitive"),
        pytest.param(_vec_headers(webhook_signature=VEC_B64), VEC_BODY, VEC_SECRET, VEC_TS, False, id="no-version-prefix"),
        pytest.param(_vec_headers(webhook_signature=f"v1={VEC_B64}"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="equals-not-comma"),
        pytest.param(_vec_headers(webhook_signature="v1,"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="empty-b64"),
        pytest.param(_vec_headers(webhook_signature="v1,!!!notbase64!!!"), VEC_BODY, VEC_SECRET, VEC_TS, False, id="non-base64"),
        pytest.param(_vec_headers(webhook_signature="v1," + VEC_B64.rstrip("=")), VEC_BODY, VEC_SECRET, VEC_TS, False, id="b64-missing-padding"),
        pytest.param(_vec_headers(webhook_signature="v1," + base64.urlsafe_b64encode(base64.b64decode(VEC_B64)).decode()), VEC_BODY, VEC_SECRET, VEC_TS, False, id="urlsafe-b64-alphabet"),
        pytest.param(_vec_headers(webhook_signature="v1," + base64.b64encode(base64.b64decode(VEC_B64)[:16]).decode()), VEC_BODY, VEC_SECRET, VEC_TS, False, id="truncated-mac"),
        pytest.param(_vec_headers(webhook_signature="v1," + base64.b64encode(base64.b64decode(VEC_B64) + b"\0").decode()), VEC_BODY, VEC_SECRET, VEC_TS, False, id="mac-too-long"),
        pytest.param(_vec_headers(webhook_signature="v1," + bytes.fromhex(base64.b64decode(VEC_B64).hex()).hex()), VEC_BODY, VEC_SECRET, VEC_TS, False, id="hex-not-base64"),
        pytest.param(_vec_headers(webhook_signature=" ".join([OTHER_SIG] * 40 + [VEC_SIG])), VEC_BODY, VEC_SECRET, VEC_TS, False, id="too-many-signatures"),
        pytest.param(_vec_headers(webhook_timestamp=f"{VEC_TS} "), VEC_BODY, VEC_SECRET, VEC_TS, False, id="timestamp-trailing-space"),
        pytest.param(_vec_headers(), VEC_BODY, "whsec_", VEC_TS, False, id="secret-empty-key"),
        pytest.param(_vec_headers(), VEC_BODY, "whsec_!!!!", VEC_TS, False, id="secret-not-base64"),
        pytest.param(_vec_headers(), VEC_BODY, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS", VEC_TS, False, id="secret-one-char-short"),
        pytest.param(_vec_headers(), VEC_BODY, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwA", VEC_TS, False, id="secret-length-1-mod-4"),
        pytest.param(_vec_headers(), VEC_BODY, "", VEC_TS, False, id="secret-empty"),
        pytest.param(_vec_headers(), VEC_BODY, None, VEC_TS, False, id="secret-none"),
        pytest.param(_vec_headers(), VEC_BODY, "whsec_ñ", VEC_TS, False, id="secret-unicode"),
        pytest.param(None, VEC_BODY, VEC_SECRET, VEC_TS, False, id="headers-none"),
        pytest.param(_vec_headers(), None, VEC_SECRET, VEC_TS, False, id="body-none"),
        pytest.param(_vec_headers(), VEC_BODY.decode(), VEC_SECRET, VEC_TS, False, id="body-str"),
    ],
)
def test_standard_webhooks_table(headers, body, secret, now, expected: bool) -> None:
    assert verify_standard_webhooks(headers, body, secret, now) is expected


# The secret's forms: a key of 24 bytes encodes without padding, of 32 bytes
# with one "=", of 31 bytes with two. The reference (standardwebhooks,
# svix) strips "whsec_" and decodes secret + "==", so every form below names
# the same key there; tests/signing/test_standard_webhooks_reference.py runs
# the reference itself on them.
KEY_0PAD = bytes(range(24))
KEY_1PAD = bytes(range(100, 132))
KEY_2PAD = bytes(range(200, 231))
KEY_ALPHA = b"\xfb\xff" * 16  # standard base64 "+/+/...": its url-safe form differs


def _b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


@pytest.mark.parametrize(
    "key,secret,expected",
    [
        pytest.param(KEY_0PAD, "whsec_" + _b64(KEY_0PAD), True, id="no-padding-needed"),
        pytest.param(KEY_0PAD, _b64(KEY_0PAD), True, id="no-padding-needed-no-prefix"),
        pytest.param(KEY_1PAD, "whsec_" + _b64(KEY_1PAD), True, id="one-pad"),
        pytest.param(KEY_1PAD, "whsec_" + _b64(KEY_1PAD).rstrip("="), True, id="one-pad-missing"),
        pytest.param(KEY_1PAD, _b64(KEY_1PAD), True, id="one-pad-no-prefix"),
        pytest.param(KEY_1PAD, _b64(KEY_1PAD).rstrip("="), True, id="one-pad-missing-no-prefix"),
        pytest.param(KEY_2PAD, "whsec_" + _b64(KEY_2PAD), True, id="two-pads"),
        pytest.param(KEY_2PAD, "whsec_" + _b64(KEY_2PAD).rstrip("="), True, id="two-pads-missing"),
        pytest.param(KEY_2PAD, "whsec_" + _b64(KEY_2PAD)[:-1], True, id="two-pads-one-missing"),
        pytest.param(KEY_2PAD, _b64(KEY_2PAD).rstrip("="), True, id="two-pads-missing-no-prefix"),
        pytest.param(KEY_0PAD, "whsec_" + _b64(KEY_0PAD) + "==", True, id="surplus-pads-on-aligned"),
        pytest.param(KEY_ALPHA, "whsec_" + _b64(KEY_ALPHA), True, id="plus-and-slash"),
        pytest.param(KEY_1PAD, "whsec_" + _b64(KEY_1PAD) + "\n", True, id="trailing-newline"),
        pytest.param(KEY_1PAD, " whsec_" + _b64(KEY_1PAD).rstrip("=") + " \r\n", True, id="surrounding-whitespace"),
        # refused: not base64 as any sender hands it out (the reference would
        # drop or stop at these characters and derive some other key)
        pytest.param(KEY_ALPHA, "whsec_" + base64.urlsafe_b64encode(KEY_ALPHA).decode(), False, id="url-safe-alphabet"),
        pytest.param(KEY_1PAD, "whsec_" + _b64(KEY_1PAD) + "==", False, id="three-pads"),
        pytest.param(KEY_0PAD, "whsec_" + _b64(KEY_0PAD)[:16] + "=" + _b64(KEY_0PAD)[16:], False, id="inner-pad"),
        pytest.param(KEY_0PAD, "whsec_" + _b64(KEY_0PAD)[:16] + " " + _b64(KEY_0PAD)[16:], False, id="inner-space"),
        pytest.param(KEY_0PAD, "whsec_" + _b64(KEY_0PAD)[:16] + "\n" + _b64(KEY_0PAD)[16:], False, id="inner-newline"),
        pytest.param(KEY_0PAD, "whsec_whsec_" + _b64(KEY_0PAD), False, id="prefix-twice"),
        pytest.param(KEY_0PAD, "WHSEC_" + _b64(KEY_0PAD), False, id="prefix-upper-case"),
        pytest.param(KEY_0PAD, "whsec_" + _b64(KEY_0PAD) + "A", False, id="length-1-mod-4"),
        pytest.param(KEY_0PAD, "whsec_==", False, id="padding-only"),
        pytest.param(KEY_0PAD, "\n", False, id="whitespace-only"),
    ],
)
def test_standard_webhooks_secret_forms(key: bytes, secret: str, expected: bool) -> None:
    # The expected signature is computed here from the raw key, not by our signer.
    digest = hmac.new(key, f"{VEC_ID}.{VEC_TS}.".encode() + VEC_BODY, hashlib.sha256).digest()
    sig = "v1," + base64.b64encode(digest).decode()
    headers = _vec_headers(webhook_signature=sig)
    assert verify_standard_webhooks(headers, VEC_BODY, secret, VEC_TS) is expected
    if expected:
        assert sign_standard_webhooks(secret, VEC_ID, VEC_TS, VEC_BODY) == sig
    else:
        with pytest.raises(ValueError):
            sign_standard_webhooks(secret, VEC_ID, VEC_TS, VEC_BODY)


def test_standard_webhooks_published_vector_unpadded_forms() -> None:
    """The published secret needs no padding; its key re-encoded with one or
    two missing pads still signs the published vector's way."""
    key = base64.b64decode(VEC_SECRET[len("whsec_"):])
    assert len(key) % 3 == 0  # so the vector itself cannot show the padding bug
    for extra in (b"\x00", b"\x00\x01"):
        padded = base64.b64encode(key + extra).decode()
        assert padded.endswith("=")
        assert sign_standard_webhooks("whsec_" + padded.rstrip("="), VEC_ID, VEC_TS, VEC_BODY) == \
            sign_standard_webhooks("whsec_" + padded, VEC_ID, VEC_TS, VEC_BODY)


def test_standard_webhooks_sign_refuses_bad_secret() -> None:
    with pytest.raises(ValueError) as err:
        sign_standard_webhooks("whsec_!!!!", "msg", T, b"")
    assert "!!!!" not in str(err.value)


# ------------------------------------------------------------ fal specifics

FAL_SIG = sign_fal(FAL_KEY, "req-1", "user-1", T, BODY)


def _fal_headers(**over: str) -> dict:
    h = {
        "x-fal-webhook-request-id": "req-1",
        "x-fal-webhook-user-id": "user-1",
        "x-fal-webhook-timestamp": str(T),
        "x-fal-webhook-signature": FAL_SIG,
    }
    h.update({"x-fal-webhook-" + k.replace("_", "-"): v for k, v in over.items()})
    return h


def test_fal_signed_message_matches_the_documented_layout() -> None:
    message = "\n".join(["req-1", "user-1", str(T), hashlib.sha256(BODY).hexdigest()]).encode()
    FAL_KEY.public_key().verify(bytes.fromhex(FAL_SIG), message)  # raises if not


@pytest.mark.parametrize(
    "headers,keys,expected",
    [
        pytest.param(_fal_headers(), [_raw(FAL_KEY)], True, id="valid"),
        pytest.param(_fal_headers(), [_raw(FAL_OLD), _raw(FAL_KEY)], True, id="rotation-second-key"),
        pytest.param(_fal_headers(), [_raw(FAL_KEY), _raw(FAL_OLD)], True, id="rotation-first-key"),
        pytest.param(_fal_headers(), (_raw(FAL_KEY),), True, id="keys-as-tuple"),
        pytest.param(_fal_headers(), [b"\0" * 31, b"junk", None, _raw(FAL_KEY)], True, id="malformed-keys-skipped"),
        pytest.param(_fal_headers(signature=FAL_SIG.upper()), [_raw(FAL_KEY)], True, id="uppercase-hex"),
        pytest.param({k.upper(): v for k, v in _fal_headers().items()}, [_raw(FAL_KEY)], True, id="uppercase-header-names"),
        pytest.param(_fal_headers(), [_raw(FAL_OLD), _raw(FAL_OTHER)], False, id="no-matching-key"),
        pytest.param(_fal_headers(), [], False, id="no-keys"),
        pytest.param(_fal_headers(), None, False, id="keys-none"),
        pytest.param(_fal_headers(), _raw(FAL_KEY), False, id="keys-bare-bytes"),
        pytest.param(_fal_headers(request_id="req-2"), [_raw(FAL_KEY)], False, id="other-request-id"),
        pytest.param(_fal_headers(user_id="user-2"), [_raw(FAL_KEY)], False, id="other-user-id"),
        pytest.param(_fal_headers(request_id=""), [_raw(FAL_KEY)], False, id="empty-request-id"),
        pytest.param(_fal_headers(user_id=""), [_raw(FAL_KEY)], False, id="empty-user-id"),
        pytest.param(_fal_headers(signature=FAL_SIG[:-2]), [_raw(FAL_KEY)], False, id="sig-too-short"),
        pytest.param(_fal_headers(signature=FAL_SIG + "00"), [_raw(FAL_KEY)], False, id="sig-too-long"),
        pytest.param(_fal_headers(signature=FAL_SIG[:-1] + "z"), [_raw(FAL_KEY)], False, id="sig-non-hex"),
        pytest.param(_fal_headers(signature=base64.b64encode(bytes.fromhex(FAL_SIG)).decode()), [_raw(FAL_KEY)], False, id="sig-base64-not-hex"),
        pytest.param(_fal_headers(signature="00" * 64), [_raw(FAL_KEY)], False, id="sig-zeros"),
        pytest.param(_fal_headers(signature=f"{FAL_SIG},{FAL_SIG}"), [_raw(FAL_KEY)], False, id="sig-list-not-accepted"),
        pytest.param(_fal_headers(signature=FAL_SIG[:-1] + "\u0661"), [_raw(FAL_KEY)], False, id="sig-unicode-digit"),
    ],
)
def test_fal_table(headers, keys, expected: bool) -> None:
    assert verify_fal(headers, BODY, keys, T) is expected


# ------------------------------------------------------------ JWKS


def _x(raw: bytes, pad: bool = False) -> str:
    enc = base64.urlsafe_b64encode(raw).decode()
    return enc if pad else enc.rstrip("=")


RAW = _raw(FAL_KEY)


@pytest.mark.parametrize(
    "jwks,expected",
    [
        pytest.param({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _x(RAW)}]}, [RAW], id="minimal"),
        pytest.param({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _x(RAW, pad=True)}]}, [RAW], id="padded-x"),
        pytest.param({"keys": [jwk_for(FAL_KEY.public_key())]}, [RAW], id="jwk_for-entry"),
        pytest.param({"keys": [jwk_for(FAL_KEY.public_key()), jwk_for(FAL_OLD.public_key())]}, [RAW, _raw(FAL_OLD)], id="two-keys"),
        pytest.param({"keys": [jwk_for(FAL_KEY.public_key())] * 2}, [RAW], id="duplicates-collapsed"),
        pytest.param({"keys": [
            {"kty": "RSA", "n": "abc", "e": "AQAB"},
            {"kty": "OKP", "crv": "X25519", "x": _x(RAW)},
            {"kty": "OKP", "crv": "Ed25519"},
            {"kty": "OKP", "crv": "Ed25519", "x": 12},
            {"kty": "OKP", "crv": "Ed25519", "x": "!!!"},
            {"kty": "OKP", "crv": "Ed25519", "x": _x(RAW[:31])},
            {"kty": "OKP", "crv": "Ed25519", "x": _x(RAW + b"\0")},
            {"kty": "OKP", "crv": "Ed25519", "x": _x(RAW), "use": "enc"},
            "string-entry",
            None,
            {"kty": "OKP", "crv": "Ed25519", "x": _x(RAW)},
        ]}, [RAW], id="malformed-entries-ignored"),
        pytest.param({"keys": []}, [], id="empty"),
        pytest.param({"keys": "nope"}, [], id="keys-not-list"),
        pytest.param({}, [], id="no-keys-field"),
        pytest.param([], [], id="list"),
        pytest.param(None, [], id="none"),
        pytest.param("{}", [], id="string"),
    ],
)
def test_jwks_public_keys(jwks, expected) -> None:
    assert jwks_public_keys(jwks) == expected


def test_jwk_for_shape() -> None:
    jwk = jwk_for(FAL_KEY.public_key())
    assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
    assert "=" not in jwk["x"] and base64.urlsafe_b64decode(jwk["x"] + "=") == RAW
    assert "d" not in jwk  # never the private part
    json.dumps(jwk)


def test_fal_end_to_end_through_jwks() -> None:
    keys = jwks_public_keys({"keys": [jwk_for(FAL_OLD.public_key()), jwk_for(FAL_KEY.public_key())]})
    assert verify_fal(_fal_headers(), BODY, keys, T)


# ------------------------------------------------------------ never raises

JUNK = [None, 0, -1, 10**400, 1.5, float("nan"), "", "💥", b"\xff\xfe", [], {}, object(), True]


@pytest.mark.parametrize("junk", JUNK, ids=lambda j: type(j).__name__)
def test_verifiers_never_raise(junk) -> None:
    good_tv1 = sign_tv1(SECRET, BODY, T)
    good_std = _vec_headers()
    good_fal = _fal_headers()
    calls = [
        lambda: verify_tv1(junk, BODY, SECRET, T),
        lambda: verify_tv1(good_tv1, junk, SECRET, T),
        lambda: verify_tv1(good_tv1, BODY, junk, T),
        lambda: verify_tv1(good_tv1, BODY, SECRET, junk),
        lambda: verify_tv1(good_tv1, BODY, SECRET, T + 5, junk),  # none of JUNK is a tolerance ≥ 5
        lambda: verify_standard_webhooks(junk, VEC_BODY, VEC_SECRET, VEC_TS),
        lambda: verify_standard_webhooks({**good_std, "webhook-signature": junk}, VEC_BODY, VEC_SECRET, VEC_TS),
        lambda: verify_standard_webhooks({**good_std, "webhook-timestamp": junk}, VEC_BODY, VEC_SECRET, VEC_TS),
        lambda: verify_standard_webhooks(good_std, junk, VEC_SECRET, VEC_TS),
        lambda: verify_standard_webhooks(good_std, VEC_BODY, junk, VEC_TS),
        lambda: verify_standard_webhooks(good_std, VEC_BODY, VEC_SECRET, junk),
        lambda: verify_fal(junk, BODY, [RAW], T),
        lambda: verify_fal({**good_fal, "x-fal-webhook-signature": junk}, BODY, [RAW], T),
        lambda: verify_fal({**good_fal, "x-fal-webhook-request-id": junk}, BODY, [RAW], T),
        lambda: verify_fal(good_fal, junk, [RAW], T),
        lambda: verify_fal(good_fal, BODY, junk, T),
        lambda: verify_fal(good_fal, BODY, [junk], T),
        lambda: verify_fal(good_fal, BODY, [RAW], junk),
        lambda: jwks_public_keys(junk),
        lambda: jwks_public_keys({"keys": [junk]}),
        lambda: jwks_public_keys({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": junk}]}),
    ]
    for call in calls:
        assert call() in (False, [])


def test_bytes_header_values_are_tolerated() -> None:
    """Raw ASGI headers are bytes; a mapping of bytes values still verifies."""
    headers = {k: v.encode() for k, v in _vec_headers().items()}
    assert verify_standard_webhooks(headers, VEC_BODY, VEC_SECRET, VEC_TS)
