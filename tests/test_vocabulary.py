"""The database speaks the vocabulary of app/vocabulary.py: the migration's
CHECK constraints and the status-set index predicates, read back from
PostgreSQL itself, hold exactly the module's sets. A status, kind or set
changed on one side only fails here."""
from __future__ import annotations

import re
import subprocess
import sys

from app.vocabulary import (
    ALL_STATUSES,
    IN_FLIGHT,
    NEEDS_A_HUMAN,
    REFUNDED,
    SUBMITTED,
    TERMINAL,
    IntentKind,
    LedgerKind,
    sql_list,
)

QUOTED = re.compile(r"'([a-z_]+)'::text")


async def _constraints(conn, table: str) -> list[str]:
    rows = await conn.fetch(
        "select pg_get_constraintdef(oid) as def from pg_constraint "
        "where conrelid = $1::regclass and contype = 'c' order by conname", table)
    return [r["def"] for r in rows]


def _sets(definition: str) -> list[set[str]]:
    """Every `IN (...)`/`= ANY (ARRAY[...])` list of text literals in a definition."""
    groups = re.findall(r"ARRAY\[([^\]]*)\]", definition)
    return [set(QUOTED.findall(g)) for g in groups]


async def test_job_status_check_is_the_vocabulary(pool):
    async with pool.acquire() as conn:
        defs = await _constraints(conn, "jobs")
    status_checks = [d for d in defs if d.startswith("CHECK ((status = ANY")]
    assert len(status_checks) == 1, defs
    assert _sets(status_checks[0]) == [set(ALL_STATUSES)]


async def test_money_checks_use_the_terminal_and_refunded_sets(pool):
    async with pool.acquire() as conn:
        defs = await _constraints(conn, "jobs")
    money = [d for d in defs if "credits_charged + credits_refunded" in d]
    assert len(money) == 1, defs
    assert _sets(money[0]) == [set(TERMINAL)]
    never_charged = [d for d in defs if "<> ALL" in d and "credits_charged = 0" in d]
    assert len(never_charged) == 1, defs
    assert _sets(never_charged[0]) == [set(REFUNDED)]


async def test_intent_and_ledger_kinds_are_the_vocabulary(pool):
    async with pool.acquire() as conn:
        outbox = await _constraints(conn, "outbox")
        ledger = await _constraints(conn, "ledger")
    kinds = [d for d in outbox if "kind = ANY" in d]
    assert [_sets(d) for d in kinds] == [[set(IntentKind)]]
    entries = [d for d in ledger if "kind = ANY" in d]
    assert [_sets(d) for d in entries] == [[set(LedgerKind)]]


async def test_submitted_index_predicate_is_the_submitted_set(pool):
    async with pool.acquire() as conn:
        indexdef = await conn.fetchval("select indexdef from pg_indexes where indexname = 'jobs_submitted'")
    assert indexdef is not None
    assert _sets(indexdef) == [set(SUBMITTED)]
    assert set(SUBMITTED) == set(IN_FLIGHT) - {"queued"}


async def test_in_flight_index_is_the_unfinished_jobs(pool):
    """Not a status list: a statement checking one job's status by its id
    would be planned through it (tests/outbox/test_hot_plans.py). The jobs
    it holds are the in-flight set's: the check below ties `finished_at` to
    the terminal statuses."""
    async with pool.acquire() as conn:
        indexdef = await conn.fetchval("select indexdef from pg_indexes where indexname = 'jobs_in_flight'")
        checks = await conn.fetchval("select string_agg(pg_get_constraintdef(oid), ' ') from pg_constraint "
                                     "where conrelid = 'jobs'::regclass and contype = 'c'")
    assert indexdef is not None and indexdef.endswith("WHERE (finished_at IS NULL)")
    assert "finished_at IS NOT NULL" in checks and "finished_at IS NULL" in checks


async def test_needs_a_human_index_predicate_is_the_needs_a_human_set(pool):
    async with pool.acquire() as conn:
        indexdef = await conn.fetchval("select indexdef from pg_indexes where indexname = 'jobs_needs_human'")
    assert indexdef is not None
    assert _sets(indexdef) == [set(NEEDS_A_HUMAN)]


def test_sets_partition_the_statuses():
    assert set(IN_FLIGHT) | set(TERMINAL) == set(ALL_STATUSES)
    assert not set(IN_FLIGHT) & set(TERMINAL)
    assert set(REFUNDED) < set(TERMINAL)


def test_sql_list_quotes_each_member():
    assert sql_list((IntentKind.SUBMIT, IntentKind.SETTLE)) == "('submit', 'settle')"


def test_the_literal_check_passes_and_would_catch_one(tmp_path):
    """tools/check_vocabulary.py is clean on the tree, and finds a status
    written out in a copy of a module."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    clean = subprocess.run([sys.executable, "tools/check_vocabulary.py"], cwd=root, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout
    (tmp_path / "app").mkdir()
    (tmp_path / "outbox").mkdir()
    (tmp_path / "app" / "vocabulary.py").write_text((root / "app" / "vocabulary.py").read_text())
    (tmp_path / "outbox" / "bad.py").write_text(
        '"""A docstring may say \'queued\'."""\n'
        'SQL = "select 1 from jobs where status = \'queued\'"\nKIND = "settle"\n')
    dirty = subprocess.run([sys.executable, str(root / "tools" / "check_vocabulary.py"), str(tmp_path)],
                           capture_output=True, text=True)
    assert dirty.returncode == 1
    assert "outbox/bad.py:2: literal 'queued'" in dirty.stdout
    assert "outbox/bad.py:3: literal 'settle'" in dirty.stdout
    assert "outbox/bad.py:1:" not in dirty.stdout
