"""The owners routes' body rules, as pure functions (app/web/owners.py)."""
from __future__ import annotations

import pytest

from app.domain.owners import MAX_OWNER_ACTIVE
from app.web.body import MAX_CREDITS
from app.web.errors import ApiError
from app.web.owners import MAX_GRANT_REASON, validate_grant, validate_new_owner


@pytest.mark.parametrize(("body", "expected"), [
    ({"name": "alice"}, ("alice", 0, 10)),
    ({"name": "Zoë’s café ✓"}, ("Zoë’s café ✓", 0, 10)),
    ({"name": "alice", "credits": 0, "max_active": 0}, ("alice", 0, 0)),
    ({"name": "a" * 200, "credits": MAX_CREDITS, "max_active": MAX_OWNER_ACTIVE},
     ("a" * 200, MAX_CREDITS, MAX_OWNER_ACTIVE)),
])
def test_a_new_owner(body, expected):
    assert validate_new_owner(body) == expected


@pytest.mark.parametrize(("body", "says"), [
    ({}, "name"),
    ({"name": ""}, "name"),
    ({"name": "   "}, "name"),
    ({"name": "a" * 201}, "name"),
    ({"name": "Alice\nBob"}, "printable"),  # a line break would pass for two owners in a listing
    ({"name": "a\x1b[31m"}, "printable"),
    ({"name": 5}, "name"),
    ({"name": "a", "credits": -1}, "credits"),
    ({"name": "a", "credits": MAX_CREDITS + 1}, "credits"),
    ({"name": "a", "credits": 1.0}, "credits"),
    ({"name": "a", "credits": True}, "credits"),
    ({"name": "a", "credits": "5"}, "credits"),
    ({"name": "a", "max_active": -1}, "max_active"),
    ({"name": "a", "max_active": MAX_OWNER_ACTIVE + 1}, "max_active"),
    ({"name": "a", "max_active": None}, "max_active"),
    ({"name": "a", "platform": True}, "unknown field"),
])
def test_a_bad_new_owner(body, says):
    with pytest.raises(ApiError) as refused:
        validate_new_owner(body)
    assert refused.value.code == "invalid_request" and says in refused.value.message


@pytest.mark.parametrize(("body", "expected"), [
    ({"credits": 100}, (100, None)),
    ({"credits": -1, "reason": "chargeback"}, (-1, "chargeback")),
    ({"credits": MAX_CREDITS, "reason": None}, (MAX_CREDITS, None)),
    ({"credits": -MAX_CREDITS, "reason": "r" * MAX_GRANT_REASON}, (-MAX_CREDITS, "r" * MAX_GRANT_REASON)),
])
def test_a_grant(body, expected):
    assert validate_grant(body) == expected


@pytest.mark.parametrize(("body", "says"), [
    ({}, "missing"),
    ({"credits": 0}, "not 0"),
    ({"credits": MAX_CREDITS + 1}, "credits"),
    ({"credits": -MAX_CREDITS - 1}, "credits"),
    ({"credits": 1.5}, "credits"),
    ({"credits": False}, "credits"),
    ({"credits": None}, "credits"),
    ({"credits": 5, "reason": 5}, "reason"),
    ({"credits": 5, "reason": "r" * (MAX_GRANT_REASON + 1)}, "reason"),
    ({"credits": 5, "owner_id": "own_x"}, "unknown field"),
])
def test_a_bad_grant(body, says):
    with pytest.raises(ApiError) as refused:
        validate_grant(body)
    assert refused.value.code == "invalid_request" and says in refused.value.message
