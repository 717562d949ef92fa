"""Native webhooks: signed t/v1, retried, sent on every terminal state."""
from __future__ import annotations

import json
import time

import httpx

from app.signing.webhooks import verify_tv1

from .conftest import RETRY_DELAYS
from .helpers import free_port, wait_until


def create(client: httpx.Client, callback_url: str, **input) -> dict:
    body = {"model": "m", "input": {"duration_s": 0.1, **input}, "callback_url": callback_url}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201
    return response.json()


def test_webhook_is_signed_and_carries_the_task_as_get_shows_it(client, receiver):
    task = create(client, f"{receiver.url}/webhooks/sim/job_1?x=1", outputs=2)
    (hook,) = receiver.wait_for(1)
    assert hook.path == "/webhooks/sim/job_1" and hook.query == "x=1"
    assert hook.headers["content-type"] == "application/json"
    assert verify_tv1(hook.headers["x-signature"], hook.body, task["webhook_secret"], time.time())
    assert not verify_tv1(hook.headers["x-signature"], hook.body, "another-secret", time.time())
    assert not verify_tv1(hook.headers["x-signature"], hook.body + b" ", task["webhook_secret"], time.time())
    payload = json.loads(hook.body)
    assert payload["status"] == "succeeded" and len(payload["outputs"]) == 2
    assert payload == client.get(f"/v1/tasks/{task['id']}").json()
    time.sleep(0.3)
    assert len(receiver.received) == 1
    stats = client.get("/_sim/stats").json()
    assert stats["webhooks_sent"] == 1 and stats["webhooks_delivered"] == 1


def test_failed_and_cancelled_tasks_send_a_webhook_too(client, receiver):
    create(client, f"{receiver.url}/failed", outcome="failed")
    cancelled = create(client, f"{receiver.url}/cancelled", duration_s=30)
    client.post(f"/v1/tasks/{cancelled['id']}/cancel")
    hooks = {h.path: json.loads(h.body) for h in receiver.wait_for(2)}
    assert hooks["/failed"]["status"] == "failed" and hooks["/failed"]["error"]
    assert hooks["/cancelled"]["status"] == "cancelled"
    time.sleep(0.3)
    assert len(receiver.received) == 2  # a cancel replaces the planned webhook, not adds one


def test_a_failing_receiver_gets_the_webhook_again_after_a_delay(client, receiver):
    receiver.fail_next(2)
    task = create(client, f"{receiver.url}/hook")
    hooks = receiver.wait_for(3, timeout=5)
    assert [h.body for h in hooks] == [hooks[0].body] * 3
    assert hooks[1].at - hooks[0].at >= RETRY_DELAYS[0] * 0.9
    assert hooks[2].at - hooks[1].at >= RETRY_DELAYS[1] * 0.9
    assert verify_tv1(hooks[2].headers["x-signature"], hooks[2].body, task["webhook_secret"], time.time())
    time.sleep(0.5)
    assert len(receiver.received) == 3
    stats = client.get("/_sim/stats").json()
    assert stats["webhooks_sent"] == 3 and stats["webhooks_delivered"] == 1 and stats["webhooks_failed"] == 0


def test_delivery_is_given_up_after_the_last_retry(client, receiver):
    receiver.fail_next(100, status=503)
    create(client, f"{receiver.url}/hook")
    receiver.wait_for(len(RETRY_DELAYS) + 1, timeout=5)
    wait_until(lambda: client.get("/_sim/stats").json()["webhooks_failed"] == 1, 5, "the give-up")
    time.sleep(0.3)
    assert len(receiver.received) == len(RETRY_DELAYS) + 1
    assert client.get("/_sim/stats").json()["webhooks_delivered"] == 0


def test_connection_errors_are_retried_then_given_up(client):
    create(client, f"http://127.0.0.1:{free_port()}/nobody-listens")
    attempts = len(RETRY_DELAYS) + 1
    wait_until(lambda: client.get("/_sim/stats").json()["webhooks_failed"] == 1, 5, "the give-up")
    assert client.get("/_sim/stats").json()["webhooks_sent"] == attempts


def test_no_callback_url_no_webhook(client, receiver):
    client.post("/v1/tasks", json={"model": "m", "input": {"duration_s": 0}})
    time.sleep(0.2)
    assert client.get("/_sim/stats").json()["webhooks_sent"] == 0


def test_reset_cancels_pending_webhooks(client, receiver):
    create(client, f"{receiver.url}/hook", duration_s=0.3)
    client.post("/_sim/reset")
    time.sleep(0.6)
    assert receiver.received == []
