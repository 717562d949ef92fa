"""The `longcall` command: owners, keys, grants, errors as one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(migrated, db):
    def run(*args, env=None, ok=True):
        base = {"PATH": os.environ["PATH"], "DATABASE_URL": migrated, "PYTHONPATH": str(REPO)}
        base.update(env or {})
        p = subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, env=base,
                           capture_output=True, text=True, timeout=60)
        if ok:
            assert p.returncode == 0, p.stderr
        return p
    return run


def test_owners_keys_and_grants(run, db):
    out = json.loads(run("owners", "create", "acme", "--credits", "50", "--max-active", "3", "--json").stdout)
    assert set(out) == {"owner_id", "api_key"} and out["api_key"].startswith("lc_")
    owner = out["owner_id"]
    run("owners", "grant", owner, "25")
    second = json.loads(run("keys", "create", owner, "--json").stdout)["api_key"]
    assert second != out["api_key"]
    run("keys", "revoke", second[:12])
    p = run("keys", "revoke", second[:12], ok=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    text = run("owners", "create", "plain").stdout
    assert "api_key:" in text and "owner_id:" in text


async def test_numbers_after_commands(run, db):
    owner = json.loads(run("owners", "create", "acme", "--credits", "50", "--json").stdout)["owner_id"]
    run("owners", "grant", owner, "25")
    row = await db.fetchrow("select * from owners where id = $1", owner)
    assert (row["granted"], row["balance"], row["max_active"]) == (75, 75, 10)
    assert await db.fetchval("select sum(amount) from ledger where owner_id = $1 and kind = 'grant'", owner) == 75
    # keys are stored hashed, never in clear
    key = json.loads(run("keys", "create", owner, "--json").stdout)["api_key"]
    stored = await db.fetch("select prefix, key_hash from api_keys where owner_id = $1", owner)
    assert all(key.encode() not in bytes(r["key_hash"]) and r["prefix"] != key for r in stored)


async def test_a_platform_owner_is_made_by_its_flag(run, db):
    platform = json.loads(run("owners", "create", "my app", "--platform", "--json").stdout)["owner_id"]
    plain = json.loads(run("owners", "create", "acme", "--json").stdout)["owner_id"]
    rows = dict(await db.fetch("select id, is_platform from owners"))
    assert rows == {platform: True, plain: False}


@pytest.mark.parametrize("args,code", [
    (("owners", "grant", "own_000000000000000000000000", "5"), 1),
    (("owners", "grant", "own_x", "-5"), 1),
    (("owners", "create", "x", "--credits", "lots"), 2),
    (("keys", "revoke", "lc_nope"), 1),
    (("jobs", "resolve", "job_000000000000000000000000", "--failed"), 1),
    (("jobs", "resolve", "nope", "--failed"), 1),
    (("jobs", "resolve", "job_000000000000000000000000"), 2),
    (("frobnicate",), 2),
])
def test_bad_arguments_are_one_line_errors(run, args, code):
    p = run(*args, ok=False)
    assert p.returncode == code, (p.stdout, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("args", [
    ("serve", "--port", "99999"),
    ("serve", "--port", "0"),
    ("serve", "--port", "http"),
    ("settler", "--metrics-port", "70000"),
    ("sim", "--port", "65536"),
])
def test_a_port_out_of_range_is_a_one_line_error(run, args):
    """Refused before anything starts (the configuration is valid here)."""
    p = run(*args, env={"SECRET_KEY": "x" * 20}, ok=False)
    assert p.returncode == 2 and "port" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0


def test_the_port_setting_is_checked_at_start(run):
    p = run("serve", env={"SECRET_KEY": "x" * 20, "PORT": "70000"}, ok=False)
    assert p.returncode == 2 and "PORT must be at most 65535" in p.stderr, p.stderr


def test_a_header_timeout_that_is_no_number_is_one_line_not_a_traceback(run):
    # (It was read as the module loaded, before serve's own check.)
    p = run("serve", env={"SECRET_KEY": "x" * 20, "HEADER_TIMEOUT_S": "abc"}, ok=False)
    assert p.returncode == 2 and "HEADER_TIMEOUT_S must be a number" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


@pytest.mark.parametrize("env,needle", [
    ({"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"}, "cannot"),
    ({"DATABASE_URL": ""}, "DATABASE_URL is required"),
    ({"DATABASE_URL": "mysql://x"}, "postgresql://"),
    ({"DATABASE_URL": "postgresql://[bad"}, "postgresql://"),
    ({"DATABASE_URL": "postgresql://u:pw@127.0.0.1:notaport/x"}, "postgresql://"),
    ({"DATABASE_URL": "postgresql://nobody:pw@127.0.0.1:1/x?sslmode=bogus"}, "cannot connect to the database"),
])
def test_unreachable_or_missing_database(run, env, needle):
    for args in (("migrate",), ("owners", "create", "x"), ("status",), ("sweep", "--once"),
                 ("serve", "--port", "1"), ("settler",)):
        p = run(*args, env={**env, "SECRET_KEY": "x" * 20}, ok=False)
        assert p.returncode != 0 and needle in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
        assert p.stderr.strip().count("\n") == 0 and "pw" not in p.stderr


@pytest.mark.parametrize("env,needle", [
    ({}, "SECRET_KEY is required"),
    ({"SECRET_KEY": "short"}, "SECRET_KEY must be at least 16"),
    ({"SECRET_KEY": "x" * 20, "STORAGE_URL": "ftp://x"}, "STORAGE_URL must be file:// or s3://"),
    ({"SECRET_KEY": "x" * 20, "PUBLIC_URL": "http://example.com"}, "PUBLIC_URL must be https"),
    ({"SECRET_KEY": "x" * 20, "SWEEP_INTERVAL_S": "soon"}, "SWEEP_INTERVAL_S must be a number"),
    ({"SECRET_KEY": "x" * 20, "LOG_LEVEL": "LOUD"}, "LOG_LEVEL"),
    ({"SECRET_KEY": "x" * 20, "PUBLIC_URL": "https://[bad"}, "PUBLIC_URL must be an origin"),
    ({"SECRET_KEY": "x" * 20, "NOTIFY_ALLOWED_ORIGINS": "http://[bad"}, "NOTIFY_ALLOWED_ORIGINS"),
    ({"SECRET_KEY": "x" * 20, "GIVE_UP_AFTER_S": "nan"}, "GIVE_UP_AFTER_S must be a number of seconds"),
    ({"SECRET_KEY": "x" * 20, "SETTLER_LEASE_S": "inf"}, "SETTLER_LEASE_S must be a number of seconds"),
    ({"SECRET_KEY": "x" * 20, "S3_ENDPOINT_URL": "not a url"}, "S3_ENDPOINT_URL must be an http(s) URL"),
    # a mistyped provider: a setting that would never apply
    ({"SECRET_KEY": "x" * 20, "GIVE_UP_AFTER_S_REPLICAT": "60"}, "GIVE_UP_AFTER_S_REPLICAT names no provider"),
    ({"SECRET_KEY": "x" * 20, "MAX_IN_FLIGHT_replicate": "2"}, "MAX_IN_FLIGHT_replicate names no provider"),
])
def test_configuration_is_checked_at_start(run, env, needle):
    for args in (("serve", "--port", "1"), ("settler",)):
        p = run(*args, env=env, ok=False)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.strip().count("\n") == 0


# Bytes that are not UTF-8 (a Latin-1 é) reach Python as a lone surrogate.
NOT_UTF8 = "\udce9"


@pytest.mark.parametrize("args", [
    ("keys", "revoke", "lc_ABCDEFGHIJ" + NOT_UTF8),
    ("owners", "create", "caf" + NOT_UTF8),
    ("sim", "--host", NOT_UTF8, "--port", "1"),
])
def test_an_argument_not_utf8_is_one_line(run, args):
    p = run(*args, env={"SECRET_KEY": "x" * 20}, ok=False)
    assert p.returncode == 2 and p.stderr.strip() == "longcall: an argument is not valid UTF-8", p.stderr


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "ADMIN_TOKEN", "FAL_KEY"])
def test_a_setting_not_utf8_is_named_and_never_quoted(run, migrated, name):
    values = {"SECRET_KEY": "s3cr3t-value-" + NOT_UTF8 + "-0123456789", "DATABASE_URL": migrated + NOT_UTF8,
              "ADMIN_TOKEN": "adm1n-" + NOT_UTF8, "FAL_KEY": "fal-" + NOT_UTF8}
    for args in (("serve", "--port", "1"), ("settler",), ("migrate",), ("status",)):
        p = run(*args, env={"SECRET_KEY": "x" * 20, name: values[name]}, ok=False)
        assert p.returncode == 2 and p.stderr.strip() == f"longcall: {name} is not valid UTF-8", (args, p.stderr)

@pytest.mark.parametrize("args,message", [
    (("owners", "create", "x", "--credits", str(10**12 + 1)), "--credits must be a whole number from 0 to"),
    (("owners", "create", "x", "--max-active", "99999999999999"), "--max-active must be a whole number from 0"),
    (("owners", "create", "   "), "NAME must be 1 to 200 printable characters, not blank"),
    (("jobs", "resolve", "job_000000000000000000000000", "--task-id", "   "), "a provider task id is 1 to 500"),
    (("jobs", "resolve", "job_000000000000000000000000", "--task-id", "x" * 501), "a provider task id is 1 to 500"),
    (("jobs", "resolve", "job_000000000000000000000000", "--task-id", "ab\ncd"), "a provider task id is 1 to 500"),
])
def test_values_out_of_range_say_what_range(run, db, args, message):
    p = run(*args, ok=False)
    assert p.returncode == 1 and message in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


async def test_a_grant_past_the_limit_moves_nothing(run, db):
    owner = json.loads(run("owners", "create", "acme", "--credits", str(10**12), "--json").stdout)["owner_id"]
    p = run("owners", "grant", owner, "99999999999999999999999", ok=False)
    assert p.returncode == 1 and "N must be a whole number of credits from 1 to" in p.stderr, p.stderr
    assert await db.fetchval("select granted from owners where id = $1", owner) == 10**12


async def test_a_mistyped_whole_key_revokes_nothing(run, db):
    key = json.loads(run("owners", "create", "acme", "--json").stdout)["api_key"]
    wrong = key[:12] + ("A" if key[12] != "A" else "B") + key[13:]
    for given in (wrong, key + "x"):
        p = run("keys", "revoke", given, ok=False)
        assert p.returncode == 1 and "no active key is that key" in p.stderr, p.stderr
        assert key not in p.stderr and wrong not in p.stderr
    assert await db.fetchval("select count(*) from api_keys where revoked_at is null") == 1
    run("keys", "revoke", key)  # the whole key, right: revoked
    assert await db.fetchval("select count(*) from api_keys where revoked_at is null") == 0


def test_a_port_in_use_is_one_line(run):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = run("serve", "--host", "127.0.0.1", "--port", str(port), env={"SECRET_KEY": "x" * 20}, ok=False)
    assert p.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0
    p = run("serve", "--host", "no such host.invalid", "--port", "8000", env={"SECRET_KEY": "x" * 20}, ok=False)
    assert p.returncode == 1 and "no such address" in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


def test_status_is_one_screen(run, db):
    owner = json.loads(run("owners", "create", "acme", "--credits", "50", "--json").stdout)["owner_id"]
    assert owner
    out = run("status").stdout
    assert out.startswith("jobs:") and "settlers: 0 connected" in out and "uncertain jobs: 0" in out
    assert "notifications: 0 deliveries pending, 0 failed" in out
    assert len(out.splitlines()) < 25


def test_sweep_once_with_nothing_in_flight(run, db):
    out = run("sweep", "--once").stdout
    assert out.startswith("sweep: 0 submit and 0 settle intents queued")


async def test_revoked_key_stops_working_at_once(run, db, web):
    server = await web()
    out = json.loads(run("owners", "create", "acme", "--credits", "5", "--json").stdout)
    async with server.client(out["api_key"]) as c:
        assert (await c.get("/v1/account")).status_code == 200
        assert run("keys", "revoke", out["api_key"][:3], ok=False).returncode == 1  # too short to name a key
        run("keys", "revoke", out["api_key"][:8])
        r = await c.get("/v1/account")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
