"""schemathesis hooks for `make fuzz` (tools/fuzz.py loads this file).

A valid `?wait=N` holds a read for up to N seconds while the job does not
change, and with no settler running the fuzzed jobs never do: a few dozen
such reads would spend the whole time bound waiting. So a *valid* wait is
cut to at most one second; invalid values (negative, over 30, NaN, text)
are sent as generated, since those are what the fuzzing is for.
"""
from __future__ import annotations

import math

import schemathesis

MAX_FUZZED_WAIT_S = 1.0


def shortened_wait(value: object) -> object:
    try:
        seconds = float(str(value))
    except ValueError:
        return value
    if math.isfinite(seconds) and MAX_FUZZED_WAIT_S < seconds <= 30:
        return MAX_FUZZED_WAIT_S
    return value


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    if case.query and "wait" in case.query:
        case.query["wait"] = shortened_wait(case.query["wait"])
