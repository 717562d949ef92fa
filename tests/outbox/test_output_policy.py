"""Where outputs may be fetched from, end to end through the settler: real
PostgreSQL, real HTTP on loopback, the real adapters and settle step.

Each provider's base URL points at a scripted provider of its own (the
simulator's `input` controls cannot name arbitrary output URLs). It answers
that provider's status call, in that provider's wire shape, with the output
URL the test chose. Output URLs under /canary count every request that
reaches them: a refused output must be refused before anything is fetched.
Every request that reaches any scripted server with a credential header is
recorded too: a provider's key may reach its own origin only.

Jobs start running (tests/outbox/conftest.py `running_job`: the submit is
already saved, with no operation), so the apps answer status reads and serve
outputs; no submit is ever made. The status answers, each the documented
shape cut to what the adapter reads:
- the Gateway: `POST /video-model/status` `{"operation": {"gatewayJobId": id}}`
  (the operation a task id alone names) → `{"status": "completed",
  "videos": [{"type": "url", "url", "mediaType"}]}`;
- Gemini: `GET /v1beta/models/{model}/operations/{id}` → a done operation,
  `response.generateVideoResponse.generatedSamples[].video.uri`;
- ElevenLabs: `GET /v1/dubbing/{id}` → a `dubbed` DubbingMetadataResponse
  whose `target_languages` name its outputs, which the adapter builds on its
  own base URL (`GET /v1/dubbing/{id}/audio/{language}`): its answer names
  no URL, so its outputs can leave its origin only by a redirect;
- KIE's families: Veo `GET /api/v1/veo/record-info` (`response.resultUrls`),
  Runway `GET /api/v1/runway/record-detail` (`videoInfo.videoUrl`), Flux
  Kontext `GET /api/v1/flux/kontext/record-info` (`response.resultImageUrl`),
  Suno `GET /api/v1/generate/record-info` (`response.sunoData[].audioUrl`).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, running_job, wait_for_status
from tests.support.loopback import InLoopServer, serve_in_loop

PROVIDERS = ("sim", "replicate", "fal", "kie", "gateway", "gemini", "elevenlabs")  # one scripted app each
# A job's case: its provider and model (KIE's families are models of provider kie).
CASES = {
    "sim": ("sim", "image-fast"), "replicate": ("replicate", "acme/model"), "fal": ("fal", "fal-ai/flux/dev"),
    "kie": ("kie", "acme/model"), "kie-veo": ("kie", "veo/veo3"), "kie-runway": ("kie", "runway/generate"),
    "kie-flux": ("kie", "flux-kontext/flux-kontext-pro"), "kie-suno": ("kie", "suno/V4_5"),
    "gateway": ("gateway", "klingai/kling-v3.0-t2v"), "gemini": ("gemini", "veo-3.1-generate-preview"),
    "elevenlabs": ("elevenlabs", "dubbing"),
}
# Each provider's key, distinct, so every credential that arrives anywhere names whose it is.
KEYS = {"replicate": "r8_policyReplicateKey01", "fal": "policy-fal-key:0123", "kie": "policy-kie-key-0123",
        "gateway": "vck_policy_gateway_key_0123", "gemini": "AIzaPolicyGeminiKey0123456789",
        "elevenlabs": "sk_policy_elevenlabs_key_0123"}
KEY_SETTINGS = {"replicate": "REPLICATE_API_TOKEN", "fal": "FAL_KEY", "kie": "KIE_API_KEY",
                "gateway": "AI_GATEWAY_API_KEY", "gemini": "GEMINI_API_KEY", "elevenlabs": "ELEVENLABS_API_KEY"}
BASE_URL_SETTINGS = {"sim": "SIM_URL", "replicate": "REPLICATE_BASE_URL", "fal": "FAL_BASE_URL",
                     "kie": "KIE_BASE_URL", "gateway": "AI_GATEWAY_BASE_URL", "gemini": "GEMINI_BASE_URL",
                     "elevenlabs": "ELEVENLABS_BASE_URL"}
CREDENTIAL_HEADERS = ("authorization", "x-goog-api-key", "xi-api-key")
# The header each provider's output downloads carry to its own (API) host (their facts'
# credential_hosts): Gemini's and ElevenLabs', whose output URLs are the API's own routes. Every
# other provider's downloads carry none there; Replicate's key goes to replicate.delivery only,
# since its outputs are the model's to choose (tests/outbox/test_replicate_outputs.py).
DOWNLOAD_KEYS = {"gemini": {"x-goog-api-key": KEYS["gemini"]}, "elevenlabs": {"xi-api-key": KEYS["elevenlabs"]}}
USUAL_SIM_PORT = 8787  # what SIM_URL used to default to everywhere
SERVED = b"healthy output"
GEMINI_RESPONSE_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse"


def task_id_for(case: str, key: str) -> str:
    """The provider task id of the job whose outputs are script.outputs[key]:
    a Gemini task id is its operation's name."""
    provider, model = CASES[case]
    return f"models/{model}/operations/{key}" if provider == "gemini" else key


def provider_settings(own: dict[str, str]) -> dict[str, str]:
    """Each provider's base URL (its scripted app) and key."""
    env = {BASE_URL_SETTINGS[p]: url for p, url in own.items()}
    if "fal" in own:
        env["FAL_JWKS_URL"] = f"{own['fal']}/jwks"
    return {**env, **{KEY_SETTINGS[p]: KEYS[p] for p in own if p in KEYS}}


# ----------------------------------------------------------------- scripted providers

@dataclass
class Fetched:
    server: str
    path: str
    headers: dict[str, str]


@dataclass
class Script:
    """Shared by every scripted provider of a test: which output each task
    has, and every request that reached an output."""

    # task id (Gemini: its operation's last segment) -> output URL; for
    # ElevenLabs, the language code its dub lists (the adapter builds the URL).
    outputs: dict[str, str] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # /redirect/<hop> (or a dub language) -> where to
    redirected: list[str] = field(default_factory=list)  # "<server> <path>" of each redirect answered
    canary_hits: list[str] = field(default_factory=list)  # "<server> <path>" of each /canary request
    fetched: list[Fetched] = field(default_factory=list)  # each output served (/ok, ElevenLabs' audio)
    credentials: list[tuple[str, str, str]] = field(default_factory=list)  # (server, header, value), any request
    stalled: int = 0  # /stall requests waiting now
    release_stalls: asyncio.Event = field(default_factory=asyncio.Event)

    def assert_keys_stayed_home(self) -> None:
        """Every credential any scripted server saw was its own provider's."""
        strays = [(server, header) for server, header, value in self.credentials
                  if server not in KEYS or KEYS[server] not in value]
        assert strays == [], strays


def provider_app(name: str, script: Script) -> Callable[..., Awaitable[None]]:
    """Answers the status calls of every protocol (each adapter asks its own
    base URL) with the task's output URL; serves outputs under /canary
    (counted), /ok (a healthy host), /redirect (to script.redirects) and
    /stall (accepts, never answers until released). Records the credential
    headers of every request."""

    def output(request: Request) -> str:
        task_id = request.path_params.get("task_id") or request.query_params.get("taskId", "")
        return script.outputs[task_id]

    def kie_record(request: Request, data: dict[str, Any]) -> Response:
        task_id = request.query_params["taskId"]
        return JSONResponse({"code": 200, "msg": "success", "data": {"taskId": task_id, **data}})

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
        return kie_record(request, {"state": "success", "resultJson": json.dumps({"resultUrls": [output(request)]})})

    async def kie_veo_status(request: Request) -> Response:
        return kie_record(request, {"successFlag": 1, "response": {"resultUrls": [output(request)]},
                                    "errorCode": None, "errorMessage": ""})

    async def kie_runway_status(request: Request) -> Response:
        return kie_record(request, {"state": "success", "videoInfo": {"videoUrl": output(request)}, "expireFlag": 0})

    async def kie_flux_status(request: Request) -> Response:
        return kie_record(request, {"successFlag": 1, "response": {"resultImageUrl": output(request)},
                                    "errorCode": None, "errorMessage": ""})

    async def kie_suno_status(request: Request) -> Response:
        track = {"id": f"track-{request.query_params['taskId']}", "audioUrl": output(request), "duration": 1.5}
        return kie_record(request, {"status": "SUCCESS", "response": {"sunoData": [track]},
                                    "errorCode": None, "errorMessage": None})

    async def gateway_status(request: Request) -> Response:
        task_id = (await request.json())["operation"]["gatewayJobId"]
        return JSONResponse({"status": "completed", "videos": [
            {"type": "url", "url": script.outputs[task_id], "mediaType": "video/mp4"}]})

    async def gemini_operation(request: Request) -> Response:
        name = f"models/{request.path_params['model']}/operations/{request.path_params['task_id']}"
        return JSONResponse({"name": name, "done": True, "response": {
            "@type": GEMINI_RESPONSE_TYPE,
            "generateVideoResponse": {"generatedSamples": [{"video": {"uri": output(request)}}]}}})

    async def elevenlabs_dub(request: Request) -> Response:
        return JSONResponse({"dubbing_id": request.path_params["task_id"], "name": "job", "status": "dubbed",
                             "source_language": "en", "target_languages": [output(request)], "editable": False,
                             "created_at": "2024-01-15T09:30:00Z", "media_metadata": None, "error": None})

    async def elevenlabs_audio(request: Request) -> Response:
        language = request.path_params["language"]
        if language in script.redirects:
            return redirect(request, language)
        return ok(request)

    async def canary(request: Request) -> Response:
        script.canary_hits.append(f"{name} {request.url.path}")
        return Response(b"fetched: this must never happen", media_type="image/png")

    def ok(request: Request) -> Response:
        script.fetched.append(Fetched(name, request.url.path, dict(request.headers)))
        return Response(SERVED, media_type="application/octet-stream")

    async def ok_route(request: Request) -> Response:
        return ok(request)

    def redirect(request: Request, hop: str) -> Response:
        script.redirected.append(f"{name} {request.url.path}")
        return RedirectResponse(script.redirects[hop], status_code=302)

    async def redirect_route(request: Request) -> Response:
        return redirect(request, request.path_params["rest"])

    async def stall(request: Request) -> Response:
        script.stalled += 1
        try:
            await script.release_stalls.wait()
        finally:
            script.stalled -= 1
        return Response(b"released", status_code=503)

    app = Starlette(routes=[
        Route("/canary/{rest:path}", canary),
        Route("/ok/{rest:path}", ok_route),
        Route("/redirect/{rest:path}", redirect_route),
        Route("/stall/{rest:path}", stall),
        Route("/v1/tasks/{task_id}", sim_status),
        Route("/v1/predictions/{task_id}", replicate_status),
        Route("/api/v1/jobs/recordInfo", kie_status),
        Route("/api/v1/veo/record-info", kie_veo_status),
        Route("/api/v1/runway/record-detail", kie_runway_status),
        Route("/api/v1/flux/kontext/record-info", kie_flux_status),
        Route("/api/v1/generate/record-info", kie_suno_status),
        Route("/video-model/status", gateway_status, methods=["POST"]),
        Route("/v1beta/models/{model}/operations/{task_id}", gemini_operation),
        Route("/v1/dubbing/{task_id}/audio/{language:path}", elevenlabs_audio),
        Route("/v1/dubbing/{task_id}", elevenlabs_dub),
        Route("/{owner}/{app}/requests/{task_id}/status", fal_status),
        Route("/{owner}/{app}/requests/{task_id}", fal_result),
    ])

    async def recording(scope, receive, send) -> None:
        if scope["type"] == "http":
            for raw_name, raw_value in scope["headers"]:
                header = raw_name.decode("latin-1").lower()
                if header in CREDENTIAL_HEADERS:
                    script.credentials.append((name, header, raw_value.decode("latin-1")))
        await app(scope, receive, send)

    return recording


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
    env = provider_settings(own)
    if not sim_configured:
        env["SIM_URL"] = ""
    cases = [c for c in CASES if sim_configured or c != "sim"]

    owner = await make_owner(credits=1000, max_active=100)
    jobs: dict[str, tuple[str, str]] = {}  # job id -> (case, where its output is)
    for case in cases:
        provider, model = CASES[case]
        another = own[PROVIDERS[(PROVIDERS.index(provider) + 1) % len(PROVIDERS)]]
        elsewhere = [("another provider's origin", f"{another}/canary/{case}.png"),
                     ("the usual SIM_URL origin", f"{usual}/canary/{case}.png"),
                     ("an unconfigured loopback port", f"{nobodys}/canary/{case}.png"),
                     # The Gateway may fetch from any public https host: loopback is none.
                     ("the same, over https", f"{nobodys.replace('http:', 'https:')}/canary/{case}.png")]
        for where, url in elsewhere:
            hop = f"hop-{len(script.redirects)}"
            script.redirects[hop] = url  # and the same place reached by a redirect from the provider's own origin
            via_redirect = f"{own[provider]}/redirect/{hop}"
            # ElevenLabs' answer names no URL (its outputs are its own audio routes): only the redirect applies.
            places = [(f"a redirect from its own origin to {where}", via_redirect)]
            if provider != "elevenlabs":
                places.append((where, url))
            for place, output in places:
                key = f"task-{len(jobs)}"
                script.outputs[key] = output
                if provider == "elevenlabs":  # the dub lists a language whose audio route redirects
                    script.outputs[key] = hop
                job_id = await running_job(db, owner.owner_id, provider, model, task_id_for(case, key))
                jobs[job_id] = (case, place)

    await start_settler(make_settings(**env), concurrency=16)
    for job_id, (case, where) in jobs.items():
        row = await wait_for_status(db, job_id, (JobStatus.FAILED, JobStatus.SUCCEEDED))
        assert (row["status"], row["error_code"]) == (JobStatus.FAILED, JobError.OUTPUT_REFUSED), \
            f"{case}, output on {where}: {row['status']} {row['error_code']} {row['error_message']}"
        assert (row["credits_charged"], row["credits_refunded"]) == (0, row["credits_reserved"])
    assert script.canary_hits == []
    assert script.fetched == []
    # The redirected ones were refused at the second hop, once their own origin had answered.
    assert len(script.redirected) == sum(where.startswith("a redirect") for _, where in jobs.values())
    script.assert_keys_stayed_home()
    assert await db.fetchval("select count(*) from assets") == 0
    await assert_money_balances(db)


async def test_outputs_on_the_providers_own_origin_are_fetched(db, make_owner, make_settings, start_settler,
                                                               serve):
    # The other side of the policy: each provider's own loopback origin works.
    script = Script()
    own = {p: await serve(provider_app(p, script)) for p in PROVIDERS}
    owner = await make_owner(credits=1000, max_active=50)
    jobs: dict[str, tuple[str, str | None]] = {}  # job id -> (case, the label its output has)
    served: set[tuple[str, str]] = set()  # (server, path) each output must be fetched from
    for case, (provider, model) in CASES.items():
        key = f"task-{case}"
        label: str | None = None
        if provider == "elevenlabs":  # the dub lists Spanish: its audio route is the output
            script.outputs[key] = label = "es"
            path = f"/v1/dubbing/{key}/audio/es"
        else:
            path = f"/ok/{case}.bin"
            script.outputs[key] = f"{own[provider]}{path}"
            label = f"track-{key}" if case == "kie-suno" else None  # a Suno output is labelled with its track id
        served.add((provider, path))
        jobs[await running_job(db, owner.owner_id, provider, model, task_id_for(case, key))] = (case, label)
    # A dub language that spells another origin's URL is still a path on ElevenLabs' own origin.
    spelled = f"{own['gemini']}/canary/elevenlabs.mp3"
    script.outputs["task-spelled"] = spelled
    served.add(("elevenlabs", f"/v1/dubbing/task-spelled/audio/{spelled}"))
    jobs[await running_job(db, owner.owner_id, "elevenlabs", "dubbing", "task-spelled")] = ("elevenlabs", spelled)

    await start_settler(make_settings(**provider_settings(own)))
    for job_id, (case, label) in jobs.items():
        row = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, (case, row["error_message"])
        assets = await db.fetch("select index, bytes, sha256, label from assets where job_id = $1", job_id)
        assert [tuple(a) for a in assets] == [(0, len(SERVED), hashlib.sha256(SERVED).hexdigest(), label)], case
    assert script.canary_hits == []
    # Every output came from its provider's own origin, once, with its key where the provider's files need it.
    assert sorted((f.server, f.path) for f in script.fetched) == sorted(served)
    for fetched in script.fetched:
        keys = {h: v for h, v in fetched.headers.items() if h in CREDENTIAL_HEADERS}
        assert keys == DOWNLOAD_KEYS.get(fetched.server, {}), (fetched.server, fetched.path)
    script.assert_keys_stayed_home()
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
        stalled_ids.append(await running_job(db, owner.owner_id, "sim", CASES["sim"][1], f"stall-{i}"))
    # Due after all of them, so a settler that claims in order gives them every slot first.
    script.outputs["healthy"] = f"{healthy}/ok/out.bin"
    healthy_id = await running_job(db, owner.owner_id, "replicate", CASES["replicate"][1], "healthy")

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
