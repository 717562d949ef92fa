"""Where outputs live once they are ours: a directory (file://) or S3 (s3://).

Keys are deterministic per job output (`object_key`), so a repeated settle
overwrites the same object instead of leaving a second copy. Every write
checks the bytes it stores against the sha256 and size the download measured,
so what we record is what we hold.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

CHUNK_BYTES = 1024 * 1024
MAX_PRESIGN_S = 60
_KEY_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=-]*$")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class StorageError(Exception):
    """A storage operation failed. The message is safe to store and log."""


class ObjectNotFound(StorageError):
    """No object under that key."""


def object_key(owner_id: str, job_id: str, index: int) -> str:
    """The key of output `index` of a job; the storage adds its own prefix."""
    if not (isinstance(owner_id, str) and _ID.match(owner_id)):
        raise ValueError("owner id must be 1-128 letters, digits, '_' or '-'")
    if not (isinstance(job_id, str) and _ID.match(job_id)):
        raise ValueError("job id must be 1-128 letters, digits, '_' or '-'")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError("output index must be a whole number >= 0")
    return f"outputs/{owner_id}/{job_id}/{index}"


def check_key(key: str) -> list[str]:
    """Split a key into its segments, refusing anything that could leave the
    storage root or collide with our temp files (dot-names)."""
    if not isinstance(key, str) or not key or len(key) > 512:
        raise ValueError("storage key must be a non-empty string of at most 512 characters")
    segments = key.split("/")
    if not all(_KEY_SEGMENT.match(s) for s in segments):
        raise ValueError("storage key segments must be letters, digits, '_', '-', '.', '=' and not start with '.'")
    return segments


class Storage(Protocol):
    async def put_file(self, key: str, path: str, content_type: str | None, sha256: str, size: int, *,
                       move: bool = False) -> None:
        """Store the file at `path` under `key`, replacing what was there.
        Raises StorageError if the file is not `size` bytes with that sha256.
        `move`: the caller gives the file up, so the storage may take it as
        it is instead of copying it: after a success it is gone; after a
        failure it may still be there, the caller's to remove."""

    async def open_stream(self, key: str) -> AsyncIterator[bytes]:
        """Await it to open the object (ObjectNotFound if missing), then iterate the chunks."""

    async def presigned_url(self, key: str, expires_s: int = 60, *, content_type: str | None = None,
                            content_disposition: str | None = None) -> str | None:
        """A GET URL valid for at most 60 s (S3) whose answer carries this
        Content-Type and Content-Disposition (signed into the URL, so the
        holder cannot change them); None when the storage serves bytes itself."""

    async def aclose(self) -> None:
        ...


def _sha256_check(sha256: str, size: int) -> None:
    if not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
        raise ValueError("sha256 must be 64 lowercase hex characters")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("size must be a whole number >= 0")


def _mismatch(key: str, size: int, got_size: int, sha256: str, got_sha256: str) -> StorageError:
    if got_size != size:
        return StorageError(f"{key}: file has {got_size} bytes, expected {size}")
    return StorageError(f"{key}: file sha256 {got_sha256[:12]}… does not match the expected {sha256[:12]}…")


# --------------------------------------------------------------------------- file://

class FileStorage(Storage):
    """Objects as files under a root directory. A write goes to a temp file in
    the target directory, is fsynced, renamed over the key and the directory
    fsynced: a reader sees the old object or the new one, never a part.
    Size, sha256 and content type live in the assets row (put_file checks
    the bytes against them), so an object is its bytes and nothing beside."""

    def __init__(self, root: str):
        if not os.path.isabs(root):
            raise ValueError("file storage needs an absolute path")
        self.root = os.path.normpath(root)

    def path_of(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key))

    async def put_file(self, key: str, path: str, content_type: str | None, sha256: str, size: int, *,
                       move: bool = False) -> None:
        target = self.path_of(key)
        _sha256_check(sha256, size)
        try:
            await asyncio.to_thread(self._put_sync, key, target, path, sha256, size, move)
        except OSError as exc:
            raise StorageError(f"{key}: could not write ({exc.strerror or type(exc).__name__})") from None

    def _put_sync(self, key: str, target: str, source: str, sha256: str, size: int, move: bool) -> None:
        directory = os.path.dirname(target)
        created = _make_dirs(directory)
        if not (move and _moved(key, source, target, size)):
            _copied(key, source, target, sha256, size)
            if move:  # from another filesystem: the file given up is not needed now
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(source)
        # The rename is durable once its directory is, and a new directory
        # once its parent is.
        for path in [directory, *(os.path.dirname(d) for d in created)]:
            _fsync_dir(path)

    async def open_stream(self, key: str) -> AsyncIterator[bytes]:
        target = self.path_of(key)
        try:
            # Opened now, so a missing object fails before any response starts
            # and a concurrent overwrite cannot mix two versions in one stream.
            file = await asyncio.to_thread(open, target, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(f"{key}: no such object") from None
        except OSError as exc:
            raise StorageError(f"{key}: could not read ({exc.strerror or type(exc).__name__})") from None
        return _file_chunks(file)

    async def presigned_url(self, key: str, expires_s: int = 60, *, content_type: str | None = None,
                            content_disposition: str | None = None) -> str | None:
        return None

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"FileStorage({self.root!r})"


async def _file_chunks(file) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(file.read, CHUNK_BYTES):
            yield chunk
    finally:
        file.close()


def _make_dirs(directory: str) -> list[str]:
    """makedirs that returns the directories it created, top first."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    created = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
            created.append(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
    return created


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copied(key: str, source: str, target: str, sha256: str, size: int) -> None:
    """Copy `source` over `target` through a temp file beside it, fsynced,
    checking the bytes against `size` and `sha256` on the way."""
    directory, name = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        digest = hashlib.sha256()
        written = 0
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            while chunk := src.read(CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != size or digest.hexdigest() != sha256:
            raise _mismatch(key, size, written, sha256, digest.hexdigest())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _moved(key: str, source: str, target: str, size: int) -> bool:
    """Rename `source` over `target` once its bytes are on the disk: a file
    the caller gives up, hashed as it was written, so no copy and no second
    hash. False, with nothing changed, when the two are on different
    filesystems (the caller copies instead)."""
    fd = os.open(source, os.O_RDONLY)
    try:
        got = os.fstat(fd).st_size
        if got != size:
            raise StorageError(f"{key}: file has {got} bytes, expected {size}")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(source, target)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return False
        raise
    return True


# --------------------------------------------------------------------------- s3://

def _b64_sha256(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


class S3Storage(Storage):
    """Objects in an S3 bucket under a prefix, through one aiobotocore client
    made on first use. Files up to `multipart_threshold` are one PUT (read
    whole, so the threshold bounds memory); larger ones a multipart upload
    read part by part from the file, so memory stays at one part whatever the
    size. S3 checks every body against the SHA-256 we send with it."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 multipart_threshold: int = 16 * 1024 * 1024, part_size: int = 16 * 1024 * 1024,
                 max_attempts: int = 3):
        if not _BUCKET.match(bucket or ""):
            raise ValueError("S3 bucket names are 3-63 lowercase letters, digits, '.' or '-'")
        if part_size < 5 * 1024 * 1024:
            raise ValueError("S3 parts must be at least 5 MiB")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.multipart_threshold = max(multipart_threshold, 1)
        self.part_size = part_size
        self.max_attempts = max_attempts
        self._client: Any = None
        self._client_context: Any = None
        self._client_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"S3Storage(bucket={self.bucket!r}, prefix={self.prefix!r}, endpoint_url={self.endpoint_url!r})"

    def full_key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def _s3(self) -> Any:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    from aiobotocore.config import AioConfig
                    from aiobotocore.session import get_session

                    config = AioConfig(
                        signature_version="s3v4",
                        connect_timeout=10,
                        read_timeout=60,
                        retries={"max_attempts": self.max_attempts, "mode": "standard"},
                        # A custom endpoint (MinIO, moto, R2...) rarely has per-bucket DNS names.
                        s3={"addressing_style": "path" if self.endpoint_url else "auto"},
                    )
                    context = get_session().create_client("s3", endpoint_url=self.endpoint_url, config=config)
                    self._client = await context.__aenter__()
                    self._client_context = context
        return self._client

    async def aclose(self) -> None:
        context, self._client, self._client_context = self._client_context, None, None
        if context is not None:
            await context.__aexit__(None, None, None)

    async def put_file(self, key: str, path: str, content_type: str | None, sha256: str, size: int, *,
                       move: bool = False) -> None:
        full_key = self.full_key(key)
        _sha256_check(sha256, size)
        try:
            actual = await asyncio.to_thread(os.path.getsize, path)
        except OSError as exc:
            raise StorageError(f"{key}: cannot read the file to upload ({exc.strerror})") from None
        if actual != size:
            raise _mismatch(key, size, actual, sha256, "")
        extra: dict[str, Any] = {"Metadata": {"sha256": sha256}}
        if content_type:
            extra["ContentType"] = content_type
        try:
            if size <= self.multipart_threshold:
                await self._put_single(key, full_key, path, sha256, size, extra)
            else:
                await self._put_multipart(key, full_key, path, sha256, size, extra)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"{key}: upload failed ({_describe_error(exc)})") from None
        if move:  # uploaded: the file the caller gave up is not needed any more
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.unlink, path)

    async def _put_single(self, key: str, full_key: str, path: str, sha256: str, size: int,
                          extra: dict[str, Any]) -> None:
        body, body_sha256 = await asyncio.to_thread(_read_and_hash, path)
        if len(body) != size or body_sha256 != sha256:
            raise _mismatch(key, size, len(body), sha256, body_sha256)
        s3 = await self._s3()
        # And S3 checks the bytes it received against the same SHA-256.
        await s3.put_object(Bucket=self.bucket, Key=full_key, Body=body,
                            ChecksumSHA256=_b64_sha256(sha256), **extra)

    async def _put_multipart(self, key: str, full_key: str, path: str, sha256: str, size: int,
                             extra: dict[str, Any]) -> None:
        s3 = await self._s3()
        created = await s3.create_multipart_upload(Bucket=self.bucket, Key=full_key,
                                                   ChecksumAlgorithm="SHA256", **extra)
        upload_id = created["UploadId"]
        try:
            whole = hashlib.sha256()
            parts = []
            file = await asyncio.to_thread(open, path, "rb")
            with file:
                number = 1
                while True:
                    body = await asyncio.to_thread(file.read, self.part_size)
                    if not body:
                        break
                    part_sha = await asyncio.to_thread(_hash_both, whole, body)
                    answer = await s3.upload_part(Bucket=self.bucket, Key=full_key, UploadId=upload_id,
                                                  PartNumber=number, Body=body,
                                                  ChecksumSHA256=part_sha)
                    parts.append({"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": part_sha})
                    number += 1
                    del body
            # The parts were each checked by S3; this checks they are the file we measured.
            if whole.hexdigest() != sha256:
                raise _mismatch(key, size, size, sha256, whole.hexdigest())
            await s3.complete_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id,
                                               MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                await s3.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
            except Exception:
                pass  # an abandoned upload is cleaned by the bucket's lifecycle rule
            raise

    async def open_stream(self, key: str) -> AsyncIterator[bytes]:
        full_key = self.full_key(key)
        s3 = await self._s3()
        try:
            answer = await s3.get_object(Bucket=self.bucket, Key=full_key)
        except Exception as exc:
            if _is_not_found(exc):
                raise ObjectNotFound(f"{key}: no such object") from None
            raise StorageError(f"{key}: could not read ({_describe_error(exc)})") from None
        return _s3_chunks(answer["Body"])

    async def presigned_url(self, key: str, expires_s: int = 60, *, content_type: str | None = None,
                            content_disposition: str | None = None) -> str | None:
        full_key = self.full_key(key)
        expires_s = max(1, min(int(expires_s), MAX_PRESIGN_S))
        params = {"Bucket": self.bucket, "Key": full_key}
        # S3 answers with these instead of the stored object's own headers.
        if content_type is not None:
            params["ResponseContentType"] = content_type
        if content_disposition is not None:
            params["ResponseContentDisposition"] = content_disposition
        s3 = await self._s3()
        return await s3.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s)


async def _s3_chunks(body: Any) -> AsyncIterator[bytes]:
    try:
        async with body as stream:
            while chunk := await stream.read(CHUNK_BYTES):
                yield chunk
    except Exception as exc:
        raise StorageError(f"reading an object failed ({_describe_error(exc)})") from None


def _read_and_hash(path: str) -> tuple[bytes, str]:
    with open(path, "rb") as f:
        body = f.read()
    return body, hashlib.sha256(body).hexdigest()


def _hash_both(whole: hashlib._Hash, body: bytes) -> str:
    whole.update(body)
    return base64.b64encode(hashlib.sha256(body).digest()).decode()


def _is_not_found(exc: Exception) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("404", "NoSuchKey", "NotFound") or status == 404


def _describe_error(exc: Exception) -> str:
    """botocore's error code, or the exception's class: never a signed URL or a credential."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = str(error.get("Code", "")) or "error"
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{code}, HTTP {status}" if status else code
    return type(exc).__name__


# --------------------------------------------------------------------------- choosing one

class StorageUrlError(ValueError):
    """STORAGE_URL is not one we can use; the message is one line naming the fix."""


@dataclass(frozen=True)
class FileLocation:
    root: str  # absolute, percent-decoded


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # without surrounding slashes; "" for the bucket's root


def parse_storage_url(storage_url: str) -> FileLocation | S3Location:
    """Where STORAGE_URL says outputs live: file:///abs/path or s3://bucket[/prefix].
    The one check of STORAGE_URL: the configuration and open_storage both use it."""
    parts = urlsplit(storage_url or "")
    if parts.scheme in ("file", "s3") and ("?" in storage_url or "#" in storage_url):
        # Dropped silently, they would put outputs somewhere the operator did not write.
        raise StorageUrlError("STORAGE_URL takes no query or fragment (in a path, '?' is %3F and '#' is %23)")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StorageUrlError("STORAGE_URL file:// needs an absolute path, like file:///var/lib/longcall")
        return FileLocation(unquote(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StorageUrlError("STORAGE_URL s3:// needs a bucket, like s3://bucket/prefix")
        if not _BUCKET.match(parts.netloc):
            raise StorageUrlError("STORAGE_URL s3:// bucket names are 3-63 lowercase letters, digits, '.' or '-'")
        return S3Location(parts.netloc, parts.path.strip("/"))
    raise StorageUrlError("STORAGE_URL must be file:// or s3://")


def open_storage(storage_url: str, *, s3_endpoint_url: str | None = None) -> Storage:
    """FileStorage for file:///abs/path, S3Storage for s3://bucket[/prefix]
    (StorageUrlError, a ValueError, for anything else)."""
    location = parse_storage_url(storage_url)
    if isinstance(location, FileLocation):
        return FileStorage(location.root)
    return S3Storage(location.bucket, location.prefix, endpoint_url=s3_endpoint_url)
