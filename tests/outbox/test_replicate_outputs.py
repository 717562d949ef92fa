"""Replicate outputs that are not files, and outputs that are gone, end to
end through the settler: real PostgreSQL, real HTTP, files storage, the real
Replicate adapter and settle step.

Against the simulator's Replicate protocol: a model that answers a string
(`output_text`), and a prediction read after its output lifetime
(`output_ttl_s`: `output: null`, `data_removed: true`). Shapes the simulator
has no control for (a list of strings, a completion long ago with a 404ing
file) come from a scripted Replicate on loopback answering the documented
prediction object.
"""
from __future__ import annotations

import hashlib
import json
import pathlib

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.providers.replicate import ReplicateProvider
from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, running_job, succeeded_with_one_output, wait_for_status
from tests.support.loopback import LoopbackServer

TOKEN = "r8_outputs_test_token"
TEXT = "hello Alice \N{SLIGHTLY SMILING FACE}"


def replicate_env(sim_url: str) -> dict[str, str]:
    return {"SIM_URL": sim_url, "REPLICATE_BASE_URL": f"{sim_url}/replicate", "REPLICATE_API_TOKEN": TOKEN}


def replicate_job(**input) -> dict:
    return {"provider": "replicate", "model": "acme/llm", "input": {"duration_s": 0.1, **input}, "max_credits": 10}


async def test_a_text_answer_is_one_text_output(web, make_owner, db, sim, make_settings, start_settler):
    env = replicate_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    got, out, body = await succeeded_with_one_output(server, owner.api_key, db, replicate_job(output_text=TEXT))
    expected = TEXT.encode()
    assert (out["index"], out["content_type"], out["bytes"]) == (0, "text/plain; charset=utf-8", len(expected))
    assert body == expected and out["sha256"] == hashlib.sha256(expected).hexdigest()
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}  # Replicate reports no cost
    await assert_money_balances(db)


async def test_outputs_removed_before_the_settle_fail_output_expired_refunded(web, make_owner, db, sim,
                                                                              make_settings, start_settler,
                                                                              tmp_objects):
    # No webhook (PUBLIC_URL unset): the first look at the prediction is the
    # first poll, later than the prediction's end + its output lifetime.
    duration_s, ttl_s = 0.1, 0.5
    assert ReplicateProvider("https://api.replicate.com", None).facts.poll_delays_s[0] > duration_s + ttl_s
    env = replicate_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=replicate_job(duration_s=duration_s, output_ttl_s=ttl_s,
                                                               outputs=2))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        acct = (await c.get("/v1/account")).json()
    # what the settler saw: the simulator's prediction as it stands
    prediction = httpx.get(f"{sim.url}/replicate/v1/predictions/{row['provider_task_id']}",
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    assert (prediction["status"], prediction["data_removed"], prediction["output"]) == ("succeeded", True, None)
    assert row["status"] == JobStatus.FAILED, row["last_error"]
    assert got["error"] == {"code": JobError.OUTPUT_EXPIRED,
                            "message": "the provider removed the outputs before they were copied"}
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and got["outputs"] == []
    assert acct["credits"] == {"balance": 100, "reserved": 0, "charged": 0} and acct["active"] == 0
    assert await db.fetchval("select count(*) from assets") == 0
    assert [p for p in pathlib.Path(tmp_objects).rglob("*") if p.is_file()] == []
    assert await db.fetchval("select count(*) from outbox where kind = 'settle'") == 0
    await assert_money_balances(db)


# ----------------------------------------------------------------- a scripted Replicate

LONG_AGO = "2023-09-08T16:19:34.791859Z"  # far more than an hour before any run of this test


def prediction(task_id: str, output, completed_at: str) -> dict:
    """Replicate's documented prediction object, succeeded."""
    return {
        "id": task_id, "model": "acme/llm",
        "version": "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa",
        "input": {"prompt": "say hello"}, "logs": "", "output": output, "data_removed": False, "error": None,
        "status": "succeeded", "created_at": "2023-09-08T16:19:33.765994Z",
        "started_at": "2023-09-08T16:19:33.779176Z", "completed_at": completed_at,
        "urls": {"get": f"https://api.replicate.com/v1/predictions/{task_id}",
                 "cancel": f"https://api.replicate.com/v1/predictions/{task_id}/cancel"},
        "metrics": {"predict_time": 1.0},
    }


@pytest.fixture
def scripted_replicate():
    """A Replicate whose predictions are `answers[task_id]`; its own /gone/…
    answers 404, like an expired replicate.delivery file."""
    answers: dict[str, dict] = {}
    account_reads: list[str | None] = []  # the Authorization header of each read of /v1/account

    async def get_prediction(request: Request) -> Response:
        return JSONResponse(answers[request.path_params["task_id"]])

    async def account(request: Request) -> Response:
        account_reads.append(request.headers.get("authorization"))
        return JSONResponse({"type": "organization", "username": "acme", "name": "Acme"})

    async def gone(request: Request) -> Response:
        return Response(b"not found", status_code=404)

    server = LoopbackServer(Starlette(routes=[
        Route("/v1/predictions/{task_id}", get_prediction),
        Route("/gone/{rest:path}", gone),
        Route("/v1/account", account),
    ])).start()
    server.answers = answers  # type: ignore[attr-defined]
    server.account_reads = account_reads  # type: ignore[attr-defined]
    yield server
    server.stop()


async def test_a_list_of_strings_is_one_json_output(web, make_owner, db, make_settings, start_settler,
                                                    scripted_replicate):
    tokens = ["Hello", " Alice", ", caf\N{LATIN SMALL LETTER E WITH ACUTE}?"]
    scripted_replicate.answers["p-tokens"] = prediction("p-tokens", tokens, LONG_AGO)
    env = {"REPLICATE_BASE_URL": scripted_replicate.url, "REPLICATE_API_TOKEN": TOKEN}
    server = await web(**env)
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "replicate", "acme/llm", "p-tokens")
    await start_settler(make_settings(**env))
    await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
    async with server.client(owner.api_key) as c:
        got = (await c.get(f"/v1/jobs/{job_id}")).json()
        assert got["status"] == JobStatus.SUCCEEDED, got["error"]
        (out,) = got["outputs"]
        body = (await c.get(out["url"])).content
    assert out["content_type"] == "application/json" and out["index"] == 0
    assert body == '["Hello"," Alice",", café?"]'.encode() and json.loads(body) == tokens
    assert out["sha256"] == hashlib.sha256(body).hexdigest() and out["bytes"] == len(body)
    await assert_money_balances(db)


async def test_a_listed_file_that_answers_404_is_output_expired(web, make_owner, db, make_settings,
                                                                start_settler, scripted_replicate):
    # The prediction still lists its file, but the file answers 404: gone at
    # the provider, for good (CONTRACT.md), not retried.
    url = f"{scripted_replicate.url}/gone/out-0.png"
    scripted_replicate.answers["p-old"] = prediction("p-old", [url], LONG_AGO)
    env = {"REPLICATE_BASE_URL": scripted_replicate.url, "REPLICATE_API_TOKEN": TOKEN}
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "replicate", "acme/llm", "p-old")
    await start_settler(make_settings(**env))
    row = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
    assert (row["status"], row["error_code"]) == (JobStatus.FAILED, JobError.OUTPUT_EXPIRED), row["last_error"]
    assert row["error_message"] == f"download 0: HTTP 404 from {scripted_replicate.url}"
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    assert await db.fetchval("select count(*) from assets") == 0
    await assert_money_balances(db)


async def test_an_output_naming_replicates_api_is_fetched_without_our_token(web, make_owner, db, make_settings,
                                                                            start_settler, scripted_replicate):
    """The output is the model's to choose (any model, an owner's own
    included): an output URL on the API's host (the account, every tenant's
    predictions, the webhook secret) is fetched as anyone would, never with
    the API token, which goes only to replicate.delivery's files."""
    url = f"{scripted_replicate.url}/v1/account"
    scripted_replicate.answers["p-api"] = prediction("p-api", url, LONG_AGO)
    env = {"REPLICATE_BASE_URL": scripted_replicate.url, "REPLICATE_API_TOKEN": TOKEN}
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "replicate", "acme/llm", "p-api")
    await start_settler(make_settings(**env))
    await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
    assert scripted_replicate.account_reads == [None]

