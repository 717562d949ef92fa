"""ElevenLabs dubbing jobs end to end: the web API, the settler, real
PostgreSQL, real HTTP, files storage, the real adapter and settle step,
against the simulator's /elevenlabs protocol (and, for a dub in two
languages and a redirecting audio route, a scripted ElevenLabs on
loopback answering the documented bodies).

Dubs are polled (no webhook), the first look 10 s after submit: these tests
let a client's read of a running job ask for the settle at once
(READ_RECHECK_AFTER_S=0), once the dub has ended at the provider."""
from __future__ import annotations

import asyncio
import hashlib
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.simulator import output_sha256
from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, running_job, wait_for_status
from tests.support.loopback import LoopbackServer
from tests.support.simulator import clear_faults, set_faults, stats

KEY = "sk_elevenlabs_jobs_test_key"
AUTH = {"xi-api-key": KEY}
SOURCE = "https://media.example.com/talks/keynote.mp4"
READ_SETTLES = {"READ_RECHECK_AFTER_S": "0"}


def eleven_env(base_url: str, sim_url: str | None = None) -> dict[str, str]:
    env = {"ELEVENLABS_BASE_URL": base_url, "ELEVENLABS_API_KEY": KEY}
    return {**env, "SIM_URL": sim_url} if sim_url else env


def dub_job(model: str = "dubbing", **input) -> dict:
    return {"provider": "elevenlabs", "model": model,
            "input": {"source_url": SOURCE, "target_lang": "es", "duration_s": 0.2, **input}, "max_credits": 10}


def dub_at_sim(sim_url: str, dubbing_id: str) -> dict:
    return httpx.get(f"{sim_url}/elevenlabs/v1/dubbing/{dubbing_id}", headers=AUTH, timeout=5,
                     trust_env=False).json()


def dubs_named(sim_url: str, name: str) -> list[dict]:
    page = httpx.get(f"{sim_url}/elevenlabs/v1/dubbing", params={"page_size": 200}, headers=AUTH, timeout=5,
                     trust_env=False).json()
    return [d for d in page["dubs"] if d["name"] == name]


async def settle_by_reading(c: httpx.AsyncClient, db, sim_url: str, job_id: str, statuses) -> dict:
    """Once the dub has ended at the provider, a client's read of the job
    asks for its settle; wait for the job to close."""
    row = await wait_for_status(db, job_id, JobStatus.RUNNING)
    deadline = time.monotonic() + 10
    while dub_at_sim(sim_url, row["provider_task_id"])["status"] not in ("dubbed", "failed"):
        assert time.monotonic() < deadline, "the dub did not end"
        await asyncio.sleep(0.05)
    assert (await c.get(f"/v1/jobs/{job_id}")).status_code == 200
    return await wait_for_status(db, job_id, statuses)


async def test_a_dub_is_stored_with_its_language_and_charged_once(web, make_owner, db, sim, make_settings,
                                                                  start_settler):
    env = eleven_env(f"{sim.url}/elevenlabs", sim.url)
    server = await web(**env, **READ_SETTLES)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=dub_job(output_bytes=3000, num_speakers=1))).json()
        row = await settle_by_reading(c, db, sim.url, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        (out,) = got["outputs"]
        body = (await c.get(out["url"])).content
    dubbing_id = row["provider_task_id"]
    # The audio route needs the key: the settler sent it to the API's own origin.
    assert (out["index"], out["label"], out["content_type"], out["bytes"]) == (0, "es", "audio/mpeg", 3000)
    assert out["sha256"] == output_sha256(dubbing_id, 0, 3000) == hashlib.sha256(body).hexdigest()
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}  # no cost reported: the reservation
    (dub,) = dubs_named(sim.url, created["id"])  # named after the job, so a lost submit can be found
    assert dub["dubbing_id"] == dubbing_id
    await assert_money_balances(db)


async def test_a_failed_dub_is_refunded(web, make_owner, db, sim, make_settings, start_settler):
    env = eleven_env(f"{sim.url}/elevenlabs", sim.url)
    server = await web(**env, **READ_SETTLES)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=dub_job(outcome="failed"))).json()
        await settle_by_reading(c, db, sim.url, created["id"], JobStatus.FAILED)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert got["error"]["code"] == JobError.PROVIDER_FAILED and got["error"]["message"]
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and got["outputs"] == []
    await assert_money_balances(db)


async def test_an_in_doubt_submit_is_found_by_name_one_dub_charged_once(web, make_owner, db, sim, make_settings,
                                                                        start_settler):
    env = eleven_env(f"{sim.url}/elevenlabs", sim.url)
    server = await web(**env, **READ_SETTLES)
    # The create answer is held and dropped: the adapter gives up after 2 s
    # not knowing whether a dub exists, and lists the dubs for one named after the job.
    set_faults(sim.url, submit_timeout_after_create=1)
    await start_settler(make_settings(**env), provider_timeout_s=2.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=dub_job())).json()
        row = await wait_for_status(db, created["id"], JobStatus.RUNNING)
        clear_faults(sim.url)
        # Every create answer was dropped: the task id the job runs with came from the list.
        (dub,) = dubs_named(sim.url, created["id"])
        assert row["provider_task_id"] == dub["dubbing_id"]
        row = await settle_by_reading(c, db, sim.url, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
    assert stats(sim.url)["tasks_created"] == 1  # one dub: the lost answer's, adopted, never made again
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert [o["label"] for o in got["outputs"]] == ["es"]
    await assert_money_balances(db)


REFUSED = [
    # A dub's input sent to the sync models: nothing to speak.
    (dub_job(model="text-to-speech/JBFqnCBsd6RMkjVDRZzb"), "elevenlabs: input.text is required"),
    (dub_job(model="sound-generation"), "elevenlabs: input.text is required"),
    (dub_job(model="lip-sync"), "elevenlabs: model must be text-to-speech/<voice_id>, sound-generation or dubbing"),
    ({**dub_job(), "input": {"target_lang": "es"}}, "input.source_url is required"),
    (dub_job(file="keynote.mp4"), "input.file: file uploads are not supported"),
]


async def test_what_cannot_be_dubbed_fails_at_submit_refunded(web, make_owner, db, sim, make_settings,
                                                              start_settler):
    # The web tier takes these jobs (it does not know ElevenLabs' models);
    # the submit (or the sync call) refuses them before anything is sent.
    env = eleven_env(f"{sim.url}/elevenlabs", sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = [(await c.post("/v1/jobs", json=job)).json()["id"] for job, _ in REFUSED]
        for job_id, (_, says) in zip(created, REFUSED, strict=True):
            await wait_for_status(db, job_id, JobStatus.FAILED)
            got = (await c.get(f"/v1/jobs/{job_id}")).json()
            assert got["error"]["code"] == JobError.SUBMIT_REJECTED and says in got["error"]["message"], got
            assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    assert stats(sim.url)["tasks_created"] == 0
    await assert_money_balances(db)


# ----------------------------------------------------------------- a scripted ElevenLabs


@pytest.fixture
def elsewhere():
    """Another loopback origin, recording every request that reaches it."""
    arrivals: list[dict[str, str]] = []

    async def record(request: Request) -> Response:
        arrivals.append({k.lower(): v for k, v in request.headers.items()})
        return Response(b"not the dub", media_type="audio/mpeg")

    server = LoopbackServer(Starlette(routes=[Route("/{path:path}", record)])).start()
    server.arrivals = arrivals  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture
def scripted_elevenlabs(elsewhere):
    """ElevenLabs' get and audio routes for the dubs in `dubs`; each
    language's audio needs the key, and `redirects` languages answer a 302
    to the other origin instead."""
    dubs: dict[str, list[str]] = {}
    redirects: set[str] = set()

    async def get_dub(request: Request) -> Response:
        dubbing_id = request.path_params["dubbing_id"]
        return JSONResponse({"dubbing_id": dubbing_id, "name": "job", "status": "dubbed", "source_language": "en",
                             "target_languages": dubs[dubbing_id], "editable": False,
                             "created_at": "2026-01-15T09:30:00Z", "media_metadata": None, "error": None})

    async def audio(request: Request) -> Response:
        if request.headers.get("xi-api-key") != KEY:
            return JSONResponse({"detail": {"status": "needs_authorization", "message": "no key"}}, status_code=401)
        language = request.path_params["language"]
        if language in redirects:
            return RedirectResponse(f"{elsewhere.url}/cdn/{language}.mp3", status_code=302)
        return Response(f"the dub in {language}".encode(), media_type="audio/mpeg")

    server = LoopbackServer(Starlette(routes=[
        Route("/v1/dubbing/{dubbing_id}", get_dub),
        Route("/v1/dubbing/{dubbing_id}/audio/{language}", audio),
    ])).start()
    server.dubs, server.redirects = dubs, redirects  # type: ignore[attr-defined]
    yield server
    server.stop()


async def test_a_dub_in_two_languages_is_two_labelled_outputs(web, make_owner, db, make_settings, start_settler,
                                                              scripted_elevenlabs):
    # One create takes one target_lang; a dub can hold more (languages added
    # in Dubbing Studio), and lists them in `target_languages`.
    scripted_elevenlabs.dubs["dub-two"] = ["es", "fr"]
    env = eleven_env(scripted_elevenlabs.url)
    server = await web(**env)
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "elevenlabs", "dubbing", "dub-two")
    await start_settler(make_settings(**env))
    row = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
    assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
    async with server.client(owner.api_key) as c:
        got = (await c.get(f"/v1/jobs/{job_id}")).json()
        bodies = [(await c.get(o["url"])).content for o in got["outputs"]]
    assert [(o["index"], o["label"]) for o in got["outputs"]] == [(0, "es"), (1, "fr")]
    assert bodies == [b"the dub in es", b"the dub in fr"]
    assert [o["sha256"] for o in got["outputs"]] == [hashlib.sha256(b).hexdigest() for b in bodies]
    await assert_money_balances(db)


async def test_the_key_never_follows_a_redirect_to_another_origin(web, make_owner, db, make_settings, start_settler,
                                                                  scripted_elevenlabs, elsewhere):
    scripted_elevenlabs.dubs["dub-moved"] = ["es"]
    scripted_elevenlabs.redirects.add("es")
    env = eleven_env(scripted_elevenlabs.url)
    owner = await make_owner(credits=100)
    job_id = await running_job(db, owner.owner_id, "elevenlabs", "dubbing", "dub-moved")
    await start_settler(make_settings(**env))
    row = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
    # Plain http to a loopback origin is allowed only for the configured API origin: refused.
    assert (row["status"], row["error_code"]) == (JobStatus.FAILED, JobError.OUTPUT_REFUSED), row["last_error"]
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    assert elsewhere.arrivals == []  # neither the key nor anything else reached the other origin
    await assert_money_balances(db)
