"""Helpers for the platform-owner tests: an owner made over the API, and an
owner's money checked against its grant rows."""
from __future__ import annotations


async def new_owner(c, name: str, **fields) -> str:
    """An owner under the platform whose key `c` sends (POST /v1/owners)."""
    made = await c.post("/v1/owners", json={"name": name, **fields})
    assert made.status_code == 201, made.text
    return made.json()["owner_id"]


async def money(db, owner_id: str) -> dict:
    """The owner's counters, after checking they add up to its grant rows."""
    row = await db.fetchrow("select granted, balance, reserved, charged from owners where id = $1", owner_id)
    grants = await db.fetchval("select coalesce(sum(amount), 0) from ledger where owner_id = $1 and kind = 'grant'",
                               owner_id)
    assert row["granted"] == grants == row["balance"] + row["reserved"] + row["charged"], (dict(row), grants)
    return dict(row)
