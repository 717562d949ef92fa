"""The bench's pure bookkeeping: PostgreSQL's CPU between two readings of
its processes, by what each serves."""
from __future__ import annotations

import pytest

from proof.bench_env import by_backend


@pytest.mark.parametrize("before, after, spent", [
    # Kept connections: the difference, summed by name, largest first.
    ({1: ("longcall-web", 1.0), 2: ("longcall-web", 2.0), 3: ("longcall-settler", 0.5)},
     {1: ("longcall-web", 1.5), 2: ("longcall-web", 2.25), 3: ("longcall-settler", 2.0)},
     {"longcall-settler": 1.5, "longcall-web": 0.75}),
    # A connection opened between the readings counts from zero.
    ({1: ("longcall-web", 1.0)}, {1: ("longcall-web", 1.0), 4: ("walwriter", 0.25)},
     {"walwriter": 0.25, "longcall-web": 0.0}),
    # One that ended between them is missing; its pid reused by another
    # process counts that process from zero.
    ({1: ("longcall-web", 1.0), 2: ("autovacuum worker", 3.0)}, {2: ("longcall-settler", 0.5)},
     {"longcall-settler": 0.5}),
    ({}, {}, {}),
])
def test_postgres_cpu_by_backend(before, after, spent):
    got = by_backend(before, after)
    assert got == spent
    assert list(got) == list(spent)
