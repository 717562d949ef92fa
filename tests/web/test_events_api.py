"""A job's timeline (`GET /v1/jobs/{id}/events`) over real HTTP: who may
read it, and the lines real jobs write — an async job through the
simulator and a settler, a cancelled job, a sync call — plus the two rules
that keep it small (a repeated status check is one line; repeated lines
stop at MAX_REPEATED_LINES)."""
from __future__ import annotations

import datetime as dt
from urllib.parse import parse_qs, urlsplit

import pytest

from app.domain import events
from app.domain.events import MAX_REPEATED_LINES
from tests.outbox.conftest import wait_for_status
from tests.outbox.test_sync_jobs import claude_job, sync_env
from tests.support.simulator import RunningSimulator, stats

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}


@pytest.fixture(scope="module")
def sim():
    with RunningSimulator() as running:
        yield running


async def timeline(c, job_id: str) -> list[dict]:
    r = await c.get(f"/v1/jobs/{job_id}/events")
    assert r.status_code == 200, r.text
    lines = r.json()["events"]
    assert all(set(e) == {"at", "type", "detail"} for e in lines)
    ats = [dt.datetime.fromisoformat(e["at"]) for e in lines]
    assert ats == sorted(ats), "oldest first"
    return lines


def types(lines: list[dict]) -> list[str]:
    return [e["type"] for e in lines]


async def test_who_may_read_a_timeline(web, make_owner, db):
    server = await web()
    alice, bob = await make_owner(name="alice"), await make_owner(name="bob")
    async with server.client(alice.api_key) as a:
        job = (await a.post("/v1/jobs", json={**JOB, "metadata": {"order": "A-17"}})).json()
        other = (await a.post("/v1/jobs", json=JOB)).json()
        lines = await timeline(a, job["id"])
    assert types(lines) == ["created"]
    path = f"/v1/jobs/{job['id']}/events"
    token = parse_qs(urlsplit(job["status_url"]).query)["token"][0]
    other_token = parse_qs(urlsplit(other["status_url"]).query)["token"][0]
    async with server.client() as anon, server.client(bob.api_key) as b:
        r = await anon.get(path, params={"token": token})  # the status_url's token
        assert r.status_code == 200 and r.json()["events"] == lines
        assert r.headers["access-control-allow-origin"] == "*"
        for bad in (other_token, token[:-2], "nope", ""):
            r = await anon.get(path, params={"token": bad})
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", bad
        r = await b.get(path)  # another owner
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await anon.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
        r = await anon.get(path, headers={"Authorization": "Bearer lc_not-a-key"})
        assert r.status_code == 401
        r = await anon.options(path, headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"
        for missing in ("job_" + "0" * 24, "job_nope"):
            async with server.client(alice.api_key) as a:
                assert (await a.get(f"/v1/jobs/{missing}/events")).status_code == 404


async def test_a_succeeded_job_tells_its_story_in_order(web, make_owner, db, make_settings, start_settler, sim,
                                                       tmp_path):
    # Checked every 0.2 s while it runs for 2 s: many status calls, one line per state.
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nprovider = "sim"\nmodel = "*"\npoll_every_s = [0.2]\n')
    env = {"SIM_URL": sim.url, "MODELS_FILE": str(models)}
    server = await web(**env)
    await start_settler(make_settings(**env), concurrency=4, provider_timeout_s=5.0)
    owner = await make_owner(credits=100)
    calls_before = stats(sim.url)["status_calls"]
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json={
            "provider": "sim", "model": "image-fast", "max_credits": 10, "metadata": {"order": "A-17"},
            "input": {"duration_s": 2.0, "outputs": 2, "output_bytes": 3000, "cost": 4}})).json()
        await wait_for_status(db, created["id"], "succeeded", timeout=60)
        job = (await c.get(f"/v1/jobs/{created['id']}")).json()
        lines = await timeline(c, created["id"])
    assert stats(sim.url)["status_calls"] - calls_before >= 4, "the test needs repeated checks of a running task"
    checks = [e["detail"] for e in lines if e["type"] == "status_checked"]
    # The task spends its first 0.2 s queued at the simulator: a first check may see that.
    states = [d["state"] for d in checks]
    assert states in (["running", "succeeded"], ["queued", "running", "succeeded"]), checks
    assert all(d["error"] is None for d in checks)
    assert types(lines) == ["created", "submit_sent", "task_saved"] + ["status_checked"] * len(checks) + [
        "output_stored", "output_stored", "closed"], types(lines)
    created_line, submit, saved = (e["detail"] for e in lines[:3])
    out0, out1, closed = (e["detail"] for e in lines[-3:])
    assert created_line == {"provider": "sim", "model": "image-fast", "max_credits": 10,
                            "metadata": {"order": "A-17"}}
    assert submit == {"attempt": 1, "in_doubt": False}
    task_id = await db.fetchval("select provider_task_id from jobs where id = $1", created["id"])
    assert saved == {"task_id": task_id, "job_was_closed": False}
    for line, output in zip((out0, out1), job["outputs"], strict=True):
        assert line == {"index": output["index"], "bytes": output["bytes"], "sha256": output["sha256"],
                        "content_type": output["content_type"], "label": output["label"]}
        assert output["bytes"] == 3000
    assert (closed["status"], closed["charged"], closed["refunded"], closed["error_code"]) == \
        ("succeeded", 4, 6, None)
    assert closed["price_applied"]["charged"] == 4


async def test_a_job_closed_by_its_webhook_says_the_webhook_came(web, make_owner, db, make_settings, start_settler,
                                                                 sim):
    server = await web(SIM_URL=sim.url)
    # With a webhook registered the sim job is not polled for 30 s: its webhook closes it.
    await start_settler(make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url), concurrency=4,
                        provider_timeout_s=5.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json={**JOB, "input": {"duration_s": 0.5, "cost": 2}})).json()
        await wait_for_status(db, created["id"], "succeeded", timeout=60)
        lines = await timeline(c, created["id"])
    kinds = types(lines)
    assert kinds[:3] == ["created", "submit_sent", "task_saved"] and kinds[-2:] == ["output_stored", "closed"]
    assert "webhook_accepted" in kinds, kinds
    first_webhook = kinds.index("webhook_accepted")
    assert first_webhook < kinds.index("output_stored")
    # the settle it asked for asked the provider, which said so
    assert {"state": "succeeded", "error": None} in [e["detail"] for e in lines[first_webhook:]
                                                     if e["type"] == "status_checked"]


async def test_a_cancelled_job_is_created_then_closed(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=JOB)).json()
        assert (await c.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
        lines = await timeline(c, job["id"])
    assert types(lines) == ["created", "closed"]
    closed = lines[1]["detail"]
    assert (closed["status"], closed["charged"], closed["refunded"]) == ("cancelled", 0, 10)
    assert lines[0]["detail"]["metadata"] == {}


async def test_a_sync_call_says_when_it_started(web, make_owner, db, make_settings, start_settler, sim):
    env = sync_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env), concurrency=4, provider_timeout_s=5.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=claude_job(output_text="Hello!"))).json()
        row = await wait_for_status(db, created["id"], ("succeeded", "failed"), timeout=60)
        assert row["status"] == "succeeded", row["last_error"]
        job = (await c.get(f"/v1/jobs/{created['id']}")).json()
        lines = await timeline(c, created["id"])
    assert types(lines) == ["created", "submit_sent", "call_started", "output_stored", "closed"], types(lines)
    [output] = job["outputs"]
    assert lines[3]["detail"]["sha256"] == output["sha256"] and lines[3]["detail"]["bytes"] == output["bytes"]
    assert lines[4]["detail"]["status"] == "succeeded"


async def test_the_same_answer_twice_is_one_status_checked_line(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
        running = {"state": "running", "error": None}
        async with db.acquire() as conn:
            for _ in range(5):
                await events.status_checked(conn, job_id, running)
        assert [e["detail"] for e in await timeline(c, job_id) if e["type"] == "status_checked"] == [running]
        busy = {"state": None, "error": "ProviderError: HTTP 503"}
        async with db.acquire() as conn:
            for detail in (busy, busy, running, running):
                await events.status_checked(conn, job_id, detail)
        checked = [e["detail"] for e in await timeline(c, job_id) if e["type"] == "status_checked"]
        assert checked == [running, busy, running]  # a change back is a change


async def test_repeated_lines_stop_at_the_cap_and_the_close_is_still_written(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
        async with db.acquire() as conn:
            for n in range(MAX_REPEATED_LINES + 50):  # each one different: none deduplicated
                await events.status_checked(conn, job_id, {"state": "running", "error": f"progress {n}"})
        checked = [e for e in await timeline(c, job_id) if e["type"] == "status_checked"]
        assert MAX_REPEATED_LINES - 5 <= len(checked) <= MAX_REPEATED_LINES
        assert [e["detail"]["error"] for e in checked] == [f"progress {n}" for n in range(len(checked))]
        assert (await c.post(f"/v1/jobs/{job_id}/cancel")).status_code == 200
        lines = await timeline(c, job_id)
    assert types(lines)[0] == "created" and types(lines)[-1] == "closed"
    assert lines[-1]["detail"]["status"] == "cancelled"


async def test_a_delivery_ended_by_deleting_its_endpoint_says_so_in_the_timeline(web, make_owner, db):
    """A delivery that ends adds its line (app/domain/notifications.py): one
    ended because its endpoint was deleted is `notification_failed` too."""
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        endpoint = (await c.post("/v1/webhook-endpoints", json={"url": "https://93.184.216.34/hook"})).json()
        job = (await c.post("/v1/jobs", json=JOB)).json()
        assert (await c.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
        [n] = (await c.get("/v1/notifications")).json()["notifications"]
        assert n["deliveries"][0]["status"] == "pending"
        assert (await c.delete(f"/v1/webhook-endpoints/{endpoint['id']}")).status_code == 204
        [n] = (await c.get("/v1/notifications")).json()["notifications"]
        assert n["deliveries"][0]["status"] == "failed"
        lines = await timeline(c, job["id"])
    assert types(lines) == ["created", "closed", "notification_failed"], types(lines)
    detail = lines[-1]["detail"]
    assert (detail["notification_id"], detail["endpoint_id"]) == (n["id"], endpoint["id"])
