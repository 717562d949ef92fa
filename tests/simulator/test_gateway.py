"""The AI Gateway's asynchronous video API under /gateway/v4/ai, answering
only what @ai-sdk/gateway's schemas and fixtures name
(vercel/ai packages/gateway/src/gateway-video-model.ts and its test)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time

import httpx
import pytest

from app.simulator import output_sha256
from app.simulator.gateway import base64_chunks

from .helpers import wait_until

START = "/gateway/v4/ai/video-model/start"
STATUS = "/gateway/v4/ai/video-model/status"
MODEL = "klingai/kling-v3.0-t2v"
INLINE_MODEL = "google/veo-3.1-generate-001"


def headers(model: str = MODEL, key: str | None = None, **changed: str | None) -> dict[str, str]:
    """What @ai-sdk/gateway sends (gateway-provider.ts createAuthHeaders, the
    video model's getModelConfigHeaders), with `changed` (None drops one)."""
    sent = {
        "Authorization": "Bearer gw-test-key",
        "ai-gateway-protocol-version": "0.0.1",
        "ai-gateway-auth-method": "api-key",
        "ai-video-model-specification-version": "4",
        "ai-model-id": model,
    }
    if key is not None:
        sent["idempotency-key"] = key
    for name, value in changed.items():
        name = name.replace("_", "-")
        if value is None:
            sent.pop(name, None)
        else:
            sent[name] = value
    return sent


def start(client: httpx.Client, body: dict, *, model: str = MODEL, key: str | None = None) -> dict:
    response = client.post(START, json={"prompt": "a cat", "n": 1, **body}, headers=headers(model, key))
    assert response.status_code == 200, response.text
    return response.json()


def status(client: httpx.Client, operation, model: str = MODEL) -> dict:
    response = client.post(STATUS, json={"operation": operation}, headers=headers(model))
    assert response.status_code == 200, response.text
    return response.json()


def wait_status(client: httpx.Client, operation, value: str, model: str = MODEL) -> dict:
    return wait_until(lambda: (s := status(client, operation, model))["status"] == value and s, 5, value)


def job_of(answer: dict) -> dict:
    return answer["providerMetadata"]["gateway"]["asyncJob"]


# ------------------------------------------------------------------ auth and headers


@pytest.mark.parametrize("path", [START, STATUS])
def test_a_call_without_the_bearer_is_the_documented_authentication_error(client, path):
    response = client.post(path, json={"prompt": "a cat"}, headers=headers(Authorization=None))
    assert response.status_code == 401
    # create-gateway-error.ts: {"error": {"message", "type", ...}}
    assert response.json() == {"error": {"message": "Missing or invalid API key", "type": "authentication_error"}}
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


@pytest.mark.parametrize("name,value", [
    ("ai-gateway-protocol-version", None), ("ai-gateway-protocol-version", "0.0.2"),
    ("ai-gateway-auth-method", None), ("ai-gateway-auth-method", "password"),
    ("ai-video-model-specification-version", None), ("ai-video-model-specification-version", "3"),
    ("ai-model-id", None), ("ai-model-id", ""),
])
@pytest.mark.parametrize("path", [START, STATUS])
def test_every_header_the_sdk_sends_is_required(client, path, name, value):
    response = client.post(path, json={"prompt": "a cat", "operation": {}}, headers=headers(**{name: value}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and name in error["message"]
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_oidc_is_an_auth_method_too(client):
    response = client.post(START, json={"prompt": "a cat"}, headers=headers(ai_gateway_auth_method="oidc"))
    assert response.status_code == 200


# ------------------------------------------------------------------ start


def test_start_answers_the_operation_and_the_async_job_without_a_secret_unless_a_callback_is_given(client):
    answer = start(client, {"duration_s": 5})
    job = job_of(answer)
    # gatewayVideoStartResponseSchema; the values as in the SDK test's fixture.
    assert answer == {"operation": {"gatewayJobId": job["jobId"]},
                      "providerMetadata": {"gateway": {"asyncJob": {"jobId": job["jobId"], "status": "queued"}}}}

    with_callback = start(client, {"duration_s": 5, "callbackUrl": "https://example.com/hook?token=t"})
    secret = job_of(with_callback)["webhookSigningSecret"]
    assert isinstance(secret, str) and len(secret) >= 32
    assert set(job_of(with_callback)) == {"jobId", "status", "webhookSigningSecret"}
    assert client.get("/_sim/stats").json()["creates_by_callback_url"] == {"https://example.com/hook": 1}


@pytest.mark.parametrize("body,field", [
    ({"duration_s": "soon"}, "duration_s"),
    ({"n": 0}, "n"),
    ({"n": "two"}, "n"),
    ({"callbackUrl": "not a url"}, "callbackUrl"),
])
def test_a_bad_body_is_an_invalid_request_and_creates_nothing(client, body, field):
    response = client.post(START, json={"prompt": "a cat", **body}, headers=headers())
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"]
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_the_same_idempotency_key_answers_the_same_operation_without_the_secret(client):
    body = {"duration_s": 5, "callbackUrl": "https://example.com/hook"}
    first = start(client, body, key="job_0123456789abcdef01234567")
    again = start(client, body, key="job_0123456789abcdef01234567")
    assert again["operation"] == first["operation"]
    assert "webhookSigningSecret" in job_of(first) and "webhookSigningSecret" not in job_of(again)
    other = start(client, body, key="job_76543210fedcba9876543210")
    assert other["operation"] != first["operation"]
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 2
    assert stats["creates_by_idempotency_key"] == {"job_0123456789abcdef01234567": 1,
                                                   "job_76543210fedcba9876543210": 1}



@pytest.mark.parametrize("native_first", [True, False])
def test_one_key_sent_to_the_native_api_and_the_gateway_is_a_task_at_each(client, native_first):
    """Two providers keep their keys apart: a key the Gateway has seen
    neither answers its job on /v1/tasks nor the reverse."""
    key = "job_0123456789abcdef01234567"

    def native() -> dict:
        response = client.post("/v1/tasks", json={"model": "m", "input": {"duration_s": 5}},
                               headers={"Idempotency-Key": key})
        assert response.status_code in (200, 201), response.text
        return response.json()

    def gateway() -> str:
        return start(client, {"duration_s": 5, "callbackUrl": "https://example.com/hook"}, key=key)["operation"]

    if native_first:
        task, operation = native(), gateway()
    else:
        operation, task = gateway(), native()
    assert native() == task and gateway() == operation
    assert client.get(f"/v1/tasks/{task['id']}").status_code == 200
    assert client.get("/_sim/stats").json()["creates_by_idempotency_key"] == {key: 2}

# ------------------------------------------------------------------ status


def test_a_job_is_pending_then_completed_with_url_videos_of_n(client, sim_url):
    answer = start(client, {"duration_s": 0.5, "n": 3, "output_bytes": 1000})
    operation, job_id = answer["operation"], job_of(answer)["jobId"]
    first = status(client, operation)
    assert first["status"] == "pending"
    assert first["providerMetadata"]["gateway"]["asyncJob"]["status"] in ("queued", "running")
    assert set(first) == {"status", "providerMetadata"}

    done = wait_status(client, operation, "completed")
    assert set(done) == {"status", "videos", "providerMetadata"}
    assert done["providerMetadata"] == {"gateway": {"asyncJob": {"jobId": job_id, "status": "completed"}}}
    videos = done["videos"]
    assert [v["type"] for v in videos] == ["url"] * 3
    for index, video in enumerate(videos):
        assert video == {"type": "url", "url": f"{sim_url}/outputs/{job_id}/{index}", "mediaType": "video/mp4"}
        got = client.get(video["url"])
        assert got.status_code == 200 and got.headers["content-type"] == "video/mp4"
        assert hashlib.sha256(got.content).hexdigest() == output_sha256(job_id, index, 1000)
    assert client.get("/_sim/stats").json()["status_calls"] >= 2


def test_the_outputs_control_counts_the_videos_over_n_and_content_type_sets_their_type(client):
    answer = start(client, {"duration_s": 0, "n": 3, "outputs": 2, "content_type": "video/webm"})
    videos = wait_status(client, answer["operation"], "completed")["videos"]
    assert [v["mediaType"] for v in videos] == ["video/webm", "video/webm"]


def test_a_google_model_answers_base64_videos_of_the_deterministic_bytes(client):
    size = 3 * 1024 * 1024 + 1  # not a whole number of base64 quartets, and over one output chunk
    answer = start(client, {"duration_s": 0, "n": 2, "output_bytes": size}, model=INLINE_MODEL)
    job_id = job_of(answer)["jobId"]
    done = wait_status(client, answer["operation"], "completed", model=INLINE_MODEL)
    assert [set(v) for v in done["videos"]] == [{"type", "data", "mediaType"}] * 2
    for index, video in enumerate(done["videos"]):
        assert (video["type"], video["mediaType"]) == ("base64", "video/mp4")
        data = base64.b64decode(video["data"], validate=True)
        assert len(data) == size and hashlib.sha256(data).hexdigest() == output_sha256(job_id, index, size)


def test_a_failed_job_answers_the_documented_error(client):
    answer = start(client, {"duration_s": 0, "outcome": "failed"})
    # The SDK test's fixture: {"status": "error", "error": "..."}, nothing else.
    assert wait_status(client, answer["operation"], "error") == {
        "status": "error", "error": "simulated failure (input.outcome = 'failed')"}


@pytest.mark.parametrize("operation", [{"gatewayJobId": "gwjob_nosuchjob"}, "gwjob_nosuchjob", None, 7])
def test_an_unknown_operation_is_not_found(client, operation):
    response = client.post(STATUS, json={"operation": operation}, headers=headers())
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_a_status_body_without_an_operation_is_an_invalid_request(client):
    response = client.post(STATUS, json={"gatewayJobId": "x"}, headers=headers())
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------------ webhooks


def tv1_valid(header: str, body: bytes, secret: str) -> bool:
    """The SDK docs' reference verifier, written again here: t and v1 by
    their regexes, HMAC-SHA256 keyed with the secret over "<t>.<raw body>",
    within 300 s."""
    t = re.search(r"(?:^|,)t=(\d+)", header)
    v1 = re.search(r"(?:^|,)v1=([0-9a-f]{64})(?:,|$)", header)
    if not t or not v1:
        return False
    expected = hmac.new(secret.encode(), t.group(1).encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, v1.group(1)) and abs(time.time() - int(t.group(1))) <= 300


@pytest.mark.parametrize("outcome,event", [("succeeded", "video.generation.completed"),
                                           ("failed", "video.generation.failed")])
def test_the_terminal_webhook_is_signed_with_the_jobs_secret(client, receiver, outcome, event):
    answer = start(client, {"duration_s": 0.2, "outcome": outcome,
                            "callbackUrl": f"{receiver.url}/hooks/gw?token=abc"})
    secret = job_of(answer)["webhookSigningSecret"]
    (hook,) = receiver.wait_for(1)
    assert (hook.path, hook.query) == ("/hooks/gw", "token=abc")
    assert json.loads(hook.body) == {"type": event}
    assert tv1_valid(hook.headers["x-ai-gateway-signature"], hook.body, secret)
    assert not tv1_valid(hook.headers["x-ai-gateway-signature"], hook.body + b" ", secret)
    assert not tv1_valid(hook.headers["x-ai-gateway-signature"], hook.body, "another-secret")


def test_a_job_without_a_callback_sends_no_webhook(client, receiver):
    start(client, {"duration_s": 0})
    time.sleep(0.3)
    assert receiver.received == [] and client.get("/_sim/stats").json()["webhooks_sent"] == 0


def test_drop_webhook_sends_none(client, receiver):
    client.post("/_sim/faults", json={"drop_webhook": 1}).raise_for_status()
    answer = start(client, {"duration_s": 0, "callbackUrl": f"{receiver.url}/hooks/gw"})
    wait_status(client, answer["operation"], "completed")
    time.sleep(0.3)
    assert receiver.received == []


# ------------------------------------------------------------------ faults


def test_submit_error_is_a_500_in_the_documented_shape_and_creates_nothing(client):
    client.post("/_sim/faults", json={"submit_error": 1}).raise_for_status()
    response = client.post(START, json={"prompt": "a cat"}, headers=headers(key="k1"))
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "internal_server_error"
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


@pytest.mark.parametrize("path", [START, STATUS])
def test_throttle_is_the_documented_rate_limit_with_retry_after(client, path):
    client.post("/_sim/faults", json={"throttle": 1}).raise_for_status()
    response = client.post(path, json={"operation": {"gatewayJobId": "x"}}, headers=headers())
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_exceeded"


def test_status_error_is_a_500(client):
    answer = start(client, {"duration_s": 5})
    client.post("/_sim/faults", json={"status_error": 1}).raise_for_status()
    response = client.post(STATUS, json={"operation": answer["operation"]}, headers=headers())
    assert response.status_code == 500 and response.json()["error"]["type"] == "internal_server_error"


def test_a_start_held_then_dropped_made_its_job_and_the_replay_finds_it(client, sim_url):
    client.post("/_sim/faults", json={"submit_timeout_after_create": 1}).raise_for_status()
    key = "job_aaaaaaaaaaaaaaaaaaaaaaaa"
    with pytest.raises(httpx.HTTPError):  # held past the client's timeout, or dropped (hold_s is short here)
        httpx.post(f"{sim_url}{START}", json={"prompt": "a cat", "duration_s": 5}, headers=headers(key=key),
                   timeout=0.5, trust_env=False)
    client.delete("/_sim/faults").raise_for_status()
    replayed = start(client, {"duration_s": 5}, key=key)
    assert status(client, replayed["operation"])["status"] == "pending"
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 1 and stats["creates_by_idempotency_key"] == {key: 1}


# ------------------------------------------------------------------ pure


@pytest.mark.parametrize("sizes", [[], [0], [1], [2], [3], [1, 1, 1], [5, 7, 1024 * 1024, 2], [3, 3, 3]])
def test_base64_chunks_join_into_the_base64_of_the_whole(sizes):
    chunks = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    assert b"".join(base64_chunks(chunks)) == base64.b64encode(b"".join(chunks))
