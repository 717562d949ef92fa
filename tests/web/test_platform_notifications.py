"""A platform's endpoints receive its owners' notifications; who sees and
redelivers which delivery (app/domain/notifications.py)."""
from __future__ import annotations

import asyncio

import pytest
import standardwebhooks

from app.domain import owners
from tests.support.receiver import Receiver, RunningReceiver
from tests.support.waiting import wait_until

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


async def test_the_platform_and_the_owner_each_receive_the_one_notification_signed_with_their_own_secret(
        web, make_owner, db, make_settings, start_settler):
    with RunningReceiver(Receiver()) as app_rx, RunningReceiver(Receiver()) as user_rx, \
            RunningReceiver(Receiver()) as rival_rx:
        env = {"NOTIFY_ALLOWED_ORIGINS": ",".join(rx.origin for rx in (app_rx, user_rx, rival_rx))}
        served = await web(**env)
        platform = await make_owner(platform=True, name="app")
        rival = await make_owner(platform=True, name="rival")
        async with served.client(rival.api_key) as c:
            assert (await c.post("/v1/webhook-endpoints", json={"url": rival_rx.url})).status_code == 201
        async with served.client(platform.api_key) as c:
            user = (await c.post("/v1/owners", json={"name": "alice", "credits": 100})).json()["owner_id"]
            sibling = (await c.post("/v1/owners", json={"name": "bob", "credits": 100})).json()["owner_id"]
            acting = {"Longcall-Owner": user}
            app_endpoint = (await c.post("/v1/webhook-endpoints", json={"url": app_rx.url})).json()
            # The platform's endpoint that asks only for successes gets no cancellation.
            successes = (await c.post("/v1/webhook-endpoints", json={"url": app_rx.url, "events": ["job.succeeded"]}
                                      )).json()["id"]
            user_endpoint = (await c.post("/v1/webhook-endpoints", json={"url": user_rx.url},
                                          headers=acting)).json()
            job = (await c.post("/v1/jobs", json={**JOB, "metadata": {"order": "A-1"}}, headers=acting)).json()["id"]
            assert (await c.post(f"/v1/jobs/{job}/cancel", headers=acting)).status_code == 200
        await start_settler(make_settings(**env), concurrency=4)

        async def both_received() -> bool:
            return bool(app_rx.receiver.received and user_rx.receiver.received)

        await wait_until(both_received, what="a delivery to each endpoint")
        await asyncio.sleep(1.0)  # a second delivery, or one to the rival, would have come by now
        [to_app], [to_user] = app_rx.receiver.received, user_rx.receiver.received
        assert rival_rx.receiver.received == []
        for got, endpoint in ((to_app, app_endpoint), (to_user, user_endpoint)):
            verified = standardwebhooks.Webhook(endpoint["secret"]).verify(got.body, got.headers)
            assert verified["type"] == "job.cancelled" and verified["data"]["id"] == job
            assert verified["data"]["owner_id"] == user and verified["data"]["metadata"] == {"order": "A-1"}
            # Signed with that endpoint's secret, not the other's.
            other = user_endpoint if endpoint is app_endpoint else app_endpoint
            with pytest.raises(standardwebhooks.WebhookVerificationError):
                standardwebhooks.Webhook(other["secret"]).verify(got.body, got.headers)
        assert to_app.headers["webhook-id"] == to_user.headers["webhook-id"]  # one notification
        notification = to_app.headers["webhook-id"]
        assert await db.fetchval("select count(*) from deliveries where endpoint_id = $1", successes) == 0

        def deliveries(listing) -> dict:
            [n] = listing["notifications"]
            assert (n["id"], n["job_id"], n["type"]) == (notification, job, "job.cancelled")
            return {d["endpoint_id"]: (d["status"], d["attempts"]) for d in n["deliveries"]}

        async with served.client(platform.api_key) as c:
            assert deliveries((await c.get("/v1/notifications")).json()) == {
                app_endpoint["id"]: ("delivered", 1), user_endpoint["id"]: ("delivered", 1)}
            assert deliveries((await c.get("/v1/notifications", headers=acting)).json()) == {
                user_endpoint["id"]: ("delivered", 1)}
        async with db.acquire() as conn:
            key_of_user, key_of_sibling = await owners.create_key(conn, user), await owners.create_key(conn, sibling)
        async with served.client(key_of_user) as c:
            assert deliveries((await c.get("/v1/notifications")).json()) == {user_endpoint["id"]: ("delivered", 1)}
        for key in (key_of_sibling, rival.api_key):
            async with served.client(key) as c:
                assert (await c.get("/v1/notifications")).json()["notifications"] == []
                missing = await c.post(f"/v1/notifications/{notification}/redeliver")
                assert (missing.status_code, missing.json()["error"]["message"]) == (404, "no such notification")

        # The owner's own key redelivers its endpoint's delivery, and only that one is sent again.
        async with served.client(key_of_user) as c:
            again = await c.post(f"/v1/notifications/{notification}/redeliver")
            assert again.status_code == 202, again.text
            assert [d["endpoint_id"] for d in again.json()["deliveries"]] == [user_endpoint["id"]]

        async def sent_again() -> bool:
            return len(user_rx.receiver.received) == 2

        await wait_until(sent_again, what="the owner's redelivery")
        await asyncio.sleep(1.0)
        assert len(app_rx.receiver.received) == 1 and user_rx.receiver.ids() == [notification] * 2
