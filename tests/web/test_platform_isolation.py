"""Cross-platform isolation on every owner-scoped route: acting for an owner
outside the platform is the very answer an unknown owner gets, and changes
nothing; an owner's own key cannot act, and never sees its siblings."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.domain import owners

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}
NO_SUCH_OWNER = '{"error":{"code":"not_found","message":"no such owner"}}'
UNKNOWN = "own_" + "0" * 24
ORIGIN = "http://127.0.0.1:9"  # allowed by NOTIFY_ALLOWED_ORIGINS


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
        ("POST", "/v1/webhook-endpoints", {"url": f"{ORIGIN}/x"}),
        ("GET", "/v1/webhook-endpoints", None),
        ("DELETE", f"/v1/webhook-endpoints/{endpoint_id}", None),
        ("GET", "/v1/notifications", None),
        ("POST", f"/v1/notifications/{notification_id}/redeliver", None),
        ("GET", "/v1/models", None),
    ]


async def snapshot(db) -> tuple:
    """Everything a refused request could have changed."""
    return (
        tuple(await db.fetch("select id, balance, reserved, charged, granted, active from owners order by id")),
        tuple(await db.fetch("select id, status, credits_reserved from jobs order by id")),
        tuple(await db.fetch("select id, deleted_at from webhook_endpoints order by id")),
        tuple(await db.fetch("select id, status, attempts from deliveries order by id")),
        *[await db.fetchval(f"select count(*) from {t}") for t in ("ledger", "notifications", "outbox")],
    )


@dataclass
class World:
    served: object
    mine: owners.NewOwner     # a platform, with owners a and b (100 credits each)
    rival: owners.NewOwner    # another platform, with owner `theirs`
    plain: owners.NewOwner    # an ordinary owner
    theirs: str
    job: str                  # theirs, queued
    endpoint: str             # the rival's
    notification: str         # of another job of theirs, delivered to the rival's endpoint
    a: str
    b: str


@pytest.fixture
async def two_platforms(web, make_owner, db) -> World:
    # Endpoints on an allowed loopback origin: no DNS is asked, nothing is sent (no settler).
    served = await web(NOTIFY_ALLOWED_ORIGINS=ORIGIN)
    mine = await make_owner(platform=True, name="mine")
    rival = await make_owner(platform=True, name="rival")
    plain = await make_owner(name="plain")
    async with served.client(rival.api_key) as c:
        theirs = (await c.post("/v1/owners", json={"name": "carol", "credits": 100})).json()["owner_id"]
        acting = {"Longcall-Owner": theirs}
        job = (await c.post("/v1/jobs", json=JOB, headers=acting)).json()["id"]
        endpoint = (await c.post("/v1/webhook-endpoints", json={"url": f"{ORIGIN}/rival"})).json()["id"]
        done = (await c.post("/v1/jobs", json=JOB, headers=acting)).json()["id"]
        assert (await c.post(f"/v1/jobs/{done}/cancel", headers=acting)).status_code == 200
    notification = await delivered(db, done)
    async with served.client(mine.api_key) as c:
        a = (await c.post("/v1/owners", json={"name": "a", "credits": 100})).json()["owner_id"]
        b = (await c.post("/v1/owners", json={"name": "b", "credits": 100})).json()["owner_id"]
    return World(served, mine, rival, plain, theirs, job, endpoint, notification, a, b)


async def delivered(db, job_id: str) -> str:
    """The job's notification, its deliveries marked delivered: a redeliver
    that got through would really queue them again."""
    notification = await db.fetchval("select id from notifications where job_id = $1", job_id)
    assert notification is not None
    await db.execute("update deliveries set status = 'delivered', attempts = 1 where notification_id = $1",
                     notification)
    return notification


async def test_another_platforms_owner_is_an_unknown_owner_on_every_route(two_platforms, db):
    w = two_platforms
    before = await snapshot(db)
    async with w.served.client(w.mine.api_key) as c:
        for method, path, body in routes(w.job, w.endpoint, w.notification):
            answers = [await c.request(method, path, json=body, headers={"Longcall-Owner": who})
                       for who in (w.theirs, UNKNOWN, "own_nonsense", "", w.mine.owner_id)]
            assert [(a.status_code, a.text) for a in answers] == [(404, NO_SUCH_OWNER)] * 5, (method, path)
    # An ordinary owner's key cannot act, not even as itself.
    async with w.served.client(w.plain.api_key) as c:
        for method, path, body in routes(w.job, w.endpoint, w.notification):
            for who in (w.theirs, w.plain.owner_id, UNKNOWN, "own_nonsense", w.a):
                answer = await c.request(method, path, json=body, headers={"Longcall-Owner": who})
                assert (answer.status_code, answer.text) == (404, NO_SUCH_OWNER), (method, path, who)
    assert await snapshot(db) == before


async def test_the_owners_routes_keep_to_the_platform(two_platforms, db):
    w = two_platforms
    before = await snapshot(db)
    owners_routes = [("POST", "/v1/owners", {"name": "x"}), ("GET", "/v1/owners", None),
                     ("GET", f"/v1/owners/{w.a}", None), ("POST", f"/v1/owners/{w.a}/grants", {"credits": 5})]
    async with w.served.client(w.mine.api_key) as c:
        for who in (w.theirs, UNKNOWN, "own_nonsense", w.mine.owner_id, w.plain.owner_id):
            read = await c.get(f"/v1/owners/{who}")
            grant = await c.post(f"/v1/owners/{who}/grants", json={"credits": 5}, headers={"Idempotency-Key": who})
            assert [(r.status_code, r.text) for r in (read, grant)] == [(404, NO_SUCH_OWNER)] * 2, who
        listed = (await c.get("/v1/owners")).json()
        assert {o["owner_id"] for o in listed["owners"]} == {w.a, w.b}
        # The owners routes take the platform's own key: acting for anyone there is a 400.
        for method, path, body in owners_routes:
            for who in (w.a, w.theirs, w.mine.owner_id):
                answer = await c.request(method, path, json=body,
                                         headers={"Longcall-Owner": who, "Idempotency-Key": "k"})
                assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request"), \
                    (method, path, who)
    async with w.served.client(w.plain.api_key) as c:
        for method, path, body in owners_routes:
            answer = await c.request(method, path, json=body, headers={"Idempotency-Key": "k"})
            assert (answer.status_code, answer.text) == (404, NO_SUCH_OWNER), (method, path)
    assert await snapshot(db) == before


async def test_the_owners_list_pages_newest_first_each_owner_once(two_platforms, db):
    w = two_platforms
    async with w.served.client(w.mine.api_key) as c:
        made = [(await c.post("/v1/owners", json={"name": f"user {i}"})).json()["owner_id"] for i in range(5)]
        pages, cursor = [], None
        while True:
            page = await c.get("/v1/owners", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, page.text
            pages.append(page.json()["owners"])
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
            assert len(pages) < 10, "the cursor does not move"
        listed = [o["owner_id"] for p in pages for o in p]
        assert [len(p) for p in pages] == [2, 2, 2, 1]
        assert listed == made[::-1] + [w.b, w.a]  # newest first; a and b came before the five
        stamps = [o["created_at"] for p in pages for o in p]
        assert stamps == sorted(stamps, reverse=True) and all(t.endswith("Z") for t in stamps)
        for o in (o for p in pages for o in p):  # one shape everywhere
            assert (await c.get(f"/v1/owners/{o['owner_id']}")).json() == o
        for bad in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"cursor": "forged"}, {"status": "x"}):
            answer = await c.get("/v1/owners", params=bad)
            assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request"), bad
    in_db = await db.fetch("select id from owners where platform_id = $1 order by created_at desc, id desc",
                           w.mine.owner_id)
    assert listed == [r["id"] for r in in_db]
    async with w.served.client(w.rival.api_key) as c:
        assert [o["owner_id"] for o in (await c.get("/v1/owners")).json()["owners"]] == [w.theirs]


async def test_an_owners_own_key_never_sees_its_sibling(two_platforms, db):
    w = two_platforms
    b_acting = {"Longcall-Owner": w.b}
    async with w.served.client(w.mine.api_key) as c:
        job_of_b = (await c.post("/v1/jobs", json=JOB, headers=b_acting)).json()["id"]
        endpoint_of_b = (await c.post("/v1/webhook-endpoints", json={"url": f"{ORIGIN}/b"},
                                      headers=b_acting)).json()["id"]
        done = (await c.post("/v1/jobs", json=JOB, headers=b_acting)).json()["id"]
        assert (await c.post(f"/v1/jobs/{done}/cancel", headers=b_acting)).status_code == 200
    notification_of_b = await delivered(db, done)
    async with db.acquire() as conn:
        key_of_a = await owners.create_key(conn, w.a)
    before = await snapshot(db)
    unknown_job, unknown_endpoint, unknown_notification = "job_" + "0" * 24, "we_" + "0" * 24, "evt_" + "0" * 32

    def sibling_routes(job: str, endpoint: str, notification: str) -> list[tuple[str, str]]:
        return [("GET", f"/v1/jobs/{job}"), ("POST", f"/v1/jobs/{job}/cancel"),
                ("GET", f"/v1/jobs/{job}/outputs/0"), ("GET", f"/v1/jobs/{job}/events"),
                ("DELETE", f"/v1/webhook-endpoints/{endpoint}"),
                ("POST", f"/v1/notifications/{notification}/redeliver")]

    async with w.served.client(key_of_a) as c:
        for (method, path), (_, unknown_path) in zip(
                sibling_routes(job_of_b, endpoint_of_b, notification_of_b),
                sibling_routes(unknown_job, unknown_endpoint, unknown_notification), strict=True):
            sibling, unknown = await c.request(method, path), await c.request(method, unknown_path)
            assert sibling.status_code == 404 and (sibling.status_code, sibling.text) == \
                (unknown.status_code, unknown.text), (method, path)
        assert (await c.get(f"/v1/jobs/{job_of_b}")).text == '{"error":{"code":"not_found","message":"no such job"}}'
        assert (await c.get("/v1/jobs")).json()["jobs"] == []
        assert (await c.get("/v1/webhook-endpoints")).json()["webhook_endpoints"] == []
        assert (await c.get("/v1/notifications")).json()["notifications"] == []
        account = (await c.get("/v1/account")).json()
        assert account["owner_id"] == w.a and account["credits"]["balance"] == 100
        acting = await c.get("/v1/account", headers={"Longcall-Owner": w.b})
        assert (acting.status_code, acting.text) == (404, NO_SUCH_OWNER)
        assert (await c.get("/v1/owners")).text == NO_SUCH_OWNER
        assert (await c.get(f"/v1/owners/{w.b}")).text == NO_SUCH_OWNER
    assert await snapshot(db) == before


async def test_acting_is_exactly_the_owners_own(two_platforms, db):
    w = two_platforms
    a, b = w.a, w.b
    platform_before = await db.fetchrow("select balance, reserved, active from owners where id = $1",
                                        w.mine.owner_id)
    async with w.served.client(w.mine.api_key) as c:
        key = {"Idempotency-Key": "order-1"}
        first = await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": a, **key})
        replay = await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": a, **key})
        for_b = await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": b, **key})
        assert (first.status_code, replay.status_code, for_b.status_code) == (202, 200, 202)
        assert replay.json()["id"] == first.json()["id"] != for_b.json()["id"]
        assert (first.json()["owner_id"], for_b.json()["owner_id"]) == (a, b)
        # The platform's own scope is a third one: the same key makes its own job.
        own = await c.post("/v1/jobs", json=JOB, headers=key)
        assert own.status_code == 202 and own.json()["owner_id"] == w.mine.owner_id
        assert len({first.json()["id"], for_b.json()["id"], own.json()["id"]}) == 3
        assert (await c.get("/v1/account", headers={"Longcall-Owner": a})).json() == {
            "owner_id": a, "credits": {"balance": 90, "reserved": 10, "charged": 0}, "active": 1, "max_active": 10}
        status_url = first.json()["status_url"]
    async with w.served.client() as anonymous:  # the read token is the job's, whoever made it
        read = await anonymous.get(status_url)
        assert read.status_code == 200 and read.json()["owner_id"] == a
    async with db.acquire() as conn:
        key_of_a = await owners.create_key(conn, a)
    async with w.served.client(key_of_a) as c:
        assert (await c.get(f"/v1/jobs/{first.json()['id']}")).json()["owner_id"] == a
        assert [j["id"] for j in (await c.get("/v1/jobs")).json()["jobs"]] == [first.json()["id"]]
        # The owner's own key is the same idempotency scope as the platform acting for it.
        again = await c.post("/v1/jobs", json=JOB, headers=key)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    for who in (a, b):
        row = await db.fetchrow("select balance, reserved, active from owners where id = $1", who)
        assert dict(row) == {"balance": 90, "reserved": 10, "active": 1}
    platform_after = await db.fetchrow("select balance, reserved, active from owners where id = $1", w.mine.owner_id)
    assert dict(platform_after) == {"balance": platform_before["balance"] - 10,
                                    "reserved": platform_before["reserved"] + 10,
                                    "active": platform_before["active"] + 1}  # its own job only
