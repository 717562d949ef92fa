"""Replicate's own give-up, end to end: the settler sends `Cancel-After`
from the job's give-up deadline, Replicate (the simulator's protocol) stops
the prediction there, and the job expires `give_up`, refunded in full.
Real PostgreSQL, real HTTP, the real adapter, webhooks over loopback."""
from __future__ import annotations

import httpx

from app.vocabulary import JobError, JobStatus
from tests.outbox.conftest import assert_money_balances, wait_for_status

TOKEN = "r8_deadline_test_token"
# Long enough that a loaded machine's slow submit still leaves Replicate's
# 5 s minimum.
GIVE_UP_S = 12


async def test_a_prediction_stopped_at_the_give_up_deadline_expires_the_job_refunded(web, make_owner, db, sim,
                                                                                    make_settings, start_settler):
    env = {"SIM_URL": sim.url, "REPLICATE_BASE_URL": f"{sim.url}/replicate", "REPLICATE_API_TOKEN": TOKEN,
           "GIVE_UP_AFTER_S_REPLICATE": str(GIVE_UP_S)}
    server = await web(**env)
    public = {**env, "PUBLIC_URL": server.url}  # the simulator calls the web server back over loopback
    await start_settler(make_settings(**public))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        # 200 s of work, the first 20 s queued: the deadline comes before it starts.
        created = (await c.post("/v1/jobs", json={"provider": "replicate", "model": "acme/video",
                                                  "input": {"duration_s": 200}, "max_credits": 10})).json()
        row = await wait_for_status(db, created["id"], JobStatus.EXPIRED, timeout=GIVE_UP_S + 20)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert got["error"]["code"] == JobError.GIVE_UP
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    prediction = httpx.get(f"{sim.url}/replicate/v1/predictions/{row['provider_task_id']}",
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    # Replicate stopped it at the deadline it was given (whole seconds left
    # at submit: no later than ours), before it ever ran: not billed.
    assert prediction["status"] == "aborted" and prediction["started_at"] is None
    lifetime = (_time(prediction["deadline"]) - _time(prediction["created_at"])).total_seconds()
    assert 5 <= lifetime <= GIVE_UP_S
    await assert_money_balances(db)


def _time(value: str):
    from datetime import datetime
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
