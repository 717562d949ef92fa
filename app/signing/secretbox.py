"""Per-job webhook secrets, encrypted at rest.

AES-256-GCM under a key derived with HKDF-SHA256 from each SECRET_KEY; a
random 96-bit nonce per message; the job id is associated data, so a
ciphertext copied onto another job's row does not decrypt.

Blob layout:  0x01 (version) | key id (4 bytes) | nonce (12) | ciphertext+tag

The key id is an HKDF-derived fingerprint of the secret key (it reveals
nothing about it) so decrypt goes straight to the right key; the first key
encrypts, every key decrypts (rotation). The version and key id are part of
the associated data too.

``decrypt`` returns None for anything it cannot open and never raises; no
message here ever includes a secret.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["SecretBox"]

_VERSION = 0x01
_KID_LEN = 4
_NONCE_LEN = 12
_TAG_LEN = 16
_HEADER_LEN = 1 + _KID_LEN
_MIN_BLOB = _HEADER_LEN + _NONCE_LEN + _TAG_LEN
_MAX_BLOB = 64 * 1024
_ENC_INFO = b"longcall/v1/secretbox/aes-256-gcm"
_KID_INFO = b"longcall/v1/secretbox/key-id"
_AD_PREFIX = b"longcall.secretbox.v1\x00"


def _hkdf(secret: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


class SecretBox:
    __slots__ = ("_keys",)

    def __init__(self, keys: Sequence[bytes]):
        if keys is None or isinstance(keys, (bytes, bytearray, str)):
            raise TypeError("SecretBox takes a sequence of keys")
        derived: list[tuple[bytes, AESGCM]] = []
        for key in keys:
            if not isinstance(key, (bytes, bytearray)) or not key:
                raise ValueError("SecretBox keys must be non-empty bytes")
            key = bytes(key)
            derived.append((_hkdf(key, _KID_INFO, _KID_LEN), AESGCM(_hkdf(key, _ENC_INFO, 32))))
        if not derived:
            raise ValueError("SecretBox needs at least one key")
        self._keys = tuple(derived)

    def __repr__(self) -> str:
        return f"<SecretBox keys={len(self._keys)}>"

    @staticmethod
    def _ad(header: bytes, associated: str) -> bytes:
        return _AD_PREFIX + header + associated.encode("utf-8")

    def encrypt(self, plaintext: str, associated: str) -> bytes:
        if not isinstance(plaintext, str) or not isinstance(associated, str):
            raise TypeError("SecretBox.encrypt takes (str, str)")
        kid, aead = self._keys[0]
        header = bytes([_VERSION]) + kid
        nonce = os.urandom(_NONCE_LEN)
        sealed = aead.encrypt(nonce, plaintext.encode("utf-8"), self._ad(header, associated))
        return header + nonce + sealed

    def decrypt(self, blob: bytes | None, associated: str) -> str | None:
        try:
            return self._decrypt(blob, associated)
        except Exception:
            return None

    def _decrypt(self, blob: Any, associated: Any) -> str | None:
        if not isinstance(blob, (bytes, bytearray, memoryview)) or not isinstance(associated, str):
            return None
        blob = bytes(blob)
        if not _MIN_BLOB <= len(blob) <= _MAX_BLOB or blob[0] != _VERSION:
            return None
        header, kid = blob[:_HEADER_LEN], blob[1:_HEADER_LEN]
        nonce, sealed = blob[_HEADER_LEN:_HEADER_LEN + _NONCE_LEN], blob[_HEADER_LEN + _NONCE_LEN:]
        ad = self._ad(header, associated)
        for key_id, aead in self._keys:
            if key_id != kid:
                continue
            try:
                plain = aead.decrypt(nonce, sealed, ad)
            except InvalidTag:
                continue
            try:
                return plain.decode("utf-8")
            except UnicodeDecodeError:
                return None
        return None
