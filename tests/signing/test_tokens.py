"""Table tests for signed read tokens, capability tokens, and the console's
session and form (CSRF) tokens."""
from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest

from app.signing.tokens import (
    check_capability_token,
    check_form_token,
    check_read_token,
    check_session_token,
    make_capability_token,
    make_form_token,
    make_read_token,
    make_session_token,
)

KEY = b"new-secret-key-0123456789"
OLD = b"old-secret-key-0123456789"
OTHER = b"someone-elses-key-0123456"
JOB = "job_0123456789abcdef01234567"
JOB_B = "job_fedcba9876543210fedcba98"
NOW = 1_700_000_000
EXP = NOW + 3600

READ = make_read_token(JOB, KEY, EXP)
READ_OLD = make_read_token(JOB, OLD, EXP)
CAP = make_capability_token("kie", JOB, KEY)
CAP_OLD = make_capability_token("kie", JOB, OLD)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _raw(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _flip(token: str, index: int) -> str:
    raw = bytearray(_raw(token))
    raw[index] ^= 0x01
    return _b64(bytes(raw))


def _with_expiry(token: str, expires_at: int) -> str:
    raw = _raw(token)
    return _b64(raw[:1] + expires_at.to_bytes(8, "big") + raw[9:])


# ------------------------------------------------------------ read tokens


def test_read_token_is_url_safe_and_unpadded() -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]+", READ)
    assert "." not in READ and "=" not in READ


@pytest.mark.parametrize(
    "token,job_id,keys,now,expected",
    [
        pytest.param(READ, JOB, [KEY], NOW, True, id="round-trip"),
        pytest.param(READ, JOB, (KEY,), NOW, True, id="keys-as-tuple"),
        pytest.param(READ, JOB, [KEY], EXP - 1, True, id="one-second-before-expiry"),
        pytest.param(READ, JOB, [KEY], EXP - 0.001, True, id="just-before-expiry"),
        pytest.param(READ, JOB, [KEY], EXP, False, id="at-expiry"),
        pytest.param(READ, JOB, [KEY], EXP + 1, False, id="expired"),
        pytest.param(make_read_token(JOB, KEY, NOW - 1), JOB, [KEY], NOW, False, id="minted-already-expired"),
        pytest.param(READ, JOB_B, [KEY], NOW, False, id="other-job"),
        pytest.param(READ, JOB + "x", [KEY], NOW, False, id="job-id-extended"),
        pytest.param(READ, JOB[:-1], [KEY], NOW, False, id="job-id-truncated"),
        pytest.param(READ, "", [KEY], NOW, False, id="empty-job-id"),
        pytest.param(READ, None, [KEY], NOW, False, id="job-id-none"),
        pytest.param(READ, JOB, [OTHER], NOW, False, id="other-key"),
        pytest.param(READ, JOB, [], NOW, False, id="no-keys"),
        pytest.param(READ, JOB, None, NOW, False, id="keys-none"),
        pytest.param(READ, JOB, KEY, NOW, False, id="keys-bare-bytes"),
        pytest.param(READ, JOB, [b"", None, "str", KEY], NOW, True, id="junk-keys-skipped"),
        pytest.param(READ_OLD, JOB, [KEY, OLD], NOW, True, id="rotation-old-key-accepted"),
        pytest.param(READ, JOB, [KEY, OLD], NOW, True, id="rotation-new-key-accepted"),
        pytest.param(READ_OLD, JOB, [KEY], NOW, False, id="retired-key-refused"),
        pytest.param(_with_expiry(READ, EXP + 86400 * 365), JOB, [KEY], NOW, False, id="forged-later-expiry"),
        pytest.param(_with_expiry(READ, EXP + 86400 * 365), JOB, [KEY], EXP + 10, False, id="forged-expiry-after-real"),
        pytest.param(_flip(READ, 0), JOB, [KEY], NOW, False, id="forged-version-byte"),
        pytest.param(_flip(READ, 20), JOB, [KEY], NOW, False, id="forged-tag-bit"),
        pytest.param(_flip(READ, -1), JOB, [KEY], NOW, False, id="forged-last-byte"),
        pytest.param(READ[:-1], JOB, [KEY], NOW, False, id="truncated-one-char"),
        pytest.param(READ[:20], JOB, [KEY], NOW, False, id="truncated-half"),
        pytest.param(READ + "A", JOB, [KEY], NOW, False, id="extended-one-char"),
        pytest.param(READ + "==", JOB, [KEY], NOW, False, id="padded"),
        pytest.param(READ[:-1] + ("B" if READ[-1] == "A" else "A"), JOB, [KEY], NOW, False, id="last-char-changed"),
        pytest.param(base64.b64encode(_raw(READ)).decode(), JOB, [KEY], NOW,
                     READ == base64.b64encode(_raw(READ)).decode(), id="standard-b64-alphabet"),
        pytest.param(READ + "." + READ, JOB, [KEY], NOW, False, id="dotted"),
        pytest.param(" " + READ, JOB, [KEY], NOW, False, id="leading-space"),
        pytest.param("", JOB, [KEY], NOW, False, id="empty"),
        pytest.param(None, JOB, [KEY], NOW, False, id="none"),
        pytest.param(123, JOB, [KEY], NOW, False, id="int"),
        pytest.param(READ.encode(), JOB, [KEY], NOW, False, id="bytes"),
        pytest.param("💥" * 10, JOB, [KEY], NOW, False, id="unicode-junk"),
        pytest.param("A" * 10_000, JOB, [KEY], NOW, False, id="huge"),
        pytest.param(CAP, JOB, [KEY], NOW, False, id="capability-token-is-not-a-read-token"),
        pytest.param(READ, JOB, [KEY], float("nan"), False, id="now-nan"),
        pytest.param(READ, JOB, [KEY], None, False, id="now-none"),
    ],
)
def test_read_token_table(token, job_id, keys, now, expected: bool) -> None:
    assert check_read_token(token, job_id, keys, now) is expected


def test_read_token_binds_expiry_not_just_job() -> None:
    a = make_read_token(JOB, KEY, EXP)
    b = make_read_token(JOB, KEY, EXP + 1)
    assert a != b
    assert _raw(a)[9:] != _raw(b)[9:]


def test_read_token_job_ids_are_length_prefixed() -> None:
    # no (job, expiry) splice: different job ids never share a tag
    tags = {_raw(make_read_token(j, KEY, EXP))[9:] for j in ("a", "ab", "a\0", "job_1", "job_10")}
    assert len(tags) == 5


def test_read_token_is_not_hmac_under_the_raw_key() -> None:
    raw = _raw(READ)
    naive = hmac.new(KEY, JOB.encode() + raw[1:9], hashlib.sha256).digest()
    assert raw[9:] != naive


@pytest.mark.parametrize(
    "job_id,key,expires_at",
    [
        pytest.param(JOB, b"", EXP, id="empty-key"),
        pytest.param(JOB, "str-key", EXP, id="str-key"),
        pytest.param("", KEY, EXP, id="empty-job"),
        pytest.param(JOB, KEY, -1, id="negative-expiry"),
        pytest.param(JOB, KEY, 2**64, id="expiry-too-large"),
    ],
)
def test_make_read_token_refuses_bad_input(job_id, key, expires_at) -> None:
    with pytest.raises(ValueError) as err:
        make_read_token(job_id, key, expires_at)
    assert "str-key" not in str(err.value)


# ------------------------------------------------------------ capability tokens


def test_capability_token_is_url_safe_and_stable() -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]+", CAP)
    assert make_capability_token("kie", JOB, KEY) == CAP  # deterministic: same URL every time


@pytest.mark.parametrize(
    "token,provider,job_id,keys,expected",
    [
        pytest.param(CAP, "kie", JOB, [KEY], True, id="round-trip"),
        pytest.param(CAP, "kie", JOB_B, [KEY], False, id="other-job"),
        pytest.param(CAP, "sim", JOB, [KEY], False, id="other-provider"),
        pytest.param(CAP, "KIE", JOB, [KEY], False, id="provider-case"),
        pytest.param(make_capability_token("ki", "e" + JOB, KEY), "kie", JOB, [KEY], False, id="no-boundary-splice"),
        pytest.param(CAP, "kie", JOB, [OTHER], False, id="other-key"),
        pytest.param(CAP_OLD, "kie", JOB, [KEY, OLD], True, id="rotation-old-key-accepted"),
        pytest.param(CAP, "kie", JOB, [KEY, OLD], True, id="rotation-new-key-accepted"),
        pytest.param(CAP_OLD, "kie", JOB, [KEY], False, id="retired-key-refused"),
        pytest.param(_flip(CAP, 0), "kie", JOB, [KEY], False, id="forged-version-byte"),
        pytest.param(_flip(CAP, 5), "kie", JOB, [KEY], False, id="forged-tag-bit"),
        pytest.param(CAP[:-1], "kie", JOB, [KEY], False, id="truncated"),
        pytest.param(CAP + "A", "kie", JOB, [KEY], False, id="extended"),
        pytest.param(READ, "kie", JOB, [KEY], False, id="read-token-is-not-a-capability-token"),
        pytest.param("", "kie", JOB, [KEY], False, id="empty"),
        pytest.param(None, "kie", JOB, [KEY], False, id="none"),
        pytest.param("💥", "kie", JOB, [KEY], False, id="unicode-junk"),
        pytest.param(CAP, "", JOB, [KEY], False, id="empty-provider"),
        pytest.param(CAP, "kie", "", [KEY], False, id="empty-job"),
        pytest.param(CAP, "kie", JOB, [], False, id="no-keys"),
        pytest.param(CAP, "kie", JOB, None, False, id="keys-none"),
    ],
)
def test_capability_token_table(token, provider, job_id, keys, expected: bool) -> None:
    assert check_capability_token(token, provider, job_id, keys) is expected


def test_read_and_capability_tags_differ_for_the_same_inputs() -> None:
    """Domain separation: same key and job, the two kinds never share a tag."""
    assert _raw(make_read_token(JOB, KEY, EXP))[9:] != _raw(make_capability_token("kie", JOB, KEY))[1:]
    assert _raw(READ)[0] != _raw(CAP)[0]
    assert len(_raw(READ)) != len(_raw(CAP))


@pytest.mark.parametrize(
    "provider,job_id,key",
    [
        pytest.param("kie", JOB, b"", id="empty-key"),
        pytest.param("", JOB, KEY, id="empty-provider"),
        pytest.param("kie", "", KEY, id="empty-job"),
    ],
)
def test_make_capability_token_refuses_bad_input(provider, job_id, key) -> None:
    with pytest.raises(ValueError):
        make_capability_token(provider, job_id, key)


# ------------------------------------------------------------ console sessions

ADMIN = "admin-token-0123456789"
NONCE = bytes(range(16))
NONCE_B = bytes(range(1, 17))
SESSION = make_session_token(KEY, ADMIN, NONCE, EXP)
SESSION_OLD = make_session_token(OLD, ADMIN, NONCE, EXP)
FORM = make_form_token(KEY, "action", NONCE)


@pytest.mark.parametrize(
    "token,keys,admin,now,expected",
    [
        pytest.param(SESSION, [KEY], ADMIN, NOW, NONCE, id="valid"),
        pytest.param(SESSION_OLD, [KEY, OLD], ADMIN, NOW, NONCE, id="rotated-old-key-accepted"),
        pytest.param(SESSION_OLD, [KEY], ADMIN, NOW, None, id="old-key-dropped"),
        pytest.param(SESSION, [OTHER], ADMIN, NOW, None, id="other-key"),
        pytest.param(SESSION, [KEY], ADMIN + "x", NOW, None, id="admin-token-changed"),
        pytest.param(SESSION, [KEY], None, NOW, None, id="admin-token-unset"),
        pytest.param(SESSION, [KEY], "", NOW, None, id="admin-token-empty"),
        pytest.param(SESSION, [KEY], ADMIN, EXP - 1, NONCE, id="last-second"),
        pytest.param(SESSION, [KEY], ADMIN, EXP, None, id="expired"),
        pytest.param(_with_expiry(SESSION, EXP + 3600), [KEY], ADMIN, EXP, None, id="expiry-extended"),
        pytest.param(_flip(SESSION, 10), [KEY], ADMIN, NOW, None, id="nonce-flipped"),
        pytest.param(_flip(SESSION, 40), [KEY], ADMIN, NOW, None, id="tag-flipped"),
        pytest.param(_flip(SESSION, 0), [KEY], ADMIN, NOW, None, id="version-flipped"),
        pytest.param(SESSION[:-1], [KEY], ADMIN, NOW, None, id="truncated"),
        pytest.param(SESSION + "A", [KEY], ADMIN, NOW, None, id="extended"),
        pytest.param(READ, [KEY], ADMIN, NOW, None, id="read-token-is-not-a-session"),
        pytest.param(FORM, [KEY], ADMIN, NOW, None, id="form-token-is-not-a-session"),
        pytest.param(None, [KEY], ADMIN, NOW, None, id="none"),
        pytest.param("", [KEY], ADMIN, NOW, None, id="empty"),
        pytest.param("A" * 10_000, [KEY], ADMIN, NOW, None, id="huge"),
        pytest.param(SESSION, [KEY], ADMIN, float("nan"), None, id="now-nan"),
        pytest.param(SESSION, [], ADMIN, NOW, None, id="no-keys"),
    ],
)
def test_session_token_table(token, keys, admin, now, expected) -> None:
    assert check_session_token(token, keys, admin, now) == expected


def test_session_tag_commits_to_the_admin_token_without_carrying_it() -> None:
    raw = _raw(SESSION)
    assert ADMIN.encode() not in raw and hashlib.sha256(ADMIN.encode()).digest() not in raw
    assert make_session_token(KEY, ADMIN, NONCE, EXP) == SESSION  # deterministic for the same inputs
    assert make_session_token(KEY, ADMIN, NONCE_B, EXP) != SESSION


@pytest.mark.parametrize(
    "key,admin,nonce,expires_at",
    [
        pytest.param(b"", ADMIN, NONCE, EXP, id="empty-key"),
        pytest.param(KEY, "", NONCE, EXP, id="empty-admin-token"),
        pytest.param(KEY, ADMIN, NONCE[:15], EXP, id="short-nonce"),
        pytest.param(KEY, ADMIN, "x" * 16, EXP, id="str-nonce"),
        pytest.param(KEY, ADMIN, NONCE, -1, id="negative-expiry"),
    ],
)
def test_make_session_token_refuses_bad_input(key, admin, nonce, expires_at) -> None:
    with pytest.raises(ValueError) as err:
        make_session_token(key, admin, nonce, expires_at)
    assert ADMIN not in str(err.value)


# ------------------------------------------------------------ console forms (CSRF)


@pytest.mark.parametrize(
    "token,keys,purpose,nonce,expected",
    [
        pytest.param(FORM, [KEY], "action", NONCE, True, id="valid"),
        pytest.param(make_form_token(OLD, "action", NONCE), [KEY, OLD], "action", NONCE, True, id="rotated"),
        pytest.param(FORM, [KEY], "action", NONCE_B, False, id="another-session"),
        pytest.param(FORM, [KEY], "sign-in", NONCE, False, id="another-purpose"),
        pytest.param(FORM, [OTHER], "action", NONCE, False, id="other-key"),
        pytest.param(FORM, [KEY], "action", None, False, id="no-session"),
        pytest.param(FORM, [KEY], "action", b"short", False, id="bad-nonce"),
        pytest.param(_flip(FORM, 5), [KEY], "action", NONCE, False, id="tag-flipped"),
        pytest.param(SESSION, [KEY], "action", NONCE, False, id="session-token-is-not-a-form-token"),
        pytest.param(CAP, [KEY], "action", NONCE, False, id="capability-token-is-not-a-form-token"),
        pytest.param("", [KEY], "action", NONCE, False, id="empty"),
        pytest.param(None, [KEY], "action", NONCE, False, id="missing"),
    ],
)
def test_form_token_table(token, keys, purpose, nonce, expected: bool) -> None:
    assert check_form_token(token, keys, purpose, nonce) is expected


def test_read_token_expiry_reads_what_was_signed() -> None:
    from app.signing.tokens import read_token_expiry
    assert read_token_expiry(make_read_token("job_x", b"k" * 32, 1_900_000_000)) == 1_900_000_000
    for bad in ("", "garbage", make_read_token("job_x", b"k" * 32, 5)[:-2]):
        assert read_token_expiry(bad) is None
