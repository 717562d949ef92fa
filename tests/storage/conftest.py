"""A moto S3 server per test module (its environment changes end with the
module), a fresh bucket per test."""
from __future__ import annotations

import uuid

import pytest

from tests.support.s3 import RunningS3


@pytest.fixture(scope="module")
def running_s3():
    with RunningS3() as s3:
        yield s3


@pytest.fixture
def bucket(running_s3) -> str:
    return running_s3.bucket(f"test-{uuid.uuid4().hex[:16]}")
