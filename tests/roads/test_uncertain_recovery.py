"""An `uncertain` job is recovered by its own webhook (DESIGN.md, "Grounded
in the real providers"; issue #11).

A submit whose answer is lost (the simulator's `submit_timeout_after_create`
creates the task, then drops the answer) leaves a job whose task cannot be
looked up `uncertain`. Its callback URL names the job and carries our
capability token, so a delivery to it that passes both the provider's scheme
and ours names the task: the settle step asks the provider, with our own
credentials, whether that task is this job's, and only then adopts it; the
job then settles as usual. A task the provider denies changes nothing.

Real PostgreSQL, the web app and a settler over real HTTP, the real
simulator. Replicate can look a lost task up by its callback URL; its
look-up is made to find nothing here (as when the task is further back than
the pages it reads), so that its job becomes uncertain too. The native `sim`
protocol never leaves a job uncertain (its submit is idempotent: it is
simply asked again), and its deliveries are signed with the per-task secret
only the lost answer carried, so it has no case here.
"""
from __future__ import annotations

import time

import httpx
import pytest

from app.providers.base import WebhookRequest
from app.providers.fal import FalProvider
from app.providers.kie import KieProvider
from app.providers.replicate import ReplicateProvider
from app.providers.sim import SimProvider
from app.signing.webhooks import sign_standard_webhooks
from tests.roads.conftest import (
    assert_money_balances,
    hook_path,
    provider_env,
    snapshot,
    wait_for_status,
    wait_until,
)
from tests.support.simulator import clear_faults, set_faults, stats

MODELS = {"replicate": "acme/painter", "fal": "fal-ai/flux/dev", "kie": "kie-image"}
REPLICATE_AUTH = {"Authorization": "Bearer r8_roads_test_token"}
JSON = {"content-type": "application/json"}


@pytest.fixture
def replicate_finds_nothing(monkeypatch):
    """Replicate's look-up by callback URL finds nothing, so an in-doubt
    Replicate submit ends `uncertain` as fal's and KIE's do."""
    async def nothing(self, request):
        return None

    async def no_candidates(self, request):
        return ()

    monkeypatch.setattr(ReplicateProvider, "find", nothing)
    monkeypatch.setattr(ReplicateProvider, "find_candidates", no_candidates, raising=False)


async def _start(web, make_settings, sim, settlers):
    env = provider_env(sim.url)
    server = await web(**env)
    settings = make_settings(**provider_env(sim.url, PUBLIC_URL=server.url))
    # The simulator holds a lost answer for 60 s: the settler gives up after 1 s.
    await settlers(settings, provider_timeout_s=1.0)
    return server, settings


async def _create(server, owner, provider: str, **input) -> str:
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json={"provider": provider, "model": MODELS[provider],
                                           "input": input, "max_credits": 10})
        assert r.status_code == 202, r.text
    return r.json()["id"]


async def _created_at_sim(sim_url: str, n: int) -> bool:
    return stats(sim_url)["tasks_created"] >= n


async def _waits_for_its_deadline(db, job_id: str) -> bool:
    """The uncertain job's one intent is its give-up timer: a settle, not
    claimed, due at its deadline (within a few seconds: the settler's clock
    sets it, the database's the deadline)."""
    rows = await db.fetch("select o.kind, o.claimed_until, abs(extract(epoch from j.deadline_at - o.not_before)) as off"
                          " from outbox o join jobs j on j.id = o.job_id where o.job_id = $1", job_id)
    return (len(rows) == 1 and rows[0]["kind"] == "settle" and rows[0]["claimed_until"] is None
            and rows[0]["off"] < 5)


async def _claim_settled(db, job_id: str) -> bool:
    """The receiver's claim has been taken up by the settle step (adopted or
    dropped), and the job is back to waiting for its deadline."""
    claimed = await db.fetchval("select claimed_task_id from jobs where id = $1", job_id)
    return claimed is None and await _waits_for_its_deadline(db, job_id)


def _but_the_outbox(snap: dict) -> dict:
    """A snapshot without the outbox: the settle a delivery asks for moves
    the job's timer row (its generation, attempts, due time) and puts it back."""
    return {table: rows for table, rows in snap.items() if table != "outbox"}


async def _no_intents_but(db, job_id: str) -> bool:
    return await db.fetchval("select count(*) from outbox where job_id <> $1", job_id) == 0


async def _assert_closed_once(db, job_id: str, sim_url: str, callback_base: str) -> dict:
    row = await wait_for_status(db, job_id, ("succeeded", "failed", "expired"), timeout=30)
    assert row["status"] == "succeeded", row["last_error"]
    assert row["provider_task_id"] and row["claimed_task_id"] is None
    # One task at the provider for this job, created once, never again blindly.
    seen = stats(sim_url)
    assert seen["tasks_created"] == 1 and seen["creates_by_callback_url"] == {callback_base: 1}
    # Charged once: no cost is reported by these protocols, so the reservation.
    assert (row["credits_charged"], row["credits_refunded"]) == (10, 0)
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", job_id) == 1
    assert await db.fetchval("select count(*) from assets where job_id = $1", job_id) == 1
    await assert_money_balances(db)
    return row


@pytest.mark.parametrize("provider", ["fal", "kie", "replicate"])
async def test_an_in_doubt_submit_is_recovered_by_the_tasks_own_webhook(
        provider, web, make_settings, make_owner, sim, settlers, db, replicate_finds_nothing):
    """The simulator's own signed delivery, whenever it comes: after the job
    turned uncertain, or while the submit was still waiting for its answer
    (then the claim waits for the job to turn uncertain). Either way: one
    task, the job succeeds, charged once."""
    set_faults(sim.url, submit_timeout_after_create=1)
    server, settings = await _start(web, make_settings, sim, settlers)
    job_id = await _create(server, await make_owner(credits=100), provider, duration_s=3)
    await wait_until(lambda: _created_at_sim(sim.url, 1), timeout=15)
    clear_faults(sim.url)  # the one create is made; nothing else is faulted
    callback_base = f"{server.url}/webhooks/{provider}/{job_id}"
    row = await _assert_closed_once(db, job_id, sim.url, callback_base)
    assert row["submit_attempts"] >= 1 and row["callback_registered"]


async def test_replicate_uncertain_job_recovered_by_a_signed_delivery(
        web, make_settings, make_owner, sim, settlers, db, replicate_finds_nothing):
    """Step by step, with the deliveries ours to send (the simulator's
    dropped): the job is uncertain first; a delivery without our token, or
    with another job's, is a 401 however well Replicate signed it; one that
    names a prediction Replicate does not know changes nothing; the
    prediction's own delivery recovers the job."""
    set_faults(sim.url, submit_timeout_after_create=1, drop_webhook=1)
    server, settings = await _start(web, make_settings, sim, settlers)
    job_id = await _create(server, await make_owner(credits=100), "replicate", duration_s=0.2)
    uncertain = await wait_for_status(db, job_id, "uncertain", timeout=30)
    assert uncertain["provider_task_id"] is None and uncertain["credits_reserved"] == 10
    clear_faults(sim.url)
    await wait_until(lambda: _waits_for_its_deadline(db, job_id))
    callback_base = f"{server.url}/webhooks/replicate/{job_id}"
    page = httpx.get(f"{sim.url}/replicate/v1/predictions", headers=REPLICATE_AUTH, trust_env=False).json()
    [prediction] = page["results"]  # the one this job's submit made
    secret = httpx.get(f"{sim.url}/replicate/v1/webhooks/default/secret", headers=REPLICATE_AUTH,
                       trust_env=False).json()["key"]

    def signed(body: bytes) -> dict:
        t = int(time.time())
        return {**JSON, "webhook-id": "msg_1", "webhook-timestamp": str(t),
                "webhook-signature": sign_standard_webhooks(secret, "msg_1", t, body)}

    ours = hook_path(settings, "replicate", job_id)
    another_jobs = hook_path(settings, "replicate", "job_" + "0" * 24).partition("?")[2]
    body = httpx.get(prediction["urls"]["get"], headers=REPLICATE_AUTH, trust_env=False).content
    before = await snapshot(db)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        refused = [
            await anon.post(f"/webhooks/replicate/{job_id}", content=body, headers=signed(body)),
            await anon.post(f"/webhooks/replicate/{job_id}?{another_jobs}", content=body, headers=signed(body)),
            await anon.post(ours, content=body, headers=JSON),  # our token, no signature
        ]
        assert [r.status_code for r in refused] == [401] * 3
        assert await snapshot(db) == before

        # Genuine, but naming a prediction Replicate does not know.
        stranger = body.replace(prediction["id"].encode(), b"qzqzqzqzqzqzqzqzqzqzqzqzqz")
        assert (await anon.post(ours, content=stranger, headers=signed(stranger))).status_code == 204
        await wait_until(lambda: _claim_settled(db, job_id))
        # still uncertain, the hold and the slot kept, its give-up timer too
        assert _but_the_outbox(await snapshot(db)) == _but_the_outbox(before)

        # The prediction's own delivery.
        assert (await anon.post(ours, content=body, headers=signed(body))).status_code == 204
    row = await _assert_closed_once(db, job_id, sim.url, callback_base)
    assert row["provider_task_id"] == prediction["id"]


async def test_kie_a_task_kie_denies_or_made_for_another_job_changes_nothing(
        web, make_settings, make_owner, sim, settlers, db):
    """KIE signs no body: the token is its scheme, and a delivery carrying it
    may name any task id. recordInfo, asked with our key, must know the task
    and echo this job's callback URL: a made-up id, or another job's task,
    is dropped and the job stays uncertain with its hold."""
    set_faults(sim.url, submit_timeout_after_create=1)
    server, settings = await _start(web, make_settings, sim, settlers)
    owner = await make_owner(credits=100)
    first = await _create(server, owner, "kie", duration_s=2)  # recovered by its own webhook
    await wait_until(lambda: _created_at_sim(sim.url, 1), timeout=15)
    set_faults(sim.url, submit_timeout_after_create=1, drop_webhook=1)
    second = await _create(server, owner, "kie", duration_s=0.2)  # no webhook of its own will come
    await wait_until(lambda: _created_at_sim(sim.url, 2), timeout=15)
    clear_faults(sim.url)
    recovered = await wait_for_status(db, first, "succeeded", timeout=30)
    await wait_for_status(db, second, "uncertain", timeout=30)
    await wait_until(lambda: _waits_for_its_deadline(db, second))
    await wait_until(lambda: _no_intents_but(db, second))

    before = await snapshot(db)
    ours = hook_path(settings, "kie", second)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        for task_id in ("task_0000000000000000000000000000dead", recovered["provider_task_id"]):
            body = b'{"code": 200, "msg": "success", "data": {"taskId": "%s", "state": "success"}}' % (
                task_id.encode())
            assert (await anon.post(ours, content=body, headers=JSON)).status_code == 204
            await wait_until(lambda: _claim_settled(db, second))
            assert _but_the_outbox(await snapshot(db)) == _but_the_outbox(before)
    row = await db.fetchrow("select * from jobs where id = $1", second)
    assert row["status"] == "uncertain" and row["provider_task_id"] is None
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 0)
    await assert_money_balances(db)


async def test_no_claim_is_taken_from_a_delivery_to_a_running_job(web, make_settings, make_owner, sim, settlers,
                                                                  db):
    """A job with its task saved never takes a task id from a body: a
    delivery naming another task only asks for a settle of the saved one."""
    set_faults(sim.url, drop_webhook=1)
    server, settings = await _start(web, make_settings, sim, settlers)
    job_id = await _create(server, await make_owner(credits=100), "kie", duration_s=600)
    row = await wait_for_status(db, job_id, "running", timeout=15)
    body = b'{"code": 200, "data": {"taskId": "task_someone_elses"}}'
    async with httpx.AsyncClient(base_url=server.url) as anon:
        assert (await anon.post(hook_path(settings, "kie", job_id), content=body, headers=JSON)).status_code == 204
    after = await db.fetchrow("select * from jobs where id = $1", job_id)
    assert after["claimed_task_id"] is None and after["provider_task_id"] == row["provider_task_id"]


# --- which task a verified delivery names (pure) ------------------------------------------

ADAPTERS = {
    "sim": SimProvider("http://127.0.0.1:9"),
    "replicate": ReplicateProvider("http://127.0.0.1:9/replicate", "r8_x"),
    "fal": FalProvider("http://127.0.0.1:9/fal", "k", jwks_url="http://127.0.0.1:9/jwks"),
    "kie": KieProvider("http://127.0.0.1:9/kie", "k", secret_keys=(b"0123456789abcdef",)),
}
FAL_ID = {"x-fal-webhook-request-id": "5c1a63a1-4f6f-4b7e-9e44-0d3b3c8f2a11"}
WEBHOOK_TASK_IDS = [
    ("sim", {}, b'{"id": "sim_1", "status": "succeeded"}', "sim_1"),
    ("replicate", {}, b'{"id": "ufawqhfynnddngldkgtslldrkq", "status": "succeeded"}',
     "ufawqhfynnddngldkgtslldrkq"),
    ("replicate", {}, b'{"status": "succeeded"}', None),
    ("replicate", {}, b'{"id": 7}', None),
    ("replicate", {}, b'{"id": "has space"}', None),
    ("replicate", {}, b'{"id": "' + b"a" * 201 + b'"}', None),
    ("replicate", {}, b"not json", None),
    ("replicate", {}, b'["id"]', None),
    # fal: the signed header, not the body
    ("fal", FAL_ID, b'{"request_id": "other"}', FAL_ID["x-fal-webhook-request-id"]),
    ("fal", {}, b'{"request_id": "5c1a63a1"}', None),
    ("fal", {"x-fal-webhook-request-id": "../etc"}, b"{}", None),
    # KIE: a recordInfo-shaped callback, or taskId at the top level
    ("kie", {}, b'{"code": 200, "data": {"taskId": "task_1", "state": "success"}}', "task_1"),
    ("kie", {}, b'{"code": 200, "taskId": "task_2"}', "task_2"),
    ("kie", {}, b'{"code": 200, "data": {"state": "success"}}', None),
    ("kie", {}, b'{"code": 200, "data": "task_3"}', None),
]


@pytest.mark.parametrize("provider,headers,body,expected", WEBHOOK_TASK_IDS)
def test_the_task_a_delivery_names(provider, headers, body, expected):
    hook = WebhookRequest(job_id="job_" + "0" * 24, headers=headers, query={}, raw_body=body)
    assert ADAPTERS[provider].webhook_task_id(hook) == expected


async def test_an_uncertain_job_expires_at_its_deadline_by_its_own_timer(web, make_settings, make_owner, sim,
                                                                         settlers, db):
    """No sweep runs here (the settlers of these tests have none): the give-up
    deadline is the uncertain job's own durable timer, written when it turned
    uncertain. Expired with a full refund, its slot freed, on time. Nothing
    waits on the uncertain state itself (a loaded machine may pass through it
    quickly): the close's message says the job was uncertain when it expired."""
    set_faults(sim.url, submit_timeout_after_create=1, drop_webhook=1)
    env = provider_env(sim.url, GIVE_UP_AFTER_S_KIE=8)
    server = await web(**env)
    await settlers(make_settings(**provider_env(sim.url, PUBLIC_URL=server.url, GIVE_UP_AFTER_S_KIE=8)),
                   provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    job_id = await _create(server, owner, "kie", duration_s=0.2)
    row = await wait_for_status(db, job_id, "expired", timeout=40)
    assert row["error_code"] == "give_up" and row["error_message"] == "gave up on an uncertain submit"
    assert row["finished_at"] >= row["deadline_at"]
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    assert await db.fetchval("select active from owners where id = $1", owner.owner_id) == 0
    await assert_money_balances(db)
