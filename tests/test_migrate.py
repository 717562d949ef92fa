"""Migrations: fresh apply, re-apply is a no-op, concurrent apply is safe."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import asyncpg
import pytest

from app.migrate import discover, migrate

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


async def _tables(dsn):
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("select tablename from pg_tables where schemaname = 'public' order by 1")
        versions = await conn.fetch("select version from schema_migrations order by 1")
        return [r[0] for r in rows], [r[0] for r in versions]
    finally:
        await conn.close()


async def test_fresh_apply_then_reapply_is_a_noop(empty_db):
    applied = await migrate(empty_db)
    assert [m.version for m in applied] == [m.version for m in discover()]
    tables, versions = await _tables(empty_db)
    assert {"owners", "api_keys", "jobs", "ledger", "assets", "outbox", "schema_migrations"} <= set(tables)
    assert await migrate(empty_db) == []
    assert (await _tables(empty_db))[1] == versions


async def test_concurrent_apply_is_safe(empty_db):
    results = await asyncio.gather(*[migrate(empty_db) for _ in range(5)])
    assert sorted(len(r) for r in results) == [0, 0, 0, 0, len(discover())]
    _, versions = await _tables(empty_db)
    assert versions == [m.version for m in discover()]


def test_concurrent_migrate_commands(empty_db):
    env = {"DATABASE_URL": empty_db, "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-m", "app", "migrate"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sorted(o[0].splitlines()[0] for o in outs) == \
        ["applied 0 migration(s)"] * 2 + [f"applied {len(discover())} migration(s)"]


async def test_a_failing_migration_applies_nothing_of_itself(empty_db, tmp_path):
    (tmp_path / "001_ok.sql").write_text("create table a (x int);")
    (tmp_path / "002_bad.sql").write_text("create table b (x int); select * from no_such_table;")
    with pytest.raises(asyncpg.UndefinedTableError):
        await migrate(empty_db, tmp_path)
    tables, versions = await _tables(empty_db)
    assert "a" in tables and "b" not in tables and versions == [1]


def test_a_command_on_a_database_never_migrated_says_to_migrate(empty_db):
    for args in (("status",), ("sweep", "--once"), ("owners", "create", "x")):
        p = subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "DATABASE_URL": empty_db},
                           timeout=60)
        assert p.returncode == 1 and "run longcall migrate" in p.stderr, (args, p.stderr)
        assert p.stderr.strip().count("\n") == 0
