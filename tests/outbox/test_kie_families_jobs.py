"""KIE's own families (Veo 3.1, Runway, Flux Kontext, Suno) end to end:
the web API, a settler, real PostgreSQL, files storage and the real KIE
adapter against the simulator's emulation of each family, with KIE's
callbacks coming back over loopback (PUBLIC_URL) to the web server."""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
from urllib.parse import urlsplit

import httpx

from app.simulator import output_sha256
from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.support.simulator import clear_faults, set_faults, stats

KEY = "kie-families-jobs-key"
# Each family's job: its model and the fields its generate page requires.
JOBS = {
    "veo": ("veo/veo3_fast", {}),
    "runway": ("runway/generate", {"duration": 5, "quality": "720p"}),
    "flux-kontext": ("flux-kontext/flux-kontext-pro", {}),
    "suno": ("suno/V4_5", {"customMode": False, "instrumental": False}),
}
FAMILIES = sorted(JOBS)
CONTENT_TYPES = {"veo": "video/mp4", "runway": "video/mp4", "flux-kontext": "image/jpeg", "suno": "audio/mpeg"}


def kie_env(sim_url: str, **extra) -> dict[str, str]:
    return {"SIM_URL": sim_url, "KIE_BASE_URL": f"{sim_url}/kie", "KIE_API_KEY": KEY, **extra}


def job(family: str, **controls) -> dict:
    model, fields = JOBS[family]
    return {"provider": "kie", "model": model, "max_credits": 10,
            "input": {"prompt": f"a {family} job", **fields, **controls}}


async def start(web, make_settings, start_settler, sim, **settler_options):
    """The web server, and a settler registering callbacks to it."""
    server = await web(**kie_env(sim.url))
    settings = make_settings(**kie_env(sim.url, PUBLIC_URL=server.url))
    await start_settler(settings, **settler_options)
    return server, settings


def hook_path(settings, job_id: str) -> str:
    url = urlsplit(settings.callback_url("kie", job_id))
    return f"{url.path}?{url.query}"


async def test_every_family_job_succeeds_with_its_outputs_stored_charged_once(web, make_owner, db, sim,
                                                                             make_settings, start_settler):
    server, _ = await start(web, make_settings, start_settler, sim)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = {f: (await c.post("/v1/jobs", json=job(f, duration_s=0.2, output_bytes=300))).json()["id"]
                   for f in FAMILIES}
        rows, got, bodies = {}, {}, {}
        for family, job_id in created.items():
            rows[family] = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED))
            assert rows[family]["status"] == JobStatus.SUCCEEDED, (family, rows[family]["last_error"])
            got[family] = (await c.get(f"/v1/jobs/{job_id}")).json()
            bodies[family] = [(await c.get(out["url"])).content for out in got[family]["outputs"]]
    for family in FAMILIES:
        task_id, outputs = rows[family]["provider_task_id"], got[family]["outputs"]
        assert [o["index"] for o in outputs] == list(range(2 if family == "suno" else 1)), family
        for index, (out, body) in enumerate(zip(outputs, bodies[family], strict=True)):
            assert (out["bytes"], out["content_type"]) == (300, CONTENT_TYPES[family])
            assert out["sha256"] == hashlib.sha256(body).hexdigest() == output_sha256(task_id, index, 300)
        # KIE reports no cost: charged the reservation, once.
        assert got[family]["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
        assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'",
                                 created[family]) == 1
    assert stats(sim.url)["tasks_created"] == len(FAMILIES)

    # Suno's two tracks: indexes 0 and 1, each labelled with its track id, in KIE's order.
    record = httpx.get(f"{sim.url}/kie/api/v1/generate/record-info",
                       params={"taskId": rows["suno"]["provider_task_id"]},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=5).json()
    track_ids = [t["id"] for t in record["data"]["response"]["sunoData"]]
    assert len(track_ids) == 2 and track_ids[0] != track_ids[1]
    assert [(o["index"], o["label"]) for o in got["suno"]["outputs"]] == list(enumerate(track_ids))
    assert rows["suno"]["usage"] == [{"unit": "seconds", "amount": 60.0}]  # the tracks' summed duration
    assert all(o["label"] is None for f in FAMILIES if f != "suno" for o in got[f]["outputs"])
    await assert_money_balances(db)


async def test_every_family_failure_is_refunded(web, make_owner, db, sim, make_settings, start_settler):
    server, _ = await start(web, make_settings, start_settler, sim)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = {f: (await c.post("/v1/jobs", json=job(f, duration_s=0.2, outcome="failed"))).json()["id"]
                   for f in FAMILIES}
        # Runway's one model is runway/generate: refused before any call.
        refused = (await c.post("/v1/jobs", json={**job("runway"), "model": "runway/gen4"})).json()["id"]
        for job_id in [*created.values(), refused]:
            await wait_for_status(db, job_id, JobStatus.FAILED)
        got = {f: (await c.get(f"/v1/jobs/{job_id}")).json() for f, job_id in created.items()}
        rejected = (await c.get(f"/v1/jobs/{refused}")).json()
        acct = (await c.get("/v1/account")).json()
    for family, failed in got.items():
        assert failed["error"]["code"] == JobError.PROVIDER_FAILED and failed["error"]["message"], family
        assert failed["credits"] == {"reserved": 10, "charged": 0, "refunded": 10} and failed["outputs"] == []
    assert rejected["error"]["code"] == JobError.SUBMIT_REJECTED
    assert "runway/generate" in rejected["error"]["message"] and rejected["credits"]["refunded"] == 10
    assert stats(sim.url)["tasks_created"] == len(FAMILIES)
    assert acct["credits"] == {"balance": 100, "reserved": 0, "charged": 0}
    await assert_money_balances(db)


async def test_in_doubt_submits_are_uncertain_then_recovered_by_their_callbacks(web, make_owner, db, sim,
                                                                                make_settings, start_settler):
    """The answer to each submit is lost (the simulator creates the task,
    then drops the answer): KIE has no idempotency and no look-up, so each
    job is `uncertain` until its task's own callback names it; the status
    endpoint confirms it with our key, and the job settles. One task per
    job, charged once."""
    set_faults(sim.url, submit_timeout_after_create=1)
    # The simulator holds a lost answer for 60 s: the settler gives up after 1 s,
    # and the tasks' callbacks come 2 s after that.
    server, _ = await start(web, make_settings, start_settler, sim, provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = {f: (await c.post("/v1/jobs", json=job(f, duration_s=3))).json()["id"] for f in FAMILIES}
    for family, job_id in created.items():
        uncertain = await wait_for_status(db, job_id, (JobStatus.UNCERTAIN, JobStatus.SUCCEEDED), timeout=15)
        assert uncertain["status"] == JobStatus.UNCERTAIN and uncertain["provider_task_id"] is None, family
    clear_faults(sim.url)  # the creates are made; nothing else is faulted
    for family, job_id in created.items():
        row = await wait_for_status(db, job_id, (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.EXPIRED),
                                    timeout=30)
        assert row["status"] == JobStatus.SUCCEEDED, (family, row["last_error"])
        assert row["provider_task_id"] and row["claimed_task_id"] is None
        assert (row["credits_charged"], row["credits_refunded"]) == (10, 0)
        assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", job_id) == 1
        assert await db.fetchval("select count(*) from assets where job_id = $1", job_id) == (
            2 if family == "suno" else 1)
    seen = stats(sim.url)
    assert seen["tasks_created"] == len(FAMILIES)
    assert seen["creates_by_callback_url"] == {f"{server.url}/webhooks/kie/{job_id}": 1 for job_id in created.values()}
    await assert_money_balances(db)


async def _settle_due_in(db, job_id: str) -> float:
    """Seconds until the job's settle intent is due (negative: due)."""
    not_before = await db.fetchval("select not_before from outbox where job_id = $1 and kind = 'settle'", job_id)
    return (not_before - dt.datetime.now(dt.UTC)).total_seconds()


async def test_suno_stage_callbacks_are_accepted_without_a_settle_and_complete_settles(
        web, make_owner, db, sim, make_settings, start_settler):
    # The simulator's own callbacks are dropped: the deliveries are ours to send.
    set_faults(sim.url, drop_webhook=1)
    server, settings = await start(web, make_settings, start_settler, sim)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job("suno", duration_s=600))).json()
    row = await wait_for_status(db, created["id"], JobStatus.RUNNING)
    # With a callback registered, the next look is Suno's lost-webhook check, 30 minutes out.
    assert await _settle_due_in(db, created["id"]) > 25 * 60
    status_calls = stats(sim.url)["status_calls"]
    path = hook_path(settings, created["id"])

    def callback(callback_type: str) -> bytes:
        # https://docs.kie.ai/suno-api/generate-music-callbacks
        return json.dumps({"code": 200, "msg": "ok", "data": {"callbackType": callback_type,
                                                               "task_id": row["provider_task_id"],
                                                               "data": []}}).encode()

    async with httpx.AsyncClient(base_url=server.url) as anon:
        for stage in ("text", "first"):
            response = await anon.post(path, content=callback(stage), headers={"content-type": "application/json"})
            assert response.status_code == 204
        assert await _settle_due_in(db, created["id"]) > 25 * 60  # accepted, nothing settled
        assert stats(sim.url)["status_calls"] == status_calls
        # Without our token, a stage report is refused like any delivery.
        assert (await anon.post(path.partition("?")[0], content=callback("text"))).status_code == 401

        response = await anon.post(path, content=callback("complete"), headers={"content-type": "application/json"})
        assert response.status_code == 204
    # `complete` asks for a settle: the settle step asks Suno (still running: 600 s).
    for _ in range(200):
        if stats(sim.url)["status_calls"] > status_calls:
            break
        await asyncio.sleep(0.05)
    assert stats(sim.url)["status_calls"] > status_calls
    assert (await db.fetchrow("select status from jobs where id = $1", created["id"]))["status"] == JobStatus.RUNNING
