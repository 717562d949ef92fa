"""A moto S3 server per test module (its environment changes end with the
module), a fresh bucket per test."""
from __future__ import annotations

import hashlib
import uuid

import pytest

from app.storage import ObjectNotFound
from tests.support.s3 import RunningS3


@pytest.fixture(scope="module")
def running_s3():
    with RunningS3() as s3:
        yield s3


@pytest.fixture
def bucket(running_s3) -> str:
    return running_s3.bucket(f"test-{uuid.uuid4().hex[:16]}")


async def read_all(storage, key: str) -> bytes:
    chunks = await storage.open_stream(key)
    return b"".join([chunk async for chunk in chunks])


async def stored(storage, key: str) -> tuple[int, str] | None:
    """Size and sha256 of the object as read back, or None when there is none."""
    try:
        data = await read_all(storage, key)
    except ObjectNotFound:
        return None
    return len(data), hashlib.sha256(data).hexdigest()
