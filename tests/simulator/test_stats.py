"""/_sim/stats counts across every protocol; /_sim/reset forgets everything."""
from __future__ import annotations

AUTH_BEARER = {"Authorization": "Bearer t"}
AUTH_KEY = {"Authorization": "Key k"}
LONG = {"duration_s": 30}


def test_creates_and_status_calls_are_counted_across_protocols(client):
    cb = "http://127.0.0.1:9/webhooks"  # never called: the tasks outlive the test
    native = client.post("/v1/tasks", json={"model": "m", "input": LONG, "callback_url": f"{cb}/sim/a"},
                         headers={"Idempotency-Key": "job_a"}).json()
    client.post("/v1/tasks", json={"model": "m", "input": LONG}, headers={"Idempotency-Key": "job_a"})
    client.post("/v1/tasks", json={"model": "m", "input": LONG})
    pred = client.post("/replicate/v1/predictions", headers=AUTH_BEARER,
                       json={"version": "a/b:1", "input": LONG, "webhook": f"{cb}/replicate/b",
                             "webhook_events_filter": ["completed"]}).json()
    req = client.post("/fal/fal-ai/flux/dev", params={"fal_webhook": f"{cb}/fal/c"}, json=LONG,
                      headers=AUTH_KEY).json()
    kie = client.post("/kie/api/v1/jobs/createTask", headers=AUTH_BEARER,
                      json={"model": "k", "input": LONG, "callBackUrl": f"{cb}/kie/d?token=x"}).json()

    client.get(f"/v1/tasks/{native['id']}")
    client.get(f"/v1/tasks/{native['id']}")
    client.get(pred["urls"]["get"], headers=AUTH_BEARER)
    client.get(req["status_url"], headers=AUTH_KEY)
    client.get("/kie/api/v1/jobs/recordInfo", params={"taskId": kie["data"]["taskId"]}, headers=AUTH_BEARER)
    client.get("/v1/tasks/sim_unknown")  # a read of nothing is still a call

    assert client.get("/_sim/stats").json() == {
        "tasks_created": 5,
        "creates_by_idempotency_key": {"job_a": 1},
        "creates_by_callback_url": {
            f"{cb}/sim/a": 1, f"{cb}/replicate/b": 1, f"{cb}/fal/c": 1, f"{cb}/kie/d": 1,  # without the query string
        },
        "webhooks_sent": 0,
        "webhooks_delivered": 0,
        "webhooks_failed": 0,
        "status_calls": 6,
        "sync_calls_by_body": {},  # no sync call was made
        # Every task outlives the test; the replayed key made none.
        "peak_concurrent": {"/v1": 2, "/replicate": 1, "/fal": 1, "/kie": 1},
    }


def test_reset_forgets_tasks_counters_and_faults(client):
    task_id = client.post("/v1/tasks", json={"model": "m", "input": LONG},
                          headers={"Idempotency-Key": "k"}).json()["id"]
    client.post("/_sim/faults", json={"status_error": 0.5})
    assert client.post("/_sim/reset").status_code == 200
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 0 and stats["creates_by_idempotency_key"] == {}
    assert stats["peak_concurrent"] == {}
    assert client.get("/_sim/faults").json()["status_error"] == 0.0
    assert client.get(f"/v1/tasks/{task_id}").status_code == 404
    # the key is free again
    assert client.post("/v1/tasks", json={"model": "m", "input": LONG},
                       headers={"Idempotency-Key": "k"}).status_code == 201


def test_delete_stats_is_a_reset_too(client):
    client.post("/v1/tasks", json={"model": "m", "input": LONG})
    assert client.delete("/_sim/stats").status_code == 200
    assert client.get("/_sim/stats").json()["tasks_created"] == 0
