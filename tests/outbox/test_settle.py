"""End to end through the settler: real simulator, real PostgreSQL, real
HTTP, files storage."""
from __future__ import annotations

import hashlib

import httpx

from app.simulator.outputs import output_sha256
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.support.simulator import set_faults


def job(**input):
    return {"provider": "sim", "model": "image-fast", "input": {"duration_s": 0.2, **input}, "max_credits": 10}


async def test_job_succeeds_with_outputs_copied_and_charged(web, make_owner, db, sim, make_settings,
                                                            start_settler):
    settings = make_settings(SIM_URL=sim.url)
    server = await web(SIM_URL=sim.url)
    await start_settler(settings)
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
    server = await web(SIM_URL=sim.url)
    set_faults(sim.url, download_error=0.5)
    await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=1000, max_active=20)
    async with server.client(owner.api_key) as c:
        ids = [(await c.post("/v1/jobs", json=job(cost=2))).json()["id"] for _ in range(10)]
        for job_id in ids:
            await wait_for_status(db, job_id, ("succeeded", "failed"), timeout=60)
    assert await db.fetchval("select count(*) from ledger where kind = 'charge'") == \
        await db.fetchval("select count(*) from jobs where status = 'succeeded'")
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
