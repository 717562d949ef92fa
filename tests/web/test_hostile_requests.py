"""What an attacker can send the HTTP edge, over real HTTP against a real
PostgreSQL: hostile JSON and query values are a 400 naming the field (never
a 500, never a traceback); odd paths neither alias an output nor grow the
metrics; 405s say what is allowed; a trailing slash is no open redirect."""
from __future__ import annotations

import base64
import json
import logging
import secrets

import pytest
from prometheus_client import REGISTRY

from app.vocabulary import JobStatus
from tests.web.raw_http import raw_request

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}
DEEP = 1000


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def problems():
    """Warnings and errors logged while the test runs (a 500 logs one, and
    uvicorn logs a traceback for anything that escapes the app)."""
    handler = Records()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)


async def job_rows(db) -> int:
    return await db.fetchval("select count(*) from jobs")


def body_with(**fields) -> bytes:
    return json.dumps({**JOB, **fields}).encode()


# Each is written as raw JSON text: the escapes are what a client sends.
HOSTILE_CREATES = [
    ("NUL in input", b'{"provider": "sim", "model": "m", "input": {"p": "a\\u0000b"}, "max_credits": 1}',
     "input.p must not contain NUL"),
    ("NUL in an input key", b'{"provider": "sim", "model": "m", "input": {"\\u0000": 1}, "max_credits": 1}',
     "a field name in input must not contain NUL"),
    ("NUL in model", b'{"provider": "sim", "model": "m\\u0000", "input": {}, "max_credits": 1}',
     "model must not contain NUL"),
    ("NUL in provider", b'{"provider": "\\u0000", "model": "m", "input": {}, "max_credits": 1}',
     "provider must not contain NUL"),
    ("lone high surrogate in input", b'{"provider": "sim", "model": "m", "input": {"p": "\\ud800"}, "max_credits": 1}',
     "input.p must not contain lone UTF-16 surrogates"),
    ("lone low surrogate in model", b'{"provider": "sim", "model": "\\udfff", "input": {}, "max_credits": 1}',
     "model must not contain lone UTF-16 surrogates"),
    ("lone surrogate in an unknown field's name",
     b'{"provider": "sim", "model": "m", "input": {}, "max_credits": 1, "\\ud800": 1}',
     "a field name in the request body must not contain lone UTF-16 surrogates"),
    ("nesting 1,000 deep in input",
     b'{"provider": "sim", "model": "m", "input": {"p": ' + b"[" * DEEP + b"]" * DEEP + b'}, "max_credits": 1}',
     "input nests deeper than 64 levels"),
    ("nesting 100,000 deep", b'{"provider": "sim", "model": "m", "input": {"p": ' + b"[" * 100_000
     + b"]" * 100_000 + b'}, "max_credits": 1}', "input nests deeper than 64 levels"),
    ("nesting 100 deep", b'{"provider": "sim", "model": "m", "input": {"p": ' + b"[" * 100 + b"]" * 100
     + b'}, "max_credits": 1}', "input.p[0][0]"),
    ("1e999 in input", b'{"provider": "sim", "model": "m", "input": {"p": 1e999}, "max_credits": 1}',
     "input.p must be a finite number"),
    ("-1e999 in a list in input", b'{"provider": "sim", "model": "m", "input": {"p": [0, -1e999]}, "max_credits": 1}',
     "input.p[1] must be a finite number"),
    ("1e999 as max_credits", b'{"provider": "sim", "model": "m", "input": {}, "max_credits": 1e999}',
     "max_credits must be a finite number"),
    ("max_credits over 10^12", body_with(max_credits=10**12 + 1), "max_credits must be between 1 and"),
]


@pytest.mark.parametrize("name,body,message", HOSTILE_CREATES, ids=[c[0] for c in HOSTILE_CREATES])
async def test_hostile_json_is_a_400_naming_the_field(web, make_owner, db, problems, name, body, message):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and message in r.json()["error"]["message"]
    assert await job_rows(db) == 0
    assert problems == []


async def test_the_limits_themselves_are_accepted(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=10**12)
    deepest = 62  # levels 3..64 under the body (1) and input (2)
    body = {**JOB, "input": {"p": json.loads("[" * deepest + "]" * deepest)}, "max_credits": 10**12}
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k" * 255})
        assert r.status_code == 202, r.text
        # a surrogate *pair* is one character, stored and echoed as such
        r = await c.post("/v1/jobs", content=b'{"provider": "sim", "model": "m", "input": {"e": "\\ud83d\\ude00"},'
                         b' "max_credits": 1}', headers={"content-type": "application/json"})
        assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_credits"  # all reserved above


async def test_hostile_admin_resolve_body_is_a_400(web, make_owner, db, problems):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
    await db.execute("update jobs set status = $2 where id = $1", job_id, JobStatus.UNCERTAIN)
    async with server.client("test-admin-token") as admin:
        for body, message in ((b'{"provider_task_id": "t\\u0000"}', "provider_task_id must not contain NUL"),
                              (b'{"provider_task_id": "\\udc00"}', "provider_task_id must not contain lone"),
                              (b'{"outcome": "failed", "x": 1e999}', "x must be a finite number"),
                              # a line break in a task id: refused as the console and the CLI refuse it
                              (b'{"provider_task_id": "ab\\ncd"}', 'body must be {"provider_task_id": "..."}'),
                              (b'{"provider_task_id": "ab\\tcd"}', 'body must be {"provider_task_id": "..."}')):
            r = await admin.post(f"/v1/admin/jobs/{job_id}/resolve", content=body)
            assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert await db.fetchval("select status from jobs where id = $1", job_id) == JobStatus.UNCERTAIN
    assert problems == []


def cursor_of(created_at: str, job_id: str = "job_0123456789abcdef01234567") -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, job_id]).encode()).decode().rstrip("=")


@pytest.mark.parametrize("params", [
    {"cursor": cursor_of("0001-01-01T00:00:00+14:00")},
    {"cursor": cursor_of("9999-12-31T23:59:59-14:00")},
    {"cursor": cursor_of("0001-01-01T00:00:00+00:00")},
    {"cursor": base64.urlsafe_b64encode(b"[" * 3000).decode()},
    {"cursor": "a\x00"},
    {"status": "queued\x00"},
    {"limit": "\x00"},
    {"limit": "1" * 5000},
    {"limit": "\u0661"},
    {"limit": ""},
    {"cursor": "x" * 5000},
], ids=lambda p: repr(p)[:40])
async def test_hostile_list_queries_are_a_400(web, make_owner, db, problems, params):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.get("/v1/jobs", params=params)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    assert problems == []


async def test_hostile_read_queries(web, make_owner, db, problems):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
        for wait in ("nan", "inf", "-1", "31", "\x00", "1" * 5000):
            r = await c.get(f"/v1/jobs/{job_id}", params={"wait": wait})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", wait
    async with server.client() as anon:
        for token in ("\x00", "a" * 5000, "\u00e9"):
            assert (await anon.get(f"/v1/jobs/{job_id}", params={"token": token})).status_code == 404
    assert problems == []


async def test_idempotency_key_surrounding_whitespace_is_the_same_key(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    body = json.dumps(JOB).encode()

    async def create(key: bytes) -> tuple[int, dict]:
        # Raw bytes: HTTP clients refuse to send trailing whitespace in a header.
        status, _, content = await raw_request(
            server.url, b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + owner.api_key.encode() + b"\r\nIdempotency-Key: " + key, body)
        return status, json.loads(content)

    first_status, first = await create(b"key-1")
    again_status, again = await create(b"key-1 \t ")
    assert (first_status, again_status) == (202, 200) and again["id"] == first["id"]
    for bad in ("caf\u00e9".encode("latin-1"), b"x" * 256, b"\t"):
        status, answer = await create(bad)
        assert status == 400 and "Idempotency-Key" in answer["error"]["message"], bad
    assert await job_rows(db) == 1


async def test_405_says_what_is_allowed(web, db):
    server = await web()
    async with server.client() as c:
        for method, path, allow in (("DELETE", "/v1/jobs", "GET, HEAD, POST"),
                                    ("PUT", "/v1/jobs/job_0123456789abcdef01234567", "GET, HEAD, OPTIONS"),
                                    ("GET", "/v1/jobs/job_0123456789abcdef01234567/cancel", "POST"),
                                    ("POST", "/healthz", "GET, HEAD")):
            r = await c.request(method, path)
            assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
            assert r.headers["allow"] == allow, (method, path)


async def test_trailing_slash_is_a_404_not_a_redirect_to_the_given_host(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        for path in ("/v1/jobs/", "/v1/account/", "/healthz/"):
            r = await c.get(path, headers={"Host": "evil.example"})
            assert r.status_code == 404 and "location" not in r.headers, path
            assert r.json()["error"]["code"] == "not_found"


async def test_output_index_has_one_spelling(web, make_owner, db, tmp_objects):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
        key = f"outputs/{owner.owner_id}/{job_id}/0"
        (tmp_objects / "outputs" / owner.owner_id / job_id).mkdir(parents=True)
        (tmp_objects / key).write_bytes(b"png!")
        await db.execute("insert into assets (job_id, index, storage_key, bytes, sha256, content_type)"
                         " values ($1, 0, $2, 4, $3, 'image/png')", job_id, key, "0" * 64)
        assert (await c.get(f"/v1/jobs/{job_id}/outputs/0")).content == b"png!"
        for alias in ("+0", "-0", "00", "01", "%D9%A0", "%EF%BC%90", "0_0", "%200", "0%20"):
            r = await c.get(f"/v1/jobs/{job_id}/outputs/{alias}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", alias


def http_series() -> set[tuple]:
    return {tuple(sorted(s.labels.items())) for metric in REGISTRY.collect()
            if metric.name == "longcall_http_requests" for s in metric.samples if s.name.endswith("_total")}


async def test_random_paths_and_methods_add_at_most_one_series(web, db):
    server = await web()
    async with server.client() as c:
        await c.get("/nope")  # the one series unmatched paths share
        await c.request("BREW", "/nope")
        before = http_series()
        for i in range(1000):
            prefix = ("/v1/", "/webhooks/", "/", "/v1/jobs/job_0123456789abcdef01234567/")[i % 4]
            method = ("GET", "POST", "BREW", f"X{i}")[i % 4] if i % 8 else "GET"
            r = await c.request(method, prefix + secrets.token_hex(8))
            assert r.status_code in (400, 404, 405), r.status_code
    assert len(http_series() - before) <= 1
