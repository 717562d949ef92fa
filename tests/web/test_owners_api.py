"""The owners API over real HTTP against a real PostgreSQL: a platform
creates, lists and reads owners under it, grants and claws back credits,
and acts for its owners with Longcall-Owner (CONTRACT.md: Apps with many
users)."""
from __future__ import annotations

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
