"""app.providers.inline: JSON answers with whole files inline, read with the
skeleton in memory and the long strings on disk."""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest

from app.download_errors import DownloadError, OutputTooLarge
from app.providers import inline
from app.providers.inline import AnswerTooLarge, Spilled, decode_base64, spool_json
from tests.download.download_servers import PeakRss

MiB = 1024 * 1024


async def chunks_of(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i:i + size]


async def spool(data: bytes, tmp_path: Path, *, size: int = 8192, spill_after: int = 64, cap: int = MiB):
    return await spool_json(chunks_of(data, size), directory=str(tmp_path), max_inline_bytes=cap,
                            spill_after=spill_after)


# Answers with nothing long in them parse exactly as json.loads does,
# however the bytes are cut.
SMALL = [
    {"status": "pending"},
    {"a": "quote \" and backslash \\ and slash \\/ and \u00e9 \N{SLIGHTLY SMILING FACE}", "n": [1, 2.5, None, True]},
    ["\\", "\"", "", "\\\\\""],
    "just a string",
    {"nested": {"deep": [{"x": "y" * 64}]}},  # exactly at the spill threshold: kept
]


@pytest.mark.parametrize("value", SMALL)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 8192])
async def test_small_answers_parse_as_json_loads_does(value, size, tmp_path):
    raw = json.dumps(value).encode()
    with await spool(raw, tmp_path, size=size) as doc:
        assert doc.value == json.loads(raw) and doc.spilled == []
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("size", [1, 5, 4096])
async def test_a_long_string_is_spilled_with_its_raw_text(size, tmp_path):
    long_text = "ab\\\"cd" * 50  # escapes kept raw, as sent
    raw = json.dumps({"video": {"data": long_text, "mediaType": "video/mp4"}, "after": "x"}).encode()
    doc = await spool(raw, tmp_path, size=size)
    (spilled,) = doc.spilled
    assert doc.value == {"video": {"data": spilled, "mediaType": "video/mp4"}, "after": "x"}
    assert Path(spilled.path).read_bytes() == json.dumps(long_text).encode()[1:-1]
    assert spilled.size == len(json.dumps(long_text)) - 2
    doc.close()
    assert os.listdir(tmp_path) == []


async def test_base64_decodes_to_the_bytes_with_size_and_sha256(tmp_path):
    payload = os.urandom(300_000)
    encoded = base64.b64encode(payload).decode()
    raw = json.dumps({"videos": [{"type": "base64", "data": encoded}]}).encode()
    with await spool(raw, tmp_path, size=65536) as doc:
        spilled = doc.value["videos"][0]["data"]
        assert isinstance(spilled, Spilled)
        out = decode_base64(spilled, directory=str(tmp_path), max_bytes=MiB)
    assert Path(out.path).read_bytes() == payload
    assert (out.bytes, out.sha256) == (len(payload), hashlib.sha256(payload).hexdigest())


async def test_escaped_slashes_are_base64_slashes_even_across_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(inline, "_READ", 8)  # every read boundary falls somewhere in the text
    payload = bytes(range(256)) * 40  # has '/' in its base64 many times
    encoded = base64.b64encode(payload).decode().replace("/", "\\/")
    raw = ('{"data":"' + encoded + '"}').encode()
    with await spool(raw, tmp_path, size=3) as doc:
        out = decode_base64(doc.value["data"], directory=str(tmp_path), max_bytes=MiB)
    assert Path(out.path).read_bytes() == payload


@pytest.mark.parametrize("text", ["not base64!" * 10, "QUJD" * 20 + "\\n", "QUJD" * 20 + "Q"])
async def test_what_is_not_base64_is_a_download_error_and_leaves_no_file(text, tmp_path):
    raw = json.dumps({"data": text}).encode()
    with await spool(raw, tmp_path) as doc:
        with pytest.raises(DownloadError):
            decode_base64(doc.value["data"], directory=str(tmp_path), max_bytes=MiB)
        assert len(os.listdir(tmp_path)) == 1  # only the spilled string, until close
    assert os.listdir(tmp_path) == []


async def test_decoded_bytes_over_the_cap_are_refused(tmp_path):
    raw = json.dumps({"data": base64.b64encode(b"x" * 1000).decode()}).encode()
    with await spool(raw, tmp_path) as doc:
        with pytest.raises(OutputTooLarge):
            decode_base64(doc.value["data"], directory=str(tmp_path), max_bytes=999)
    assert os.listdir(tmp_path) == []


async def test_a_string_over_the_inline_cap_is_refused_while_reading(tmp_path):
    raw = json.dumps({"data": "A" * 2000}).encode()
    with pytest.raises(OutputTooLarge):
        await spool(raw, tmp_path, cap=1000)  # 1000 bytes are 1336 base64 characters
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("raw", [b'{"a": "unterminated', b'{"a": 1', b"<html>", b'{"a": "' + b"x" * 500])
async def test_what_is_not_json_is_a_value_error_and_leaves_no_file(raw, tmp_path):
    with pytest.raises(ValueError):
        await spool(raw, tmp_path)
    assert os.listdir(tmp_path) == []


async def test_a_huge_skeleton_is_refused(tmp_path):
    raw = json.dumps([1] * (inline.MAX_SKELETON // 2)).encode()
    with pytest.raises(AnswerTooLarge):
        await spool(raw, tmp_path)


def test_base64_size():
    assert [inline.base64_size(n) for n in (0, 1, 2, 3, 4, 50 * MiB)] == [0, 4, 4, 4, 8, 4 * ((50 * MiB + 2) // 3)]


async def test_a_50_mib_inline_video_keeps_memory_flat(tmp_path):
    """The answer streamed in 64 KiB pieces, never whole in this process:
    only the skeleton (and a read's worth) is ever in memory."""
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc to sample memory")
    size = 50 * MiB
    block = os.urandom(3 * 65536)  # 196,608 bytes: a whole number of base64 quartets
    encoded_block = base64.b64encode(block)
    count = size // len(block)

    async def answer():
        yield b'{"status":"completed","videos":[{"type":"base64","mediaType":"video/mp4","data":"'
        for _ in range(count):
            yield encoded_block
        yield b'"}]}'

    digest = hashlib.sha256()
    for _ in range(count):
        digest.update(block)
    with PeakRss() as rss:
        with await spool_json(answer(), directory=str(tmp_path), max_inline_bytes=size) as doc:
            out = decode_base64(doc.value["videos"][0]["data"], directory=str(tmp_path), max_bytes=size)
    assert (out.bytes, out.sha256) == (count * len(block), digest.hexdigest())
    assert rss.growth < 24 * MiB, f"resident memory grew by {rss.growth / MiB:.1f} MiB"
