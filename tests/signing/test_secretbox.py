"""Table tests for SecretBox (per-job webhook secrets at rest)."""
from __future__ import annotations

import pytest

from app.signing.secretbox import SecretBox

KEY = b"new-secret-key-0123456789"
OLD = b"old-secret-key-0123456789"
OTHER = b"someone-elses-key-0123456"
JOB = "job_0123456789abcdef01234567"
JOB_B = "job_fedcba9876543210fedcba98"
SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="

BOX = SecretBox([KEY])
BLOB = BOX.encrypt(SECRET, JOB)


def _flip(blob: bytes, index: int) -> bytes:
    b = bytearray(blob)
    b[index] ^= 0x01
    return bytes(b)


@pytest.mark.parametrize(
    "plaintext",
    [SECRET, "", "ünïcødé ✓ 💥", "x" * 10_000],
    ids=["webhook-secret", "empty", "unicode", "long"],
)
def test_round_trip(plaintext: str) -> None:
    assert BOX.decrypt(BOX.encrypt(plaintext, JOB), JOB) == plaintext


def test_ciphertext_does_not_contain_the_secret_and_is_randomized() -> None:
    a, b = BOX.encrypt(SECRET, JOB), BOX.encrypt(SECRET, JOB)
    assert a != b  # fresh nonce every time
    assert SECRET.encode() not in a
    assert len(a) == 1 + 4 + 12 + len(SECRET.encode()) + 16


@pytest.mark.parametrize(
    "box,blob,associated,expected",
    [
        pytest.param(BOX, BLOB, JOB, SECRET, id="round-trip"),
        pytest.param(BOX, bytearray(BLOB), JOB, SECRET, id="bytearray"),
        pytest.param(BOX, memoryview(BLOB), JOB, SECRET, id="memoryview"),
        pytest.param(BOX, BLOB, JOB_B, None, id="wrong-associated-job"),
        pytest.param(BOX, BLOB, "", None, id="empty-associated"),
        pytest.param(BOX, BLOB, None, None, id="associated-none"),
        pytest.param(SecretBox([OTHER]), BLOB, JOB, None, id="unknown-key"),
        pytest.param(SecretBox([OLD, KEY]), BLOB, JOB, SECRET, id="rotation-old-key-still-decrypts"),
        pytest.param(SecretBox([OLD]), BLOB, JOB, None, id="key-retired"),
        pytest.param(BOX, _flip(BLOB, 0), JOB, None, id="tampered-version"),
        pytest.param(BOX, _flip(BLOB, 2), JOB, None, id="tampered-key-id"),
        pytest.param(BOX, _flip(BLOB, 7), JOB, None, id="tampered-nonce"),
        pytest.param(BOX, _flip(BLOB, 20), JOB, None, id="tampered-ciphertext"),
        pytest.param(BOX, _flip(BLOB, -1), JOB, None, id="tampered-tag"),
        pytest.param(BOX, BLOB[:-1], JOB, None, id="truncated"),
        pytest.param(BOX, BLOB + b"\0", JOB, None, id="extended"),
        pytest.param(BOX, BLOB[:17], JOB, None, id="header-and-nonce-only"),
        pytest.param(BOX, b"", JOB, None, id="empty"),
        pytest.param(BOX, None, JOB, None, id="none"),
        pytest.param(BOX, b"\x01" + b"\0" * 40, JOB, None, id="zeros"),
        pytest.param(BOX, b"\xff" * 100, JOB, None, id="garbage"),
        pytest.param(BOX, b"\x01" * 200_000, JOB, None, id="huge"),
        pytest.param(BOX, SECRET, JOB, None, id="plaintext-str"),
        pytest.param(BOX, SECRET.encode(), JOB, None, id="plaintext-bytes"),
        pytest.param(BOX, BLOB.hex(), JOB, None, id="hex-str"),
        pytest.param(BOX, 12345, JOB, None, id="int"),
    ],
)
def test_decrypt_table(box: SecretBox, blob, associated, expected) -> None:
    assert box.decrypt(blob, associated) == expected


def test_rotation_first_key_encrypts_all_decrypt() -> None:
    rotated = SecretBox([KEY, OLD])
    old_blob = SecretBox([OLD]).encrypt(SECRET, JOB)
    new_blob = rotated.encrypt(SECRET, JOB)
    assert rotated.decrypt(old_blob, JOB) == SECRET
    assert rotated.decrypt(new_blob, JOB) == SECRET
    assert SecretBox([KEY]).decrypt(new_blob, JOB) == SECRET  # encrypted under the first key
    assert SecretBox([OLD]).decrypt(new_blob, JOB) is None


def test_key_id_differs_per_key_and_reveals_nothing() -> None:
    a = SecretBox([KEY]).encrypt(SECRET, JOB)
    b = SecretBox([OLD]).encrypt(SECRET, JOB)
    assert a[1:5] != b[1:5]
    assert a[1:5] not in KEY


@pytest.mark.parametrize("keys", [[], [b""], ["str-key"], None, b"bytes-not-a-list"],
                         ids=["empty", "empty-key", "str-key", "none", "bare-bytes"])
def test_constructor_refuses_bad_keys(keys) -> None:
    with pytest.raises((ValueError, TypeError)) as err:
        SecretBox(keys)
    assert "str-key" not in str(err.value) and "bytes-not-a-list" not in str(err.value)


def test_repr_does_not_leak_keys() -> None:
    text = repr(SecretBox([KEY, OLD]))
    assert "secret-key" not in text and KEY.hex() not in text


def test_encrypt_refuses_non_str() -> None:
    with pytest.raises(TypeError) as err:
        BOX.encrypt(b"raw-secret-bytes", JOB)  # type: ignore[arg-type]
    assert "raw-secret-bytes" not in str(err.value)
