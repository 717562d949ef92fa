"""End to end through the settler: real simulator, real PostgreSQL, real
HTTP, files storage."""
from __future__ import annotations

import hashlib
import os

import httpx

from app.simulator.outputs import output_sha256
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.support.simulator import clear_faults, set_faults


def job(**input):
    return {"provider": "sim", "model": "image-fast", "input": {"duration_s": 0.2, **input}, "max_credits": 10}


async def test_job_succeeds_with_outputs_copied_and_charged(web, make_owner, db, sim, make_settings,
                                                            start_settler):
    settings = make_settings(SIM_URL=sim.url)
    server = await web(SIM_URL=sim.url)
    settler = await start_settler(settings)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(outputs=2, output_bytes=5000, cost=3))).json()
        row = await wait_for_status(db, created["id"], "succeeded")
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        assert got["credits"] == {"reserved": 10, "charged": 3, "refunded": 7}
        assert [o["index"] for o in got["outputs"]] == [0, 1]
        for out in got["outputs"]:
            body = (await c.get(out["url"])).content
            assert len(body) == out["bytes"] == 5000
            assert hashlib.sha256(body).hexdigest() == out["sha256"] == \
                output_sha256(row["provider_task_id"], out["index"], 5000)
        # a read token fetches the outputs too, without the key
        async with httpx.AsyncClient(base_url=server.url) as anon:
            token_read = (await anon.get(got["status_url"])).json()
            assert (await anon.get(token_read["outputs"][0]["url"])).status_code == 200
            assert (await anon.get(got["outputs"][0]["url"])).status_code == 401
        acct = (await c.get("/v1/account")).json()
    assert acct["credits"] == {"balance": 97, "reserved": 0, "charged": 3} and acct["active"] == 0
    assert row["webhook_secret"] is None
    assert await db.fetchval("select count(*) from outbox") == 0
    assert os.listdir(settler.ctx.download_dir) == [], "each download was given to the storage"
    await assert_money_balances(db)


async def test_provider_failure_refunds_everything(web, make_owner, db, sim, make_settings, start_settler):
    server = await web(SIM_URL=sim.url)
    await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(outcome="failed"))).json()
        await wait_for_status(db, created["id"], "failed")
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert got["error"]["code"] == "provider_failed"
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    await assert_money_balances(db)


async def test_output_over_the_cap_fails_with_refund(web, make_owner, db, sim, make_settings, start_settler):
    server = await web(SIM_URL=sim.url)
    await start_settler(make_settings(SIM_URL=sim.url, MAX_OUTPUT_BYTES=1000))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(output_bytes=5000))).json()
        row = await wait_for_status(db, created["id"], "failed")
    assert row["error_code"] == "output_too_large" and row["credits_refunded"] == 10
    await assert_money_balances(db)


async def test_download_errors_then_success_charge_once(web, make_owner, db, sim, make_settings,
                                                        start_settler):
    # Every download fails until each job has failed a settle attempt; then
    # downloads work again and every job must succeed, charged exactly once.
    server = await web(SIM_URL=sim.url)
    set_faults(sim.url, download_error=1)
    settler = await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=1000, max_active=20)
    async with server.client(owner.api_key) as c:
        ids = [(await c.post("/v1/jobs", json=job(cost=2))).json()["id"] for _ in range(10)]
    for job_id in ids:
        await wait_for_failed_attempt(db, job_id)
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == 0
    clear_faults(sim.url)
    # Skip the backoff rather than wait it out; the retry itself is real.
    await db.execute("update outbox set not_before = now() where kind = 'settle'")
    await db.execute("select pg_notify('longcall_outbox', '')")
    for job_id in ids:
        row = await wait_for_status(db, job_id, ("succeeded", "failed"), timeout=60)
        assert row["status"] == "succeeded" and row["credits_charged"] == 2, row
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == 10
    assert os.listdir(settler.ctx.download_dir) == [], "neither a failed download nor a stored one is left"
    await assert_money_balances(db)


async def test_webhook_closes_the_job_before_any_timer(web, make_owner, db, sim, make_settings,
                                                       start_settler):
    # PUBLIC_URL is the web server itself: the simulator calls back over loopback.
    server = await web(SIM_URL=sim.url)
    public = server.url
    settings = make_settings(SIM_URL=sim.url, PUBLIC_URL=public)
    server2 = await web(SIM_URL=sim.url, PUBLIC_URL=public)
    await start_settler(settings)
    owner = await make_owner(credits=100)
    async with server2.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job())).json()
        row = await wait_for_status(db, created["id"], "succeeded", timeout=10)
    # the first timer was the lost-webhook check (30 s): only the webhook can have closed it this fast
    assert row["callback_registered"] is True
    assert (row["finished_at"] - row["created_at"]).total_seconds() < 10


async def _exhaust_next_attempt(db, job_id: str) -> None:
    """Jump the job's settle intent to its last attempt (instead of waiting
    through minutes of backoff), and make it due."""
    from outbox.policy import MAX_ATTEMPTS
    await db.execute("update outbox set attempts = $2, not_before = now() where job_id = $1 and kind = 'settle'",
                     job_id, MAX_ATTEMPTS["settle"])
    await db.execute("select pg_notify('longcall_outbox', '')")


async def wait_for_failed_attempt(db, job_id: str, timeout: float = 20.0) -> None:
    import asyncio
    import time
    deadline = time.monotonic() + timeout
    while not await db.fetchval("select attempts >= 1 and claimed_until is null from outbox "
                                "where job_id = $1 and kind = 'settle'", job_id):
        assert time.monotonic() < deadline, "no failed settle attempt"
        await asyncio.sleep(0.05)


async def test_download_failures_to_the_cap_fail_the_job_with_a_refund(web, make_owner, db, sim, make_settings,
                                                                       start_settler):
    server = await web(SIM_URL=sim.url)
    set_faults(sim.url, download_error=1)
    settler = await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job())).json()
    await wait_for_failed_attempt(db, created["id"])
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == "running" and row["credits_charged"] == 0  # a failed download moves no money
    # The check that found the task succeeded has its line, though no close carried it.
    checked = await db.fetch("select detail from job_events where job_id = $1 and type = 'status_checked'",
                             created["id"])
    assert [r["detail"]["state"] for r in checked] == ["succeeded"]
    await _exhaust_next_attempt(db, created["id"])
    row = await wait_for_status(db, created["id"], "failed")
    assert row["error_code"] == "settle_exhausted" and row["credits_refunded"] == 10
    assert await db.fetchval("select count(*) from assets") == 0
    assert os.listdir(settler.ctx.download_dir) == [], "no failed download is left behind"
    await assert_money_balances(db)


async def test_an_expired_output_url_fails_output_expired_at_once_refunded(web, make_owner, db, sim, make_settings,
                                                                           start_settler):
    """CONTRACT.md: a success whose output download answers 404 or 410 is
    not a success: `output_expired` at once (no retries), fully refunded."""
    server = await web(SIM_URL=sim.url)
    await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job(output_ttl_s=0.001))).json()
    row = await wait_for_status(db, created["id"], "failed")
    assert row["error_code"] == "output_expired"
    assert "404" in row["error_message"], row["error_message"]  # the expired URL's answer, kept for operators
    assert row["credits_refunded"] == row["credits_reserved"] and row["credits_charged"] == 0
    assert await db.fetchval("select count(*) from assets where job_id = $1", created["id"]) == 0
    # The closing check's line, written by the close, comes just before its `closed` line.
    lines = await db.fetch("select type, detail from job_events where job_id = $1 order by id", created["id"])
    assert [r["type"] for r in lines][-2:] == ["status_checked", "closed"]
    assert lines[-2]["detail"]["state"] == "succeeded"
    await assert_money_balances(db)


async def test_cancel_races_the_settle_step(web, make_owner, db, sim, make_settings):
    """Owners cancel at the moment their jobs finish: each job ends either
    cancelled (fully refunded) or succeeded (charged) — never both, never
    half."""
    import asyncio

    from outbox.context import Context
    from outbox.settle import settle

    settings = make_settings(SIM_URL=sim.url)
    server = await web(SIM_URL=sim.url)
    owner = await make_owner(credits=1000, max_active=50)
    ctx = await Context.open(settings, provider_timeout_s=5)
    try:
        from outbox.submit import submit
        async with server.client(owner.api_key) as c:
            ids = [(await c.post("/v1/jobs", json=job(duration_s=0.05, cost=7))).json()["id"] for _ in range(20)]
            for job_id in ids:
                await submit(ctx, job_id, 1)
            await asyncio.sleep(0.3)
            results = await asyncio.gather(*[
                coro for job_id in ids
                for coro in (c.post(f"/v1/jobs/{job_id}/cancel"), settle(ctx, job_id, 1))])
    finally:
        await ctx.close()
    cancels = results[0::2]
    assert all(r.status_code in (200, 409) for r in cancels)
    rows = await db.fetch("select * from jobs")
    assert {r["status"] for r in rows} <= {"succeeded", "cancelled"}
    for r, cancel in zip(sorted(rows, key=lambda r: ids.index(r["id"])), cancels, strict=True):
        assert (cancel.status_code == 200) == (r["status"] == "cancelled")
        if r["status"] == "succeeded":
            assert (r["credits_charged"], r["credits_refunded"]) == (7, 3)
        else:
            assert (r["credits_charged"], r["credits_refunded"]) == (0, 10)
    ledger = await db.fetch("select job_id, kind, count(*) from ledger group by 1, 2 having count(*) > 1")
    assert ledger == []
    await assert_money_balances(db)


async def _intent(db, job_id: str, kind: str):
    return await db.fetchrow("select attempts, claimed_until, not_before from outbox where job_id = $1 and kind = $2",
                             job_id, kind)


async def _pull_due(db, job_id: str, kind: str, attempts: int | None = None) -> None:
    await db.execute("update outbox set not_before = now(), attempts = coalesce($3, attempts) "
                     "where job_id = $1 and kind = $2", job_id, kind, attempts)
    await db.execute("select pg_notify('longcall_outbox', '')")


async def _until(predicate, what: str, timeout: float = 20.0) -> None:
    import asyncio
    import time
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_status_endpoint_down_past_the_attempt_cap_fails_no_job(web, make_owner, db, sim, make_settings,
                                                                       start_settler):
    """The provider's status reads fail (500) while its task runs: each is
    waited out counting no failed attempt, so the job is still running at
    what was its last attempt (before, 10 reads in about 8 minutes failed
    it `settle_exhausted`, refunded, while the provider ran and billed the
    task), and succeeds once the provider answers again."""
    from outbox.policy import MAX_ATTEMPTS
    server = await web(SIM_URL=sim.url)
    await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    set_faults(sim.url, status_error=1)  # before the job: no read of it can work until cleared
    try:
        async with server.client(owner.api_key) as c:
            created = (await c.post("/v1/jobs", json=job())).json()
        job_id = created["id"]
        await wait_for_status(db, job_id, "running")
        await _pull_due(db, job_id, "settle", attempts=MAX_ATTEMPTS["settle"] - 1)  # its last counted attempt

        async def read_failed_and_waited():
            intent = await _intent(db, job_id, "settle")
            last_error = await db.fetchval("select last_error from jobs where id = $1", job_id)
            return intent is not None and intent["claimed_until"] is None and intent["attempts"] == 0 \
                and (last_error or "").startswith("settle: status:")

        await _until(read_failed_and_waited, "the failed read was not waited out without counting")
        await _pull_due(db, job_id, "settle", attempts=MAX_ATTEMPTS["settle"] - 1)
        await _until(read_failed_and_waited, "a second failed read counted")
        assert await db.fetchval("select status from jobs where id = $1", job_id) == "running"
    finally:
        clear_faults(sim.url)
    await _pull_due(db, job_id, "settle")
    await wait_for_status(db, job_id, "succeeded")
    await assert_money_balances(db)


async def test_an_exhausted_submit_whose_last_call_had_no_answer_makes_the_job_uncertain(
        make_owner, db, sim, make_settings, start_settler):
    """Its task may exist (the sim's submit is idempotent: timeouts are
    asked again with the same key, until the cap): uncertain, its hold and
    identity kept for its webhook or an operator, not failed and refunded
    while the provider may run the task."""
    from app.domain import jobs
    from outbox.policy import MAX_ATTEMPTS
    owner = await make_owner(credits=100)
    created = await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim", model="m",
                                    input={}, max_credits=10, give_up_after_s=3600)
    async with db.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)  # a call went out; no answer was saved
    await _pull_due(db, created.job_id, "submit", attempts=MAX_ATTEMPTS["submit"])
    await start_settler(make_settings(SIM_URL=sim.url))
    row = await wait_for_status(db, created.job_id, ("uncertain", "failed"))
    assert row["status"] == "uncertain", row["error_message"]
    assert (row["credits_reserved"], row["credits_refunded"]) == (10, 0)
    timer = await _intent(db, created.job_id, "settle")
    assert timer is not None and (timer["not_before"] - row["deadline_at"]).total_seconds() > -5
    assert await _intent(db, created.job_id, "submit") is None
    await assert_money_balances(db)


async def test_an_exhausted_settle_of_an_uncertain_job_keeps_it_uncertain(make_owner, db, sim, make_settings,
                                                                         start_settler):
    """An uncertain job keeps its hold until it is resolved or expires
    (CONTRACT): its settle intent, failed to the cap (a claimed task's
    confirm failing, say), waits for the deadline again."""
    from app.domain import jobs
    from outbox.policy import MAX_ATTEMPTS
    owner = await make_owner(credits=100)
    created = await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim", model="m",
                                    input={}, max_credits=10, give_up_after_s=3600)
    async with db.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)
        assert await jobs.mark_uncertain(conn, created.job_id, "not found")
        await conn.execute("insert into outbox (job_id, kind, attempts) values ($1, 'settle', $2)",
                           created.job_id, MAX_ATTEMPTS["settle"])
    await start_settler(make_settings(SIM_URL=sim.url))

    deadline_at = await db.fetchval("select deadline_at from jobs where id = $1", created.job_id)

    async def waits_for_the_deadline():
        intent = await _intent(db, created.job_id, "settle")
        return intent is not None and intent["attempts"] == 0 \
            and (intent["not_before"] - deadline_at).total_seconds() > -5

    await _until(waits_for_the_deadline, "the exhausted intent did not go back to the give-up timer")
    row = await db.fetchrow("select * from jobs where id = $1", created.job_id)
    assert (row["status"], row["credits_refunded"]) == ("uncertain", 0)
    await assert_money_balances(db)
