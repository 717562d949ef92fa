"""FileStorage on real files, object keys, and choosing a storage by URL."""
from __future__ import annotations

import asyncio
import hashlib
import os
import threading

import pytest

from app.storage import (
    FileStorage,
    ObjectNotFound,
    S3Storage,
    StorageError,
    object_key,
    open_storage,
)
from tests.storage.conftest import read_all, stored

MiB = 1024 * 1024


def write_source(directory, name: str, data: bytes) -> tuple[str, str]:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture
def storage(tmp_path):
    return FileStorage(str(tmp_path / "objects"))


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources"
    path.mkdir()
    return str(path)


async def test_round_trip(storage, sources):
    data = os.urandom(3 * MiB + 5)
    path, sha = write_source(sources, "a", data)
    key = object_key("own_1", "job_0123456789abcdef01234567", 0)
    await storage.put_file(key, path, "image/png", sha, len(data))

    assert await read_all(storage, key) == data
    assert await storage.presigned_url(key) is None
    assert os.path.exists(path), "the source file is the caller's"
    stored = os.path.join(storage.root, "outputs", "own_1", "job_0123456789abcdef01234567", "0")
    with open(stored, "rb") as f:
        assert f.read() == data


async def test_overwrite_same_key(storage, sources):
    key = object_key("o", "j", 1)
    first, first_sha = write_source(sources, "first", b"first version")
    second, second_sha = write_source(sources, "second", b"second, longer version")
    await storage.put_file(key, first, "text/plain", first_sha, 13)
    await storage.put_file(key, second, None, second_sha, 22)

    assert await stored(storage, key) == (22, second_sha)
    assert await read_all(storage, key) == b"second, longer version"
    # Only the object: no temp files left behind.
    assert os.listdir(os.path.dirname(storage.path_of(key))) == ["1"]


async def test_readers_never_see_a_partial_object(storage, sources):
    key = object_key("o", "j", 0)
    old, old_sha = write_source(sources, "old", b"o" * MiB)
    new, new_sha = write_source(sources, "new", b"n" * (24 * MiB))
    await storage.put_file(key, old, None, old_sha, MiB)

    seen: set[int] = set()
    stop = threading.Event()

    def watch():
        target = storage.path_of(key)
        while not stop.is_set():
            seen.add(os.stat(target).st_size)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        await storage.put_file(key, new, None, new_sha, 24 * MiB)
        await asyncio.sleep(0.01)
    finally:
        stop.set()
        watcher.join()
    assert seen <= {MiB, 24 * MiB}, f"saw partial sizes {sorted(seen - {MiB, 24 * MiB})}"
    assert MiB in seen
    assert await stored(storage, key) == (24 * MiB, new_sha)


async def test_an_open_stream_keeps_reading_the_version_it_opened(storage, sources):
    key = object_key("o", "j", 0)
    old, old_sha = write_source(sources, "old", b"o" * (3 * MiB))
    new, new_sha = write_source(sources, "new", b"n" * (2 * MiB))
    await storage.put_file(key, old, None, old_sha, 3 * MiB)
    chunks = await storage.open_stream(key)
    first = await chunks.__anext__()
    await storage.put_file(key, new, None, new_sha, 2 * MiB)
    rest = b"".join([chunk async for chunk in chunks])
    assert first + rest == b"o" * (3 * MiB)


@pytest.mark.parametrize("claimed_size, claimed_sha", [
    (6, hashlib.sha256(b"wrong").hexdigest()),  # right size, wrong sha256
    (7, None),  # right sha256, wrong size
])
async def test_mismatched_file_is_refused_and_the_old_object_kept(storage, sources, claimed_size, claimed_sha):
    key = object_key("o", "j", 0)
    good, good_sha = write_source(sources, "good", b"good")
    await storage.put_file(key, good, None, good_sha, 4)
    bad, bad_sha = write_source(sources, "bad", b"badbad")
    with pytest.raises(StorageError) as info:
        await storage.put_file(key, bad, None, claimed_sha or bad_sha, claimed_size)
    assert "outputs/o/j/0" in str(info.value)
    assert await stored(storage, key) == (4, good_sha)
    assert os.listdir(os.path.dirname(storage.path_of(key))) == ["0"]


async def test_a_file_given_up_is_renamed_into_place_not_copied(storage, sources):
    data = os.urandom(2 * MiB + 3)
    path, sha = write_source(sources, "download", data)
    inode = os.stat(path).st_ino
    key = object_key("o", "j", 0)
    await storage.put_file(key, path, None, sha, len(data), move=True)

    assert not os.path.exists(path), "the file given up is gone"
    assert os.stat(storage.path_of(key)).st_ino == inode, "the same file, renamed: no copy"
    assert await read_all(storage, key) == data
    assert os.listdir(os.path.dirname(storage.path_of(key))) == ["0"]


async def test_a_file_given_up_of_the_wrong_size_is_refused_and_kept(storage, sources):
    key = object_key("o", "j", 0)
    good, good_sha = write_source(sources, "good", b"good")
    await storage.put_file(key, good, None, good_sha, 4)
    bad, bad_sha = write_source(sources, "bad", b"badbad")
    with pytest.raises(StorageError, match="6 bytes, expected 7"):
        await storage.put_file(key, bad, None, bad_sha, 7, move=True)
    assert await stored(storage, key) == (4, good_sha)
    assert os.path.exists(bad), "still the caller's to remove"


SHM = "/dev/shm"


@pytest.mark.skipif(not (os.path.isdir(SHM) and os.access(SHM, os.W_OK)), reason="no /dev/shm to be another filesystem")
async def test_a_file_given_up_on_another_filesystem_is_copied_then_removed(storage, tmp_path):
    if os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the storage here")
    data = os.urandom(MiB + 1)
    path, sha = write_source(SHM, f"longcall-test-{os.getpid()}-{id(data)}", data)
    try:
        key = object_key("o", "j", 0)
        await storage.put_file(key, path, None, sha, len(data), move=True)  # rename: EXDEV
        assert not os.path.exists(path)
        assert await read_all(storage, key) == data
        assert os.stat(storage.path_of(key)).st_dev != os.stat(SHM).st_dev
        assert os.listdir(os.path.dirname(storage.path_of(key))) == ["0"], "no temp file left"
    finally:
        if os.path.exists(path):
            os.unlink(path)


async def test_missing_source_is_a_storage_error(storage, sources):
    with pytest.raises(StorageError):
        await storage.put_file("outputs/o/j/0", os.path.join(sources, "nope"), None, "0" * 64, 1)


async def test_missing_object(storage):
    with pytest.raises(ObjectNotFound):
        await storage.open_stream("outputs/o/j/0")


@pytest.mark.parametrize("key", [
    "", "../etc/passwd", "outputs/../../x", "/abs/key", "outputs//x", "outputs/.0.meta", ".hidden",
    "outputs/x/", "outputs\\x", "outputs/x\x00", "a" * 513,
])
async def test_keys_cannot_escape_or_collide(storage, sources, key):
    path, sha = write_source(sources, "a", b"x")
    with pytest.raises(ValueError):
        await storage.put_file(key, path, None, sha, 1)
    with pytest.raises(ValueError):
        await storage.open_stream(key)


async def test_bad_sha256_or_size_arguments(storage, sources):
    path, sha = write_source(sources, "a", b"x")
    for bad_sha in ("", "XYZ", sha.upper(), sha[:-1]):
        with pytest.raises(ValueError):
            await storage.put_file("outputs/o/j/0", path, None, bad_sha, 1)
    with pytest.raises(ValueError):
        await storage.put_file("outputs/o/j/0", path, None, sha, -1)


def test_object_key():
    assert object_key("own_abc", "job_" + "a" * 24, 3) == f"outputs/own_abc/job_{'a' * 24}/3"


@pytest.mark.parametrize("owner, job, index", [
    ("", "j", 0), ("o/x", "j", 0), ("..", "j", 0), ("o", "j/../k", 0), ("o", "j", -1), ("o", "j", True),
    ("o", "j", "0"), (None, "j", 0),
])
def test_object_key_refuses_bad_parts(owner, job, index):
    with pytest.raises(ValueError):
        object_key(owner, job, index)


def test_open_storage_by_url(tmp_path):
    files = open_storage(f"file://{tmp_path}/objects")
    assert isinstance(files, FileStorage) and files.root == f"{tmp_path}/objects"
    spaced = open_storage("file:///var/lib/long%20call")
    assert isinstance(spaced, FileStorage) and spaced.root == "/var/lib/long call"
    s3 = open_storage("s3://my-bucket/some/prefix/", s3_endpoint_url="http://127.0.0.1:9")
    assert isinstance(s3, S3Storage)
    assert (s3.bucket, s3.prefix, s3.endpoint_url) == ("my-bucket", "some/prefix", "http://127.0.0.1:9")
    assert s3.full_key("outputs/o/j/0") == "some/prefix/outputs/o/j/0"
    assert open_storage("s3://my-bucket").full_key("outputs/o/j/0") == "outputs/o/j/0"


@pytest.mark.parametrize("url", [
    "file://relative/path", "file:", "s3://", "s3:///prefix", "s3://UPPER/x", "s3://user@bucket/x", "http://x/y", "",
    "/abs",
])
def test_open_storage_refuses_bad_urls(url):
    with pytest.raises(ValueError):
        open_storage(url)


async def test_a_directory_is_not_an_object(storage, sources):
    path, sha = write_source(sources, "a", b"x")
    await storage.put_file("outputs/o/j/0", path, None, sha, 1)
    with pytest.raises(ObjectNotFound):
        await storage.open_stream("outputs/o/j")
    with pytest.raises(ObjectNotFound):
        await storage.open_stream("outputs/o/j/0/deeper")
