"""The notification API over real HTTP against a real PostgreSQL: webhook
endpoints, the notifications list, redeliver — and a job's `metadata`.

Endpoint names are looked up by a fake resolver (create_app's
`endpoint_resolver`): no test asks real DNS. Deliveries go only to a
receiver on loopback whose origin is in NOTIFY_ALLOWED_ORIGINS."""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json

import pytest
import standardwebhooks

from app.signing.secretbox import SecretBox
from app.vocabulary import DEFAULT_EVENTS
from app.web import create_app
from tests.conftest import Served, serve_app
from tests.support.receiver import Receiver, RunningReceiver
from tests.support.waiting import wait_until

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}
HOOK = "https://hooks.example.com/longcall"
PUBLIC = "93.184.216.34"
TERMINAL_EVENTS = ["job.succeeded", "job.failed", "job.cancelled", "job.expired"]


class FakeDns:
    """Every name resolves to a public address unless told otherwise; an
    address resolves to itself (as getaddrinfo does)."""

    def __init__(self, answers: dict[str, list[str]] | None = None):
        self.answers = answers or {}

    async def __call__(self, host: str, port: int) -> list[str]:
        with contextlib.suppress(ValueError):
            return [str(ipaddress.ip_address(host))]
        return list(self.answers.get(host, [PUBLIC]))


@pytest.fixture
async def app_with(db, make_settings):
    """`await app_with(resolver=..., **settings)`: the web app over real HTTP."""
    started = []

    async def start(resolver=None, **overrides) -> Served:
        app = create_app(make_settings(**overrides), endpoint_resolver=resolver or FakeDns())
        server, task, url = await serve_app(app)
        started.append((server, task))
        return Served(url, app)

    yield start
    for server, task in started:
        server.should_exit = True
        await task



def error_code(response) -> str:
    return response.json()["error"]["code"]


async def count(db, table: str) -> int:
    return await db.fetchval(f"select count(*) from {table}")


async def cancelled_job(c) -> str:
    """A job created and cancelled at once: its notification (job.cancelled)
    is written by the cancel, no settler needed."""
    created = await c.post("/v1/jobs", json=JOB)
    assert created.status_code == 202, created.text
    cancelled = await c.post(f"/v1/jobs/{created.json()['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    return created.json()["id"]


# --- endpoints ----------------------------------------------------------------------------

async def test_the_secret_is_shown_once_and_stored_only_sealed(app_with, make_owner, db, make_settings):
    server = await app_with()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/webhook-endpoints", json={"url": HOOK})
        assert r.status_code == 201, r.text
        made = r.json()
        assert set(made) == {"id", "url", "events", "secret", "created_at"}
        assert made["id"].startswith("we_") and made["url"] == HOOK and made["secret"].startswith("whsec_")
        assert made["events"] == TERMINAL_EVENTS == list(DEFAULT_EVENTS)
        listed = (await c.get("/v1/webhook-endpoints")).json()
        assert listed == {"webhook_endpoints": [{k: v for k, v in made.items() if k != "secret"}]}
    stored = await db.fetchval("select secret from webhook_endpoints where id = $1", made["id"])
    # Booleans only: a failing assert must not print the secret.
    plain = made["secret"].encode()
    in_the_clear = plain in stored or made["secret"].removeprefix("whsec_").encode() in stored
    assert not in_the_clear, "the endpoint's secret is stored in the clear"
    # sealed under SECRET_KEY for this endpoint: it opens to the secret shown
    opens = SecretBox(make_settings().secret_keys).decrypt(stored, made["id"]) == made["secret"]
    assert opens, "the stored secret does not open to the one shown"


async def test_named_events_are_kept_once_each_in_order(app_with, make_owner, db):
    server = await app_with()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/webhook-endpoints",
                         json={"url": HOOK, "events": ["job.running", "job.failed", "job.running"]})
        assert r.status_code == 201, r.text
        assert r.json()["events"] == ["job.running", "job.failed"]
        r = await c.post("/v1/webhook-endpoints", json={"url": HOOK, "events": None})
        assert r.status_code == 201 and r.json()["events"] == TERMINAL_EVENTS


@pytest.mark.parametrize("body", [
    {"url": HOOK, "events": ["job.finished"]},
    {"url": HOOK, "events": ["job.succeeded", "succeeded"]},
    {"url": HOOK, "events": []},
    {"url": HOOK, "events": "job.succeeded"},
    {"url": HOOK, "events": [1]},
    {"url": HOOK, "events": {"job.succeeded": True}},
    {"url": HOOK, "secret": "whsec_mine"},  # an unknown field
    {"events": ["job.succeeded"]},  # no url
    {"url": 17},
])
async def test_a_bad_body_is_400_and_stores_nothing(app_with, make_owner, db, body):
    server = await app_with()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/webhook-endpoints", json=body)
    assert r.status_code == 400 and error_code(r) == "invalid_request", r.text
    assert await count(db, "webhook_endpoints") == 0


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/hook",  # loopback, its origin not allowed
    "https://127.0.0.1/hook",
    "https://10.0.0.1/hook",
    "https://169.254.169.254/latest/meta-data/",
    "https://[::ffff:10.0.0.1]/hook",
    "https://localhost/hook",
    "http://hooks.example.com/hook",  # plain http to a public host
    "https://inside.example.com/hook",  # a name that resolves to loopback
    "https://mixed.example.com/hook",  # ... or to a private address among public ones
    "https://hooks.example.com/hook#frag",
    "ftp://hooks.example.com/hook",
])
async def test_a_refused_url_is_400_and_stores_nothing(app_with, make_owner, db, url):
    dns = FakeDns({"inside.example.com": ["127.0.0.1"], "mixed.example.com": [PUBLIC, "192.168.0.7"]})
    # Another origin on loopback is allowed: the rule is the exact origin, not "loopback is fine".
    server = await app_with(resolver=dns, NOTIFY_ALLOWED_ORIGINS="http://127.0.0.1:1")
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/webhook-endpoints", json={"url": url.format(port=server.url.rsplit(":", 1)[1])})
    assert r.status_code == 400 and error_code(r) == "invalid_request", r.text
    assert await count(db, "webhook_endpoints") == 0


async def test_an_allowed_origin_may_be_loopback_over_http(app_with, make_owner, db):
    server = await app_with(NOTIFY_ALLOWED_ORIGINS="http://127.0.0.1:8999")
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        assert (await c.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:8999/in"})).status_code == 201
        r = await c.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:8998/in"})
        assert r.status_code == 400 and error_code(r) == "invalid_request"
    assert await count(db, "webhook_endpoints") == 1


async def test_endpoints_are_the_owners_own(app_with, make_owner, db):
    server = await app_with()
    alice, bob = await make_owner(name="alice"), await make_owner(name="bob")
    async with server.client(alice.api_key) as a, server.client(bob.api_key) as b:
        made = (await a.post("/v1/webhook-endpoints", json={"url": HOOK})).json()
        assert (await b.get("/v1/webhook-endpoints")).json() == {"webhook_endpoints": []}
        r = await b.delete(f"/v1/webhook-endpoints/{made['id']}")
        assert r.status_code == 404 and error_code(r) == "not_found"
        assert [e["id"] for e in (await a.get("/v1/webhook-endpoints")).json()["webhook_endpoints"]] == [made["id"]]
        assert (await a.delete(f"/v1/webhook-endpoints/{made['id']}")).status_code == 204
        assert (await a.get("/v1/webhook-endpoints")).json() == {"webhook_endpoints": []}
        assert (await a.delete(f"/v1/webhook-endpoints/{made['id']}")).status_code == 404
        assert (await a.delete("/v1/webhook-endpoints/we_nothing")).status_code == 404
        assert (await a.delete("/v1/webhook-endpoints/we_" + "0" * 24)).status_code == 404
    async with server.client() as anon:
        assert (await anon.get("/v1/webhook-endpoints")).status_code == 401
        assert (await anon.post("/v1/webhook-endpoints", json={"url": HOOK})).status_code == 401
    assert await count(db, "webhook_endpoints") == 1  # deleted is kept (its deliveries name it)


async def test_an_owner_has_at_most_20_endpoints(app_with, make_owner, db):
    server = await app_with()
    alice, bob = await make_owner(name="alice"), await make_owner(name="bob")
    async with server.client(alice.api_key) as a, server.client(bob.api_key) as b:
        made = []
        for n in range(20):
            r = await a.post("/v1/webhook-endpoints", json={"url": f"{HOOK}/{n}"})
            assert r.status_code == 201, (n, r.text)
            made.append(r.json()["id"])
        r = await a.post("/v1/webhook-endpoints", json={"url": f"{HOOK}/20"})
        assert r.status_code == 400 and error_code(r) == "invalid_request"
        assert (await b.post("/v1/webhook-endpoints", json={"url": HOOK})).status_code == 201  # per owner
        assert (await a.delete(f"/v1/webhook-endpoints/{made[0]}")).status_code == 204
        assert (await a.post("/v1/webhook-endpoints", json={"url": f"{HOOK}/20"})).status_code == 201
        assert len((await a.get("/v1/webhook-endpoints")).json()["webhook_endpoints"]) == 20


# --- notifications --------------------------------------------------------------------------

async def test_notifications_page_newest_first_and_filter_by_job(app_with, make_owner, db):
    server = await app_with()
    alice, bob = await make_owner(name="alice"), await make_owner(name="bob")
    async with server.client(alice.api_key) as a, server.client(bob.api_key) as b:
        endpoint = (await a.post("/v1/webhook-endpoints", json={"url": HOOK})).json()
        job_ids = [await cancelled_job(a) for _ in range(5)]
        pages, cursor = [], None
        while True:
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            r = await a.get("/v1/notifications", params=params)
            assert r.status_code == 200, r.text
            pages.append(r.json()["notifications"])
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [n for p in pages for n in p]
        assert [n["job_id"] for n in listed] == job_ids[::-1]
        assert len({n["id"] for n in listed}) == 5 and all(n["id"].startswith("evt_") for n in listed)
        first = listed[0]
        assert set(first) == {"id", "type", "job_id", "created_at", "deliveries"}
        assert first["type"] == "job.cancelled"
        assert first["deliveries"] == [{"endpoint_id": endpoint["id"], "status": "pending", "attempts": 0,
                                        "last_status_code": None, "last_attempt_at": None}]
        # one page of everything is the same list
        whole = (await a.get("/v1/notifications", params={"limit": 100})).json()
        assert whole["notifications"] == listed and whole["next_cursor"] is None

        r = await a.get("/v1/notifications", params={"job_id": job_ids[2]})
        assert [n["job_id"] for n in r.json()["notifications"]] == [job_ids[2]]
        other = "job_" + "0" * 24
        assert (await a.get("/v1/notifications", params={"job_id": other})).json()["notifications"] == []
        for bad in ({"job_id": "job_123"}, {"job_id": job_ids[0] + "0"}, {"limit": 0}, {"limit": 101},
                    {"limit": "ten"}, {"cursor": "not-a-cursor"}, {"status": "pending"}):
            r = await a.get("/v1/notifications", params=bad)
            assert r.status_code == 400 and error_code(r) == "invalid_request", (bad, r.text)

        # another owner sees none of them, even by job id
        assert (await b.get("/v1/notifications")).json() == {"notifications": [], "next_cursor": None}
        assert (await b.get("/v1/notifications", params={"job_id": job_ids[0]})).json()["notifications"] == []
    async with server.client() as anon:
        assert (await anon.get("/v1/notifications")).status_code == 401


async def test_no_endpoint_for_the_event_writes_no_notification(app_with, make_owner, db):
    server = await app_with()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        await c.post("/v1/webhook-endpoints", json={"url": HOOK, "events": ["job.succeeded"]})
        await cancelled_job(c)
        assert (await c.get("/v1/notifications")).json()["notifications"] == []
    assert await count(db, "notifications") == 0 and await count(db, "deliveries") == 0


async def test_redeliver_a_delivered_notification_sends_it_again_under_the_same_id(app_with, make_owner, db,
                                                                                  make_settings, start_settler):
    with RunningReceiver(Receiver()) as rx:
        env = {"NOTIFY_ALLOWED_ORIGINS": rx.origin}
        server = await app_with(**env)
        owner = await make_owner()
        async with server.client(owner.api_key) as c:
            endpoint = (await c.post("/v1/webhook-endpoints", json={"url": rx.url})).json()
            job_id = await cancelled_job(c)
            await start_settler(make_settings(**env), concurrency=4)

            async def delivery():
                [n] = (await c.get("/v1/notifications")).json()["notifications"]
                return n, n["deliveries"][0]

            async def delivered_times(times: int) -> bool:
                _, d = await delivery()
                return d["status"] == "delivered" and len(rx.receiver.received) == times

            await wait_until(lambda: delivered_times(1), what="the first delivery")
            notification, first = await delivery()
            assert first["attempts"] == 1 and first["last_status_code"] == 204
            r = await c.post(f"/v1/notifications/{notification['id']}/redeliver")
            assert r.status_code == 202, r.text
            assert r.json()["id"] == notification["id"] and r.json()["job_id"] == job_id
            await wait_until(lambda: delivered_times(2), what="the second delivery")
            await asyncio.sleep(1.0)  # a third would have come by now
            assert len(rx.receiver.received) == 2
            assert rx.receiver.ids() == [notification["id"], notification["id"]]
            for got in rx.receiver.received:
                verified = standardwebhooks.Webhook(endpoint["secret"]).verify(got.body, got.headers)
                assert verified["id"] == notification["id"] and verified["data"]["id"] == job_id
            _, again = await delivery()
            assert again["status"] == "delivered" and again["attempts"] == 1
    assert await count(db, "notifications") == 1 and await count(db, "deliveries") == 1


async def test_redeliver_refuses_pending_and_others_and_unknown(app_with, make_owner, db):
    server = await app_with()
    alice, bob = await make_owner(name="alice"), await make_owner(name="bob")
    async with server.client(alice.api_key) as a, server.client(bob.api_key) as b:
        endpoint = (await a.post("/v1/webhook-endpoints", json={"url": HOOK})).json()
        await cancelled_job(a)
        [n] = (await a.get("/v1/notifications")).json()["notifications"]
        intents = await count(db, "outbox")
        r = await a.post(f"/v1/notifications/{n['id']}/redeliver")  # no settler: still pending
        assert r.status_code == 409 and error_code(r) == "invalid_state", r.text
        r = await b.post(f"/v1/notifications/{n['id']}/redeliver")
        assert r.status_code == 404 and error_code(r) == "not_found"
        for unknown in ("evt_" + "0" * 32, "evt_nope", "job_" + "0" * 24):
            r = await a.post(f"/v1/notifications/{unknown}/redeliver")
            assert r.status_code == 404 and error_code(r) == "not_found", unknown
        assert await count(db, "outbox") == intents  # nothing queued by any of them
        # A route that takes no body still caps it (CONTRACT: every request body), before anything else.
        big = b"x" * (1024 * 1024 + 1)
        r = await a.post(f"/v1/notifications/{n['id']}/redeliver", content=big)
        assert r.status_code == 413 and error_code(r) == "payload_too_large"
        r = await a.request("DELETE", f"/v1/webhook-endpoints/{endpoint['id']}", content=big)
        assert r.status_code == 413 and error_code(r) == "payload_too_large"
        assert (await a.get("/v1/webhook-endpoints")).json()["webhook_endpoints"][0]["id"] == endpoint["id"]
        assert await count(db, "outbox") == intents

        # its endpoint deleted, the pending delivery ends failed, and nothing is left to redeliver
        assert (await a.delete(f"/v1/webhook-endpoints/{endpoint['id']}")).status_code == 204
        [n] = (await a.get("/v1/notifications")).json()["notifications"]
        assert n["deliveries"][0]["status"] == "failed"
        r = await a.post(f"/v1/notifications/{n['id']}/redeliver")
        assert r.status_code == 409 and error_code(r) == "invalid_state"


# --- metadata on create -----------------------------------------------------------------------

def compact_size(value) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


async def test_metadata_is_echoed_and_defaults_to_an_empty_object(app_with, make_owner, db):
    server = await app_with()
    owner = await make_owner()
    metadata = {"order": "A-17", "user": {"id": 42, "tags": ["vip"]}, "note": "café"}
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json={**JOB, "metadata": metadata})
        assert r.status_code == 202, r.text
        with_meta = r.json()
        assert with_meta["metadata"] == metadata
        assert (await c.get(f"/v1/jobs/{with_meta['id']}")).json()["metadata"] == metadata
        plain = (await c.post("/v1/jobs", json=JOB)).json()
        assert plain["metadata"] == {}
        assert (await c.get(f"/v1/jobs/{plain['id']}")).json()["metadata"] == {}
        listed = {j["id"]: j["metadata"] for j in (await c.get("/v1/jobs")).json()["jobs"]}
        assert listed == {with_meta["id"]: metadata, plain["id"]: {}}
        async with server.client() as anon:  # the read token's view too
            assert (await anon.get(with_meta["status_url"])).json()["metadata"] == metadata


async def test_metadata_of_4_kib_is_kept_and_one_byte_more_is_400_with_nothing_created(app_with, make_owner, db):
    server = await app_with()
    owner = await make_owner(credits=100)
    exact = {"k": "x" * 4088}
    assert compact_size(exact) == 4096
    over = {"k": "x" * 4089}
    wide = {"k": "é" * 2045}  # 2045 characters, 4098 bytes of UTF-8
    assert compact_size(wide) > 4096 > len(json.dumps(wide, ensure_ascii=False))
    async with server.client(owner.api_key) as c:
        for metadata in (over, wide):
            r = await c.post("/v1/jobs", json={**JOB, "metadata": metadata})
            assert r.status_code == 400 and error_code(r) == "invalid_request", r.text
        assert await count(db, "jobs") == 0 and await count(db, "outbox") == 0
        assert await db.fetchval("select count(*) from ledger where kind <> 'grant'") == 0
        assert (await c.get("/v1/account")).json()["credits"]["balance"] == 100
        r = await c.post("/v1/jobs", json={**JOB, "metadata": exact})
        assert r.status_code == 202 and r.json()["metadata"] == exact


@pytest.mark.parametrize("metadata", [[], ["a"], "order A-17", 17, True, None])
async def test_metadata_that_is_not_an_object_is_400(app_with, make_owner, db, metadata):
    server = await app_with()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json={**JOB, "metadata": metadata})
    assert r.status_code == 400 and error_code(r) == "invalid_request", r.text
    assert await count(db, "jobs") == 0


async def test_metadata_is_part_of_the_idempotent_payload(app_with, make_owner, db):
    server = await app_with()
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        key = {"Idempotency-Key": "order-A-17"}
        first = await c.post("/v1/jobs", json={**JOB, "metadata": {"order": "A-17", "n": 1}}, headers=key)
        assert first.status_code == 202
        # the same object (its keys in another order) is the same payload
        again = await c.post("/v1/jobs", json={**JOB, "metadata": {"n": 1, "order": "A-17"}}, headers=key)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        assert again.json()["metadata"] == {"order": "A-17", "n": 1}
        for other in ({"order": "A-18", "n": 1}, {}, None):
            body = {**JOB, "metadata": other} if other is not None else JOB
            r = await c.post("/v1/jobs", json=body, headers=key)
            assert r.status_code == 409 and error_code(r) == "idempotency_conflict", (other, r.text)
    assert await count(db, "jobs") == 1


async def test_the_limit_of_20_holds_under_concurrent_creates(app_with, make_owner, db):
    """Twenty-five creates at once from an owner with 18 endpoints: two
    more at most, never a 21st (the limit is checked with the insert, as
    an owner's active slots are)."""
    server = await app_with()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        for n in range(18):
            assert (await c.post("/v1/webhook-endpoints", json={"url": f"{HOOK}/{n}"})).status_code == 201
        responses = await asyncio.gather(*[c.post("/v1/webhook-endpoints", json={"url": f"{HOOK}/more/{n}"})
                                           for n in range(25)])
    stored = await db.fetchval("select count(*) from webhook_endpoints where deleted_at is null")
    made = sum(r.status_code == 201 for r in responses)
    assert (made, stored) == (2, 20), f"{made} of 25 concurrent creates succeeded: the owner has {stored} endpoints"
    assert all(r.status_code in (201, 400) for r in responses)
