"""Reading PostgreSQL's JSON plans (`explain (format json)`) in tests."""
from __future__ import annotations

from collections.abc import Iterator


def plan_nodes(node: dict) -> Iterator[dict]:
    """A plan node and every node below it, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
