"""Replicate trainings as jobs, end to end: a job of model
`train:owner/name:version` with `input.destination`, through the web API and
the settler, against the simulator's Replicate trainings. Real PostgreSQL,
real HTTP, files storage, the real adapter and settle step; the simulator
calls the web server back over loopback.

What is stored of a succeeded training: output 0 the weights file (label
"weights"), output 1 the training's whole `output` object as JSON (label
"output": it holds the new version's id).
"""
from __future__ import annotations

import hashlib
import json

import httpx

from app.simulator import output_sha256
from app.vocabulary import JobStatus
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.support.simulator import clear_faults, set_faults, stats

TOKEN = "r8_training_jobs_test_token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRAINER_VERSION = "39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"
MODEL = f"train:stability-ai/sdxl:{TRAINER_VERSION}"


def replicate_env(sim_url: str, **extra: str) -> dict[str, str]:
    return {"SIM_URL": sim_url, "REPLICATE_BASE_URL": f"{sim_url}/replicate", "REPLICATE_API_TOKEN": TOKEN,
            **extra}


def training_job(**input) -> dict:
    return {"provider": "replicate", "model": MODEL, "max_credits": 10,
            "input": {"destination": "acme/my-sdxl", "input_images": "https://example.com/data.zip", **input}}


async def _start(web, make_settings, start_settler, sim, *, provider_timeout_s: float = 2.0, **extra: str):
    server = await web(**replicate_env(sim.url))
    await start_settler(make_settings(**replicate_env(sim.url, PUBLIC_URL=server.url, **extra)),
                        provider_timeout_s=provider_timeout_s)
    return server


def read_training(sim_url: str, training_id: str) -> dict:
    return httpx.get(f"{sim_url}/replicate/v1/trainings/{training_id}", headers=AUTH, timeout=5).json()


async def test_a_training_job_stores_its_weights_and_its_new_version_charged_once(web, make_owner, db, sim,
                                                                                 make_settings, start_settler):
    server = await _start(web, make_settings, start_settler, sim)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=training_job(duration_s=0.3, output_bytes=3000,
                                                              content_type="application/x-tar"))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        weights, output = got["outputs"]
        weights_body = (await c.get(weights["url"])).content
        output_body = (await c.get(output["url"])).content
    training = read_training(sim.url, row["provider_task_id"])
    assert training["status"] == "succeeded" and row["provider_operation"] == {"kind": "training"}
    # What the trainer was given: the job's input less the destination, which went in the body.
    assert training["input"] == {"input_images": "https://example.com/data.zip", "duration_s": 0.3,
                                 "output_bytes": 3000, "content_type": "application/x-tar"}
    assert (weights["index"], weights["label"], weights["content_type"], weights["bytes"]) == (
        0, "weights", "application/x-tar", 3000)
    assert weights["sha256"] == output_sha256(row["provider_task_id"], 0, 3000)
    assert hashlib.sha256(weights_body).hexdigest() == weights["sha256"]
    assert (output["index"], output["label"], output["content_type"]) == (1, "output", "application/json")
    assert json.loads(output_body) == training["output"]
    assert json.loads(output_body)["version"].startswith("acme/my-sdxl:")
    assert output["sha256"] == hashlib.sha256(output_body).hexdigest() and output["bytes"] == len(output_body)
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", created["id"]) == 1
    assert stats(sim.url)["tasks_created"] == 1
    await assert_money_balances(db)


async def test_a_failed_training_is_refunded(web, make_owner, db, sim, make_settings, start_settler):
    server = await _start(web, make_settings, start_settler, sim)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=training_job(duration_s=0.2, outcome="failed"))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.FAILED and "simulated failure" in row["error_message"]
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and got["outputs"] == []
    await assert_money_balances(db)


async def test_a_training_without_a_destination_fails_refunded_and_nothing_is_made(web, make_owner, db, sim,
                                                                                  make_settings, start_settler):
    server = await _start(web, make_settings, start_settler, sim)
    owner = await make_owner(credits=100)
    job = training_job(duration_s=0.2)
    del job["input"]["destination"]
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job)).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.FAILED and row["provider_task_id"] is None
    assert "input.destination" in row["error_message"]
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    assert stats(sim.url)["tasks_created"] == 0
    await assert_money_balances(db)


async def test_an_in_doubt_training_create_is_found_by_the_look_up_and_charged_once(web, make_owner, db, sim,
                                                                                     make_settings, start_settler):
    """The simulator makes the training, then drops the answer: the settler's
    look-up lists the trainings (newest first, no filter) and finds the one
    of this trainer version, destination and input (its webhook is dropped:
    only the look-up can name it). One training, the job succeeds, charged
    once."""
    # Someone else's training a moment before: the same trainer, other input.
    httpx.post(f"{sim.url}/replicate/v1/models/stability-ai/sdxl/versions/{TRAINER_VERSION}/trainings",
               json={"destination": "acme/my-sdxl", "input": {"duration_s": 30, "input_images": "theirs.zip"}},
               headers=AUTH, timeout=5).raise_for_status()
    set_faults(sim.url, submit_timeout_after_create=1, drop_webhook=1)
    # No webhook will come: the lost-webhook check after 1 s closes the job.
    server = await _start(web, make_settings, start_settler, sim, provider_timeout_s=1.0, STALE_AFTER_S="1")
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=training_job(duration_s=0.5))).json()
        running = await wait_for_status(db, created["id"], (JobStatus.RUNNING, JobStatus.SUCCEEDED,
                                                            JobStatus.UNCERTAIN, JobStatus.FAILED))
        clear_faults(sim.url)
        assert running["status"] in (JobStatus.RUNNING, JobStatus.SUCCEEDED), running["last_error"]
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
    assert row["provider_operation"] == {"kind": "training"}  # saved by the look-up: read as a training
    seen = stats(sim.url)
    assert seen["webhooks_sent"] == 0
    callback_base = f"{server.url}/webhooks/replicate/{created['id']}"
    assert seen["tasks_created"] == 2 and seen["creates_by_callback_url"] == {callback_base: 1}
    assert read_training(sim.url, row["provider_task_id"])["input"]["input_images"] == "https://example.com/data.zip"
    assert [o["label"] for o in got["outputs"]] == ["weights", "output"]
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", created["id"]) == 1
    await assert_money_balances(db)


async def test_an_in_doubt_training_the_look_up_cannot_tell_apart_is_recovered_by_its_own_webhook(
        web, make_owner, db, sim, make_settings, start_settler):
    """A twin (the same trainer, destination and input) made just before the
    job makes the look-up ambiguous: the job turns `uncertain`. Its own
    training's signed webhook names it; the settle step reads that training
    with our token (/v1/trainings, not /v1/predictions), confirms it, and
    the job succeeds, charged once."""
    server = await web(**replicate_env(sim.url))
    # Three look-ups with their backoff make the job uncertain within ~5 s;
    # the training's own webhook comes at its end, 8 s in.
    job = training_job(duration_s=8)
    httpx.post(f"{sim.url}/replicate/v1/models/stability-ai/sdxl/versions/{TRAINER_VERSION}/trainings",
               json={"destination": "acme/my-sdxl",
                     "input": {k: v for k, v in job["input"].items() if k != "destination"}},
               headers=AUTH, timeout=5).raise_for_status()
    set_faults(sim.url, submit_timeout_after_create=1)
    await start_settler(make_settings(**replicate_env(sim.url, PUBLIC_URL=server.url)), provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job)).json()
        uncertain = await wait_for_status(db, created["id"], (JobStatus.UNCERTAIN, JobStatus.RUNNING,
                                                              JobStatus.SUCCEEDED), timeout=30)
        clear_faults(sim.url)
        assert uncertain["status"] == JobStatus.UNCERTAIN and uncertain["provider_task_id"] is None
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED), timeout=30)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
    seen = stats(sim.url)
    callback_base = f"{server.url}/webhooks/replicate/{created['id']}"
    assert seen["tasks_created"] == 2 and seen["creates_by_callback_url"] == {callback_base: 1}
    # The job holds the training its own submit made, not the twin.
    trainings = httpx.get(f"{sim.url}/replicate/v1/trainings", headers=AUTH, timeout=5).json()["results"]
    assert row["provider_task_id"] == trainings[0]["id"]  # newest first: made after the twin
    assert row["provider_operation"] == {"kind": "training"}
    assert [o["label"] for o in got["outputs"]] == ["weights", "output"]
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    await assert_money_balances(db)
