"""Prices on what was measured, as a table: the price, the reservation,
the measures, and the charge with its record written out."""
from __future__ import annotations

from decimal import Decimal

import pytest

from app.models_file import Price
from app.pricing import UNREADABLE, Charge, Measures, charge
from app.providers.base import Usage, UsageUnit

TOKENS = (Usage(UsageUnit.INPUT_TOKENS, 1200), Usage(UsageUnit.OUTPUT_TOKENS, 345))
CHARS = (Usage(UsageUnit.CHARACTERS, 2501),)


def p(credits: str, per: str) -> Price:
    return Price(Decimal(credits), per)


@pytest.mark.parametrize(("name", "price", "reserved", "measures", "expected"), [
    ("no price, a reported cost", None, 10, Measures(1, provider_cost=4),
     Charge(4, {"price": None, "charged": 4, "reserved": 10, "by": "the provider's cost"})),
    ("no price, no cost: the reservation", None, 10, Measures(1),
     Charge(10, {"price": None, "charged": 10, "reserved": 10, "by": "the reservation"})),
    ("per job", p("3", "job"), 10, Measures(2),
     Charge(3, {"price": {"credits": 3, "per": "job"}, "reserved": 10, "measure": 1, "charged": 3})),
    ("per output", p("2.5", "output"), 10, Measures(3),
     Charge(8, {"price": {"credits": 2.5, "per": "output"}, "reserved": 10, "measure": 3, "charged": 8})),
    ("per second of a 7.5 s WAV: rounded up once", p("3", "second"), 100, Measures(1, seconds=7.5),
     Charge(23, {"price": {"credits": 3, "per": "second"}, "reserved": 100, "measure": 7.5, "charged": 23})),
    ("seconds rounded to 0.1 s first", p("1", "second"), 100, Measures(1, seconds=4.04),
     Charge(4, {"price": {"credits": 1, "per": "second"}, "reserved": 100, "measure": 4, "charged": 4})),
    ("per second above the reservation: capped", p("3", "second"), 20, Measures(1, seconds=7.5),
     Charge(20, {"price": {"credits": 3, "per": "second"}, "reserved": 20, "measure": 7.5, "charged": 20,
                 "note": "23 credits by the price, capped at the reservation"})),
    ("per second, nothing read: the reservation", p("3", "second"), 20, Measures(1, seconds=None),
     Charge(20, {"price": {"credits": 3, "per": "second"}, "reserved": 20, "measure": None, "charged": 20,
                 "note": UNREADABLE})),
    ("per 1k tokens: input + output", p("0.8", "1k_tokens"), 10, Measures(1, usage=TOKENS),
     Charge(2, {"price": {"credits": 0.8, "per": "1k_tokens"}, "reserved": 10, "measure": 1.545, "charged": 2})),
    ("per 1k tokens, no usage reported", p("0.8", "1k_tokens"), 10, Measures(1),
     Charge(10, {"price": {"credits": 0.8, "per": "1k_tokens"}, "reserved": 10, "measure": None, "charged": 10,
                 "note": UNREADABLE})),
    ("per 1k characters", p("0.3", "1k_characters"), 10, Measures(1, usage=CHARS),
     Charge(1, {"price": {"credits": 0.3, "per": "1k_characters"}, "reserved": 10, "measure": 2.501,
                "charged": 1})),
    ("a free model", p("0", "job"), 10, Measures(1),
     Charge(0, {"price": {"credits": 0, "per": "job"}, "reserved": 10, "measure": 1, "charged": 0})),
    ("the provider's cost", p("1", "provider"), 10, Measures(1, provider_cost=7),
     Charge(7, {"price": {"credits": 1, "per": "provider"}, "reserved": 10, "measure": 7, "charged": 7})),
    # CONTRACT: `provider` is the reported cost, else the reservation, as a measure like any other.
    ("the provider reported none", p("1", "provider"), 10, Measures(1),
     Charge(10, {"price": {"credits": 1, "per": "provider"}, "reserved": 10, "measure": 10, "charged": 10})),
    ("the provider reported none, half a credit a credit", p("0.5", "provider"), 10, Measures(1),
     Charge(5, {"price": {"credits": 0.5, "per": "provider"}, "reserved": 10, "measure": 10, "charged": 5})),
    ("no audio or video output: 0 seconds", p("3", "second"), 20, Measures(2, seconds=0.0),
     Charge(0, {"price": {"credits": 3, "per": "second"}, "reserved": 20, "measure": 0, "charged": 0})),
    ("exact decimals: 0.1 x 30 is 3, not 3.0000000000000004 rounded up to 4", p("0.1", "output"), 10,
     Measures(30), Charge(3, {"price": {"credits": 0.1, "per": "output"}, "reserved": 10, "measure": 30,
                              "charged": 3})),
])
def test_charge(name, price, reserved, measures, expected):
    assert charge(price, reserved, measures) == expected
