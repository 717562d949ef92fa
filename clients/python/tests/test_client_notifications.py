"""Timeline, metadata, notification endpoints and notifications, against the
real longcall: it delivers to the session's loopback `receiver`, and what
arrives passes verify_webhook with the endpoint's secret."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from client_support import FAST, WAIT_S
from longcall_client import InvalidRequest, NotFound, WebhookEndpoint, verify_webhook

DELIVERY_WITHIN_S = 60  # the settler delivers at once; the margin is for a loaded machine


async def arrived(receiver, job_id: str, count: int = 1) -> list:
    """The deliveries the receiver got for this job, once there are `count` of them."""
    deadline = time.monotonic() + DELIVERY_WITHIN_S
    while True:
        mine = [s for s in receiver.seen if s.method == "POST" and f'"{job_id}"'.encode() in s.body]
        if len(mine) >= count or time.monotonic() > deadline:
            return mine
        await asyncio.sleep(0.1)


async def test_metadata_is_echoed(api):
    job = await api.jobs.create("sim", "image-fast", FAST, max_credits=2, metadata={"user": "u-42", "n": [1, 2]})
    assert job.metadata == {"user": "u-42", "n": [1, 2]}
    assert (await api.jobs.get(job.id)).metadata == {"user": "u-42", "n": [1, 2]}
    with pytest.raises(InvalidRequest):
        await api.jobs.create("sim", "image-fast", FAST, max_credits=2, metadata={"big": "x" * 5000})
    await api.jobs.cancel(job.id)


async def test_the_timeline(api):
    job = await api.jobs.wait((await api.jobs.create("sim", "image-fast", FAST, max_credits=2)).id, WAIT_S)
    assert job.status == "succeeded"
    events = await api.jobs.events(job.id)
    types = [e.type for e in events]
    assert types[0] == "created" and "output_stored" in types and "closed" in types
    assert types.index("output_stored") < types.index("closed")
    stamps = [e.at for e in events]
    assert all(stamps) and stamps == sorted(stamps)  # oldest first
    closed = next(e for e in events if e.type == "closed")
    assert closed.detail.get("status") == "succeeded"
    with pytest.raises(NotFound):
        await api.jobs.events("job_" + "0" * 24)


async def test_endpoints_create_list_delete(make_owner, make_api, receiver):
    api = make_api(make_owner().api_key)
    endpoint = await api.webhook_endpoints.create(f"{receiver.url}/hooks/a", events=["job.succeeded"])
    assert isinstance(endpoint, WebhookEndpoint) and endpoint.id.startswith("we_")
    assert endpoint.secret and endpoint.secret.startswith("whsec_") and endpoint.events == ["job.succeeded"]
    assert endpoint.secret not in repr(endpoint)
    listed = await api.webhook_endpoints.list()
    assert [(e.id, e.url, e.secret) for e in listed] == [(endpoint.id, f"{receiver.url}/hooks/a", None)]
    await api.webhook_endpoints.delete(endpoint.id)
    assert await api.webhook_endpoints.list() == []
    with pytest.raises(NotFound):
        await api.webhook_endpoints.delete(endpoint.id)
    with pytest.raises(InvalidRequest):  # not https, not an allowed origin
        await api.webhook_endpoints.create("http://example.com/hook")


async def test_a_notification_arrives_signed_and_is_listed_and_redelivered(make_owner, make_api, receiver):
    owner = make_owner()
    api = make_api(owner.api_key)
    endpoint = await api.webhook_endpoints.create(f"{receiver.url}/hooks/b")
    job = await api.jobs.create("sim", "image-fast", FAST, max_credits=2, metadata={"order": 7})
    assert (await api.jobs.wait(job.id, WAIT_S)).status == "succeeded"

    [delivery] = await arrived(receiver, job.id)
    assert delivery.path == "/hooks/b"
    payload = verify_webhook(delivery.headers, delivery.body, endpoint.secret)
    assert payload["type"] == "job.succeeded" and payload["id"] == delivery.headers["webhook-id"]
    assert payload["data"]["id"] == job.id and payload["data"]["owner_id"] == owner.owner_id
    assert payload["data"]["metadata"] == {"order": 7}
    # Another endpoint's secret does not verify it.
    other = await api.webhook_endpoints.create(f"{receiver.url}/hooks/other", events=["job.cancelled"])
    with pytest.raises(Exception, match="signature"):
        verify_webhook(delivery.headers, delivery.body, other.secret)

    page = await api.notifications.list(job_id=job.id)
    [notification] = page.notifications
    assert page.next_cursor is None
    assert notification.id == payload["id"] and notification.type == "job.succeeded" and notification.job_id == job.id
    deadline = time.monotonic() + DELIVERY_WITHIN_S
    while notification.deliveries[0].status != "delivered" and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        [notification] = (await api.notifications.list(job_id=job.id)).notifications
    [state] = notification.deliveries
    assert (state.endpoint_id, state.status, state.last_status_code) == (endpoint.id, "delivered", 204)
    assert state.attempts >= 1 and state.last_attempt_at is not None

    again = await api.notifications.redeliver(notification.id)
    assert again.id == notification.id
    first, second = await arrived(receiver, job.id, count=2)
    assert second.headers["webhook-id"] == first.headers["webhook-id"]  # the same id: receivers deduplicate on it
    assert verify_webhook(second.headers, second.body, endpoint.secret)["id"] == notification.id
    with pytest.raises(NotFound):
        await api.notifications.redeliver("evt_" + "0" * 24)


async def test_the_body_is_json_of_the_job(make_owner, make_api, receiver):
    """The notification's `data` parses into the same Job the API answers."""
    from longcall_client import Job

    api = make_api(make_owner().api_key)
    endpoint = await api.webhook_endpoints.create(f"{receiver.url}/hooks/c")
    job = await api.jobs.wait((await api.jobs.create("sim", "image-fast", FAST, max_credits=2)).id, WAIT_S)
    [delivery] = await arrived(receiver, job.id)
    data = Job.from_json(verify_webhook(delivery.headers, delivery.body, endpoint.secret)["data"])
    assert (data.id, data.status, data.outputs[0].sha256) == (job.id, "succeeded", job.outputs[0].sha256)
    assert json.loads(delivery.body)["data"]["status_url"].startswith(f"/v1/jobs/{job.id}?token=")
