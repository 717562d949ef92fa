"""Notifications when things go wrong: a settler process killed while its
delivery is in the air, and an endpoint so slow that every delivery slot
waits on it. Receivers are on loopback, their origins in
NOTIFY_ALLOWED_ORIGINS."""
from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from dataclasses import dataclass, field

import standardwebhooks
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.outbox.conftest import wait_for_status
from tests.outbox.test_races import env_of, settler_process
from tests.support.loopback import LoopbackServer
from tests.support.receiver import Receiver, RunningReceiver

HOLD_S = 120.0  # far past the test: a held request is never answered while it matters


def job(**input) -> dict:
    return {"provider": "sim", "model": "image-fast", "input": {"duration_s": 0.2, **input}, "max_credits": 10}


@dataclass
class HoldFirst:
    """A receiver that holds its first request open (never answering it in
    time) and answers every later one 204 at once."""

    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            body = await request.body()
            with self.lock:
                self.received.append((dict(request.headers), body))
                first = len(self.received) == 1
            if first:
                await asyncio.sleep(HOLD_S)
            return Response(status_code=204)
        return Starlette(routes=[Route("/hook", hook, methods=["POST"])])

    def count(self) -> int:
        with self.lock:
            return len(self.received)


async def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_settler_killed_mid_delivery_is_followed_by_the_same_notification(web, make_owner, db, sim,
                                                                                 make_settings, tmp_objects):
    receiver = HoldFirst()
    server_rx = LoopbackServer(receiver.app()).start()
    procs = []
    try:
        env = env_of(make_settings, sim, tmp_objects, NOTIFY_ALLOWED_ORIGINS=server_rx.url, SETTLER_LEASE_S=3)
        server = await web(SIM_URL=sim.url, NOTIFY_ALLOWED_ORIGINS=server_rx.url)
        owner = await make_owner(credits=100)
        async with server.client(owner.api_key) as c:
            endpoint = (await c.post("/v1/webhook-endpoints", json={"url": f"{server_rx.url}/hook"})).json()
            assert "secret" in endpoint, endpoint
            created = (await c.post("/v1/jobs", json={**job(cost=2), "metadata": {"order": "K-1"}})).json()
        procs.append(settler_process(env))
        await wait_for_status(db, created["id"], "succeeded", timeout=60)

        async def first_attempt_held() -> bool:
            return receiver.count() >= 1
        await wait_until(first_attempt_held, 60, "the first attempt to reach the receiver")
        procs[0].send_signal(signal.SIGKILL)  # while the receiver holds that attempt open
        await asyncio.to_thread(procs[0].wait, 30)
        assert receiver.count() == 1
        [delivery] = await db.fetch("select * from deliveries")
        assert delivery["status"] == "pending" and delivery["attempts"] == 0  # nothing was recorded

        procs.append(settler_process(env))  # the lease (3 s) returns the claim to it

        async def delivered() -> bool:
            return await db.fetchval("select status from deliveries") == "delivered"
        await wait_until(delivered, 60, "the delivery by the second settler")
        await asyncio.sleep(1.0)  # a third attempt would have come by now
        assert receiver.count() == 2
        (first_headers, first_body), (second_headers, second_body) = receiver.received
        [notification] = await db.fetch("select * from notifications")
        assert first_headers["webhook-id"] == second_headers["webhook-id"] == notification["id"]
        hook = standardwebhooks.Webhook(endpoint["secret"])
        for headers, body in ((first_headers, first_body), (second_headers, second_body)):
            sent = hook.verify(body, headers)
            assert sent["id"] == notification["id"] and sent["type"] == "job.succeeded"
            assert sent["data"]["id"] == created["id"] and sent["data"]["metadata"] == {"order": "K-1"}
        assert json.loads(first_body)["data"]["outputs"] == json.loads(second_body)["data"]["outputs"]

        assert await db.fetchval("select count(*) from notifications") == 1
        [delivery] = await db.fetch("select * from deliveries")
        assert (delivery["status"], delivery["last_status_code"], delivery["attempts"]) == ("delivered", 204, 1)
        lines = await db.fetch("select type from job_events where job_id = $1 and type like 'notification_%'",
                               created["id"])
        assert [r["type"] for r in lines] == ["notification_delivered"]
        assert await db.fetchval("select count(*) from outbox") == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                await asyncio.to_thread(proc.wait, 30)
        server_rx.stop()


async def test_a_slow_endpoint_does_not_hold_up_settling(web, make_owner, db, sim, make_settings, start_settler,
                                                         tmp_path):
    # Jobs checked every 0.2 s: each closes in well under a second, far
    # inside the 10 s the endpoint holds every delivery.
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nprovider = "sim"\nmodel = "*"\npoll_every_s = [0.2]\n')
    with RunningReceiver(Receiver(delay_s=10.0)) as rx:
        env = {"SIM_URL": sim.url, "NOTIFY_ALLOWED_ORIGINS": rx.origin, "MODELS_FILE": str(models)}
        server = await web(**env)
        owner = await make_owner(credits=1000, max_active=50)
        async with server.client(owner.api_key) as c:
            # Only cancels are notified: six deliveries, all to the slow endpoint.
            await c.post("/v1/webhook-endpoints", json={"url": rx.url, "events": ["job.cancelled"]})
            for _ in range(6):
                cancelled = (await c.post("/v1/jobs", json=job())).json()
                assert (await c.post(f"/v1/jobs/{cancelled['id']}/cancel")).status_code == 200
            assert await db.fetchval("select count(*) from deliveries where status = 'pending'") == 6

            await start_settler(make_settings(**env), concurrency=4)

            async def slots_held() -> bool:
                return len(rx.receiver.received) >= 4
            await wait_until(slots_held, 30, "deliveries to take their slots at the slow endpoint")

            # Every delivery slot now waits on the endpoint; jobs still go through.
            started = time.monotonic()
            ids = [(await c.post("/v1/jobs", json=job(cost=1))).json()["id"] for _ in range(8)]
            for job_id in ids:
                await wait_for_status(db, job_id, "succeeded", timeout=60)
            took = time.monotonic() - started
        # ... all of them before the endpoint answered any delivery
        answered = await db.fetchval("select count(*) from deliveries where attempts > 0")
        assert answered == 0, f"the jobs waited for the slow endpoint ({took:.1f} s)"
        assert len(rx.receiver.received) == 4  # at most four at once to one endpoint
        assert await db.fetchval("select count(*) from deliveries where status = 'pending'") == 6
