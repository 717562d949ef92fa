"""Proofs that the service keeps its promises: the chaos run (chaos.py) and
the invariant checks it ends with (invariants.py), reusable by tests."""

# `longcall bench --only` choices, in the order the rows run (proof/bench.py).
BENCH_GROUPS = ("ingest", "create", "reads", "drain", "e2e", "idle", "sweep", "rss", "http")
