"""JSON answers that carry whole files inline, read without holding them.

The AI Gateway answers a finished video job with the video itself, base64
in a JSON string (`{"type": "base64", "data": "..."}`), and Gemini may do
the same (`encodedVideo`): tens of megabytes in one answer. `json.loads` on
that body would hold the body, the string and the decoded bytes at once.

`spool_json` reads an answer's bytes as they arrive and keeps only its
skeleton in memory: a string longer than `spill_after` bytes is written to a
file of its own, and the value returned holds a `Spilled` in its place.
`decode_base64` then turns such a string into the output file, in chunks,
with the byte cap, the size and the sha256 — never holding it whole.

The scan is over bytes (JSON's structural characters and quotes are ASCII,
so UTF-8 text needs no decoding to be scanned) and jumps from quote to quote
with `bytes.find`, so a 70 MB string costs a few file writes, not a Python
loop per byte.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.download_errors import DownloadError, OutputTooLarge
from app.providers.base import OutputFile, Transient, Uncertain

# Strings up to this long stay in the skeleton (ids, URLs, messages).
SPILL_AFTER = 64 * 1024
# The rest of an answer (everything but spilled strings) is small; a bigger
# one is not an answer we understand.
MAX_SKELETON = 1024 * 1024
# A spilled string in the skeleton: NUL cannot appear raw in a JSON string,
# and a provider's text escaping one to look like this is refused as base64.
_MARK = "\x00longcall-spilled:"
_SPECIAL = re.compile(rb'["\\]')


class AnswerTooLarge(ValueError):
    """The answer's skeleton is larger than MAX_SKELETON."""


@dataclass(frozen=True)
class Spilled:
    """A long JSON string, its raw text (escapes as sent) in `path`."""

    path: str
    size: int  # bytes of raw text


@dataclass
class SpooledJson:
    """The parsed answer, long strings as `Spilled`; remove the files with
    `close()` (or use it as a context manager)."""

    value: Any
    spilled: list[Spilled] = field(default_factory=list)

    def close(self) -> None:
        for item in self.spilled:
            try:
                os.unlink(item.path)
            except FileNotFoundError:
                pass
        self.spilled.clear()

    def __enter__(self) -> SpooledJson:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Scanner:
    def __init__(self, directory: str | None, spill_after: int, max_bytes: int):
        self.directory = directory
        self.spill_after = spill_after
        self.max_bytes = max_bytes  # decoded: the cap a user set
        self.max_spill = base64_size(max_bytes)
        self.skeleton = bytearray()
        self.in_string = False
        self.escaped = False  # the last byte seen inside a string was an unpaired backslash
        self.text = bytearray()  # the current string's raw text while it is short
        self.file: Any = None
        self.file_size = 0
        self.spilled: list[Spilled] = []

    def _keep(self, data: bytes | bytearray) -> None:
        self.skeleton += data
        if len(self.skeleton) > MAX_SKELETON:
            raise AnswerTooLarge(f"the answer is more than {MAX_SKELETON} bytes besides its long strings")

    def _string_text(self, data: bytes) -> None:
        if self.file is None:
            self.text += data
            if len(self.text) <= self.spill_after:
                return
            fd, path = tempfile.mkstemp(prefix=".inline-", suffix=".part", dir=self.directory)
            self.file = os.fdopen(fd, "wb")
            self.spilled.append(Spilled(path, 0))
            data, self.text = bytes(self.text), bytearray()
        self.file_size += len(data)
        if self.file_size > self.max_spill:
            raise OutputTooLarge(f"output is larger than the {self.max_bytes} byte cap")
        self.file.write(data)

    def _end_string(self) -> None:
        if self.file is None:
            self._keep(self.text)
            self.text = bytearray()
        else:
            self.file.close()
            self.file = None
            index = len(self.spilled) - 1
            self.spilled[index] = Spilled(self.spilled[index].path, self.file_size)
            self.file_size = 0
            self._keep(json.dumps(f"{_MARK}{index}")[1:-1].encode())
        self._keep(b'"')
        self.in_string = False

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if not self.in_string:
                j = data.find(b'"', i)
                if j < 0:
                    self._keep(data[i:])
                    return
                self._keep(data[i:j + 1])
                self.in_string, i = True, j + 1
                continue
            if self.escaped:  # the byte after a backslash is never the end
                self._string_text(data[i:i + 1])
                self.escaped, i = False, i + 1
                continue
            match = _SPECIAL.search(data, i)
            if match is None:
                self._string_text(data[i:])
                return
            j = match.start()
            if data[j] == 0x5C:  # backslash: it and the next byte are one escape
                self._string_text(data[i:j + 1])
                self.escaped, i = True, j + 1
            else:
                self._string_text(data[i:j])
                self._end_string()
                i = j + 1

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
        SpooledJson(None, self.spilled).close()


def _restore(value: Any, spilled: list[Spilled]) -> Any:
    if isinstance(value, str) and value.startswith(_MARK):
        index = value[len(_MARK):]
        if index.isdigit() and int(index) < len(spilled):
            return spilled[int(index)]
        return value
    if isinstance(value, list):
        return [_restore(v, spilled) for v in value]
    if isinstance(value, dict):
        return {k: _restore(v, spilled) for k, v in value.items()}
    return value


async def spool_json(chunks: AsyncIterator[bytes], *, directory: str | None, max_inline_bytes: int,
                     spill_after: int = SPILL_AFTER) -> SpooledJson:
    """Parse a JSON answer read as `chunks`; strings longer than
    `spill_after` bytes go to files in `directory`, none over the base64
    size of `max_inline_bytes` (OutputTooLarge). ValueError when it is not
    JSON (or AnswerTooLarge); no file is left behind on any error."""
    scanner = _Scanner(directory, spill_after, max_inline_bytes)
    try:
        async for chunk in chunks:
            scanner.feed(chunk)
        if scanner.in_string:
            raise ValueError("the answer ends inside a string")
        value = json.loads(bytes(scanner.skeleton))
    except BaseException:
        scanner.abort()
        raise
    return SpooledJson(_restore(value, scanner.spilled), scanner.spilled)


def base64_size(decoded_bytes: int) -> int:
    """The length of `decoded_bytes` bytes in padded base64 (pure)."""
    return 4 * -(-decoded_bytes // 3)


@dataclass(frozen=True)
class Decoded:
    path: str
    bytes: int
    sha256: str


_READ = 4 * 256 * 1024  # base64 characters per read: a multiple of 4


def decode_base64(spilled: Spilled, *, directory: str | None, max_bytes: int) -> Decoded:
    """The file a spilled base64 string holds, decoded into a new file in
    `directory` with its size and sha256, at most `max_bytes`
    (OutputTooLarge). The only escape base64 can carry in JSON is `\\/`;
    anything else is not base64 (DownloadError). Blocking: run it in a thread."""
    digest = hashlib.sha256()
    total = 0
    fd, path = tempfile.mkstemp(prefix=".decoded-", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out, open(spilled.path, "rb") as src:
            pending = b""
            while True:
                raw = src.read(_READ)
                data = pending + raw
                if data.endswith(b"\\") and raw:
                    data, pending = data[:-1], b"\\"  # an escape split across reads
                else:
                    pending = b""
                text = data.replace(b"\\/", b"/")
                if b"\\" in text:
                    raise DownloadError("an inline output is not base64 (an escape in it)")
                usable = len(text) - len(text) % 4 if raw else len(text)
                chunk, pending = text[:usable], text[usable:] + pending
                try:
                    piece = base64.b64decode(chunk, validate=True)
                except (binascii.Error, ValueError):
                    raise DownloadError("an inline output is not valid base64") from None
                total += len(piece)
                if total > max_bytes:
                    raise OutputTooLarge(f"output is larger than the {max_bytes} byte cap")
                digest.update(piece)
                out.write(piece)
                if not raw:
                    if pending:
                        raise DownloadError("an inline output is not valid base64 (truncated)")
                    break
    except BaseException:
        os.unlink(path)
        raise
    return Decoded(path, total, digest.hexdigest())


# --- for adapters: an answer read, its inline files written ------------------------


async def spool_answer(response: Any, provider: str, *, directory: str | None,
                       max_inline_bytes: int) -> SpooledJson:
    """A status answer (an open httpx response, see http.streamed_read)
    read as it arrives, decoded (a provider may compress it): its long
    strings on disk. A string over the cap is OutputTooLarge (the settle
    step fails the job output_too_large); an answer that cannot be read is
    Transient."""
    try:
        return await spool_json(response.aiter_bytes(), directory=directory, max_inline_bytes=max_inline_bytes)
    except AnswerTooLarge:
        raise Transient(f"{provider}: the answer is too large to read") from None
    except ValueError:
        raise Transient(f"{provider}: answer was not JSON (HTTP {response.status_code})") from None
    except httpx.HTTPError as exc:  # the answer broke off while it was read
        raise Transient(f"{provider}: reading the answer failed ({type(exc).__name__})") from None
    except OSError as exc:  # our disk: full, gone, read-only
        raise Transient(f"{provider}: could not spool the answer ({exc.strerror})") from None


@dataclass(frozen=True)
class InlineOutput:
    """One base64 output found in a spooled answer: the string (spilled, or
    short and still in the skeleton), its type and label."""

    data: Spilled | str
    content_type: str | None
    label: str | None = None


def write_inline(outputs: tuple[InlineOutput, ...], doc: SpooledJson, *, directory: str | None,
                 max_bytes: int) -> tuple[OutputFile, ...]:
    """Each output decoded into a file of its own (blocking: run it in a
    thread), capped, with its size and sha256. A short string is written
    out first, so one decoder (its cap and checks) handles every size. On
    any error none is left behind."""
    files: list[OutputFile] = []
    try:
        for output in outputs:
            spilled = output.data
            if isinstance(spilled, str):
                spilled = _spill_text(spilled, directory)
                doc.spilled.append(spilled)  # removed with the answer's own
            decoded = decode_base64(spilled, directory=directory, max_bytes=max_bytes)
            files.append(OutputFile(decoded.path, decoded.bytes, decoded.sha256, output.content_type, output.label))
    except BaseException:
        for file in files:
            os.unlink(file.path)
        raise
    return tuple(files)


def _spill_text(text: str, directory: str | None) -> Spilled:
    data = text.encode("utf-8", "replace")  # a lone surrogate becomes "?": not base64, refused by the decoder
    fd, path = tempfile.mkstemp(prefix=".inline-", suffix=".part", dir=directory)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    return Spilled(path, len(data))


async def write_answer(response: httpx.Response, provider: str, *, directory: str | None, max_bytes: int,
                       content_type: str | None, label: str | None = None) -> OutputFile:
    """A sync call's answer body streamed to a file of its own in
    `directory`, with the byte cap, size and sha256: the call's output 0.
    OutputTooLarge past the cap; Uncertain (the call is lost) when the body
    breaks off. No file is left behind on any error, cancellation included."""
    digest = hashlib.sha256()
    size = 0
    fd, path = tempfile.mkstemp(prefix=".answer-", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            try:
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise OutputTooLarge(f"output is larger than the {max_bytes} byte cap")
                    digest.update(chunk)
                    file.write(chunk)
            except httpx.HTTPError as exc:
                raise Uncertain(f"{provider}: the answer broke off ({type(exc).__name__})") from None
    except BaseException:
        os.unlink(path)
        raise
    return OutputFile(path=path, bytes=size, sha256=digest.hexdigest(), content_type=content_type, label=label)


def write_json_output(value: Any, *, directory: str | None, max_bytes: int) -> OutputFile:
    """A JSON answer we assembled (a streamed message) as output 0: compact
    UTF-8, with the byte cap, size and sha256."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    if len(data) > max_bytes:
        raise OutputTooLarge(f"output is larger than the {max_bytes} byte cap")
    fd, path = tempfile.mkstemp(prefix=".answer-", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return OutputFile(path=path, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                      content_type="application/json")
