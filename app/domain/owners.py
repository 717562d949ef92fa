"""Owners, their API keys and credit grants. Owns the `owners` and
`api_keys` tables (and the ledger's `grant` rows)."""
from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app import ids
from app.vocabulary import LedgerKind

CREATE_OWNER = """
insert into owners (id, name, granted, balance, max_active) values ($1, $2, $3, $3, $4)
"""
GRANT_LEDGER = f"insert into ledger (owner_id, kind, amount) values ($1, '{LedgerKind.GRANT}', $2)"
GRANT = """
update owners set granted = granted + $2, balance = balance + $2 where id = $1 returning id
"""
CREATE_KEY = "insert into api_keys (prefix, key_hash, owner_id) values ($1, $2, $3)"
REVOKE_KEY = """
update api_keys set revoked_at = now() where prefix = $1 and revoked_at is null returning owner_id
"""
AUTHENTICATE = """
select owner_id from api_keys where key_hash = $1 and revoked_at is null
"""
ACCOUNT = """
select id, balance, reserved, charged, granted, active, max_active from owners where id = $1
"""


class NotFound(Exception):
    pass


@dataclass(frozen=True)
class NewOwner:
    owner_id: str
    api_key: str


async def create_owner(conn: asyncpg.Connection, name: str, credits: int = 0,
                       max_active: int = 10) -> NewOwner:
    if not name or len(name) > 200:
        raise ValueError("NAME must be 1 to 200 characters")
    if credits < 0:
        raise ValueError("--credits must be 0 or more")
    if max_active < 0:
        raise ValueError("--max-active must be 0 or more")
    owner_id = ids.new_owner_id()
    async with conn.transaction():
        await conn.execute(CREATE_OWNER, owner_id, name, credits, max_active)
        if credits:
            await conn.execute(GRANT_LEDGER, owner_id, credits)
        key = await _insert_key(conn, owner_id)
    return NewOwner(owner_id, key)


async def _insert_key(conn: asyncpg.Connection, owner_id: str) -> str:
    key = ids.new_api_key()
    await conn.execute(CREATE_KEY, ids.api_key_prefix(key), ids.api_key_hash(key), owner_id)
    return key


async def create_key(conn: asyncpg.Connection, owner_id: str) -> str:
    if not ids.OWNER_ID.match(owner_id):
        raise NotFound(f"no owner {owner_id}")
    async with conn.transaction():
        if await conn.fetchval("select 1 from owners where id = $1", owner_id) is None:
            raise NotFound(f"no owner {owner_id}")
        return await _insert_key(conn, owner_id)


MIN_PREFIX_LEN = 7  # "lc_" and four more characters


async def revoke_key(conn: asyncpg.Connection, prefix: str) -> str:
    """Revoke the active key named by its first characters (at least 7;
    the whole key works too); returns its owner. A prefix shared by several
    active keys revokes nothing."""
    prefix = prefix[: ids.KEY_PREFIX_LEN]
    if len(prefix) < MIN_PREFIX_LEN:
        raise NotFound(f"give at least the key's first {MIN_PREFIX_LEN} characters")
    async with conn.transaction():
        matches = await conn.fetch(
            "select prefix from api_keys where starts_with(prefix, $1) and revoked_at is null for update",
            prefix)
        if not matches:
            raise NotFound(f"no active key starts with {prefix}")
        if len(matches) > 1:
            raise NotFound(f"{len(matches)} active keys start with {prefix}; give more characters")
        return await conn.fetchval(REVOKE_KEY, matches[0]["prefix"])


async def grant(conn: asyncpg.Connection, owner_id: str, amount: int) -> None:
    if amount < 1:
        raise ValueError("N must be a whole number of credits, at least 1")
    async with conn.transaction():
        if await conn.fetchval(GRANT, owner_id, amount) is None:
            raise NotFound(f"no owner {owner_id}")
        await conn.execute(GRANT_LEDGER, owner_id, amount)


def lookup_hash(api_key: str) -> bytes | None:
    """The hash to look a key up by; None for anything that cannot be a key."""
    if not api_key.startswith("lc_") or len(api_key) > 200:
        return None
    return ids.api_key_hash(api_key)


async def authenticate(conn: asyncpg.Connection | asyncpg.Pool, api_key: str) -> str | None:
    key_hash = lookup_hash(api_key)
    return None if key_hash is None else await conn.fetchval(AUTHENTICATE, key_hash)


async def account(conn: asyncpg.Connection | asyncpg.Pool, owner_id: str) -> dict:
    row = await conn.fetchrow(ACCOUNT, owner_id)
    return {
        "owner_id": row["id"],
        "credits": {"balance": row["balance"], "reserved": row["reserved"], "charged": row["charged"]},
        "active": row["active"],
        "max_active": row["max_active"],
    }
