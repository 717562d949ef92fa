"""Numbered plain-SQL migrations (migrations/NNN_name.sql), applied in order,
each once, each in its own transaction, recorded in schema_migrations.

Two `longcall migrate` at once are safe: both take one session-level advisory
lock on a dedicated connection (not a pooled one: asyncpg's pool reset would
unlock it), so the second waits, then finds nothing left to do.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
LOCK_KEY = 0x6C6F6E6763616C6C  # "longcall"
_NAME = re.compile(r"^(\d{3,})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file name must look like 001_name.sql: {path.name}")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError("two migration files share a version number")
    return sorted(found, key=lambda m: m.version)


# True when every migration up to $1 is applied (a database ahead of this
# code is fine too: a rolling deploy migrates first). A database never
# migrated has no schema_migrations: UndefinedTableError, also not current.
IS_CURRENT = "select coalesce(max(version), 0) >= $1 from schema_migrations"


def latest_version(directory: Path = MIGRATIONS_DIR) -> int:
    """The version the code expects the database at (0 for none)."""
    found = discover(directory)
    return found[-1].version if found else 0


async def migrate(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Apply what is pending; return what this call applied."""
    migrations = discover(directory)
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "longcall-migrate"})
    try:
        await conn.execute("select pg_advisory_lock($1)", LOCK_KEY)
        try:
            await conn.execute(
                "create table if not exists schema_migrations ("
                " version integer primary key, name text not null,"
                " applied_at timestamptz not null default now())")
            done = {r["version"] for r in await conn.fetch("select version from schema_migrations")}
            applied = []
            for m in migrations:
                if m.version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await conn.execute(
                        "insert into schema_migrations (version, name) values ($1, $2)",
                        m.version, m.name)
                applied.append(m)
            return applied
        finally:
            await conn.execute("select pg_advisory_unlock($1)", LOCK_KEY)
    finally:
        await conn.close()
