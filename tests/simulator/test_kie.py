"""KIE's Market jobs API under /kie, answering only the fields KIE documents."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import httpx
import pytest

from app.simulator import output_sha256

from .helpers import wait_until

AUTH = {"Authorization": "Bearer kie-test"}


def create(client: httpx.Client, input: dict, **body) -> dict:
    response = client.post("/kie/api/v1/jobs/createTask", json={"model": "kling/v2", "input": input, **body},
                           headers=AUTH)
    assert response.status_code == 200
    return response.json()


def record(client: httpx.Client, task_id: str) -> dict:
    response = client.get("/kie/api/v1/jobs/recordInfo", params={"taskId": task_id}, headers=AUTH)
    assert response.status_code == 200
    return response.json()


def wait_state(client: httpx.Client, task_id: str, state: str) -> dict:
    return wait_until(lambda: (r := record(client, task_id)["data"])["state"] == state and r, 5, state)


# Get Task Details' `data`, exactly (https://docs.kie.ai/market/common/get-task-detail).
RECORD_FIELDS = {"taskId", "model", "state", "param", "resultJson", "failCode", "failMsg",
                 "completeTime", "createTime", "updateTime"}


def test_routes_want_a_bearer_token_and_answer_in_the_body(client):
    response = client.post("/kie/api/v1/jobs/createTask", json={"model": "m", "input": {}})
    assert response.status_code == 200 and response.json()["code"] == 401
    assert client.get("/kie/api/v1/jobs/recordInfo", params={"taskId": "x"}).json()["code"] == 401
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_task_goes_waiting_generating_success_with_result_urls(client, receiver):
    answer = create(client, {"prompt": "cat", "duration_s": 0.6, "outputs": 2, "output_bytes": 1000})
    # createTask's documented answer: `msg`, and only the task id in `data`.
    assert answer == {"code": 200, "msg": "success", "data": {"taskId": answer["data"]["taskId"]}}
    task_id = answer["data"]["taskId"]
    assert task_id.startswith("task_")

    first = record(client, task_id)
    # Get Task Details' current page: `message`, not `msg`.
    assert set(first) == {"code", "message", "data"} and first["code"] == 200 and first["message"] == "success"
    assert set(first["data"]) == RECORD_FIELDS
    assert first["data"]["state"] in ("waiting", "queuing", "generating")
    assert first["data"]["resultJson"] == "" and first["data"]["completeTime"] is None
    param = json.loads(first["data"]["param"])
    assert param == {"model": "kling/v2", "input": {"prompt": "cat", "duration_s": 0.6,
                                                    "outputs": 2, "output_bytes": 1000}}
    wait_state(client, task_id, "generating")
    done = wait_state(client, task_id, "success")
    assert set(done) == RECORD_FIELDS
    assert done["taskId"] == task_id and done["model"] == "kling/v2"
    assert done["failCode"] == "" and done["failMsg"] == ""
    for name in ("completeTime", "createTime", "updateTime"):  # epoch milliseconds
        assert isinstance(done[name], int) and abs(done[name] / 1000 - time.time()) < 60
    assert done["completeTime"] >= done["createTime"] and done["updateTime"] == done["completeTime"]
    urls = json.loads(done["resultJson"])["resultUrls"]
    assert len(urls) == 2
    for index, url in enumerate(urls):
        body = httpx.get(url, trust_env=False).content
        assert hashlib.sha256(body).hexdigest() == output_sha256(task_id, index, 1000)


def test_a_long_task_is_waiting_first(client):
    task_id = create(client, {"duration_s": 60})["data"]["taskId"]
    assert record(client, task_id)["data"]["state"] == "waiting"


def test_failed_task_is_fail_with_a_message(client):
    task_id = create(client, {"duration_s": 0.1, "outcome": "failed"})["data"]["taskId"]
    done = wait_state(client, task_id, "fail")
    assert set(done) == RECORD_FIELDS
    assert done["failMsg"] and done["failCode"] == "501" and done["resultJson"] == ""
    assert isinstance(done["completeTime"], int)


def test_unknown_or_missing_task_id(client):
    assert record(client, "nope") == {"code": 404, "message": "task not found", "data": None}
    response = client.get("/kie/api/v1/jobs/recordInfo", headers=AUTH)
    assert response.status_code == 200 and response.json()["code"] == 422


def test_callback_carries_the_record(client, receiver):
    callback = f"{receiver.url}/webhooks/kie/job_1?token=abc"
    task_id = create(client, {"duration_s": 0.1}, callBackUrl=callback)["data"]["taskId"]
    (hook,) = receiver.wait_for(1)
    assert hook.path == "/webhooks/kie/job_1" and hook.query == "token=abc"
    # The Market callback has no page of its own: it is the recordInfo answer.
    body = json.loads(hook.body)
    assert body == record(client, task_id)
    assert body["data"]["taskId"] == task_id and body["data"]["state"] == "success"
    assert json.loads(body["data"]["param"])["callBackUrl"] == callback
    # No webhookHmacKey set: unsigned, as KIE sends them until a user enables one.
    assert "x-webhook-signature" not in hook.headers and "x-webhook-timestamp" not in hook.headers


def test_failed_task_callback_says_so(client, receiver):
    create(client, {"duration_s": 0.1, "outcome": "failed"}, callBackUrl=f"{receiver.url}/hook")
    (hook,) = receiver.wait_for(1)
    data = json.loads(hook.body)["data"]
    assert data["state"] == "fail" and data["failCode"] == "501" and data["failMsg"]


def test_callbacks_carry_the_documented_signature_once_a_key_is_set(client, receiver):
    key = "kie-hmac-key-for-tests"
    assert client.get("/_sim/kie/webhook-hmac-key").json() == {"key": None}
    assert client.put("/_sim/kie/webhook-hmac-key", json={"key": key}).json() == {"key": key}
    task_id = create(client, {"duration_s": 0.1}, callBackUrl=f"{receiver.url}/hook")["data"]["taskId"]
    (hook,) = receiver.wait_for(1)
    timestamp = hook.headers["x-webhook-timestamp"]
    assert timestamp.isdigit() and abs(int(timestamp) - time.time()) < 60  # unix seconds
    # https://docs.kie.ai/common-api/webhook-verification:
    # base64(HMAC-SHA256(webhookHmacKey, taskId + "." + timestamp)); the body is not signed.
    expected = hmac.new(key.encode(), f"{task_id}.{timestamp}".encode(), hashlib.sha256).digest()
    assert hook.headers["x-webhook-signature"] == base64.b64encode(expected).decode()
    assert json.loads(hook.body)["data"]["taskId"] == task_id

    assert client.delete("/_sim/kie/webhook-hmac-key").json() == {"key": None}
    receiver.clear()
    create(client, {"duration_s": 0.1}, callBackUrl=f"{receiver.url}/hook")
    (hook,) = receiver.wait_for(1)
    assert "x-webhook-signature" not in hook.headers


@pytest.mark.parametrize("content", [b"{oops", b"[]", b"{}", b'{"key": ""}', b'{"key": 3}'])
def test_a_bad_hmac_key_is_refused(client, content):
    response = client.put("/_sim/kie/webhook-hmac-key", content=content)
    assert response.status_code == 400 and response.json()["error"]
    assert client.get("/_sim/kie/webhook-hmac-key").json() == {"key": None}


def test_reset_turns_the_signature_off(client):
    client.put("/_sim/kie/webhook-hmac-key", json={"key": "k"}).raise_for_status()
    client.post("/_sim/reset").raise_for_status()
    assert client.get("/_sim/kie/webhook-hmac-key").json() == {"key": None}


@pytest.mark.parametrize("content", [
    b"{oops",
    b"[1]",
    b'{"input": {}}',
    b'{"model": "", "input": {}}',
    b'{"model": "m"}',
    b'{"model": "m", "input": []}',
    b'{"model": "m", "input": {"outputs": -2}}',
    b'{"model": "m", "input": {}, "callBackUrl": "javascript:alert(1)"}',
])
def test_invalid_create_is_code_422_and_creates_nothing(client, content):
    response = client.post("/kie/api/v1/jobs/createTask", content=content, headers=AUTH)
    assert response.status_code == 200
    assert response.json()["code"] == 422 and response.json()["msg"] and response.json()["data"] is None
    assert client.get("/_sim/stats").json()["tasks_created"] == 0
