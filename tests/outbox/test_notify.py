"""Notifications end to end: a job's transitions through the settler to a
receiver on loopback (an origin in NOTIFY_ALLOWED_ORIGINS), verified with
the `standardwebhooks` library, the reference of the scheme."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

import standardwebhooks

from tests.outbox.conftest import wait_for_status
from tests.support.receiver import Receiver, RunningReceiver


def job(**input):
    return {"provider": "sim", "model": "image-fast", "input": {"duration_s": 0.2, **input}, "max_credits": 10,
            "metadata": {"order": "A-17"}}


async def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_success_is_delivered_once_signed_with_the_job_as_json(web, make_owner, db, sim, make_settings,
                                                                      start_settler):
    with RunningReceiver(Receiver()) as rx:
        env = {"SIM_URL": sim.url, "NOTIFY_ALLOWED_ORIGINS": rx.origin}
        server = await web(**env)
        await start_settler(make_settings(**env))
        owner = await make_owner(credits=100)
        async with server.client(owner.api_key) as c:
            endpoint = (await c.post("/v1/webhook-endpoints", json={"url": rx.url})).json()
            assert endpoint["secret"].startswith("whsec_") and endpoint["events"] == [
                "job.succeeded", "job.failed", "job.cancelled", "job.expired"]
            created = (await c.post("/v1/jobs", json=job(cost=3))).json()
            await wait_for_status(db, created["id"], "succeeded")
            await wait_until(lambda: rx.receiver.received, what="a delivery")
            await asyncio.sleep(1.0)  # a second delivery would have come by now
            [got] = rx.receiver.received
            verified = standardwebhooks.Webhook(endpoint["secret"]).verify(got.body, got.headers)
            assert verified["type"] == "job.succeeded" and verified["id"] == got.headers["webhook-id"]
            data = verified["data"]
            assert data["id"] == created["id"] and data["status"] == "succeeded"
            assert data["metadata"] == {"order": "A-17"} and data["credits"]["charged"] == 3
            assert data["owner_id"] == owner.owner_id and len(data["outputs"]) == 1
            # the status_url in the notification reads the job without a key
            async with server.client() as anon:
                assert (await anon.get(data["status_url"])).json()["status"] == "succeeded"
            listed = (await c.get("/v1/notifications", params={"job_id": created["id"]})).json()
            [n] = listed["notifications"]
            assert n["id"] == got.headers["webhook-id"] and n["type"] == "job.succeeded"
            [d] = n["deliveries"]
            assert d["endpoint_id"] == endpoint["id"] and d["status"] == "delivered"
            assert d["attempts"] == 1 and d["last_status_code"] == 204
            timeline = (await c.get(f"/v1/jobs/{created['id']}/events")).json()["events"]
        types = [e["type"] for e in timeline]
        assert types[0] == "created" and timeline[0]["detail"]["metadata"] == {"order": "A-17"}
        assert types[-1] == "notification_delivered"
        assert types.index("submit_sent") < types.index("task_saved") < types.index("output_stored") \
            < types.index("closed")
        closed = timeline[types.index("closed")]["detail"]
        assert closed["status"] == "succeeded" and closed["charged"] == 3 and closed["refunded"] == 7


@contextlib.asynccontextmanager
async def failing_job_notified(web, make_owner, sim, make_settings, start_settler, receiver: Receiver,
                               retry_s: str):
    """A job that fails, of an owner whose one endpoint is `receiver`, with
    NOTIFY_RETRY_S `retry_s`: (the running receiver, the owner's client, the job)."""
    with RunningReceiver(receiver) as rx:
        env = {"SIM_URL": sim.url, "NOTIFY_ALLOWED_ORIGINS": rx.origin, "NOTIFY_RETRY_S": retry_s}
        server = await web(**env)
        await start_settler(make_settings(**env))
        owner = await make_owner(credits=100)
        async with server.client(owner.api_key) as c:
            await c.post("/v1/webhook-endpoints", json={"url": rx.url})
            created = (await c.post("/v1/jobs", json=job(outcome="failed"))).json()
            yield rx, c, created


async def test_two_failures_then_success_is_three_attempts_under_one_id(web, make_owner, db, sim, make_settings,
                                                                        start_settler):
    async with failing_job_notified(web, make_owner, sim, make_settings, start_settler,
                                    Receiver(answers=[500, 500]), "0.2,0.5") as (rx, c, created):
        await wait_for_status(db, created["id"], "failed")
        await wait_until(lambda: len(rx.receiver.received) >= 3, what="three attempts")
        await asyncio.sleep(1.5)
        assert len(set(rx.receiver.ids())) == 1 and len(rx.receiver.received) == 3
        [n] = (await c.get("/v1/notifications")).json()["notifications"]
        assert n["type"] == "job.failed"
        assert n["deliveries"][0]["status"] == "delivered" and n["deliveries"][0]["attempts"] == 3
        bodies = {json.loads(r.body)["id"] for r in rx.receiver.received}
        assert bodies == {n["id"]}
    codes = await db.fetch("select status_code from delivery_attempts order by at")
    assert [r["status_code"] for r in codes] == [500, 500, 204]  # each attempt kept


async def test_no_endpoint_no_notification_and_a_refused_create_writes_none(web, make_owner, db, sim,
                                                                            make_settings, start_settler):
    server = await web(SIM_URL=sim.url)
    await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=5)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json={**job(), "max_credits": 5})).json()
        await wait_for_status(db, created["id"], "succeeded")
        assert (await c.post("/v1/jobs", json=job())).status_code == 402  # refused: nothing written
    assert await db.fetchval("select count(*) from notifications") == 0
    assert await db.fetchval("select count(*) from outbox") == 0


async def test_the_last_attempt_is_made_at_the_24_hour_mark_then_the_delivery_fails(web, make_owner, db, sim,
                                                                                      make_settings,
                                                                                      start_settler):
    """CONTRACT.md: retried for 24 h from the notification's creation, then
    recorded as failed. A gap that would end past the mark is cut to end at
    it: one more attempt there, not a failure recorded early. The clock is
    moved by moving the delivery's retry_from, with minutes of margin."""
    async with failing_job_notified(web, make_owner, sim, make_settings, start_settler,
                                    Receiver(answers=[500] * 5), "3600") as (rx, c, created):
        await wait_until_row(db, "select attempts from deliveries", 1)

        async def attempt_now():
            await db.execute("update outbox set not_before = now() where kind = 'notify'")
            await db.execute("select pg_notify('longcall_outbox', '')")

        # As if its retries had run for 24 h less 10 min: the next attempt,
        # made now, fails, and the hour's gap after it is cut to the mark.
        await db.execute("update deliveries set retry_from = now() - interval '24 hours' + interval '10 minutes'")
        await attempt_now()
        await wait_until_row(db, "select attempts from deliveries", 2)
        await wait_until_row(db, "select not_before > now() + interval '1 minute' from outbox where kind = 'notify'",
                             True)
        past_mark = await db.fetchval("select extract(epoch from o.not_before - (d.retry_from + interval '24 hours')) "
                                      "from outbox o, deliveries d where o.kind = 'notify'")
        assert abs(past_mark) < 1.0, f"the next attempt is {past_mark:.0f} s from the mark, not at it"
        assert await db.fetchval("select status from deliveries") == "pending"
        # Its time come (the mark just passed): the last attempt is made, then failed recorded.
        await db.execute("update deliveries set retry_from = retry_from - interval '10 minutes'")
        await attempt_now()
        await wait_until_row(db, "select status from deliveries", "failed")
        [n] = (await c.get("/v1/notifications", params={"job_id": created["id"]})).json()["notifications"]
    [d] = n["deliveries"]
    assert d["status"] == "failed" and d["attempts"] == 3 and d["last_status_code"] == 500
    assert len(rx.receiver.received) == 3 and len(set(rx.receiver.ids())) == 1


async def wait_until_row(db, query: str, value, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while (got := await db.fetchval(query)) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{query!r} is {got!r}, not {value!r}")
        await asyncio.sleep(0.05)
