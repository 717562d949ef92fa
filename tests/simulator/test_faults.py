"""Fault injection through /_sim/faults, under every protocol prefix."""
from __future__ import annotations

import time

import httpx
import pytest

from .conftest import HOLD_S

AUTH_BEARER = {"Authorization": "Bearer test-token"}
AUTH_KEY = {"Authorization": "Key test-key"}
AUTH_GOOG = {"x-goog-api-key": "k"}


def faults(client: httpx.Client, **rates) -> None:
    client.post("/_sim/faults", json=rates).raise_for_status()


def created(client: httpx.Client) -> int:
    return client.get("/_sim/stats").json()["tasks_created"]


# One create and one status read per protocol; `create` returns the response,
# `read(task_response)` the status read of the task it made.
CREATES = {
    "sim": lambda c, i: c.post("/v1/tasks", json={"model": "m", "input": i}),
    "replicate": lambda c, i: c.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": i},
                                     headers=AUTH_BEARER),
    "fal": lambda c, i: c.post("/fal/fal-ai/flux/dev", json=i, headers=AUTH_KEY),
    "kie": lambda c, i: c.post("/kie/api/v1/jobs/createTask", json={"model": "k", "input": i},
                               headers=AUTH_BEARER),
    "gemini": lambda c, i: c.post("/gemini/v1beta/models/veo-3.1-generate-preview:predictLongRunning",
                                  json={"instances": [{"prompt": "p"}], "parameters": i}, headers=AUTH_GOOG),
}
READS = {
    "sim": lambda c, r: c.get(f"/v1/tasks/{r.json()['id']}"),
    "replicate": lambda c, r: c.get(r.json()["urls"]["get"], headers=AUTH_BEARER),
    "fal": lambda c, r: c.get(r.json()["status_url"], headers=AUTH_KEY),
    "kie": lambda c, r: c.get("/kie/api/v1/jobs/recordInfo", params={"taskId": r.json()["data"]["taskId"]},
                              headers=AUTH_BEARER),
    "gemini": lambda c, r: c.get(f"/gemini/v1beta/{r.json()['name']}", headers=AUTH_GOOG),
}


def test_faults_are_shown_set_replaced_and_cleared(client):
    assert client.get("/_sim/faults").json() == {
        "drop_webhook": 0.0, "duplicate_webhook": 0.0, "delay_webhook_s": 0.0, "submit_error": 0.0,
        "submit_timeout_after_create": 0.0, "status_error": 0.0, "download_error": 0.0, "throttle": 0.0,
        "overloaded": 0.0, "max_concurrent": None,
    }
    assert client.post("/_sim/faults", json={"status_error": 0.5}).json()["status_error"] == 0.5
    client.post("/_sim/faults", json={"drop_webhook": 1})
    shown = client.get("/_sim/faults").json()
    assert shown["drop_webhook"] == 1.0 and shown["status_error"] == 0.0  # a POST replaces
    assert client.delete("/_sim/faults").json()["drop_webhook"] == 0.0
    assert client.get("/_sim/faults").json()["drop_webhook"] == 0.0


@pytest.mark.parametrize("body", [
    b'{"drop_webhooks": 1}', b'{"submit_error": 2}', b'{"status_error": -1}', b'{"download_error": "1"}',
    b'{"delay_webhook_s": -3}', b'[]', b'nope',
])
def test_bad_fault_settings_are_400_and_change_nothing(client, body):
    client.post("/_sim/faults", json={"status_error": 0.25})
    response = client.post("/_sim/faults", content=body)
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str)
    assert client.get("/_sim/faults").json()["status_error"] == 0.25


@pytest.mark.parametrize("protocol", sorted(CREATES))
def test_submit_error_answers_500_without_creating(client, protocol):
    faults(client, submit_error=1)
    response = CREATES[protocol](client, {"duration_s": 1})
    assert response.status_code == 500
    assert created(client) == 0
    client.delete("/_sim/faults")
    assert CREATES[protocol](client, {"duration_s": 1}).status_code in (200, 201)
    assert created(client) == 1


@pytest.mark.parametrize("protocol", sorted(READS))
def test_status_error_answers_500_and_is_counted(client, protocol):
    response = CREATES[protocol](client, {"duration_s": 5})
    faults(client, status_error=1)
    assert READS[protocol](client, response).status_code == 500
    client.delete("/_sim/faults")
    assert READS[protocol](client, response).status_code in (200, 202)
    assert client.get("/_sim/stats").json()["status_calls"] == 2


# Each protocol's documented 429: Replicate's rate-limits page (`detail`
# alone), KIE's code table (429 "Rate Limited" in the body's `code`), fal's
# flat request-error shape (fal documents no 429 body), ours.
THROTTLE_BODIES = {
    "sim": lambda body: body == {"error": "rate limited"},
    "replicate": lambda body: set(body) == {"detail"} and body["detail"].startswith("Request was throttled."),
    "fal": lambda body: set(body) == {"detail"},
    "kie": lambda body: body["code"] == 429 and body.get("msg", body.get("message")) == "Rate Limited",
    "gemini": lambda body: body["error"]["code"] == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED",
}


@pytest.mark.parametrize("protocol", sorted(CREATES))
def test_throttle_answers_the_documented_429_and_creates_nothing(client, protocol):
    made = CREATES[protocol](client, {"duration_s": 5})
    faults(client, throttle=1)
    for response in (CREATES[protocol](client, {"duration_s": 1}), READS[protocol](client, made)):
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        assert THROTTLE_BODIES[protocol](response.json())
    assert created(client) == 1
    client.delete("/_sim/faults")
    assert READS[protocol](client, made).status_code in (200, 202)


@pytest.mark.parametrize("protocol", sorted(CREATES))
def test_submit_timeout_after_create_creates_then_never_answers(sim_url, client, protocol):
    faults(client, submit_timeout_after_create=1)
    with httpx.Client(base_url=sim_url, timeout=0.3, trust_env=False) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            CREATES[protocol](impatient, {"duration_s": 5})
    assert created(client) == 1


def test_a_timed_out_native_create_is_found_again_by_its_key(sim_url, client):
    faults(client, submit_timeout_after_create=1)
    body = {"model": "m", "input": {"duration_s": 5}}
    with httpx.Client(base_url=sim_url, timeout=0.3, trust_env=False) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/tasks", json=body, headers={"Idempotency-Key": "job_x"})
    client.delete("/_sim/faults")
    again = client.post("/v1/tasks", json=body, headers={"Idempotency-Key": "job_x"})
    assert again.status_code == 200
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 1 and stats["creates_by_idempotency_key"] == {"job_x": 1}
    assert client.get(f"/v1/tasks/{again.json()['id']}").status_code == 200


def test_a_held_create_is_dropped_without_an_answer_after_the_hold(client):
    faults(client, submit_timeout_after_create=1)
    start = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/v1/tasks", json={"model": "m", "input": {}})
    assert time.monotonic() - start >= HOLD_S * 0.9
    assert created(client) == 1


def test_download_error_answers_500_on_output_fetches(client):
    task_id = client.post("/v1/tasks", json={"model": "m", "input": {"duration_s": 0}}).json()["id"]
    faults(client, download_error=1)
    assert client.get(f"/outputs/{task_id}/0").status_code == 500
    client.delete("/_sim/faults")
    assert client.get(f"/outputs/{task_id}/0").status_code == 200


def test_fault_rates_between_zero_and_one_hit_some_requests(client):
    faults(client, status_error=0.5)
    task_id = client.post("/v1/tasks", json={"model": "m", "input": {"duration_s": 5}}).json()["id"]
    codes = [client.get(f"/v1/tasks/{task_id}").status_code for _ in range(200)]
    assert 40 < codes.count(500) < 160 and codes.count(200) == 200 - codes.count(500)


def _native_with_callback(client: httpx.Client, receiver, duration: float = 0.1) -> str:
    body = {"model": "m", "input": {"duration_s": duration}, "callback_url": f"{receiver.url}/hook"}
    return client.post("/v1/tasks", json=body).json()["id"]


def test_drop_webhook_never_sends_it_even_if_faults_are_cleared_later(client, receiver):
    faults(client, drop_webhook=1)
    _native_with_callback(client, receiver)
    client.delete("/_sim/faults")  # the task's webhook plan was drawn at creation
    _native_with_callback(client, receiver)
    receiver.wait_for(1)
    time.sleep(0.5)
    assert len(receiver.received) == 1
    assert client.get("/_sim/stats").json()["webhooks_sent"] == 1


def test_duplicate_webhook_sends_it_twice(client, receiver):
    faults(client, duplicate_webhook=1)
    _native_with_callback(client, receiver)
    first, second = receiver.wait_for(2)
    assert first.body == second.body
    time.sleep(0.3)
    assert len(receiver.received) == 2


def test_delay_webhook_sends_it_that_much_later(client, receiver):
    faults(client, delay_webhook_s=0.8)
    start = time.time()
    _native_with_callback(client, receiver, duration=0.1)
    time.sleep(0.6)
    assert receiver.received == []
    (hook,) = receiver.wait_for(1, timeout=3)
    assert hook.at - start >= 0.85
