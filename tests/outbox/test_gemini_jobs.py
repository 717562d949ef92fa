"""Gemini (Veo) jobs end to end through the web API and the settler: real
PostgreSQL, real HTTP, files storage, the real adapter and settle step.

Against the simulator's /gemini protocol: a job of two videos stored under
indexes 0 and 1 (fetched from the Files API with the key), a failed
operation, a submit whose answer is lost (`uncertain`: Gemini has no
idempotency key and no look-up, so nothing is sent twice), videos gone
before they were copied. What the simulator has no control for (every
sample filtered by Google's safety checks, videos inline in the answer)
comes from a scripted Gemini on loopback answering the documented
operation.

Gemini jobs are polled (no webhook is registered); Veo's own schedule
looks first at 10 s. These tests close jobs by the other road a polling
client takes: a read of a job running longer than READ_RECHECK_AFTER_S
asks for a settle (CONTRACT.md).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.simulator import output_sha256
from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, running_job, wait_for_status
from tests.support.loopback import LoopbackServer

KEY = "AIzaJobsTestKey0123456789abcdefghijkl"
MODEL = "veo-3.1-generate-preview"
TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)


def gemini_env(sim_url: str) -> dict[str, str]:
    return {"SIM_URL": sim_url, "GEMINI_BASE_URL": f"{sim_url}/gemini", "GEMINI_API_KEY": KEY,
            "READ_RECHECK_AFTER_S": "0.3"}


def gemini_job(prompt: str = "a cat", **parameters) -> dict:
    return {"provider": "gemini", "model": MODEL, "max_credits": 10,
            "input": {"instances": [{"prompt": prompt}], "parameters": {"duration_s": 0.1, **parameters}}}


async def read_until_closed(c: httpx.AsyncClient, job_id: str, timeout_s: float = 20.0) -> dict:
    """Read the job as a polling client does until it is closed (each read
    past the recheck threshold asks for a settle)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = (await c.get(f"/v1/jobs/{job_id}")).json()
        if got["status"] in TERMINAL or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


async def test_a_job_of_two_videos_stores_both_with_their_sha256_charged_once(web, make_owner, db, sim,
                                                                              make_settings, start_settler):
    env = gemini_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=gemini_job(sampleCount=2, output_bytes=3000))).json()
        got = await read_until_closed(c, created["id"])
        assert got["status"] == JobStatus.SUCCEEDED, got["error"]
        bodies = [(await c.get(out["url"])).content for out in got["outputs"]]
        acct = (await c.get("/v1/account")).json()
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    op_id = row["provider_task_id"].rpartition("/")[2]
    assert row["provider_task_id"] == f"models/{MODEL}/operations/{op_id}"
    assert [(o["index"], o["bytes"], o["content_type"], o["label"]) for o in got["outputs"]] == [
        (0, 3000, "video/mp4", None), (1, 3000, "video/mp4", None)]
    for index, (out, data) in enumerate(zip(got["outputs"], bodies, strict=True)):
        assert out["sha256"] == hashlib.sha256(data).hexdigest() == output_sha256(op_id, index, 3000)
    # Veo reports no cost: the reservation is the charge, once.
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert acct["credits"] == {"balance": 90, "reserved": 0, "charged": 10} and acct["active"] == 0
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", created["id"]) == 1
    assert httpx.get(f"{sim.url}/_sim/stats", timeout=5).json()["tasks_created"] == 1
    await assert_money_balances(db)


async def test_a_failed_operation_fails_the_job_refunded(web, make_owner, db, sim, make_settings, start_settler):
    env = gemini_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=gemini_job(outcome="failed"))).json()
        got = await read_until_closed(c, created["id"])
    assert got["status"] == JobStatus.FAILED and got["error"]["code"] == JobError.PROVIDER_FAILED
    assert "failed" in got["error"]["message"]
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and got["outputs"] == []
    await assert_money_balances(db)


async def test_a_refused_body_fails_at_submit_refunded_and_creates_nothing(web, make_owner, db, sim,
                                                                           make_settings, start_settler):
    env = gemini_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=gemini_job(duration_s="soon"))).json()
    row = await wait_for_status(db, created["id"], JobStatus.FAILED)
    assert row["error_code"] == JobError.SUBMIT_REJECTED and "parameters.duration_s" in row["error_message"]
    assert KEY not in (row["error_message"] or "") and KEY not in (row["last_error"] or "")
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    assert httpx.get(f"{sim.url}/_sim/stats", timeout=5).json()["tasks_created"] == 0
    await assert_money_balances(db)


async def test_a_lost_submit_answer_leaves_the_job_uncertain_and_nothing_is_sent_twice(web, make_owner, db, sim,
                                                                                        make_settings,
                                                                                        start_settler):
    env = gemini_env(sim.url)
    server = await web(**env)
    httpx.post(f"{sim.url}/_sim/faults", json={"submit_timeout_after_create": 1}, timeout=5).raise_for_status()
    # The settler's provider timeout (2 s) ends the held answer: an unknown outcome.
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=gemini_job(duration_s=30))).json()
        row = await wait_for_status(db, created["id"], JobStatus.UNCERTAIN)
        httpx.delete(f"{sim.url}/_sim/faults", timeout=5).raise_for_status()
        await asyncio.sleep(1.0)  # reads and the settler carry on: none of them may submit again
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        acct = (await c.get("/v1/account")).json()
    assert got["status"] == JobStatus.UNCERTAIN and row["provider_task_id"] is None
    assert httpx.get(f"{sim.url}/_sim/stats", timeout=5).json()["tasks_created"] == 1
    assert row["provider_call_started_at"] is not None  # the call went out; its answer never came
    assert row["last_error"] == "the submit's outcome is unknown and the task could not be looked up"
    # Its reservation and slot stay until an operator resolves it.
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 0}
    assert acct["credits"]["reserved"] == 10 and acct["active"] == 1
    await assert_money_balances(db)


async def test_videos_gone_before_they_were_copied_fail_output_expired_refunded(web, make_owner, db, sim,
                                                                                make_settings, start_settler):
    # Nobody reads the job until its video (0.1 s of work, kept 0.2 s) is
    # gone; Veo's first poll is 10 s away.
    env = gemini_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=gemini_job(output_ttl_s=0.2))).json()
        await wait_for_status(db, created["id"], JobStatus.RUNNING)
        await asyncio.sleep(0.8)
        got = await read_until_closed(c, created["id"])
    assert got["status"] == JobStatus.FAILED and got["error"]["code"] == JobError.OUTPUT_EXPIRED, got["error"]
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    await assert_money_balances(db)


# ----------------------------------------------------------------- a scripted Gemini


@pytest.fixture
def scripted_gemini():
    """A Gemini whose operations are `answers[operation id]`, its file route
    serving `files[file id]` to requests that carry the key."""
    answers: dict[str, dict] = {}
    files: dict[str, bytes] = {}
    seen_keys: list[str | None] = []

    async def get_operation(request: Request) -> Response:
        return JSONResponse(answers[request.path_params["op"]])

    async def download(request: Request) -> Response:
        seen_keys.append(request.headers.get("x-goog-api-key"))
        if request.headers.get("x-goog-api-key") != KEY:
            return JSONResponse({"error": {"code": 403, "message": "no", "status": "PERMISSION_DENIED"}},
                                status_code=403)
        return Response(files[request.path_params["file"]], media_type="video/mp4")

    server = LoopbackServer(Starlette(routes=[
        Route("/v1beta/models/{model}/operations/{op}", get_operation),
        Route("/v1beta/files/{file}:download", download),
    ])).start()
    server.answers, server.files, server.seen_keys = answers, files, seen_keys  # type: ignore[attr-defined]
    yield server
    server.stop()


def done_operation(op_id: str, video_response: dict) -> dict:
    return {"name": f"models/{MODEL}/operations/{op_id}", "done": True,
            "response": {"@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse",
                         "generateVideoResponse": video_response}}


async def test_every_sample_filtered_fails_the_job_refunded_with_the_reasons(make_owner, db, make_settings,
                                                                             start_settler, scripted_gemini):
    reason = "The prompt could not be submitted. This prompt contains words that violate Gemini's usage policy."
    scripted_gemini.answers["filtered"] = done_operation("filtered", {
        "raiMediaFilteredCount": 1, "raiMediaFilteredReasons": [reason]})
    env = {"GEMINI_BASE_URL": scripted_gemini.url, "GEMINI_API_KEY": KEY}
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "gemini", MODEL, f"models/{MODEL}/operations/filtered")
    await start_settler(make_settings(**env))
    row = await wait_for_status(db, job_id, TERMINAL)
    assert (row["status"], row["error_code"]) == (JobStatus.FAILED, JobError.PROVIDER_FAILED), row["last_error"]
    assert row["error_message"].startswith("every video (1 generated) was filtered by Google's safety checks: "
                                           "The prompt could not be submitted.")
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    assert await db.fetchval("select count(*) from assets") == 0
    await assert_money_balances(db)


async def test_inline_and_linked_videos_are_stored_in_order(make_owner, db, make_settings, start_settler,
                                                            scripted_gemini, tmp_path):
    inline, linked = os.urandom(90_000), os.urandom(5_000)  # the inline one is spilled while read
    scripted_gemini.files["f1"] = linked
    scripted_gemini.answers["mixed"] = done_operation("mixed", {"generatedSamples": [
        {"video": {"encodedVideo": base64.b64encode(inline).decode(), "encoding": "video/mp4"}},
        {"video": {"uri": f"{scripted_gemini.url}/v1beta/files/f1:download?alt=media"}}]})
    env = {"GEMINI_BASE_URL": scripted_gemini.url, "GEMINI_API_KEY": KEY}
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "gemini", MODEL, f"models/{MODEL}/operations/mixed")
    await start_settler(make_settings(**env))
    row = await wait_for_status(db, job_id, TERMINAL)
    assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
    assets = await db.fetch('select "index", bytes, sha256, content_type from assets where job_id = $1 '
                            'order by "index"', job_id)
    # The downloaded link first, then the bytes that came inline (Observation's order).
    assert [tuple(a) for a in assets] == [
        (0, len(linked), hashlib.sha256(linked).hexdigest(), "video/mp4"),
        (1, len(inline), hashlib.sha256(inline).hexdigest(), "video/mp4")]
    assert scripted_gemini.seen_keys == [KEY]
    await assert_money_balances(db)
