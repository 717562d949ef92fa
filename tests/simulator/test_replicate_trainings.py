"""Replicate's trainings under /replicate, as the OpenAPI document
(trainings.create, trainings.get, trainings.cancel, trainings.list and the
schemas_training_request/response schemas; the copy in repo tryAGI/Replicate,
src/libs/Replicate/openapi.json) and replicate-python's recorded answers
(tests/cassettes/trainings-*.yaml) show them."""
from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest

from app.signing.webhooks import verify_standard_webhooks
from app.simulator import create_app, output_sha256

from .helpers import ServedApp, wait_until

AUTH = {"Authorization": "Bearer r8_test"}
TRAINER_VERSION = "39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"
CREATE = f"/replicate/v1/models/stability-ai/sdxl/versions/{TRAINER_VERSION}/trainings"
# The documented create answer (trainings.create's example; the recorded
# trainings-create.yaml has the same keys, less urls.web).
CREATE_FIELDS = {"id", "model", "version", "input", "logs", "error", "status", "created_at", "urls"}
# schemas_training_response's properties: nothing else (no data_removed, no deadline).
FIELDS = CREATE_FIELDS | {"output", "source", "started_at", "completed_at", "metrics"}


def create(client: httpx.Client, input: dict, destination: str = "acme/my-sdxl", **body) -> httpx.Response:
    return client.post(CREATE, json={"destination": destination, "input": input, **body}, headers=AUTH)


def get(client: httpx.Client, training_id: str) -> dict:
    response = client.get(f"/replicate/v1/trainings/{training_id}", headers=AUTH)
    assert response.status_code == 200
    return response.json()


def wait_status(client: httpx.Client, training_id: str, statuses: tuple[str, ...]) -> dict:
    return wait_until(lambda: (t := get(client, training_id))["status"] in statuses and t, 5, str(statuses))


@pytest.mark.parametrize("method, path", [
    ("POST", CREATE),
    ("GET", "/replicate/v1/trainings"),
    ("GET", "/replicate/v1/trainings/abc"),
    ("POST", "/replicate/v1/trainings/abc/cancel"),
])
@pytest.mark.parametrize("auth", [None, "Bearer", "Key abc"])
def test_every_training_route_wants_a_token(client, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    response = client.request(method, path, headers=headers, json={"destination": "a/b", "input": {}})
    assert response.status_code == 401 and response.json()["status"] == 401
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_a_training_goes_starting_processing_succeeded_with_a_new_version_and_weights(client):
    response = create(client, {"input_images": "https://example.com/data.zip", "duration_s": 0.6,
                               "output_bytes": 4096})
    assert response.status_code == 201
    created = response.json()
    assert set(created) == CREATE_FIELDS
    assert (created["model"], created["version"], created["status"]) == ("stability-ai/sdxl", TRAINER_VERSION,
                                                                         "starting")
    assert created["input"]["input_images"] == "https://example.com/data.zip" and created["error"] is None
    assert created["created_at"].endswith("Z") and len(created["id"]) == 26
    # As the API answers a create: urls at /v1/predictions/{id} ...
    assert created["urls"]["get"].endswith(f"/replicate/v1/predictions/{created['id']}")
    assert created["urls"]["cancel"] == created["urls"]["get"] + "/cancel"
    # ... and a later read at /v1/trainings/{id}.
    read = get(client, created["id"])
    assert set(read) == FIELDS and read["status"] in ("starting", "processing")
    assert read["urls"]["get"].endswith(f"/replicate/v1/trainings/{created['id']}")
    assert read["urls"]["cancel"] == read["urls"]["get"] + "/cancel"
    assert set(read["urls"]) == {"web", "get", "cancel"} and read["source"] == "api"
    assert read["output"] is None and read["metrics"] == {}

    processing = wait_status(client, created["id"], ("processing",))
    assert processing["started_at"] is not None and processing["completed_at"] is None
    done = wait_status(client, created["id"], ("succeeded",))
    assert set(done["output"]) == {"version", "weights"}
    destination, _, version_id = done["output"]["version"].partition(":")
    assert destination == "acme/my-sdxl" and len(version_id) == 64 and int(version_id, 16) >= 0
    assert done["metrics"]["predict_time"] > 0 and done["metrics"]["total_time"] >= done["metrics"]["predict_time"]
    assert done["completed_at"] >= done["started_at"] >= done["created_at"]
    weights = httpx.get(done["output"]["weights"], trust_env=False)
    assert weights.status_code == 200
    assert hashlib.sha256(weights.content).hexdigest() == output_sha256(created["id"], 0, 4096)
    assert get(client, created["id"])["output"] == done["output"]  # the same version every read


def test_a_failed_training_has_an_error_string_and_no_output(client):
    training = create(client, {"duration_s": 0.1, "outcome": "failed"}).json()
    done = wait_status(client, training["id"], ("failed",))
    assert isinstance(done["error"], str) and done["error"] and done["output"] is None
    assert "predict_time" in done["metrics"]


def test_outputs_zero_makes_a_success_without_output(client):
    training = create(client, {"duration_s": 0, "outputs": 0}).json()
    assert wait_status(client, training["id"], ("succeeded",))["output"] is None


def test_cancel_makes_it_canceled_and_a_finished_one_stays(client):
    training = create(client, {"duration_s": 30}).json()
    response = client.post(f"/replicate/v1/trainings/{training['id']}/cancel", headers=AUTH)
    assert response.status_code == 200
    canceled = response.json()
    assert set(canceled) == FIELDS
    assert canceled["status"] == "canceled" and canceled["output"] is None and canceled["completed_at"]
    assert "predict_time" in canceled["metrics"]  # terminated trainings include metrics
    assert get(client, training["id"])["status"] == "canceled"
    finished = create(client, {"duration_s": 0}).json()
    assert client.post(f"/replicate/v1/trainings/{finished['id']}/cancel", headers=AUTH).json()["status"] == \
        "succeeded"
    assert client.get("/replicate/v1/trainings/nope", headers=AUTH).status_code == 404
    assert client.post("/replicate/v1/trainings/nope/cancel", headers=AUTH).status_code == 404


def test_trainings_and_predictions_are_apart(client):
    training = create(client, {"duration_s": 30}).json()
    prediction = client.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {"duration_s": 30}},
                             headers=AUTH).json()
    # The create answer's own urls are the API's quirk; nothing documents
    # that a prediction read answers a training.
    assert client.get(training["urls"]["get"], headers=AUTH).status_code == 404
    assert client.post(training["urls"]["cancel"], headers=AUTH).status_code == 404
    assert get(client, training["id"])["status"] != "canceled"
    assert client.get(f"/replicate/v1/trainings/{prediction['id']}", headers=AUTH).status_code == 404
    listed = client.get("/replicate/v1/predictions", headers=AUTH).json()["results"]
    assert [p["id"] for p in listed] == [prediction["id"]]
    trainings = client.get("/replicate/v1/trainings", headers=AUTH).json()
    assert [t["id"] for t in trainings["results"]] == [training["id"]]
    assert set(trainings["results"][0]) == FIELDS


def test_the_list_is_newest_first_cursor_paginated_and_takes_no_filter():
    served = ServedApp(create_app(replicate_page_size=2)).start()
    try:
        with httpx.Client(base_url=served.url, trust_env=False) as c:
            ids = [create(c, {"duration_s": 30, "n": n}).json()["id"] for n in range(5)]
            c.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": {}}, headers=AUTH)
            page = c.get("/replicate/v1/trainings", headers=AUTH).json()
            assert page["previous"] is None and len(page["results"]) == 2
            seen = [t["id"] for t in page["results"]]
            while page["next"]:
                assert page["next"].startswith(f"{served.url}/replicate/v1/trainings?cursor=")
                page = c.get(page["next"], headers=AUTH).json()
                seen += [t["id"] for t in page["results"]]
            assert seen == ids[::-1]
            # No query parameter is documented: a filter changes nothing.
            filtered = c.get("/replicate/v1/trainings", params={"created_after": "2999-01-01T00:00:00Z"},
                             headers=AUTH).json()
            assert [t["id"] for t in filtered["results"]] == ids[::-1][:2]
            assert c.get("/replicate/v1/trainings?cursor=%%%", headers=AUTH).status_code == 400
    finally:
        served.stop()


def test_the_list_is_empty_without_trainings(client):
    assert client.get("/replicate/v1/trainings", headers=AUTH).json() == {
        "previous": None, "next": None, "results": []}


@pytest.mark.parametrize("body, status", [
    ({"input": {}}, 422),  # destination is required
    ({"destination": "a/b"}, 422),  # input is required
    ({"destination": "a/b", "input": "x"}, 422),
    ({"destination": 3, "input": {}}, 404),
    ({"destination": "<invalid>", "input": {}}, 404),
    ({"destination": "a/b/c", "input": {}}, 404),
    ({"destination": "a/b", "input": {}, "webhook": "not a url"}, 422),
    ({"destination": "a/b", "input": {}, "webhook_events_filter": ["finished"]}, 422),
    ({"destination": "a/b", "input": {"duration_s": -1}}, 422),
    ([1], 400),
])
def test_an_invalid_create_is_refused_and_creates_nothing(client, body, status):
    response = client.post(CREATE, json=body, headers=AUTH)
    assert response.status_code == status
    assert response.json()["status"] == status and response.json()["detail"]
    assert client.post(CREATE, content=b"{oops", headers=AUTH).status_code == 400
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_an_invalid_destination_is_the_recorded_404(client):
    # trainings-create__invalid-destination.yaml
    response = create(client, {}, destination="<invalid>")
    assert response.status_code == 404
    assert response.json() == {"detail": "The specified training destination does not exist", "status": 404}


def test_cancel_after_and_prefer_are_not_training_headers(client):
    # A prediction refuses Cancel-After 2s (below the 5 s minimum); a
    # training has no such header, nor a deadline.
    response = client.post(CREATE, json={"destination": "a/b", "input": {"duration_s": 0.2}},
                           headers={**AUTH, "Cancel-After": "2s", "Prefer": "wait=5"})
    assert response.status_code == 201 and response.json()["status"] == "starting"
    assert "preference-applied" not in response.headers
    done = wait_status(client, response.json()["id"], ("succeeded",))
    assert "deadline" not in done


def test_after_the_output_lifetime_the_weights_are_gone(client):
    training = create(client, {"duration_s": 0.1, "output_ttl_s": 1}).json()
    done = wait_status(client, training["id"], ("succeeded",))
    url = done["output"]["weights"]
    wait_until(lambda: httpx.get(url, trust_env=False).status_code == 404, 10, "the weights to expire")
    assert get(client, training["id"])["output"] == done["output"]


# ------------------------------------------------------------------ faults

def test_a_throttled_create_or_read_is_the_documented_429(client):
    training = create(client, {"duration_s": 30}).json()
    client.post("/_sim/faults", json={"throttle": 1})
    for response in (create(client, {}), client.get(f"/replicate/v1/trainings/{training['id']}", headers=AUTH)):
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json()["detail"].startswith("Request was throttled.")
    assert client.get("/_sim/stats").json()["tasks_created"] == 1


def test_submit_and_status_errors(client):
    client.post("/_sim/faults", json={"submit_error": 1})
    assert create(client, {}).status_code == 500
    assert client.get("/_sim/stats").json()["tasks_created"] == 0
    client.post("/_sim/faults", json={})
    training = create(client, {"duration_s": 30}).json()
    client.post("/_sim/faults", json={"status_error": 1})
    assert client.get(f"/replicate/v1/trainings/{training['id']}", headers=AUTH).status_code == 500


def test_a_create_whose_answer_is_lost_still_made_the_training(client):
    client.post("/_sim/faults", json={"submit_timeout_after_create": 1})
    with pytest.raises(httpx.TransportError):
        create(client, {"duration_s": 30, "tag": "lost"})
    client.post("/_sim/faults", json={})
    (made,) = client.get("/replicate/v1/trainings", headers=AUTH).json()["results"]
    assert made["input"]["tag"] == "lost" and client.get("/_sim/stats").json()["tasks_created"] == 1


# ------------------------------------------------------------------ webhooks

def test_the_completed_webhook_is_the_training_signed_with_the_account_secret(client, receiver):
    secret = client.get("/replicate/v1/webhooks/default/secret", headers=AUTH).json()["key"]
    hook_url = f"{receiver.url}/webhooks/replicate/job_1"
    training = create(client, {"duration_s": 0.1}, webhook=f"{hook_url}?token=abc",
                      webhook_events_filter=["completed"]).json()
    assert set(training) == CREATE_FIELDS  # what it was created with is not echoed
    assert client.get("/_sim/stats").json()["creates_by_callback_url"] == {hook_url: 1}
    (hook,) = receiver.wait_for(1)
    assert hook.query == "token=abc"
    assert verify_standard_webhooks(hook.headers, hook.body, secret, time.time())
    assert not verify_standard_webhooks(hook.headers, hook.body + b"x", secret, time.time())
    body = json.loads(hook.body)
    # "the same as the response body of the get training operation"
    assert set(body) == FIELDS and body["id"] == training["id"] and body["status"] == "succeeded"
    assert body["output"]["version"].startswith("acme/my-sdxl:")
    assert body["urls"]["get"].endswith(f"/v1/trainings/{training['id']}")
    time.sleep(0.3)
    assert len(receiver.received) == 1


def test_default_events_send_start_and_completed(client, receiver):
    create(client, {"duration_s": 0.3}, webhook=f"{receiver.url}/hook")
    start, completed = receiver.wait_for(2)
    assert json.loads(start.body)["status"] == "starting"
    assert json.loads(completed.body)["status"] == "succeeded"
    assert start.headers["webhook-id"] != completed.headers["webhook-id"]


def test_a_canceled_training_sends_its_completed_webhook(client, receiver):
    training = create(client, {"duration_s": 30}, webhook=f"{receiver.url}/hook",
                      webhook_events_filter=["completed"]).json()
    client.post(f"/replicate/v1/trainings/{training['id']}/cancel", headers=AUTH)
    (hook,) = receiver.wait_for(1)
    assert json.loads(hook.body)["status"] == "canceled"
