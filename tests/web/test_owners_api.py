"""The owners API over real HTTP against a real PostgreSQL: a platform
creates, lists and reads owners under it, grants and claws back credits,
and acts for its owners with Longcall-Owner (CONTRACT.md: Apps with many
users)."""
from __future__ import annotations

import asyncio
import datetime as dt
import re

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}


def error_code(response) -> str:
    return response.json()["error"]["code"]


async def test_a_platform_signs_up_a_user_grants_credits_and_runs_a_job_for_them(web, make_owner, db):
    served = await web()
    platform = await make_owner(credits=0, platform=True, name="app")
    async with served.client(platform.api_key) as c:
        made = await c.post("/v1/owners", json={"name": "alice"}, headers={"Idempotency-Key": "signup-alice"})
        assert made.status_code == 201, made.text
        alice = made.json()
        assert alice["credits"] == {"granted": 0, "balance": 0, "reserved": 0, "charged": 0}
        assert alice["max_active"] == 10 and alice["active"] == 0
        again = await c.post("/v1/owners", json={"name": "alice"}, headers={"Idempotency-Key": "signup-alice"})
        assert again.status_code == 200 and again.json()["owner_id"] == alice["owner_id"]
        other = await c.post("/v1/owners", json={"name": "bob"}, headers={"Idempotency-Key": "signup-alice"})
        assert other.status_code == 409 and error_code(other) == "idempotency_conflict"

        granted = await c.post(f"/v1/owners/{alice['owner_id']}/grants", json={"credits": 100, "reason": "bought"},
                               headers={"Idempotency-Key": "order-1"})
        assert granted.status_code == 201, granted.text
        assert granted.json()["credits"]["balance"] == 100
        replay = await c.post(f"/v1/owners/{alice['owner_id']}/grants", json={"credits": 100, "reason": "bought"},
                              headers={"Idempotency-Key": "order-1"})
        assert replay.status_code == 200 and replay.json()["credits"]["granted"] == 100
        too_much = await c.post(f"/v1/owners/{alice['owner_id']}/grants", json={"credits": -101},
                                headers={"Idempotency-Key": "clawback-1"})
        assert too_much.status_code == 402 and error_code(too_much) == "insufficient_credits"

        acting = {"Longcall-Owner": alice["owner_id"]}
        job = await c.post("/v1/jobs", json=JOB, headers=acting)
        assert job.status_code == 202, job.text
        assert job.json()["owner_id"] == alice["owner_id"]
        read = await c.get(f"/v1/jobs/{job.json()['id']}", headers=acting)
        assert read.status_code == 200
        assert (await c.get(f"/v1/jobs/{job.json()['id']}")).status_code == 404  # not the platform's own
        account = (await c.get("/v1/account", headers=acting)).json()
        assert account["credits"] == {"balance": 90, "reserved": 10, "charged": 0}
        shown = (await c.get(f"/v1/owners/{alice['owner_id']}")).json()
        assert shown["credits"] == {"granted": 100, "balance": 90, "reserved": 10, "charged": 0}
        listed = (await c.get("/v1/owners")).json()
        assert [o["owner_id"] for o in listed["owners"]] == [alice["owner_id"]] and listed["next_cursor"] is None
    grants = await db.fetch("select amount, reason from ledger where owner_id = $1 and kind = 'grant'",
                            alice["owner_id"])
    assert [(g["amount"], g["reason"]) for g in grants] == [(100, "bought")]


async def test_outside_owners_and_plain_keys_get_the_same_404(web, make_owner):
    served = await web()
    platform = await make_owner(platform=True, name="app")
    rival = await make_owner(platform=True, name="rival")
    plain = await make_owner(name="plain")
    async with served.client(rival.api_key) as c:
        theirs = (await c.post("/v1/owners", json={"name": "carol"})).json()["owner_id"]
    unknown = "own_" + "0" * 24
    async with served.client(platform.api_key) as c:
        answers = [await c.get("/v1/account", headers={"Longcall-Owner": who})
                   for who in (theirs, unknown, "nonsense", plain.owner_id, platform.owner_id)]
        answers.append(await c.get(f"/v1/owners/{theirs}"))
    async with served.client(plain.api_key) as c:
        answers.append(await c.get("/v1/account", headers={"Longcall-Owner": theirs}))
        answers.append(await c.get("/v1/owners"))
    assert {(r.status_code, r.text) for r in answers} == {
        (404, '{"error":{"code":"not_found","message":"no such owner"}}')}


OWNER_KEYS = {"owner_id", "name", "credits", "active", "max_active", "created_at"}


async def test_a_new_owner_is_under_its_platform_with_its_opening_grant(web, make_owner, db):
    served = await web()
    platform = await make_owner(credits=0, platform=True, name="app")
    async with served.client(platform.api_key) as c:
        made = await c.post("/v1/owners", json={"name": "alice", "credits": 40, "max_active": 2})
        assert made.status_code == 201, made.text
        alice = made.json()
        assert set(alice) == OWNER_KEYS and re.fullmatch(r"own_[0-9a-f]{24}", alice["owner_id"])
        assert made.headers["location"] == f"/v1/owners/{alice['owner_id']}"
        assert (alice["name"], alice["credits"], alice["active"], alice["max_active"]) == (
            "alice", {"granted": 40, "balance": 40, "reserved": 0, "charged": 0}, 0, 2)
        assert dt.datetime.fromisoformat(alice["created_at"].replace("Z", "+00:00")).tzinfo is not None
        assert alice["created_at"].endswith("Z")
        assert (await c.get(made.headers["location"])).json() == alice
        bob = (await c.post("/v1/owners", json={"name": "bob"})).json()
        # A platform cannot make platforms.
        refused = await c.post("/v1/owners", json={"name": "sub", "platform": True})
        assert refused.status_code == 400 and error_code(refused) == "invalid_request"
    rows = {r["id"]: (r["platform_id"], r["is_platform"])
            for r in await db.fetch("select id, platform_id, is_platform from owners")}
    assert rows == {platform.owner_id: (None, True), alice["owner_id"]: (platform.owner_id, False),
                    bob["owner_id"]: (platform.owner_id, False)}
    grants = await db.fetch("select owner_id, amount from ledger where kind = 'grant'")
    assert [tuple(g) for g in grants] == [(alice["owner_id"], 40)]  # bob's zero is no row


async def test_concurrent_sign_ups_with_one_key_make_one_owner(web, make_owner, db):
    served = await web()
    platform = await make_owner(credits=0, platform=True, name="app")
    other = await make_owner(credits=0, platform=True, name="other")
    body, key = {"name": "alice", "credits": 25}, {"Idempotency-Key": "signup-alice"}
    async with served.client(platform.api_key) as c:
        answers = await asyncio.gather(*[c.post("/v1/owners", json=body, headers=key) for _ in range(20)])
        assert sorted(a.status_code for a in answers) == [200] * 19 + [201], {a.text for a in answers}
        assert len({a.json()["owner_id"] for a in answers}) == 1
        conflict = await c.post("/v1/owners", json={**body, "credits": 26}, headers=key)
        assert conflict.status_code == 409 and error_code(conflict) == "idempotency_conflict"
    async with served.client(other.api_key) as c:  # the key is the platform's: another's is its own
        theirs = await c.post("/v1/owners", json=body, headers=key)
        assert theirs.status_code == 201 and theirs.json()["owner_id"] != answers[0].json()["owner_id"]
    for p, count in ((platform, 1), (other, 1)):
        assert await db.fetchval("select count(*) from owners where platform_id = $1", p.owner_id) == count
    assert await db.fetchval("select count(*) from ledger where kind = 'grant'") == 2
    assert await db.fetchval("select sum(granted) from owners") == 50
