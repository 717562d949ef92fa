"""A platform's endpoints receive its owners' notifications; who sees and
redelivers which delivery (app/domain/notifications.py)."""
from __future__ import annotations

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}
ORIGIN = "http://127.0.0.1:9"  # allowed by NOTIFY_ALLOWED_ORIGINS; nothing is sent (no settler)


async def test_one_notification_reaches_the_platform_and_the_owner_and_each_sees_its_own(web, make_owner, db):
    served = await web(NOTIFY_ALLOWED_ORIGINS=ORIGIN)
    platform = await make_owner(platform=True, name="app")
    rival = await make_owner(platform=True, name="rival")
    async with served.client(rival.api_key) as c:
        assert (await c.post("/v1/webhook-endpoints", json={"url": f"{ORIGIN}/rival"})).status_code == 201
    async with served.client(platform.api_key) as c:
        user = (await c.post("/v1/owners", json={"name": "alice", "credits": 100})).json()["owner_id"]
        sibling = (await c.post("/v1/owners", json={"name": "bob", "credits": 100})).json()["owner_id"]
        acting = {"Longcall-Owner": user}
        platform_endpoint = (await c.post("/v1/webhook-endpoints", json={"url": f"{ORIGIN}/app"})).json()["id"]
        user_endpoint = (await c.post("/v1/webhook-endpoints", json={"url": f"{ORIGIN}/alice"},
                                      headers=acting)).json()["id"]
        sibling_job = (await c.post("/v1/jobs", json=JOB, headers={"Longcall-Owner": sibling})).json()["id"]
        job = (await c.post("/v1/jobs", json=JOB, headers=acting)).json()["id"]
        assert (await c.post(f"/v1/jobs/{job}/cancel", headers=acting)).status_code == 200
        assert (await c.post(f"/v1/jobs/{sibling_job}/cancel", headers={"Longcall-Owner": sibling})).status_code == 200

        rows = await db.fetch("select n.id, n.owner_id, n.platform_id, n.data, d.endpoint_id from notifications n "
                              "join deliveries d on d.notification_id = n.id where n.job_id = $1", job)
        assert {r["endpoint_id"] for r in rows} == {platform_endpoint, user_endpoint}
        assert len({r["id"] for r in rows}) == 1
        assert {(r["owner_id"], r["platform_id"], r["data"]["owner_id"]) for r in rows} == {
            (user, platform.owner_id, user)}
        notification = rows[0]["id"]

        def endpoints(listing, job_id):
            return {d["endpoint_id"] for n in listing["notifications"] if n["job_id"] == job_id
                    for d in n["deliveries"]}

        as_platform = (await c.get("/v1/notifications")).json()
        assert endpoints(as_platform, job) == {platform_endpoint, user_endpoint}
        assert endpoints(as_platform, sibling_job) == {platform_endpoint}
        as_user = (await c.get("/v1/notifications", headers=acting)).json()
        assert [n["job_id"] for n in as_user["notifications"]] == [job]
        assert endpoints(as_user, job) == {user_endpoint}

        # Delivered, both; the owner's redeliver queues only its own endpoint's.
        await db.execute("update deliveries set status = 'delivered' where notification_id = $1", notification)
        again = await c.post(f"/v1/notifications/{notification}/redeliver", headers=acting)
        assert again.status_code == 202, again.text
        assert [d["endpoint_id"] for d in again.json()["deliveries"]] == [user_endpoint]
        statuses = dict(await db.fetch("select endpoint_id, status from deliveries where notification_id = $1",
                                       notification))
        assert statuses == {platform_endpoint: "delivered", user_endpoint: "pending"}
        sibling_sees = await c.post(f"/v1/notifications/{notification}/redeliver",
                                    headers={"Longcall-Owner": sibling})
        assert sibling_sees.status_code == 404
    async with served.client(rival.api_key) as c:
        assert (await c.get("/v1/notifications")).json()["notifications"] == []
        assert (await c.post(f"/v1/notifications/{notification}/redeliver")).status_code == 404
