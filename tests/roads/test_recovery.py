"""Recovery of submits whose outcome is unknown.

An idempotent provider (the simulator) is simply asked again; Replicate
(not idempotent) is looked up by our callback URL when there is one;
otherwise the job becomes `uncertain`, keeps its hold and slot, and an
operator resolves it — `longcall jobs resolve` or the admin route — with
the provider's task id (the job then settles normally) or as failed
(refund). An uncertain job left alone expires at its give-up deadline
(the sweep)."""
from __future__ import annotations

import asyncio

import httpx

from tests.roads.conftest import (
    assert_money_balances,
    longcall,
    provider_env,
    snapshot,
    wait_for_status,
    wait_until,
)
from tests.support.simulator import clear_faults, set_faults, stats

ADMIN = {"Authorization": "Bearer test-admin-token"}  # tests/conftest.py's ADMIN_TOKEN
REPLICATE_AUTH = {"Authorization": "Bearer r8_roads_test_token"}


def replicate_job(ref: str) -> dict:
    # `ref` rides in the input so the test can tell the predictions apart
    return {"provider": "replicate", "model": "acme/painter", "input": {"duration_s": 0.2, "ref": ref},
            "max_credits": 10}


# The same model and input for every job: an in-doubt look-up finds several
# predictions that could be its own and adopts none, so the jobs become
# uncertain (no callback URL either, so no webhook can recover them).
TWIN_REPLICATE_JOB = {"provider": "replicate", "model": "acme/painter", "input": {"duration_s": 0.2},
                      "max_credits": 10}


def predictions_by_ref(sim_url: str) -> dict[str, str]:
    page = httpx.get(f"{sim_url}/replicate/v1/predictions", headers=REPLICATE_AUTH, trust_env=False).json()
    return {p["input"]["ref"]: p["id"] for p in page["results"]}


async def test_uncertain_jobs_resolved_both_ways(web, make_settings, make_owner, sim, settlers, db, migrated):
    # Every create is made and then its answer lost; the five Replicate jobs
    # are twins (TWIN_REPLICATE_JOB) and KIE has no look-up: all uncertain.
    set_faults(sim.url, submit_timeout_after_create=1)
    env = provider_env(sim.url)
    server = await web(**env)
    await settlers(make_settings(**env), provider_timeout_s=1.0)
    owner = await make_owner(credits=1000)
    refs = ("cli_task", "cli_failed", "admin_task", "admin_failed", "race")
    async with server.client(owner.api_key) as c:
        jobs = {ref: (await c.post("/v1/jobs", json=TWIN_REPLICATE_JOB)).json()["id"] for ref in refs}
        kie = (await c.post("/v1/jobs", json={"provider": "kie", "model": "kie-image",
                                              "input": {"duration_s": 0.2}, "max_credits": 10})).json()["id"]
        for job_id in [*jobs.values(), kie]:
            row = await wait_for_status(db, job_id, "uncertain", timeout=15)
            assert row["provider_task_id"] is None and "unknown" in row["last_error"]
        # the hold and the slot are kept while uncertain
        account = (await c.get("/v1/account")).json()
        assert account["credits"]["reserved"] == 60 and account["active"] == 6
    await assert_money_balances(db)
    assert stats(sim.url)["tasks_created"] == 6  # each made once, never again blindly
    # Nothing is left to send: each submit's intent is dropped by the
    # settler just after its job was marked uncertain (a moment a loaded
    # machine can stretch). What stays is each job's give-up timer: a settle
    # due at its deadline.
    async def only_their_timers() -> bool:
        rows = await db.fetch("select o.kind, o.claimed_until is null as idle,"
                              " abs(extract(epoch from j.deadline_at - o.not_before)) < 5 as at_deadline"
                              " from outbox o join jobs j on j.id = o.job_id")
        return len(rows) == 6 and all(r["kind"] == "settle" and r["idle"] and r["at_deadline"] for r in rows)

    await wait_until(only_their_timers, timeout=10)
    # The KIE job's timer is lost, as a row deleted by hand would be: the
    # sweep (below) is what expires it then, once its deadline is moved into
    # the past (by hand too: no test here waits for a deadline to come).
    await db.execute("delete from outbox where job_id = $1", kie)
    clear_faults(sim.url)
    page = httpx.get(f"{sim.url}/replicate/v1/predictions", headers=REPLICATE_AUTH, trust_env=False).json()
    predictions = [p["id"] for p in page["results"]]
    assert len(predictions) == len(refs)
    task_of = dict(zip(refs, predictions, strict=True))  # twins: any one is a real task to resolve with

    # the command line, with the task found at the provider
    job_id = jobs["cli_task"]
    done = longcall(migrated, "jobs", "resolve", job_id, "--task-id", task_of["cli_task"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{job_id}: running with provider task {task_of['cli_task']}\n"
    row = await wait_for_status(db, job_id, "succeeded", timeout=10)
    assert row["provider_task_id"] == task_of["cli_task"]
    assert row["credits_charged"] == 10  # Replicate reports no cost: the reservation
    assert await db.fetchval("select count(*) from assets where job_id = $1", job_id) == 1
    await assert_money_balances(db)

    # the command line, as failed
    job_id = jobs["cli_failed"]
    done = longcall(migrated, "jobs", "resolve", job_id, "--failed")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{job_id}: failed (refunded)\n"
    row = await db.fetchrow("select * from jobs where id = $1", job_id)
    assert (row["status"], row["error_code"], row["credits_refunded"]) == ("failed", "resolved_failed", 10)
    await assert_money_balances(db)

    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN) as admin:
        job_id = jobs["admin_task"]
        r = await admin.post(f"/v1/admin/jobs/{job_id}/resolve",
                             json={"provider_task_id": task_of["admin_task"]})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "running"
        await wait_for_status(db, job_id, "succeeded", timeout=10)
        await assert_money_balances(db)

        job_id = jobs["admin_failed"]
        r = await admin.post(f"/v1/admin/jobs/{job_id}/resolve", json={"outcome": "failed"})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "failed" and r.json()["error"]["code"] == "resolved_failed"
        assert r.json()["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
        await assert_money_balances(db)

        # Two operators at once, one with the task id, one giving up: one wins.
        job_id = jobs["race"]
        answers = await asyncio.gather(*[
            admin.post(f"/v1/admin/jobs/{job_id}/resolve",
                       json={"provider_task_id": task_of["race"]} if i % 2 else {"outcome": "failed"})
            for i in range(10)])
        assert sorted(r.status_code for r in answers) == [200] + [409] * 9
        assert {r.json()["error"]["code"] for r in answers if r.status_code == 409} == {"invalid_state"}
        winner = next(r.json()["status"] for r in answers if r.status_code == 200)
        await wait_for_status(db, job_id, "succeeded" if winner == "running" else "failed", timeout=10)
        await assert_money_balances(db)

    # The KIE job was left alone, its timer lost: past its give-up deadline,
    # the sweep expires it with a refund.
    await db.execute("update jobs set deadline_at = now() - interval '1 second' where id = $1", kie)
    done = longcall(migrated, "sweep", "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "sweep: 0 submit and 0 settle intents queued for jobs that had none, 1 uncertain jobs expired",
        f"  expired: {kie}"]
    row = await db.fetchrow("select * from jobs where id = $1", kie)
    assert (row["status"], row["error_code"], row["credits_refunded"]) == ("expired", "give_up", 10)
    await assert_money_balances(db)
    assert await db.fetchval("select count(*) from jobs where status = 'uncertain'") == 0
    assert await db.fetchval("select active from owners where id = $1", owner.owner_id) == 0


async def test_resolve_refusals_change_nothing(web, make_settings, make_owner, sim, settlers, db, migrated):
    set_faults(sim.url, submit_timeout_after_create=1)
    env = provider_env(sim.url)
    server = await web(**env)
    no_admin = await web(**env, ADMIN_TOKEN="")
    await settlers(make_settings(**env), provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        uncertain = (await c.post("/v1/jobs", json=TWIN_REPLICATE_JOB)).json()["id"]
        cancelled = (await c.post("/v1/jobs", json=TWIN_REPLICATE_JOB)).json()["id"]
        for job_id in (uncertain, cancelled):
            await wait_for_status(db, job_id, "uncertain", timeout=15)
        assert (await c.post(f"/v1/jobs/{cancelled}/cancel")).status_code == 200
    # The provider cancel (no task id: nothing to do) drained; the uncertain
    # job's give-up timer is all that is left.
    await wait_until(lambda: _only_the_timer_of(db, uncertain))
    before = await snapshot(db)
    resolve = f"/v1/admin/jobs/{uncertain}/resolve"
    task = {"provider_task_id": "abc"}
    async with httpx.AsyncClient(base_url=no_admin.url) as anon:
        r = await anon.post(resolve, json=task, headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"  # no ADMIN_TOKEN: no route
        unknown = await anon.get("/no/such/route")
        for method in ("GET", "PUT", "DELETE"):  # not a 405 that would tell the route is there
            other = await anon.request(method, resolve, headers=ADMIN)
            assert (other.status_code, other.json()) == (404, unknown.json()) and "allow" not in other.headers
    async with httpx.AsyncClient(base_url=server.url) as anon:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "test-admin-token"},
                        {"Authorization": "Basic test-admin-token"}):
            r = await anon.post(resolve, json=task, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
            assert "test-admin-token" not in r.text
        cases = [
            (f"/v1/admin/jobs/{cancelled}/resolve", task, 409, "invalid_state"),
            (f"/v1/admin/jobs/{cancelled}/resolve", {"outcome": "failed"}, 409, "invalid_state"),
            ("/v1/admin/jobs/job_0123456789abcdef01234567/resolve", task, 404, "not_found"),
            ("/v1/admin/jobs/not-a-job/resolve", task, 404, "not_found"),
            (resolve, {}, 400, "invalid_request"),
            (resolve, {"provider_task_id": ""}, 400, "invalid_request"),
            (resolve, {"provider_task_id": "   "}, 400, "invalid_request"),
            (resolve, {"provider_task_id": 7}, 400, "invalid_request"),
            (resolve, {"outcome": "succeeded"}, 400, "invalid_request"),
            (resolve, {"provider_task_id": "abc", "outcome": "failed"}, 400, "invalid_request"),
        ]
        for path, body, status, code in cases:
            r = await anon.post(path, json=body, headers=ADMIN)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (path, body, r.text)
    refused = [
        ((cancelled, "--task-id", "abc"), f"longcall: only an uncertain job can be resolved; {cancelled} is "
                                           "cancelled\n"),
        ((cancelled, "--failed"), f"longcall: only an uncertain job can be resolved; {cancelled} is cancelled\n"),
        (("job_0123456789abcdef01234567", "--failed"), "longcall: no job job_0123456789abcdef01234567\n"),
        (("not-a-job", "--failed"), "longcall: not a job id: 'not-a-job'\n"),
    ]
    runs = await asyncio.gather(*[asyncio.to_thread(longcall, migrated, "jobs", "resolve", *args)
                                  for args, _ in refused],
                                asyncio.to_thread(longcall, migrated, "jobs", "resolve", uncertain))
    for done, (_, message) in zip(runs, refused, strict=False):  # runs has one more: the last
        assert (done.returncode, done.stdout, done.stderr) == (1, "", message)
    done = runs[-1]  # neither --task-id nor --failed
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert await snapshot(db) == before


async def _only_the_timer_of(pool, job_id: str) -> bool:
    rows = await pool.fetch("select job_id, kind, claimed_until from outbox")
    return [(r["job_id"], r["kind"], r["claimed_until"]) for r in rows] == [(job_id, "settle", None)]


async def test_lost_submit_answers_are_recovered_without_a_second_task(web, make_settings, make_owner, sim,
                                                                       settlers, db):
    """The simulator's submit is idempotent: asked again with the same key,
    it returns the task it made. Replicate's is not, but `find` recovers the
    prediction from the provider's list (created since our first attempt,
    same model, same input). One provider task each, and both jobs succeed."""
    set_faults(sim.url, submit_timeout_after_create=1)
    server = await web(**provider_env(sim.url))
    # STALE_AFTER_S: the simulator's webhook for the sim task fires before
    # its id is saved (unverifiable then, so refused and retried later);
    # the lost-webhook check closes it sooner than those retries.
    await settlers(make_settings(**provider_env(sim.url, PUBLIC_URL=server.url, STALE_AFTER_S=1)),
                   provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        sim_id = (await c.post("/v1/jobs", json={"provider": "sim", "model": "m", "input": {"duration_s": 0.2},
                                                 "max_credits": 10})).json()["id"]
        rep_id = (await c.post("/v1/jobs", json=replicate_job("found"))).json()["id"]
    sim_row = await wait_for_status(db, sim_id, "succeeded", timeout=15)
    rep_row = await wait_for_status(db, rep_id, "succeeded", timeout=15)
    seen = stats(sim.url)
    assert seen["tasks_created"] == 2
    assert seen["creates_by_idempotency_key"] == {sim_id: 1}
    callback = f"{server.url}/webhooks/replicate/{rep_id}"
    assert seen["creates_by_callback_url"][callback] == 1
    assert rep_row["provider_task_id"] == predictions_by_ref(sim.url)["found"]
    assert sim_row["submit_attempts"] >= 2 and rep_row["submit_attempts"] == 1
    await assert_money_balances(db)
