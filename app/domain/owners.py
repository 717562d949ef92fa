"""Owners, their API keys and credit grants. Owns the `owners` and
`api_keys` tables (and the ledger's `grant` rows).

A *platform* owner's keys manage owners under it (CONTRACT.md: Apps with
many users): create them, grant them credits or take credits back, and act
for them (app/web/auth.py). Every grant is a ledger row; an owner's
`granted` is the sum of its grant rows, negative ones included.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass

import asyncpg

from app import ids
from app.vocabulary import LedgerKind

# What one owner may be given, by the operator's CLI and by a platform's
# API alike (app/web/owners.py checks its bodies against these too).
MAX_OWNER_NAME = 200
MAX_OWNER_ACTIVE = 100_000  # slots one owner may hold; the contract's default is 10
MAX_GRANT = 10**12  # credits one grant (or a new owner's first) may carry

CREATE_OWNER = """
insert into owners (id, name, granted, balance, max_active, is_platform) values ($1, $2, $3, $3, $4, $5)
"""
GRANT_LEDGER = f"insert into ledger (owner_id, kind, amount) values ($1, '{LedgerKind.GRANT}', $2)"
GRANT = """
update owners set granted = granted + $2, balance = balance + $2 where id = $1 returning id
"""
CREATE_KEY = "insert into api_keys (prefix, key_hash, owner_id) values ($1, $2, $3)"
REVOKE_KEY = """
update api_keys set revoked_at = now() where prefix = $1 and revoked_at is null returning owner_id
"""
# Who a request is: the key's owner, whether it is a platform, and — with a
# Longcall-Owner header ($2) — that owner when it is under the key's
# platform. One round trip, every request (nothing cached: a revoked key
# stops at once).
AUTHENTICATE = """
select k.owner_id, o.is_platform, a.id as acting
from api_keys k join owners o on o.id = k.owner_id
left join owners a on a.id = $2 and a.platform_id = k.owner_id and o.is_platform
where k.key_hash = $1 and k.revoked_at is null
"""
ACCOUNT = """
select id, balance, reserved, charged, granted, active, max_active from owners where id = $1
"""
_OWNER_COLUMNS = "id, name, granted, balance, reserved, charged, active, max_active, created_at"

# --- a platform's owners -------------------------------------------------------

# A new owner under a platform, with its opening grant, in one statement. A
# key already used by this platform inserts nothing (the unique constraint
# waits for a concurrent insert of the same key to commit or roll back).
CREATE_UNDER = f"""
with o as (
    insert into owners (id, name, granted, balance, max_active, platform_id, request_key, request_digest)
    values ($1, $2, $3, $3, $4, $5, $6, $7)
    on conflict (platform_id, request_key) do nothing
    returning {_OWNER_COLUMNS}
), opening as (
    insert into ledger (owner_id, kind, amount) select id, '{LedgerKind.GRANT}', granted from o where granted <> 0
)
select {_OWNER_COLUMNS} from o
"""
OWNER_BY_REQUEST_KEY = f"""
select {_OWNER_COLUMNS}, request_digest from owners where platform_id = $1 and request_key = $2
"""
GET_UNDER = f"select {_OWNER_COLUMNS} from owners where id = $2 and platform_id = $1"
LIST_UNDER = f"""
select {_OWNER_COLUMNS} from owners
where platform_id = $1 and ($2::timestamptz is null or (created_at, id) < ($2, $3))
order by created_at desc, id desc limit $4
"""
# A grant's ledger row first: a key already used for this owner inserts
# nothing (and a concurrent request with the same key waits here for the
# first to commit or roll back, so the money moves once). Then the owner's
# counters, guarded so a claw-back never takes the balance below zero; the
# caller rolls the ledger row back when that guard refuses.
GRANT_ENTRY = f"""
insert into ledger (owner_id, kind, amount, reason, request_key, request_digest)
select o.id, '{LedgerKind.GRANT}', $3, $4, $5, $6 from owners o where o.id = $2 and o.platform_id = $1
on conflict (owner_id, request_key) where request_key is not null do nothing
returning id
"""
GRANT_MOVE = f"""
update owners set granted = granted + $2, balance = balance + $2
where id = $1 and balance + $2 >= 0
returning {_OWNER_COLUMNS}
"""
# The operator's grant from the console: any owner, credits in, once per key
# (the key is made with the confirmation page, so a double-submitted form
# moves the money once).
OPERATOR_GRANT_ENTRY = f"""
insert into ledger (owner_id, kind, amount, reason, request_key, request_digest)
select o.id, '{LedgerKind.GRANT}', $2, $3, $4, $5 from owners o where o.id = $1
on conflict (owner_id, request_key) where request_key is not null do nothing
returning id
"""
GRANT_BY_REQUEST_KEY = f"""
select l.request_digest from ledger l
where l.owner_id = $1 and l.request_key = $2 and l.kind = '{LedgerKind.GRANT}'
"""


class NotFound(Exception):
    pass


class InsufficientCredits(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


@dataclass(frozen=True)
class NewOwner:
    owner_id: str
    api_key: str


@dataclass(frozen=True)
class Caller:
    """Who a request is: whether its key is a platform's, and the owner it
    acts as (`owner_id`: the key's own, or the one its Longcall-Owner named)."""
    is_platform: bool
    owner_id: str


@dataclass(frozen=True)
class Owner:
    id: str
    name: str
    granted: int
    balance: int
    reserved: int
    charged: int
    active: int
    max_active: int
    created_at: dt.datetime

    @classmethod
    def of(cls, row) -> Owner:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


def is_owner_name(name: str) -> bool:
    """An owner's name: 1 to 200 printable characters, not blank (it is
    shown in listings, the console and `longcall status`, where a line
    break or a control character would pass for something else). Pure; one
    rule for the CLI and `POST /v1/owners`."""
    return 0 < len(name) <= MAX_OWNER_NAME and name.isprintable() and not name.isspace()


async def create_owner(conn: asyncpg.Connection, name: str, credits: int = 0,
                       max_active: int = 10, *, platform: bool = False) -> NewOwner:
    if not is_owner_name(name):
        raise ValueError(f"NAME must be 1 to {MAX_OWNER_NAME} printable characters, not blank")
    if not 0 <= credits <= MAX_GRANT:
        raise ValueError(f"--credits must be a whole number from 0 to {MAX_GRANT}")
    if not 0 <= max_active <= MAX_OWNER_ACTIVE:
        raise ValueError(f"--max-active must be a whole number from 0 to {MAX_OWNER_ACTIVE}")
    owner_id = ids.new_owner_id()
    async with conn.transaction():
        await conn.execute(CREATE_OWNER, owner_id, name, credits, max_active, platform)
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
    active keys revokes nothing. Past the stored prefix only a whole key can
    be checked (by its hash), so anything longer must be the whole key: a
    mistyped key revokes nothing."""
    if len(prefix) < MIN_PREFIX_LEN:
        raise NotFound(f"give at least the key's first {MIN_PREFIX_LEN} characters")
    whole = None
    if len(prefix) > ids.KEY_PREFIX_LEN:
        whole = lookup_hash(prefix)
        if whole is None:
            raise NotFound("no active key is that key")
    async with conn.transaction():
        matches = await conn.fetch(
            "select prefix from api_keys where starts_with(prefix, $1) and revoked_at is null"
            " and ($2::bytea is null or key_hash = $2) for update",
            prefix[: ids.KEY_PREFIX_LEN], whole)
        if not matches:
            raise NotFound("no active key is that key" if whole is not None else f"no active key starts with {prefix}")
        if len(matches) > 1:
            raise NotFound(f"{len(matches)} active keys start with {prefix}; give more characters")
        return await conn.fetchval(REVOKE_KEY, matches[0]["prefix"])


async def grant(conn: asyncpg.Connection, owner_id: str, amount: int) -> None:
    """The operator's grant (`longcall owners grant`): credits in, never out."""
    if not 1 <= amount <= MAX_GRANT:
        raise ValueError(f"N must be a whole number of credits from 1 to {MAX_GRANT}")
    async with conn.transaction():
        if await conn.fetchval(GRANT, owner_id, amount) is None:
            raise NotFound(f"no owner {owner_id}")
        await conn.execute(GRANT_LEDGER, owner_id, amount)


def lookup_hash(api_key: str) -> bytes | None:
    """The hash to look a key up by; None for anything that cannot be a key."""
    if not api_key.startswith("lc_") or len(api_key) > 200:
        return None
    return ids.api_key_hash(api_key)


async def authenticate(conn: asyncpg.Connection | asyncpg.Pool, api_key: str,
                       acting_for: str | None = None) -> Caller | None:
    """None for a key that is not valid. With `acting_for` (a Longcall-Owner
    header) the caller's `owner_id` is that owner — or NotFound when it is
    not under the key's platform (or the key is no platform's): one answer
    for every such case, so nothing about other owners leaks."""
    key_hash = lookup_hash(api_key)
    if key_hash is None:
        return None
    valid_id = acting_for is not None and ids.is_owner_id(acting_for)
    row = await conn.fetchrow(AUTHENTICATE, key_hash, acting_for if valid_id else None)
    if row is None:
        return None
    if acting_for is None:
        return Caller(row["is_platform"], row["owner_id"])
    if row["acting"] is None:
        raise NotFound("no such owner")
    return Caller(row["is_platform"], row["acting"])


async def account(conn: asyncpg.Connection | asyncpg.Pool, owner_id: str) -> dict:
    row = await conn.fetchrow(ACCOUNT, owner_id)
    return {
        "owner_id": row["id"],
        "credits": {"balance": row["balance"], "reserved": row["reserved"], "charged": row["charged"]},
        "active": row["active"],
        "max_active": row["max_active"],
    }


def request_digest(fields: dict) -> bytes:
    """What was asked, canonically: a replay under the same key has the same digest."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).digest()


async def create_under(conn: asyncpg.Connection, platform_id: str, *, name: str, credits: int,
                       max_active: int, request_key: str | None) -> tuple[Owner, bool]:
    """(the owner, whether this request made it). Same key and body as an
    earlier request: that owner, made by nobody now. Same key, other body:
    IdempotencyConflict."""
    digest = request_digest({"name": name, "credits": credits, "max_active": max_active})
    row = await conn.fetchrow(CREATE_UNDER, ids.new_owner_id(), name, credits, max_active, platform_id,
                              request_key, digest if request_key is not None else None)
    if row is not None:
        return Owner.of(row), True
    assert request_key is not None  # only a keyed insert can meet a conflict
    existing = await conn.fetchrow(OWNER_BY_REQUEST_KEY, platform_id, request_key)
    if existing["request_digest"] != digest:
        raise IdempotencyConflict("this Idempotency-Key was used with a different request")
    return Owner.of(existing), False


async def get_under(conn: asyncpg.Connection, platform_id: str, owner_id: str) -> Owner | None:
    row = await conn.fetchrow(GET_UNDER, platform_id, owner_id) if ids.is_owner_id(owner_id) else None
    return Owner.of(row) if row else None


async def list_under(conn: asyncpg.Connection, platform_id: str, *, limit: int,
                     after: tuple[dt.datetime, str] | None) -> list[Owner]:
    created_at, last_id = after if after else (None, None)
    return [Owner.of(r) for r in await conn.fetch(LIST_UNDER, platform_id, created_at, last_id, limit)]


async def grant_under(conn: asyncpg.Connection, platform_id: str, owner_id: str, *, credits: int,
                      reason: str | None, request_key: str) -> tuple[Owner, bool]:
    """A platform's grant (negative: a claw-back) to one of its owners, once
    per key: (the owner after it, whether this request moved the money).
    NotFound: not this platform's owner. InsufficientCredits: a claw-back
    past the available balance (nothing is written)."""
    if not ids.is_owner_id(owner_id):
        raise NotFound("no such owner")
    digest = request_digest({"credits": credits, "reason": reason})
    async with conn.transaction():
        entered = await conn.fetchval(GRANT_ENTRY, platform_id, owner_id, credits, reason, request_key, digest)
        if entered is not None:
            row = await conn.fetchrow(GRANT_MOVE, owner_id, credits)
            if row is None:
                # Raising rolls the ledger row back with the transaction.
                balance = await conn.fetchval("select balance from owners where id = $1", owner_id)
                raise InsufficientCredits(f"taking {-credits} credits would leave the balance "
                                          f"{balance} below zero")
            return Owner.of(row), True
    owner = await get_under(conn, platform_id, owner_id)
    if owner is None:
        raise NotFound("no such owner")
    if await conn.fetchval(GRANT_BY_REQUEST_KEY, owner_id, request_key) != digest:
        raise IdempotencyConflict("this Idempotency-Key was used with a different grant")
    return owner, False


async def operator_grant(conn: asyncpg.Connection, owner_id: str, *, credits: int, reason: str,
                         request_key: str) -> bool:
    """The operator's grant of `credits` (at least 1) to any owner, once per
    key: whether this call moved the money (False: this key already did).
    NotFound: no such owner. IdempotencyConflict: the key was used for another grant."""
    if credits < 1:
        raise ValueError("a grant from the console adds at least 1 credit")
    if not ids.is_owner_id(owner_id):
        raise NotFound("no such owner")
    digest = request_digest({"credits": credits, "reason": reason})
    async with conn.transaction():
        entered = await conn.fetchval(OPERATOR_GRANT_ENTRY, owner_id, credits, reason, request_key, digest)
        if entered is not None:
            await conn.fetchrow(GRANT_MOVE, owner_id, credits)  # adds only: its guard always passes
            return True
    earlier = await conn.fetchval(GRANT_BY_REQUEST_KEY, owner_id, request_key)
    if earlier is None:  # nothing entered and no row under this key: no such owner
        raise NotFound("no such owner")
    if earlier != digest:
        raise IdempotencyConflict("this grant's key was used with a different grant")
    return False
