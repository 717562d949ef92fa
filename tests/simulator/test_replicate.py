"""Replicate's wire protocol under /replicate."""
from __future__ import annotations

import base64
import hashlib
import json
import time

import httpx
import pytest

from app.signing.webhooks import verify_standard_webhooks
from app.simulator import create_app, output_sha256
from app.simulator.replicate import parse_cancel_after, parse_prefer_wait

from .helpers import ServedApp, wait_until

AUTH = {"Authorization": "Bearer r8_test"}
# The OpenAPI document's prediction response: required id, model, version,
# input, output, data_removed, error, status, created_at, urls; optional
# logs, metrics, started_at, completed_at, source (deadline and deployment
# only for predictions that have one). No `webhook`: it is not documented.
FIELDS = {
    "id", "model", "version", "input", "logs", "output", "data_removed", "error", "source", "status",
    "created_at", "started_at", "completed_at", "urls", "metrics",
}


def create(client: httpx.Client, input: dict, **body) -> httpx.Response:
    return client.post("/replicate/v1/predictions", json={"version": "owner/model:abc123", "input": input, **body},
                       headers=AUTH)


def get(client: httpx.Client, prediction: dict) -> dict:
    response = client.get(prediction["urls"]["get"], headers=AUTH)
    assert response.status_code == 200
    return response.json()


def wait_status(client: httpx.Client, prediction: dict, statuses: tuple[str, ...]) -> dict:
    return wait_until(lambda: (p := get(client, prediction))["status"] in statuses and p, 5, str(statuses))


@pytest.mark.parametrize("method, path", [
    ("POST", "/replicate/v1/predictions"),
    ("POST", "/replicate/v1/models/a/b/predictions"),
    ("GET", "/replicate/v1/predictions"),
    ("GET", "/replicate/v1/predictions/abc"),
    ("POST", "/replicate/v1/predictions/abc/cancel"),
    ("GET", "/replicate/v1/webhooks/default/secret"),
])
@pytest.mark.parametrize("auth", [None, "Bearer", "Basic abc", "Key abc"])
def test_every_route_wants_a_token(client, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    response = client.request(method, path, headers=headers, json={"version": "v", "input": {}})
    assert response.status_code == 401
    assert response.json()["status"] == 401
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_prediction_goes_starting_processing_succeeded(client):
    response = create(client, {"prompt": "cat", "duration_s": 0.6, "outputs": 2, "output_bytes": 4096})
    assert response.status_code == 201
    prediction = response.json()
    assert set(prediction) == FIELDS
    assert prediction["status"] == "starting"
    assert prediction["model"] == "owner/model" and prediction["version"] == "abc123"
    assert prediction["input"]["prompt"] == "cat"
    assert prediction["output"] is None and prediction["error"] is None and prediction["started_at"] is None
    assert prediction["created_at"].endswith("Z")
    assert prediction["urls"]["cancel"] == prediction["urls"]["get"] + "/cancel"
    assert prediction["urls"]["get"].endswith(f"/replicate/v1/predictions/{prediction['id']}")
    assert set(prediction["urls"]) == {"web", "get", "cancel"}
    assert prediction["urls"]["web"].endswith(f"/p/{prediction['id']}")
    assert len(prediction["id"]) == 26

    processing = wait_status(client, prediction, ("processing",))
    assert processing["started_at"] is not None and processing["completed_at"] is None
    done = wait_status(client, prediction, ("succeeded",))
    assert done["completed_at"] is not None and done["metrics"]["predict_time"] > 0
    assert len(done["output"]) == 2
    for index, url in enumerate(done["output"]):
        body = httpx.get(url, trust_env=False).content
        assert hashlib.sha256(body).hexdigest() == output_sha256(prediction["id"], index, 4096)


def test_create_by_model_and_by_bare_version(client):
    by_model = client.post("/replicate/v1/models/black-forest-labs/flux-schnell/predictions",
                           json={"input": {"duration_s": 5}}, headers=AUTH)
    assert by_model.status_code == 201
    assert by_model.json()["model"] == "black-forest-labs/flux-schnell"
    assert len(by_model.json()["version"]) == 64
    bare = client.post("/replicate/v1/predictions", json={"version": "5c7d5dc6", "input": {}}, headers=AUTH)
    assert bare.status_code == 201 and bare.json()["version"] == "5c7d5dc6"


def test_failed_prediction_has_an_error_string(client):
    prediction = create(client, {"duration_s": 0.1, "outcome": "failed"}).json()
    done = wait_status(client, prediction, ("failed",))
    assert isinstance(done["error"], str) and done["error"] and done["output"] is None


def test_cancel_makes_it_canceled_and_a_finished_one_stays(client):
    prediction = create(client, {"duration_s": 30}).json()
    response = client.post(prediction["urls"]["cancel"], headers=AUTH)
    assert response.status_code == 200 and response.json()["status"] == "canceled"
    assert get(client, prediction)["status"] == "canceled"
    assert get(client, prediction)["completed_at"] is not None
    finished = create(client, {"duration_s": 0}).json()
    assert client.post(finished["urls"]["cancel"], headers=AUTH).json()["status"] == "succeeded"
    assert client.get("/replicate/v1/predictions/nope", headers=AUTH).status_code == 404
    assert client.post("/replicate/v1/predictions/nope/cancel", headers=AUTH).status_code == 404


def test_idempotency_key_is_ignored_like_replicate_does(client):
    headers = {**AUTH, "Idempotency-Key": "same"}
    body = {"version": "a/b:1", "input": {"duration_s": 5}}
    first = client.post("/replicate/v1/predictions", json=body, headers=headers).json()
    second = client.post("/replicate/v1/predictions", json=body, headers=headers).json()
    assert first["id"] != second["id"]
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 2 and stats["creates_by_idempotency_key"] == {}


def test_list_is_newest_first_and_cursor_paginated(client):
    ids = [create(client, {"duration_s": 30}).json()["id"] for _ in range(101)]
    client.post("/v1/tasks", json={"model": "m", "input": {}})  # other protocols are not listed
    page = client.get("/replicate/v1/predictions", headers=AUTH).json()
    assert page["previous"] is None
    assert [p["id"] for p in page["results"]] == ids[::-1][:100]
    assert page["next"] is not None
    last = client.get(page["next"], headers=AUTH).json()
    assert [p["id"] for p in last["results"]] == [ids[0]]
    assert last["next"] is None
    assert client.get("/replicate/v1/predictions?cursor=%%%", headers=AUTH).status_code == 400


def test_list_filters_on_created_after_inclusive_and_created_before_exclusive(client):
    made = [create(client, {"duration_s": 30}).json() for _ in range(3)]
    first, second, third = made

    def listed(**params) -> list[str]:
        page = client.get("/replicate/v1/predictions", params=params, headers=AUTH).json()
        assert page["next"] is None
        return [p["id"] for p in page["results"]]

    assert listed(created_after=second["created_at"]) == [third["id"], second["id"]]
    assert listed(created_before=second["created_at"]) == [first["id"]]
    assert listed(created_after=first["created_at"], created_before=third["created_at"]) == [
        second["id"], first["id"]]
    assert listed(created_after=second["created_at"].replace("Z", "+00:00")) == [third["id"], second["id"]]
    assert listed(created_after="2999-01-01T00:00:00Z") == []
    for bad in ("yesterday", "2024-13-01T00:00:00Z"):
        response = client.get("/replicate/v1/predictions", params={"created_after": bad}, headers=AUTH)
        assert response.status_code == 400 and response.json()["detail"]


def test_next_pages_keep_the_filters():
    served = ServedApp(create_app(replicate_page_size=2)).start()
    try:
        c = httpx.Client(base_url=served.url, trust_env=False)
        ids = [create(c, {"duration_s": 30}).json() for _ in range(5)]
        page = c.get("/replicate/v1/predictions", params={"created_after": ids[1]["created_at"]},
                     headers=AUTH).json()
        seen = [p["id"] for p in page["results"]]
        while page["next"]:
            assert "created_after=" in page["next"]
            page = c.get(page["next"], headers=AUTH).json()
            seen += [p["id"] for p in page["results"]]
        assert seen == [p["id"] for p in ids[:0:-1]]
        c.close()
    finally:
        served.stop()


def test_list_is_empty_without_predictions(client):
    assert client.get("/replicate/v1/predictions", headers=AUTH).json() == {
        "previous": None, "next": None, "results": []}


def test_the_account_webhook_secret_is_one_whsec_key(client):
    key = client.get("/replicate/v1/webhooks/default/secret", headers=AUTH).json()["key"]
    assert key.startswith("whsec_")
    assert len(base64.b64decode(key[len("whsec_"):], validate=True)) == 32
    assert client.get("/replicate/v1/webhooks/default/secret", headers={"Authorization": "Bearer other"}
                      ).json()["key"] == key


def test_completed_webhook_is_signed_with_standard_webhooks(client, receiver):
    secret = client.get("/replicate/v1/webhooks/default/secret", headers=AUTH).json()["key"]
    prediction = create(client, {"duration_s": 0.1}, webhook=f"{receiver.url}/webhooks/replicate/job_1",
                        webhook_events_filter=["completed"]).json()
    assert set(prediction) == FIELDS  # what it was created with is not echoed
    (hook,) = receiver.wait_for(1)
    assert verify_standard_webhooks(hook.headers, hook.body, secret, time.time())
    assert not verify_standard_webhooks(hook.headers, hook.body + b"x", secret, time.time())
    assert hook.headers["webhook-id"] and hook.headers["webhook-timestamp"].isdigit()
    body = json.loads(hook.body)
    assert body["id"] == prediction["id"] and body["status"] == "succeeded" and len(body["output"]) == 1
    time.sleep(0.3)
    assert len(receiver.received) == 1


def test_default_events_send_start_and_completed(client, receiver):
    create(client, {"duration_s": 0.3}, webhook=f"{receiver.url}/hook")
    start, completed = receiver.wait_for(2)
    assert json.loads(start.body)["status"] == "starting"
    assert json.loads(completed.body)["status"] == "succeeded"
    assert start.headers["webhook-id"] != completed.headers["webhook-id"]


def test_canceled_prediction_sends_its_completed_webhook(client, receiver):
    prediction = create(client, {"duration_s": 30}, webhook=f"{receiver.url}/hook",
                        webhook_events_filter=["completed"]).json()
    client.post(prediction["urls"]["cancel"], headers=AUTH)
    (hook,) = receiver.wait_for(1)
    assert json.loads(hook.body)["status"] == "canceled"


@pytest.mark.parametrize("body, status", [
    ({"input": {}}, 422),
    ({"version": "", "input": {}}, 422),
    ({"version": "a/b:1"}, 422),
    ({"version": "a/b:1", "input": "x"}, 422),
    ({"version": "a/b:1", "input": {}, "webhook": "not a url"}, 422),
    ({"version": "a/b:1", "input": {}, "webhook_events_filter": ["finished"]}, 422),
    ({"version": "a/b:1", "input": {}, "webhook_events_filter": "completed"}, 422),
    ({"version": "a/b:1", "input": {"duration_s": -1}}, 422),
    ([1], 400),
])
def test_invalid_create_is_rejected_and_creates_nothing(client, body, status):
    response = client.post("/replicate/v1/predictions", json=body, headers=AUTH)
    assert response.status_code == status
    assert response.json()["status"] == status and response.json()["detail"]
    assert client.post("/replicate/v1/predictions", content=b"{oops", headers=AUTH).status_code == 400
    huge = b'{"version": "a/b:1", "input": {"prompt": 1e400}}'  # would be inf, which no answer can echo
    assert client.post("/replicate/v1/predictions", content=huge, headers=AUTH).status_code == 400
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_output_text_makes_the_output_that_string(client):
    prediction = create(client, {"duration_s": 0.1, "output_text": "hello Alice"}).json()
    done = wait_status(client, prediction, ("succeeded",))
    assert done["output"] == "hello Alice" and done["data_removed"] is False


def test_after_the_output_lifetime_the_output_and_the_input_are_removed(client):
    # 2 s of lifetime: the first read after the end falls well within it.
    # Replicate's "Data retention": "all input parameters, output values,
    # output files, and logs are automatically removed after an hour".
    prediction = create(client, {"duration_s": 0.1, "output_ttl_s": 2}).json()
    done = wait_status(client, prediction, ("succeeded",))
    assert done["data_removed"] is False and done["input"] == {"duration_s": 0.1, "output_ttl_s": 2}
    (url,) = done["output"]
    removed = wait_until(lambda: (p := get(client, prediction))["data_removed"] and p, 10, "data_removed")
    assert removed["status"] == "succeeded" and removed["output"] is None and removed["input"] == {}
    assert removed["completed_at"] == done["completed_at"]
    assert httpx.get(url, trust_env=False).status_code == 404
    text = create(client, {"duration_s": 0, "output_text": "hi", "output_ttl_s": 0.01}).json()
    removed = wait_until(lambda: (p := get(client, text))["data_removed"] and p, 10, "data_removed")
    assert removed["output"] is None


def test_output_text_must_be_a_string(client):
    response = create(client, {"output_text": 3})
    assert response.status_code == 422 and "output_text" in response.json()["detail"]


# ------------------------------------------------------- Cancel-After, Prefer: wait

@pytest.mark.parametrize("value, seconds", [
    ("30", 30), ("30s", 30), ("5", 5), ("5m", 300), ("1h30m45s", 5445), ("2h30m", 9000), ("1h", 3600),
    (" 10s ", 10),
])
def test_cancel_after_durations_as_the_document_writes_them(value, seconds):
    assert parse_cancel_after(value) == seconds


@pytest.mark.parametrize("value", ["4", "4s", "0", "", "s", "1d", "30m1h", "-5", "1.5s", "10 s", "abc"])
def test_cancel_after_below_5_s_or_malformed_is_refused(value):
    with pytest.raises(ValueError):
        parse_cancel_after(value)


@pytest.mark.parametrize("value, seconds", [(None, None), ("wait", 60), ("wait=1", 1), ("wait=60", 60),
                                            ("wait=10", 10), ("wait=99", 60)])
def test_prefer_wait_as_the_document_writes_it(value, seconds):
    assert parse_prefer_wait(value) == seconds


@pytest.mark.parametrize("value", ["wait=0", "wait=100", "wait=05", "respond-async", "wait=", "wait=1.5"])
def test_prefer_outside_the_documented_pattern_is_refused(value):
    with pytest.raises(ValueError):
        parse_prefer_wait(value)


def test_a_deadline_before_the_start_aborts_and_one_while_running_cancels(client):
    # duration 100 s: queued for the first 10 s. Cancel-After 5 s passes while
    # it is still queued: aborted, never started.
    queued = client.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {"duration_s": 100}},
                         headers={**AUTH, "Cancel-After": "5s"}).json()
    assert queued["status"] == "starting" and queued["deadline"] is not None
    # duration 6 s: queued for 0.6 s, then running past its 5 s deadline.
    running = client.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {"duration_s": 6}},
                          headers={**AUTH, "Cancel-After": "5"}).json()
    aborted = wait_until(lambda: (p := get(client, queued))["status"] != "starting" and p, 10, "the deadline")
    assert aborted["status"] == "aborted" and aborted["started_at"] is None and aborted["output"] is None
    assert aborted["completed_at"] >= aborted["deadline"]
    canceled = wait_until(lambda: (p := get(client, running))["status"] in ("canceled", "succeeded") and p, 10,
                          "the deadline")
    assert canceled["status"] == "canceled" and canceled["started_at"] is not None
    assert canceled["completed_at"] >= canceled["deadline"]
    # Without the header there is no deadline field (it is optional).
    assert "deadline" not in create(client, {"duration_s": 1}).json()


def test_a_bad_cancel_after_creates_nothing(client):
    response = client.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {}},
                           headers={**AUTH, "Cancel-After": "2s"})
    assert response.status_code == 422 and "at least 5 seconds" in response.json()["detail"]
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_prefer_wait_answers_the_finished_prediction(client):
    response = client.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {"duration_s": 0.3}},
                           headers={**AUTH, "Prefer": "wait=5"})
    assert response.status_code == 201 and response.headers["preference-applied"] == "wait=5"
    assert response.json()["status"] == "succeeded" and response.json()["output"]


def test_prefer_wait_gives_up_at_its_limit_with_the_prediction_still_running(client):
    started = time.monotonic()
    response = client.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {"duration_s": 30}},
                           headers={**AUTH, "Prefer": "wait=1"})
    assert time.monotonic() - started >= 0.9
    assert response.status_code == 201 and response.json()["status"] in ("starting", "processing")


def test_an_aborted_prediction_sends_its_completed_webhook(client, receiver):
    client.post("/replicate/v1/predictions",
                json={"version": "a/b:1", "input": {"duration_s": 100}, "webhook": receiver.url,
                      "webhook_events_filter": ["completed"]},
                headers={**AUTH, "Cancel-After": "5s"})
    delivery = receiver.wait_for(1, timeout=15)[0]
    assert json.loads(delivery.body)["status"] == "aborted"
