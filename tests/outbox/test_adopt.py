"""Which of the provider's candidates an in-doubt submit adopts
(outbox/decide.adopt): only one that is not another job's, and only when no
other job's submit of the same model and input is itself in doubt."""
from __future__ import annotations

import pytest

from app.providers.base import Submitted
from outbox import decide

A, B, C = Submitted("a"), Submitted("b"), Submitted("c")

# candidates, task ids saved on other jobs, other in-doubt jobs alike -> adopted
ADOPT_TABLE = [
    ((), frozenset(), 0, None),
    ((A,), frozenset(), 0, A),
    ((A,), frozenset({"a"}), 0, None),  # it is another job's task
    ((A, B), frozenset(), 0, None),  # which one is ours cannot be told
    ((A, B), frozenset({"a"}), 0, B),
    ((A, B, C), frozenset({"a", "c"}), 0, B),
    ((A, B), frozenset({"a", "b"}), 0, None),
    ((A,), frozenset(), 1, None),  # the other job's lost submit may have made it, ours nothing
    ((A, B), frozenset({"a"}), 2, None),
    ((A,), frozenset({"z"}), 0, A),
]


@pytest.mark.parametrize("candidates, taken, rivals, expected", ADOPT_TABLE)
def test_adopt(candidates, taken, rivals, expected):
    assert decide.adopt(candidates, taken, rivals) == expected
