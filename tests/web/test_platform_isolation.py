"""Cross-platform isolation on every owner-scoped route: acting for an owner
outside the platform is the very answer an unknown owner gets, and changes
nothing; an owner's own key cannot act, and never sees its siblings."""
from __future__ import annotations

import pytest

from app.domain import owners

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}
NO_SUCH_OWNER = '{"error":{"code":"not_found","message":"no such owner"}}'
UNKNOWN = "own_" + "0" * 24


def routes(job_id: str, endpoint_id: str, notification_id: str) -> list[tuple[str, str, dict | None]]:
    """Every route that acts as an owner: (method, path, body)."""
    return [
        ("POST", "/v1/jobs", JOB),
        ("GET", "/v1/jobs", None),
        ("GET", f"/v1/jobs/{job_id}", None),
        ("POST", f"/v1/jobs/{job_id}/cancel", None),
        ("GET", f"/v1/jobs/{job_id}/outputs/0", None),
        ("GET", f"/v1/jobs/{job_id}/events", None),
        ("GET", "/v1/account", None),
        ("POST", "/v1/webhook-endpoints", {"url": "https://hooks.example.com/x"}),
        ("GET", "/v1/webhook-endpoints", None),
        ("DELETE", f"/v1/webhook-endpoints/{endpoint_id}", None),
        ("GET", "/v1/notifications", None),
        ("POST", f"/v1/notifications/{notification_id}/redeliver", None),
        ("GET", "/v1/models", None),
    ]


async def snapshot(db) -> tuple:
    return tuple([await db.fetchval(f"select count(*) from {t}") for t in
                  ("jobs", "ledger", "webhook_endpoints", "notifications", "deliveries", "outbox")]
                 + [tuple(await db.fetch("select id, balance, reserved, active from owners order by id"))])


@pytest.fixture
async def two_platforms(web, make_owner, db):
    served = await web()
    mine = await make_owner(platform=True, name="mine")
    rival = await make_owner(platform=True, name="rival")
    plain = await make_owner(name="plain")
    async with served.client(rival.api_key) as c:
        theirs = (await c.post("/v1/owners", json={"name": "carol", "credits": 100})).json()["owner_id"]
        acting = {"Longcall-Owner": theirs}
        job = (await c.post("/v1/jobs", json=JOB, headers=acting)).json()["id"]
        await c.post("/v1/webhook-endpoints", json={"url": "https://hooks.example.com/rival"})
    async with served.client(mine.api_key) as c:
        sibling_a = (await c.post("/v1/owners", json={"name": "a", "credits": 100})).json()["owner_id"]
        sibling_b = (await c.post("/v1/owners", json={"name": "b", "credits": 100})).json()["owner_id"]
    endpoint = await db.fetchval("select id from webhook_endpoints limit 1")
    return served, mine, rival, plain, theirs, job, endpoint, sibling_a, sibling_b


async def test_another_platforms_owner_is_an_unknown_owner_on_every_route(two_platforms, db):
    served, mine, _rival, plain, theirs, job, endpoint, _a, _b = two_platforms
    notification = "evt_" + "0" * 32
    before = await snapshot(db)
    async with served.client(mine.api_key) as c:
        for method, path, body in routes(job, endpoint, notification):
            answers = [await c.request(method, path, json=body, headers={"Longcall-Owner": who})
                       for who in (theirs, UNKNOWN, "own_nonsense", "", mine.owner_id)]
            assert [(a.status_code, a.text) for a in answers] == [(404, NO_SUCH_OWNER)] * 5, (method, path)
    async with served.client(plain.api_key) as c:
        for method, path, body in routes(job, endpoint, notification):
            for who in (theirs, plain.owner_id, UNKNOWN):
                answer = await c.request(method, path, json=body, headers={"Longcall-Owner": who})
                assert (answer.status_code, answer.text) == (404, NO_SUCH_OWNER), (method, path, who)
    assert await snapshot(db) == before


async def test_the_owners_routes_keep_to_the_platform(two_platforms, db):
    served, mine, _rival, plain, theirs, _job, _endpoint, a, b = two_platforms
    before = await snapshot(db)
    async with served.client(mine.api_key) as c:
        for who in (theirs, UNKNOWN, "own_nonsense", mine.owner_id):
            read = await c.get(f"/v1/owners/{who}")
            grant = await c.post(f"/v1/owners/{who}/grants", json={"credits": 5}, headers={"Idempotency-Key": who})
            assert [(r.status_code, r.text) for r in (read, grant)] == [(404, NO_SUCH_OWNER)] * 2, who
        listed = (await c.get("/v1/owners")).json()
        assert {o["owner_id"] for o in listed["owners"]} == {a, b}
        header = await c.get("/v1/owners", headers={"Longcall-Owner": a})
        assert header.status_code == 400 and header.json()["error"]["code"] == "invalid_request"
    async with served.client(plain.api_key) as c:
        for method, path, body in [("POST", "/v1/owners", {"name": "x"}), ("GET", "/v1/owners", None),
                                   ("GET", f"/v1/owners/{a}", None),
                                   ("POST", f"/v1/owners/{a}/grants", {"credits": 5})]:
            answer = await c.request(method, path, json=body, headers={"Idempotency-Key": "k"})
            assert (answer.status_code, answer.text) == (404, NO_SUCH_OWNER), (method, path)
    assert await snapshot(db) == before


async def test_an_owners_own_key_never_sees_its_sibling(two_platforms, db):
    served, mine, _rival, _plain, _theirs, _job, _endpoint, a, b = two_platforms
    async with served.client(mine.api_key) as c:
        job_of_b = (await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": b})).json()["id"]
    async with db.acquire() as conn:
        key_of_a = await owners.create_key(conn, a)
    async with served.client(key_of_a) as c:
        assert (await c.get(f"/v1/jobs/{job_of_b}")).status_code == 404
        assert (await c.get("/v1/jobs")).json()["jobs"] == []
        assert (await c.get("/v1/account")).json()["owner_id"] == a
        acting = await c.get("/v1/account", headers={"Longcall-Owner": b})
        assert (acting.status_code, acting.text) == (404, NO_SUCH_OWNER)
        assert (await c.get("/v1/owners")).status_code == 404
    assert await db.fetchval("select balance from owners where id = $1", b) == 90


async def test_acting_is_exactly_the_owners_own(two_platforms, db):
    served, mine, _rival, _plain, _theirs, _job, _endpoint, a, b = two_platforms
    platform_before = await db.fetchrow("select balance, active from owners where id = $1", mine.owner_id)
    async with served.client(mine.api_key) as c:
        key = {"Idempotency-Key": "order-1"}
        first = await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": a, **key})
        replay = await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": a, **key})
        for_b = await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": b, **key})
        assert (first.status_code, replay.status_code, for_b.status_code) == (202, 200, 202)
        assert replay.json()["id"] == first.json()["id"] != for_b.json()["id"]
        status_url = first.json()["status_url"]
    async with served.client() as anonymous:  # the read token is the job's, whoever made it
        assert (await anonymous.get(status_url)).json()["owner_id"] == a
    async with db.acquire() as conn:
        key_of_a = await owners.create_key(conn, a)
    async with served.client(key_of_a) as c:
        assert (await c.get(f"/v1/jobs/{first.json()['id']}")).status_code == 200
    for who in (a, b):
        row = await db.fetchrow("select balance, reserved, active from owners where id = $1", who)
        assert dict(row) == {"balance": 90, "reserved": 10, "active": 1}
    assert await db.fetchrow("select balance, active from owners where id = $1", mine.owner_id) == platform_before
