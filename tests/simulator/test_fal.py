"""fal's queue API under /fal."""
from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest

from app.signing.webhooks import jwks_public_keys, verify_fal
from app.simulator import output_sha256

from .helpers import wait_until

AUTH = {"Authorization": "Key fal-test"}


def submit(client: httpx.Client, input: dict, model: str = "fal-ai/flux/dev", **params) -> httpx.Response:
    return client.post(f"/fal/{model}", json=input, params=params, headers=AUTH)


def status(client: httpx.Client, request: dict) -> httpx.Response:
    return client.get(request["status_url"], headers=AUTH)


def wait_completed(client: httpx.Client, request: dict) -> dict:
    return wait_until(lambda: (r := status(client, request)).json()["status"] == "COMPLETED" and r.json(), 5,
                      "COMPLETED")


def test_routes_want_a_key(client):
    assert client.post("/fal/fal-ai/flux/dev", json={}).status_code == 401
    assert client.post("/fal/fal-ai/flux/dev", json={}, headers={"Authorization": "Bearer x"}).status_code == 401
    assert client.get("/fal/fal-ai/flux/requests/x/status").status_code == 401
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_request_goes_in_queue_in_progress_completed_with_a_result(client, sim_url):
    response = submit(client, {"prompt": "cat", "duration_s": 0.6, "outputs": 2, "output_bytes": 2048})
    assert response.status_code == 200
    request = response.json()
    request_id = request["request_id"]
    base = f"{sim_url}/fal/fal-ai/flux/requests/{request_id}"  # owner/app only: no sub-path
    assert request["response_url"] == base
    assert request["status_url"] == f"{base}/status"
    assert request["cancel_url"] == f"{base}/cancel"
    # Only what fal documents for a submit answer (fal-client reads the id and URLs).
    assert set(request) == {"status", "request_id", "response_url", "status_url", "cancel_url", "queue_position"}
    assert request["status"] == "IN_QUEUE" and request["queue_position"] == 0

    first = status(client, request)
    assert first.status_code == 202 and first.json()["status"] in ("IN_QUEUE", "IN_PROGRESS")
    wait_until(lambda: status(client, request).json()["status"] == "IN_PROGRESS", 5, "IN_PROGRESS")
    assert client.get(request["response_url"], headers=AUTH).status_code == 400  # not ready yet
    done = wait_completed(client, request)
    assert "error" not in done
    assert status(client, request).status_code == 200

    result = client.get(request["response_url"], headers=AUTH)
    assert result.status_code == 200
    images = result.json()["images"]
    assert len(images) == 2
    for index, image in enumerate(images):
        assert image["content_type"] == "image/png" and image["file_size"] == 2048
        body = httpx.get(image["url"], trust_env=False).content
        assert hashlib.sha256(body).hexdigest() == output_sha256(request_id, index, 2048)


def test_output_text_answers_as_a_text_model(client):
    request = submit(client, {"prompt": "hi", "duration_s": 0, "output_text": "héllo"}, model="fal-ai/any-llm").json()
    wait_completed(client, request)
    assert client.get(request["response_url"], headers=AUTH).json() == {"output": "héllo"}


def test_status_urls_built_from_the_full_model_id_are_404(client, sim_url):
    request = submit(client, {"duration_s": 5}).json()
    wrong = f"{sim_url}/fal/fal-ai/flux/dev/requests/{request['request_id']}/status"
    assert client.get(wrong, headers=AUTH).status_code == 404
    other_app = f"{sim_url}/fal/fal-ai/other/requests/{request['request_id']}/status"
    assert client.get(other_app, headers=AUTH).status_code == 404
    assert client.get("/fal/fal-ai/flux/requests/nope/status", headers=AUTH).status_code == 404


@pytest.mark.parametrize("model, root", [
    ("workflows/me/wf", "workflows/me/wf"),
    ("workflows/me/wf/sub/path", "workflows/me/wf"),
    ("comfy/me/wf/x", "comfy/me/wf"),
    ("123-myapp", "123/myapp"),
])
def test_namespaced_and_numeric_ids_are_addressed_as_fal_client_does(client, sim_url, model, root):
    request = submit(client, {"duration_s": 0}, model=model).json()
    base = f"{sim_url}/fal/{root}/requests/{request['request_id']}"
    assert (request["response_url"], request["status_url"], request["cancel_url"]) == (
        base, f"{base}/status", f"{base}/cancel")
    assert status(client, request).json()["status"] == "COMPLETED"
    assert client.get(request["response_url"], headers=AUTH).status_code == 200


def test_a_workflow_is_not_found_at_a_two_segment_root(client, sim_url):
    request_id = submit(client, {"duration_s": 0}, model="workflows/me/wf/sub").json()["request_id"]
    for wrong in ("workflows/me", "workflows/me/wf/sub"):
        assert client.get(f"{sim_url}/fal/{wrong}/requests/{request_id}/status", headers=AUTH).status_code == 404


@pytest.mark.parametrize("with_logs, logs", [(None, None), ("false", None), ("true", []), ("1", [])])
def test_status_bodies_carry_what_fal_client_requires(client, with_logs, logs):
    params = {"logs": with_logs} if with_logs else {}
    queued = submit(client, {"duration_s": 600}).json()
    body = client.get(queued["status_url"], params=params, headers=AUTH).json()
    assert body["status"] == "IN_QUEUE" and body["queue_position"] == 0 and "logs" not in body
    done = submit(client, {"duration_s": 0}).json()
    body = client.get(done["status_url"], params=params, headers=AUTH).json()
    assert body["status"] == "COMPLETED" and body["logs"] == logs and "error" not in body
    assert body["metrics"]["inference_time"] >= 0


def test_a_model_without_sub_path_works_the_same(client, sim_url):
    request = submit(client, {"duration_s": 0}, model="fal-ai/fast-sdxl").json()
    assert request["status_url"].startswith(f"{sim_url}/fal/fal-ai/fast-sdxl/requests/")
    assert status(client, request).json()["status"] == "COMPLETED"


def test_failed_request_is_completed_with_an_error_and_its_result_is_the_error(client):
    request = submit(client, {"duration_s": 0.1, "outcome": "failed"}).json()
    done = wait_completed(client, request)
    assert done["error"] and done["error_type"]
    result = client.get(request["response_url"], headers=AUTH)
    assert result.status_code == 422
    assert result.json()["detail"][0]["msg"]


def test_cancel_in_queue_then_already_completed(client):
    request = submit(client, {"duration_s": 30}).json()
    cancel = client.put(request["cancel_url"], headers=AUTH)
    assert cancel.status_code == 202 and cancel.json() == {"status": "CANCELLATION_REQUESTED"}
    done = status(client, request).json()
    assert done["status"] == "COMPLETED" and done["error"]
    again = client.put(request["cancel_url"], headers=AUTH)
    assert again.status_code == 400 and again.json() == {"status": "ALREADY_COMPLETED"}
    assert client.put("/fal/fal-ai/flux/requests/nope/cancel", headers=AUTH).json() == {"status": "NOT_FOUND"}


def test_webhook_is_signed_ed25519_with_keys_from_the_jwks(client, receiver):
    keys = jwks_public_keys(client.get("/fal/.well-known/jwks.json").json())
    assert len(keys) == 1
    request = submit(client, {"duration_s": 0.1}, fal_webhook=f"{receiver.url}/webhooks/fal/job_1").json()
    (hook,) = receiver.wait_for(1)
    assert hook.path == "/webhooks/fal/job_1"
    assert verify_fal(hook.headers, hook.body, keys, time.time())
    assert not verify_fal(hook.headers, hook.body + b" ", keys, time.time())
    assert hook.headers["x-fal-webhook-request-id"] == request["request_id"]
    body = json.loads(hook.body)
    assert body["request_id"] == request["request_id"] and body["status"] == "OK"
    assert body["error"] is None and len(body["payload"]["images"]) == 1


def test_failed_request_webhook_has_status_error(client, receiver):
    submit(client, {"duration_s": 0.1, "outcome": "failed"}, fal_webhook=f"{receiver.url}/hook")
    (hook,) = receiver.wait_for(1)
    body = json.loads(hook.body)
    assert body["status"] == "ERROR" and body["error"] and body["payload"]["detail"]


@pytest.mark.parametrize("content, params, model", [
    (b"[1]", {}, "fal-ai/flux/dev"),
    (b"{nope", {}, "fal-ai/flux/dev"),
    (b'{"duration_s": "soon"}', {}, "fal-ai/flux/dev"),
    (b"{}", {"fal_webhook": "not-a-url"}, "fal-ai/flux/dev"),
])
def test_invalid_submit_is_422_and_creates_nothing(client, content, params, model):
    response = client.post(f"/fal/{model}", content=content, params=params, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["detail"]
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


@pytest.mark.parametrize("model", ["flux", "workflows/me", "comfy/me", "123-", "fal-ai/flux/dev/requests/x"])
def test_a_model_id_needs_an_owner_and_an_app(client, model):
    assert client.post(f"/fal/{model}", json={}, headers=AUTH).status_code == 404
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_an_empty_body_is_an_empty_input(client):
    assert client.post("/fal/fal-ai/flux/dev", headers=AUTH).status_code == 200
