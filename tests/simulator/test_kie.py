"""KIE's jobs API under /kie."""
from __future__ import annotations

import hashlib
import json

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


def test_routes_want_a_bearer_token_and_answer_in_the_body(client):
    response = client.post("/kie/api/v1/jobs/createTask", json={"model": "m", "input": {}})
    assert response.status_code == 200 and response.json()["code"] == 401
    assert client.get("/kie/api/v1/jobs/recordInfo", params={"taskId": "x"}).json()["code"] == 401
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_task_goes_waiting_generating_success_with_result_urls(client, receiver):
    answer = create(client, {"prompt": "cat", "duration_s": 0.6, "outputs": 2, "output_bytes": 1000})
    assert answer["code"] == 200 and answer["msg"] == "success"
    task_id = answer["data"]["taskId"]

    first = record(client, task_id)
    assert first["code"] == 200
    assert first["data"]["state"] in ("waiting", "queuing", "generating")
    assert first["data"]["resultJson"] == "" and first["data"]["completeTime"] is None
    param = json.loads(first["data"]["param"])
    assert param == {"model": "kling/v2", "callBackUrl": None, "input": {"prompt": "cat", "duration_s": 0.6,
                                                                        "outputs": 2, "output_bytes": 1000}}
    wait_state(client, task_id, "generating")
    done = wait_state(client, task_id, "success")
    assert done["taskId"] == task_id and done["model"] == "kling/v2"
    assert done["failCode"] == "" and done["failMsg"] == ""
    assert done["completeTime"] >= done["createTime"] and done["costTime"] > 0
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
    assert done["failMsg"] and done["failCode"] and done["resultJson"] == ""


def test_unknown_or_missing_task_id(client):
    assert record(client, "nope")["code"] == 404
    response = client.get("/kie/api/v1/jobs/recordInfo", headers=AUTH)
    assert response.status_code == 200 and response.json()["code"] == 422


def test_callback_carries_the_record(client, receiver):
    callback = f"{receiver.url}/webhooks/kie/job_1?token=abc"
    task_id = create(client, {"duration_s": 0.1}, callBackUrl=callback)["data"]["taskId"]
    (hook,) = receiver.wait_for(1)
    assert hook.path == "/webhooks/kie/job_1" and hook.query == "token=abc"
    body = json.loads(hook.body)
    assert body["code"] == 200 and body["data"]["taskId"] == task_id and body["data"]["state"] == "success"
    assert json.loads(body["data"]["param"])["callBackUrl"] == callback


def test_failed_task_callback_says_so(client, receiver):
    create(client, {"duration_s": 0.1, "outcome": "failed"}, callBackUrl=f"{receiver.url}/hook")
    (hook,) = receiver.wait_for(1)
    body = json.loads(hook.body)
    assert body["code"] != 200 and body["data"]["state"] == "fail"


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
