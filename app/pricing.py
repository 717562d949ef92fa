"""What a succeeded job is charged: its model's price (the models file) on
what was measured, capped at the reservation (CONTRACT.md: The models file).

Pure: the measures come in (outputs stored, seconds of audio/video read from
the stored files, tokens and characters the adapter reported, the
provider's own cost), one charge and a record of how it was reached come
out. The record is kept with the job (`jobs.price_applied`): what support
reads to answer "why was I charged this?".

- `job` 1; `output` the number of stored outputs; `second` the summed
  duration of the stored audio/video outputs, rounded to 0.1 s first;
  `1k_tokens` (input + output tokens, cache tokens included) / 1000;
  `1k_characters` characters / 1000; `provider` the provider's own cost
  in credits, else the reservation (CONTRACT: The models file).
- The charge is `ceil(credits × measure)`, exact (Decimal), once per job,
  then capped at the reservation.
- A measure that cannot be read (an audio/video output no media library
  can read; no usage reported) is charged the reservation, and the record
  says so. No audio/video output at all is 0 seconds.
- Without a price (no models file entry, or one without `price`): the
  provider-reported cost capped at the reservation, or the reservation
  (states.charge_for): what longcall has always done.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal
from typing import Any

from app.domain import states
from app.models_file import Price
from app.providers.base import Usage, UsageUnit

UNREADABLE = "the measure could not be read: charged the reservation"
TOKEN_UNITS = (UsageUnit.INPUT_TOKENS, UsageUnit.OUTPUT_TOKENS)


@dataclass(frozen=True)
class Measures:
    """What a succeeded job produced and used. `seconds` is None when it was
    not read (a per-second price only reads it; an audio/video output that
    could not be read)."""

    outputs: int
    seconds: float | None = None
    usage: tuple[Usage, ...] = ()
    provider_cost: int | None = None


@dataclass(frozen=True)
class Charge:
    credits: int
    applied: dict[str, Any]  # how: kept with the job, shown in its timeline


def measure(per: str, measures: Measures, reserved: int) -> Decimal | None:
    """The amount of `per` units the job used; None when it cannot be read."""
    if per == "job":
        return Decimal(1)
    if per == "output":
        return Decimal(measures.outputs)
    if per == "second":
        if measures.seconds is None:
            return None
        return Decimal(repr(measures.seconds)).quantize(Decimal("0.1"), rounding=ROUND_HALF_EVEN)
    if per == "1k_tokens":
        tokens = _summed(measures.usage, TOKEN_UNITS)
        return None if tokens is None else tokens / 1000
    if per == "1k_characters":
        characters = _summed(measures.usage, (UsageUnit.CHARACTERS,))
        return None if characters is None else characters / 1000
    if per == "provider":
        return Decimal(reserved if measures.provider_cost is None else measures.provider_cost)
    raise ValueError(f"unknown price unit {per!r}")


def _summed(usage: Sequence[Usage], units: tuple[UsageUnit, ...]) -> Decimal | None:
    found = [u.amount for u in usage if u.unit in units]
    if not found or not all(math.isfinite(a) and a >= 0 for a in found):
        return None
    return sum((Decimal(repr(float(a))) for a in found), Decimal(0))


def charge(price: Price | None, reserved: int, measures: Measures) -> Charge:
    """The charge of a succeeded job that reserved `reserved` credits."""
    if price is None:
        credits = states.charge_for(reserved, measures.provider_cost)
        reported = "the provider's cost" if measures.provider_cost is not None else "the reservation"
        return Charge(credits, {"price": None, "charged": credits, "reserved": reserved, "by": reported})
    amount = measure(price.per, measures, reserved)
    applied: dict[str, Any] = {"price": {"credits": _number(price.credits), "per": price.per},
                               "reserved": reserved}
    if amount is None:
        return Charge(reserved, {**applied, "measure": None, "charged": reserved, "note": UNREADABLE})
    exact = (price.credits * amount).to_integral_value(rounding=ROUND_CEILING)
    credits = min(int(exact), reserved)
    applied.update(measure=_number(amount), charged=credits)
    if exact > reserved:
        applied["note"] = f"{int(exact)} credits by the price, capped at the reservation"
    return Charge(credits, applied)


def _number(value: Decimal) -> int | float:
    """A Decimal as JSON: a whole number stays whole."""
    return int(value) if value == value.to_integral_value() else float(value)
