"""S3Storage against a real S3-protocol server (moto in server mode)."""
from __future__ import annotations

import hashlib
import os
import re
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from app.storage import ObjectNotFound, S3Storage, StorageError, object_key, open_storage
from tests.storage.conftest import read_all, stored

MiB = 1024 * 1024
KEY = object_key("own_1", "job_0123456789abcdef01234567", 0)


def write_source(directory, name: str, data: bytes) -> tuple[str, str]:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture
async def storage(running_s3, bucket):
    # Small parts (S3's minimum is 5 MiB) so the multipart path runs on a 12 MiB file.
    s3 = S3Storage(bucket, "pre/fix", endpoint_url=running_s3.endpoint_url,
                   multipart_threshold=5 * MiB, part_size=5 * MiB)
    yield s3
    await s3.aclose()


async def test_a_file_given_up_is_removed_once_uploaded(storage, tmp_path):
    data = b"uploaded, then not needed"
    path, sha = write_source(tmp_path, "a", data)
    await storage.put_file(KEY, path, None, sha, len(data), move=True)
    assert await read_all(storage, KEY) == data
    assert not os.path.exists(path)
    # A refused upload leaves the file the caller's.
    bad, bad_sha = write_source(tmp_path, "b", b"six b!")
    with pytest.raises(StorageError):
        await storage.put_file(KEY, bad, None, bad_sha, 7, move=True)
    assert os.path.exists(bad)


async def test_small_object_round_trip(storage, running_s3, bucket, tmp_path):
    data = b"\x89PNG tiny image"
    path, sha = write_source(tmp_path, "a", data)
    await storage.put_file(KEY, path, "image/png", sha, len(data))

    assert await read_all(storage, KEY) == data
    # Stored under the prefix, with its type and our sha256 as metadata.
    assert await _stored_at(running_s3, bucket, f"pre/fix/{KEY}") == (len(data), sha)
    direct = httpx.get(await storage.presigned_url(KEY))
    assert direct.status_code == 200 and direct.content == data
    assert direct.headers["content-type"] == "image/png"
    assert direct.headers["x-amz-meta-sha256"] == sha


async def test_multipart_object_round_trip(storage, running_s3, bucket, tmp_path):
    data = os.urandom(12 * MiB + 7)
    path, sha = write_source(tmp_path, "big", data)
    await storage.put_file(KEY, path, "video/mp4", sha, len(data))

    assert await stored(storage, KEY) == (len(data), sha)
    response = httpx.get(await storage.presigned_url(KEY))
    assert response.status_code == 200
    assert hashlib.sha256(response.content).hexdigest() == sha
    assert response.headers["content-type"] == "video/mp4"
    assert re.fullmatch(r'"[0-9a-f]{32}-3"', response.headers["etag"]), "three 5 MiB parts"
    assert _open_uploads(running_s3, bucket) == []


async def test_overwrite_same_key(storage, tmp_path):
    big = os.urandom(6 * MiB)
    first, first_sha = write_source(tmp_path, "first", big)
    second, second_sha = write_source(tmp_path, "second", b"small now")
    await storage.put_file(KEY, first, None, first_sha, len(big))
    await storage.put_file(KEY, second, "text/plain", second_sha, 9)

    assert await stored(storage, KEY) == (9, second_sha)
    assert await read_all(storage, KEY) == b"small now"


@pytest.mark.parametrize("size", [100, 11 * MiB], ids=["single", "multipart"])
async def test_wrong_sha256_stores_nothing(storage, running_s3, bucket, tmp_path, size):
    path, _ = write_source(tmp_path, "a", os.urandom(size))
    with pytest.raises(StorageError, match="sha256"):
        await storage.put_file(KEY, path, None, hashlib.sha256(b"other").hexdigest(), size)
    assert await stored(storage, KEY) is None
    assert _open_uploads(running_s3, bucket) == []  # the multipart upload was aborted


async def test_wrong_size_stores_nothing(storage, tmp_path):
    path, sha = write_source(tmp_path, "a", b"12345")
    with pytest.raises(StorageError, match="bytes"):
        await storage.put_file(KEY, path, None, sha, 6)
    assert await stored(storage, KEY) is None


async def test_missing_object(storage):
    with pytest.raises(ObjectNotFound):
        await storage.open_stream(KEY)


async def test_presigned_url_is_short_lived(storage, tmp_path):
    path, sha = write_source(tmp_path, "a", b"hello")
    await storage.put_file(KEY, path, "text/plain", sha, 5)

    url = await storage.presigned_url(KEY, expires_s=30)
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Expires"] == ["30"]
    signed_at = time.mktime(time.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")) - time.timezone
    assert abs(signed_at - time.time()) < 60
    assert httpx.get(url).content == b"hello"
    # Longer requests are cut to the 60 s ceiling.
    longer = parse_qs(urlsplit(await storage.presigned_url(KEY, expires_s=3600)).query)
    assert longer["X-Amz-Expires"] == ["60"]


async def test_open_storage_uses_the_endpoint_and_prefix(running_s3, bucket, tmp_path):
    storage = open_storage(f"s3://{bucket}/deep/prefix", s3_endpoint_url=running_s3.endpoint_url)
    try:
        path, sha = write_source(tmp_path, "a", b"via url")
        await storage.put_file(KEY, path, None, sha, 7)
        assert await _stored_at(running_s3, bucket, f"deep/prefix/{KEY}") == (7, sha)
    finally:
        await storage.aclose()


async def test_client_is_made_once_and_closed(storage, tmp_path):
    path, sha = write_source(tmp_path, "a", b"x")
    await storage.put_file(KEY, path, None, sha, 1)
    client = storage._client
    assert await stored(storage, KEY) == (1, sha)
    assert storage._client is client is not None
    await storage.aclose()
    assert storage._client is None
    assert await stored(storage, KEY) == (1, sha)  # a new client after close, on demand


async def test_unreachable_endpoint_is_a_storage_error(tmp_path):
    storage = S3Storage("bucket", endpoint_url="http://127.0.0.1:9", max_attempts=1)
    try:
        path, sha = write_source(tmp_path, "a", b"x")
        with pytest.raises(StorageError) as info:
            await storage.put_file(KEY, path, None, sha, 1)
        assert "testing" not in str(info.value)  # no credential in the message
    finally:
        await storage.aclose()


async def _stored_at(running_s3, bucket, full_key: str):
    """Read the object by its full key, with no prefix added."""
    bare = S3Storage(bucket, endpoint_url=running_s3.endpoint_url)
    try:
        return await stored(bare, full_key)
    finally:
        await bare.aclose()


def _open_uploads(running_s3, bucket) -> list[str]:
    listing = httpx.get(f"{running_s3.endpoint_url}/{bucket}?uploads")
    assert listing.status_code == 200
    return re.findall(r"<UploadId>([^<]+)</UploadId>", listing.text)
