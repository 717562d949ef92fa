"""Proofs that the service keeps its promises: the chaos run (chaos.py) and
the invariant checks it ends with (invariants.py), reusable by tests."""
