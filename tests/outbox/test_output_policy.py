"""Where outputs may be fetched from, end to end through the settler: real
PostgreSQL, real HTTP on loopback, the real adapters and settle step.

Each provider's base URL points at a scripted provider of its own (the
simulator's `input` controls cannot name arbitrary output URLs). It answers
that provider's status call with the output URL the test chose. Output URLs
under /canary count every request that reaches them: a refused output must
be refused before anything is fetched.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, running_job, wait_for_status
from tests.support.loopback import InLoopServer, serve_in_loop

PROVIDERS = ("sim", "replicate", "fal", "kie")
MODELS = {"sim": "image-fast", "replicate": "acme/model", "fal": "fal-ai/flux/dev", "kie": "acme/model"}
USUAL_SIM_PORT = 8787  # what SIM_URL used to default to everywhere


# ----------------------------------------------------------------- scripted providers

@dataclass
class Script:
    """Shared by every scripted provider of a test: which output each task
    has, and every request that reached an output."""

    outputs: dict[str, str] = field(default_factory=dict)  # task id -> output URL
    canary_hits: list[str] = field(default_factory=list)  # "<server> <path>" of each /canary request
    stalled: int = 0  # /stall requests waiting now
    release_stalls: asyncio.Event = field(default_factory=asyncio.Event)


def provider_app(name: str, script: Script) -> Starlette:
    """Answers the status calls of all four protocols (each adapter asks its
    own base URL) with the task's output URL; serves outputs under /canary
    (counted), /ok (a healthy host) and /stall (accepts, never answers until
    released)."""

    def output(request: Request) -> str:
        task_id = request.path_params.get("task_id") or request.query_params.get("taskId", "")
        return script.outputs[task_id]

    async def sim_status(request: Request) -> Response:
        return JSONResponse({"id": request.path_params["task_id"], "status": "succeeded",
                             "outputs": [output(request)], "cost": 1, "error": None})

    async def replicate_status(request: Request) -> Response:
        return JSONResponse({"id": request.path_params["task_id"], "status": "succeeded",
                             "output": [output(request)], "error": None})

    async def fal_status(request: Request) -> Response:
        return JSONResponse({"status": "COMPLETED", "request_id": request.path_params["task_id"]})

    async def fal_result(request: Request) -> Response:
        return JSONResponse({"images": [{"url": output(request), "content_type": "image/png"}]})

    async def kie_status(request: Request) -> Response:
        return JSONResponse({"code": 200, "msg": "success", "data": {
            "taskId": request.query_params["taskId"], "state": "success",
            "resultJson": json.dumps({"resultUrls": [output(request)]})}})

    async def canary(request: Request) -> Response:
        script.canary_hits.append(f"{name} {request.url.path}")
        return Response(b"fetched: this must never happen", media_type="image/png")

    async def ok(request: Request) -> Response:
        return Response(b"healthy output", media_type="application/octet-stream")

    async def stall(request: Request) -> Response:
        script.stalled += 1
        try:
            await script.release_stalls.wait()
        finally:
            script.stalled -= 1
        return Response(b"released", status_code=503)

    return Starlette(routes=[
        Route("/canary/{rest:path}", canary),
        Route("/ok/{rest:path}", ok),
        Route("/stall/{rest:path}", stall),
        Route("/v1/tasks/{task_id}", sim_status),
        Route("/v1/predictions/{task_id}", replicate_status),
        Route("/api/v1/jobs/recordInfo", kie_status),
        Route("/{owner}/{app}/requests/{task_id}/status", fal_status),
        Route("/{owner}/{app}/requests/{task_id}", fal_result),
    ])


Serve = Callable[..., Awaitable[str | None]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """serve(app, port=0) -> its http://127.0.0.1:<port> URL, on this event
    loop; None when a fixed port is taken. Stopped after the test."""
    running: list[InLoopServer] = []

    async def start(app, port: int = 0) -> str | None:
        try:
            server = await serve_in_loop(app, port=port)
        except OSError:
            return None
        running.append(server)
        return server.url

    yield start
    await asyncio.gather(*(server.stop() for server in running), return_exceptions=True)


# ----------------------------------------------------------------- A: no fetch off the provider's own origin

@pytest.mark.parametrize("sim_configured", [True, False], ids=["sim-configured", "sim-url-unset"])
async def test_outputs_off_the_providers_own_origin_are_refused_unfetched(
        db, make_owner, make_settings, start_settler, serve, sim_configured):
    script = Script()
    own = {p: await serve(provider_app(p, script)) for p in PROVIDERS}
    nobodys = await serve(provider_app("unconfigured", script))  # a loopback port no setting names
    usual = await serve(provider_app("usual-sim-origin", script), port=USUAL_SIM_PORT)
    if usual is None:
        pytest.skip(f"127.0.0.1:{USUAL_SIM_PORT} is taken: no canary can stand there")
    env = {"SIM_URL": own["sim"] if sim_configured else "", "REPLICATE_BASE_URL": own["replicate"],
           "FAL_BASE_URL": own["fal"], "FAL_JWKS_URL": f"{own['fal']}/jwks", "KIE_BASE_URL": own["kie"]}
    providers = PROVIDERS if sim_configured else PROVIDERS[1:]

    owner = await make_owner(credits=1000, max_active=50)
    cases: dict[str, tuple[str, str]] = {}  # job id -> (provider, where its output is)
    for i, provider in enumerate(providers):
        another = own[PROVIDERS[(PROVIDERS.index(provider) + 1) % len(PROVIDERS)]]
        for where, url in (("another provider's origin", f"{another}/canary/{provider}.png"),
                           ("the usual SIM_URL origin", f"{usual}/canary/{provider}.png"),
                           ("an unconfigured loopback port", f"{nobodys}/canary/{provider}.png"),
                           ("the same, over https", f"{nobodys.replace('http:', 'https:')}/canary/{provider}.png")):
            task_id = f"task-{i}-{len(cases)}"
            script.outputs[task_id] = url
            cases[await running_job(db, owner.owner_id, provider, MODELS[provider], task_id)] = (provider, where)

    await start_settler(make_settings(**env), concurrency=16)
    for job_id, (provider, where) in cases.items():
        row = await wait_for_status(db, job_id, (JobStatus.FAILED, JobStatus.SUCCEEDED))
        assert (row["status"], row["error_code"]) == (JobStatus.FAILED, JobError.OUTPUT_REFUSED), \
            f"{provider}, output on {where}: {row['status']} {row['error_code']} {row['error_message']}"
        assert (row["credits_charged"], row["credits_refunded"]) == (0, row["credits_reserved"])
    assert script.canary_hits == []
    assert await db.fetchval("select count(*) from assets") == 0
    await assert_money_balances(db)


async def test_outputs_on_the_providers_own_origin_are_fetched(db, make_owner, make_settings, start_settler,
                                                               serve):
    # The other side of the policy: each provider's own loopback origin works.
    script = Script()
    own = {p: await serve(provider_app(p, script)) for p in PROVIDERS}
    owner = await make_owner(credits=1000, max_active=50)
    ids = []
    for provider in PROVIDERS:
        script.outputs[f"task-{provider}"] = f"{own[provider]}/ok/{provider}.bin"
        ids.append(await running_job(db, owner.owner_id, provider, MODELS[provider], f"task-{provider}"))
    await start_settler(make_settings(SIM_URL=own["sim"], REPLICATE_BASE_URL=own["replicate"],
                                      FAL_BASE_URL=own["fal"], KIE_BASE_URL=own["kie"]))
    for job_id in ids:
        row = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, row["error_message"]
    await assert_money_balances(db)


# ----------------------------------------------------------------- D: stalled hosts do not starve the settler

STALLED_JOBS = 16  # as many as the settler has slots
CLOSE_BOUND_S = 20.0  # generous on a loaded machine; the old code needed 60 s or more


@pytest.mark.parametrize("per_host, stall_s, mechanism", [
    # Only the per-host limit can explain a quick close: the stalls outlast the bound.
    # A busy host is a wait that counts no failure, so it leaves no last_error:
    # the evidence is that at most 4 downloads ever reached the stalling host.
    (4, 2 * CLOSE_BOUND_S, None),
    # Only the stall timeout can: every stalled download has a place.
    (STALLED_JOBS, 1.0, "no answer for 1 s"),
], ids=["per-host-limit", "stall-timeout"])
async def test_stalled_output_hosts_leave_the_settler_free_for_other_jobs(
        db, make_owner, make_settings, start_settler, serve, per_host, stall_s, mechanism):
    script = Script()
    stalling = await serve(provider_app("stalling", script))
    healthy = await serve(provider_app("healthy", script))
    owner = await make_owner(credits=1000, max_active=50)
    stalled_ids = []
    for i in range(STALLED_JOBS):
        script.outputs[f"stall-{i}"] = f"{stalling}/stall/{i}.mp4"
        stalled_ids.append(await running_job(db, owner.owner_id, "sim", MODELS["sim"], f"stall-{i}"))
    # Due after all of them, so a settler that claims in order gives them every slot first.
    script.outputs["healthy"] = f"{healthy}/ok/out.bin"
    healthy_id = await running_job(db, owner.owner_id, "replicate", MODELS["replicate"], "healthy")

    settings = make_settings(SIM_URL=stalling, REPLICATE_BASE_URL=healthy, DOWNLOADS_PER_HOST=per_host,
                             DOWNLOAD_STALL_TIMEOUT_S=stall_s)
    try:
        started = time.monotonic()
        await start_settler(settings, concurrency=STALLED_JOBS)
        row = await wait_for_status(db, healthy_id, JobStatus.SUCCEEDED, timeout=CLOSE_BOUND_S)
        assert row["credits_charged"] == row["credits_reserved"]  # Replicate reports no cost: the reservation
        assert time.monotonic() - started < CLOSE_BOUND_S
        # The stalled jobs are backing off, not failed for good: no money moved.
        stalled = await db.fetch("select status, last_error, credits_charged + credits_refunded as moved "
                                 "from jobs where id = any($1::text[])", stalled_ids)
        assert {(r["status"], r["moved"]) for r in stalled} == {(JobStatus.RUNNING, 0)}
        assert await db.fetchval("select count(*) from outbox where kind = 'settle' and job_id = any($1::text[])",
                                 stalled_ids) == STALLED_JOBS
        # ... and it was the mechanism under test that let them go.
        if mechanism is not None:
            assert any(mechanism in (r["last_error"] or "") for r in stalled), [r["last_error"] for r in stalled]
        else:  # waits, not failures: no attempt was spent on a busy host
            assert all(r["last_error"] is None for r in stalled), [r["last_error"] for r in stalled]
        if per_host < STALLED_JOBS:
            assert script.stalled <= per_host  # the others were turned away before connecting
    finally:
        script.release_stalls.set()  # the stalled downloads end (503) and the settler can stop
    await assert_money_balances(db)
