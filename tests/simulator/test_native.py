"""The native protocol (provider `sim`) over real HTTP."""
from __future__ import annotations

import hashlib
import time

import httpx
import pytest

from app.simulator import output_sha256

from .helpers import wait_until


def create(client: httpx.Client, input: dict, key: str | None = None, **body) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/tasks", json={"model": "image-fast", "input": input, **body}, headers=headers)


def wait_terminal(client: httpx.Client, task_id: str, timeout: float = 5.0) -> dict:
    def done():
        task = client.get(f"/v1/tasks/{task_id}").json()
        return task if task["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(done, timeout, "a terminal status")


def sha256_of(response: httpx.Response) -> str:
    return hashlib.sha256(response.content).hexdigest()


def test_task_runs_to_success_with_outputs_that_match_their_sha256(client):
    created = create(client, {"duration_s": 0.5, "outputs": 2, "output_bytes": 300_001, "cost": 7,
                              "content_type": "video/mp4"})
    assert created.status_code == 201
    task_id, secret = created.json()["id"], created.json()["webhook_secret"]
    assert set(created.json()) == {"id", "webhook_secret"} and secret

    early = client.get(f"/v1/tasks/{task_id}").json()
    # `cost` is an int in every state (CONTRACT.md): 0 until a success.
    assert early == {"id": task_id, "status": early["status"], "outputs": [], "cost": 0, "error": None}
    assert early["status"] in ("queued", "running")

    task = wait_terminal(client, task_id)
    assert task["status"] == "succeeded"
    assert task["cost"] == 7 and task["error"] is None
    assert len(task["outputs"]) == 2
    for index, url in enumerate(task["outputs"]):
        assert url.startswith(client.base_url.__str__().rstrip("/") + "/")
        response = httpx.get(url, trust_env=False)
        assert response.status_code == 200
        assert response.headers["content-type"] == "video/mp4"
        assert response.headers["content-length"] == "300001"
        assert sha256_of(response) == output_sha256(task_id, index, 300_001)
    assert task["outputs"][0] != task["outputs"][1]


def test_a_task_is_queued_for_the_first_tenth_of_its_duration_then_running(client):
    queued = create(client, {"duration_s": 60}).json()["id"]
    assert client.get(f"/v1/tasks/{queued}").json()["status"] == "queued"
    running = create(client, {"duration_s": 2.0}).json()["id"]
    time.sleep(0.3)
    assert client.get(f"/v1/tasks/{running}").json()["status"] == "running"


def test_defaults_are_one_output_of_1024_png_bytes_costing_one(client):
    task_id = create(client, {"duration_s": 0}).json()["id"]
    task = client.get(f"/v1/tasks/{task_id}").json()
    assert task["status"] == "succeeded" and task["cost"] == 1 and len(task["outputs"]) == 1
    response = client.get(task["outputs"][0])
    assert response.headers["content-type"] == "image/png"
    assert len(response.content) == 1024
    assert sha256_of(response) == output_sha256(task_id, 0, 1024)


def test_failed_outcome_reports_an_error_and_no_outputs(client):
    task_id = create(client, {"duration_s": 0.1, "outcome": "failed"}).json()["id"]
    task = wait_terminal(client, task_id)
    assert task["status"] == "failed"
    assert isinstance(task["error"], str) and task["error"]
    assert task["outputs"] == [] and task["cost"] == 0
    assert client.get(f"/outputs/{task_id}/0").status_code == 404


def test_output_text_is_the_one_output_in_place_of_files(client):
    task_id = create(client, {"duration_s": 0, "outputs": 3, "output_text": "héllo wörld"}).json()["id"]
    task = client.get(f"/v1/tasks/{task_id}").json()
    assert task == {"id": task_id, "status": "succeeded", "outputs": ["héllo wörld"], "cost": 1, "error": None}


def test_same_idempotency_key_returns_the_same_task(client):
    first = create(client, {"duration_s": 5}, key="job_1")
    again = create(client, {"duration_s": 5}, key="job_1")
    other = create(client, {"duration_s": 5}, key="job_2")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == first.json()  # same id, same secret
    assert other.json()["id"] != first.json()["id"]
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 2
    assert stats["creates_by_idempotency_key"] == {"job_1": 1, "job_2": 1}


def test_without_idempotency_key_every_create_is_a_new_task(client):
    ids = {create(client, {"duration_s": 5}).json()["id"] for _ in range(3)}
    assert len(ids) == 3
    assert client.get("/_sim/stats").json()["tasks_created"] == 3


def test_cancel_stops_a_running_task_and_not_a_finished_one(client):
    task_id = create(client, {"duration_s": 30}).json()["id"]
    cancelled = client.post(f"/v1/tasks/{task_id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert client.get(f"/v1/tasks/{task_id}").json()["status"] == "cancelled"
    assert client.post(f"/v1/tasks/{task_id}/cancel").json()["status"] == "cancelled"

    done = create(client, {"duration_s": 0}).json()["id"]
    answer = client.post(f"/v1/tasks/{done}/cancel")
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"


def test_unknown_task_is_404(client):
    assert client.get("/v1/tasks/sim_nope").status_code == 404
    assert client.post("/v1/tasks/sim_nope/cancel").status_code == 404
    assert client.get("/v1/tasks/sim_nope").json() == {"error": "task not found"}


def test_output_urls_expire_after_output_ttl_s(client):
    task_id = create(client, {"duration_s": 0, "output_ttl_s": 0.6}).json()["id"]
    url = client.get(f"/v1/tasks/{task_id}").json()["outputs"][0]
    assert client.get(url).status_code == 200
    time.sleep(0.7)
    assert client.get(url).status_code == 404
    assert client.get(f"/v1/tasks/{task_id}").json()["status"] == "succeeded"


def test_outputs_are_404_before_success_and_out_of_range(client):
    running = create(client, {"duration_s": 30}).json()["id"]
    assert client.get(f"/outputs/{running}/0").status_code == 404
    done = create(client, {"duration_s": 0, "outputs": 2}).json()["id"]
    assert client.get(f"/outputs/{done}/1").status_code == 200
    assert client.get(f"/outputs/{done}/2").status_code == 404
    assert client.get(f"/outputs/{done}/x").status_code == 404
    assert client.get("/outputs/sim_nope/0").status_code == 404


def test_head_on_an_output_gives_its_length_without_the_body(client):
    task_id = create(client, {"duration_s": 0, "output_bytes": 5000}).json()["id"]
    response = client.head(f"/outputs/{task_id}/0")
    assert response.status_code == 200
    assert response.headers["content-length"] == "5000"
    assert response.content == b""


def test_large_output_is_streamed_with_its_length(client):
    size = 64 * 1024 * 1024 + 7
    task_id = create(client, {"duration_s": 0, "output_bytes": size}).json()["id"]
    digest, received = hashlib.sha256(), 0
    with client.stream("GET", f"/outputs/{task_id}/0") as response:
        assert response.headers["content-length"] == str(size)
        for chunk in response.iter_raw():
            digest.update(chunk)
            received += len(chunk)
    assert received == size
    assert digest.hexdigest() == output_sha256(task_id, 0, size)


def test_zero_outputs_and_zero_bytes_are_allowed(client):
    none = create(client, {"duration_s": 0, "outputs": 0}).json()["id"]
    assert client.get(f"/v1/tasks/{none}").json()["outputs"] == []
    empty = create(client, {"duration_s": 0, "output_bytes": 0}).json()["id"]
    response = client.get(f"/outputs/{empty}/0")
    assert response.status_code == 200 and response.content == b""


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"",
        b"[1, 2]",
        b'{"input": {}}',
        b'{"model": "", "input": {}}',
        b'{"model": 5, "input": {}}',
        b'{"model": "m"}',
        b'{"model": "m", "input": [1]}',
        b'{"model": "m", "input": {"duration_s": "1"}}',
        b'{"model": "m", "input": {"duration_s": -1}}',
        b'{"model": "m", "input": {"duration_s": true}}',
        b'{"model": "m", "input": {"duration_s": NaN}}',
        b'{"model": "m", "input": {"outcome": "exploded"}}',
        b'{"model": "m", "input": {"output_bytes": 1.5}}',
        b'{"model": "m", "input": {"output_bytes": -1}}',
        b'{"model": "m", "input": {"outputs": 1000}}',
        b'{"model": "m", "input": {"cost": "1"}}',
        b'{"model": "m", "input": {"output_ttl_s": 0}}',
        b'{"model": "m", "input": {"content_type": "png"}}',
        b'{"model": "m", "input": {"content_type": "text/plain\\r\\nx: y"}}',
        b'{"model": "m", "input": {}, "callback_url": "ftp://example.com/x"}',
        b'{"model": "m", "input": {}, "callback_url": 7}',
        b'{"model": "m", "input": {}, "callback_url": "http://[::1/x"}',
        b'{"model": "m", "input": {}, "callback_url": "http://example.com:99999/x"}',
        b'{"model": "m", "input": {}, "callback_url": "http://exa mple.com/x"}',
        b'{"model": "m", "input": {}, "callback_url": "/relative/path"}',
        b'{"model": "m", "input": {"duration_s": 1e400}}',
        b'{"model": "m", "input": {"prompt": 1e400}}',
    ],
)
def test_bad_input_is_400_and_creates_nothing(client, body):
    response = client.post("/v1/tasks", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str)
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_overlong_idempotency_key_is_400(client):
    response = create(client, {}, key="k" * 256)
    assert response.status_code == 400
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_oversized_body_is_refused(client):
    response = client.post("/v1/tasks", content=b"{" + b" " * (1024 * 1024 + 1) + b"}")
    assert response.status_code == 400
    assert "1 MiB" in response.json()["error"]
