"""Real media files of a given duration, made of the deterministic bytes
(pure): what `output_duration_s` asks for.

- A WAV: the 44-byte RIFF header of mono 16-bit PCM, then the samples,
  `round(duration_s * rate)` frames of 2 bytes. The samples are
  `output_bytes_iter(key, index, frames * 2)`: noise, but a file any media
  library reads, whose length is frames / rate.
- An MP4: `ftyp`, then `moov` (`mvhd`, one video `trak` with `tkhd`,
  `mdia` (`mdhd`, `hdlr` "vide", `minf` with `vmhd`, `dinf`/`dref` and a
  `stbl`: one `mp4v` sample description, which readers such as ffprobe
  require, and empty sample tables), then `mdat` holding
  `output_bytes_iter(key, index, round(duration_s * MP4_BYTES_PER_S))`.
  The duration is in `mvhd`, `tkhd` and `mdhd`, at MP4_TIMESCALE units a
  second; no sample refers to the `mdat` bytes (the simulator encodes
  nothing: a reader learns the duration, a player shows no picture). The
  `mdat` makes each file differ by its key and index, and its size grow
  with its duration, as a real video's does.

The same key, index, kind and duration give the same bytes, every time.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator

WAV = "wav"
MP4 = "mp4"
KINDS = (WAV, MP4)

WAV_CONTENT_TYPE = "audio/wav"
MP4_CONTENT_TYPE = "video/mp4"
WAV_HEADER_BYTES = 44
WAV_SAMPLE_BYTES = 2  # mono, 16-bit
# The rate of the WAVs made for task outputs (ElevenLabs' speech takes its
# output format's): speech quality, the smallest files a reader takes as real audio.
WAV_RATE = 16000
# 90 kHz, video's usual clock: 3 hours fit mvhd's 32-bit duration, and a
# duration is kept to 1/90000 s.
MP4_TIMESCALE = 90000
# The mdat's size per second of video: a 128 kbit/s stream.
MP4_BYTES_PER_S = 16000
MP4_WIDTH, MP4_HEIGHT = 1280, 720
SAMPLE_ENTRY = b"mp4v"
_UNITY_MATRIX = struct.pack(">9I", 0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)
_LANGUAGE_UND = ((ord("u") - 0x60) << 10) | ((ord("n") - 0x60) << 5) | (ord("d") - 0x60)


# ------------------------------------------------------------------ WAV


def wav_frames(duration_s: float, rate: int) -> int:
    return round(duration_s * rate)


def wav_header(rate: int, data_bytes: int) -> bytes:
    """The 44-byte RIFF header of mono 16-bit PCM with `data_bytes` of samples."""
    block = WAV_SAMPLE_BYTES
    return (b"RIFF" + struct.pack("<I", WAV_HEADER_BYTES - 8 + data_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * block, block, 8 * WAV_SAMPLE_BYTES)
            + b"data" + struct.pack("<I", data_bytes))


# ------------------------------------------------------------------ MP4


def _box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I", 8 + len(body)) + kind + body


def _full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return _box(kind, bytes([version]) + flags.to_bytes(3, "big"), *payload)


def mp4_units(duration_s: float) -> int:
    """The duration in MP4_TIMESCALE units."""
    return round(duration_s * MP4_TIMESCALE)


def mp4_payload_bytes(duration_s: float) -> int:
    return round(duration_s * MP4_BYTES_PER_S)


def _visual_sample_entry() -> bytes:
    """One VisualSampleEntry (readers refuse an stsd without one)."""
    return _box(SAMPLE_ENTRY,
                bytes(6), struct.pack(">H", 1),  # reserved, data_reference_index
                bytes(16),  # pre_defined, reserved
                struct.pack(">HHIII", MP4_WIDTH, MP4_HEIGHT, 0x00480000, 0x00480000, 0),  # 72 dpi
                struct.pack(">H", 1), bytes(32),  # frame_count, compressorname
                struct.pack(">Hh", 0x0018, -1))  # depth, pre_defined


def mp4_header(duration_s: float) -> bytes:
    """Everything of the MP4 before the mdat's payload: ftyp, moov and the
    mdat box header."""
    units = mp4_units(duration_s)
    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isom", b"iso2", b"mp41")
    mvhd = _full_box(b"mvhd", 0, 0,
                     struct.pack(">IIII", 0, 0, MP4_TIMESCALE, units),
                     struct.pack(">IH", 0x00010000, 0x0100), bytes(10),  # rate 1.0, volume 1.0, reserved
                     _UNITY_MATRIX, bytes(24),  # pre_defined
                     struct.pack(">I", 2))  # next_track_ID
    tkhd = _full_box(b"tkhd", 0, 0x3,  # enabled, in the movie
                     struct.pack(">IIII", 0, 0, 1, 0),  # times, track_ID 1, reserved
                     struct.pack(">I", units), bytes(8),
                     struct.pack(">hhhH", 0, 0, 0, 0),  # layer, alternate_group, volume (video: 0), reserved
                     _UNITY_MATRIX, struct.pack(">II", MP4_WIDTH << 16, MP4_HEIGHT << 16))
    mdhd = _full_box(b"mdhd", 0, 0, struct.pack(">IIIIHH", 0, 0, MP4_TIMESCALE, units, _LANGUAGE_UND, 0))
    hdlr = _full_box(b"hdlr", 0, 0, bytes(4), b"vide", bytes(12), b"VideoHandler\x00")
    vmhd = _full_box(b"vmhd", 0, 0x1, bytes(8))  # graphicsmode copy, opcolor 0
    dinf = _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 0x1)))
    empty = struct.pack(">I", 0)
    stbl = _box(b"stbl",
                _full_box(b"stsd", 0, 0, struct.pack(">I", 1), _visual_sample_entry()),
                _full_box(b"stts", 0, 0, empty),
                _full_box(b"stsc", 0, 0, empty),
                _full_box(b"stsz", 0, 0, empty, empty),  # sample_size 0, sample_count 0
                _full_box(b"stco", 0, 0, empty))
    trak = _box(b"trak", tkhd, _box(b"mdia", mdhd, hdlr, _box(b"minf", vmhd, dinf, stbl)))
    moov = _box(b"moov", mvhd, trak)
    mdat = struct.pack(">I", 8 + mp4_payload_bytes(duration_s)) + b"mdat"
    return ftyp + moov + mdat


# ------------------------------------------------------------------ either


def media_size(kind: str, duration_s: float, *, rate: int = WAV_RATE) -> int:
    """The file's length in bytes."""
    if kind == WAV:
        return WAV_HEADER_BYTES + wav_frames(duration_s, rate) * WAV_SAMPLE_BYTES
    if kind == MP4:
        return len(mp4_header(duration_s)) + mp4_payload_bytes(duration_s)
    raise ValueError(f"unknown media kind {kind!r}")


def media_parts(kind: str, duration_s: float, *, rate: int = WAV_RATE) -> tuple[bytes, int]:
    """(the header, the number of deterministic bytes that follow it)."""
    if kind == WAV:
        data = wav_frames(duration_s, rate) * WAV_SAMPLE_BYTES
        return wav_header(rate, data), data
    if kind == MP4:
        return mp4_header(duration_s), mp4_payload_bytes(duration_s)
    raise ValueError(f"unknown media kind {kind!r}")


def prepend(header: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
    yield header
    yield from chunks
