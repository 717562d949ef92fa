"""How long a stored audio or video output plays, read from the file by
mutagen (MP3, MP4/M4A, WAV, Ogg, FLAC, AIFF, ...): the measure of a
per-second price. Never a container parser of our own."""
from __future__ import annotations

import math
from collections.abc import Iterable

import mutagen


def is_media(content_type: str | None) -> bool:
    """Whether an output of this type has a duration (audio or video)."""
    if not content_type:
        return False
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind.startswith(("audio/", "video/"))


def duration_s(path: str) -> float | None:
    """The file's duration in seconds; None when no reader knows the file
    or it says nothing sensible (blocking: call it in a thread)."""
    try:
        found = mutagen.File(path)
    except (mutagen.MutagenError, OSError, ValueError, EOFError):
        return None
    length = getattr(getattr(found, "info", None), "length", None)
    if isinstance(length, bool) or not isinstance(length, int | float):
        return None
    return float(length) if math.isfinite(length) and length >= 0 else None


def summed_duration_s(outputs: Iterable[tuple[str, str | None]]) -> float | None:
    """The summed duration of the audio/video outputs among (path, content
    type) pairs: 0 when there is none (CONTRACT: the sum over the stored
    audio/video outputs); None when one cannot be read (a job whose measure
    cannot be read is charged its reservation)."""
    total = 0.0
    for path, content_type in outputs:
        if not is_media(content_type):
            continue
        length = duration_s(path)
        if length is None:
            return None
        total += length
    return total
