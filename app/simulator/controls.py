"""The `input` controls that steer one simulated task.

They ride inside the task's `input` under every protocol (native `input`,
Replicate `input`, fal's body, KIE's `input`); every other key of `input`
is the model's business and is ignored here.

`output_duration_s` (a number greater than 0, at most 3 hours) makes each
output a real media file of that many seconds (app/simulator/media.py),
whatever `output_bytes` says: an MP4 when the output's media type is a
video type (`video/...`), else a WAV. Given without `content_type`, the
type is `audio/wav` wherever a protocol's own default is not a video type
(`image/png` here, a family's `image/jpeg` or `audio/mpeg`): the bytes are a
WAV, and the type says so. A protocol whose outputs are videos keeps its
`video/mp4` (`with_default_type`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.simulator.media import MP4, WAV, WAV_CONTENT_TYPE

# Upper bounds keep a typo from scheduling a task for a century or promising
# a petabyte; they are far above anything a test or benchmark needs.
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_OUTPUT_BYTES = 64 * 1024**3
MAX_OUTPUTS = 100
MAX_COST = 10**12
MAX_OUTPUT_TTL_S = 30 * 24 * 3600.0
MAX_TOKENS = 10**12
# Keeps a WAV's sizes inside its 32-bit fields (and an MP4's duration inside mvhd's).
MAX_OUTPUT_DURATION_S = 3 * 3600.0

OUTCOMES = ("succeeded", "failed")
_CONTENT_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}")


class ControlError(ValueError):
    """A control value is wrong. `field` names it; the message says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"input.{field} {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class Controls:
    duration_s: float = 1.0
    outcome: str = "succeeded"
    output_bytes: int = 1024
    outputs: int = 1
    cost: int = 1
    output_ttl_s: float = 3600.0
    content_type: str = "image/png"
    # The task answers this text instead of files (Replicate: `output` is the string).
    output_text: str | None = None
    # The usage a sync LLM answer reports (None: the text's length / 4, rounded up).
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Each output is a real WAV/MP4 of this many seconds (None: `output_bytes` of bytes).
    output_duration_s: float | None = None


def _number(value: Any, field: str, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ControlError(field, "must be a number")
    if value < low or (low_open and value == low) or value > high:
        bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
        raise ControlError(field, f"must be {bound} and at most {high:g}")
    return float(value)


def whole_number(value: Any, field: str, low: int, high: int) -> int:
    # 3.0 is accepted as 3: JSON encoders in other languages write floats freely.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlError(field, "must be a whole number")
    if value < low or value > high:
        raise ControlError(field, f"must be between {low} and {high}")
    return value


def parse_controls(input: Mapping[str, Any]) -> Controls:
    """The controls found in `input`, defaults for the missing ones.
    Raises ControlError on the first bad value."""
    defaults = Controls()
    values: dict[str, Any] = {}
    if "duration_s" in input:
        values["duration_s"] = _number(input["duration_s"], "duration_s", 0.0, MAX_DURATION_S)
    if "outcome" in input:
        if input["outcome"] not in OUTCOMES:
            raise ControlError("outcome", "must be 'succeeded' or 'failed'")
        values["outcome"] = input["outcome"]
    if "output_bytes" in input:
        values["output_bytes"] = whole_number(input["output_bytes"], "output_bytes", 0, MAX_OUTPUT_BYTES)
    if "outputs" in input:
        values["outputs"] = whole_number(input["outputs"], "outputs", 0, MAX_OUTPUTS)
    if "cost" in input:
        values["cost"] = whole_number(input["cost"], "cost", 0, MAX_COST)
    if "output_ttl_s" in input:
        values["output_ttl_s"] = _number(
            input["output_ttl_s"], "output_ttl_s", 0.0, MAX_OUTPUT_TTL_S, low_open=True
        )
    if "content_type" in input:
        content_type = input["content_type"]
        if not isinstance(content_type, str) or not _CONTENT_TYPE_RE.fullmatch(content_type):
            raise ControlError("content_type", "must be a media type like image/png")
        values["content_type"] = content_type.lower()
    if "output_text" in input:
        if not isinstance(input["output_text"], str):
            raise ControlError("output_text", "must be a string")
        values["output_text"] = input["output_text"]
    for tokens in ("input_tokens", "output_tokens"):
        if tokens in input:
            values[tokens] = whole_number(input[tokens], tokens, 0, MAX_TOKENS)
    if "output_duration_s" in input:
        values["output_duration_s"] = _number(
            input["output_duration_s"], "output_duration_s", 0.0, MAX_OUTPUT_DURATION_S, low_open=True
        )
        values.setdefault("content_type", WAV_CONTENT_TYPE)
    return replace(defaults, **values) if values else defaults


def is_video(content_type: str) -> bool:
    return content_type.startswith("video/")


def with_default_type(controls: Controls, input: Mapping[str, Any], default: str) -> Controls:
    """`controls` with a protocol's default media type where `input` named
    none (pure); with `output_duration_s` only a video default applies (the
    WAV keeps its `audio/wav`)."""
    if "content_type" in input or (controls.output_duration_s is not None and not is_video(default)):
        return controls
    return replace(controls, content_type=default)


def media_of(controls: Controls) -> tuple[str, float] | None:
    """What `output_duration_s` makes of each output (pure): None (plain
    bytes), or the kind (WAV, or MP4 for a video type) and the duration."""
    if controls.output_duration_s is None:
        return None
    return (MP4 if is_video(controls.content_type) else WAV), controls.output_duration_s
