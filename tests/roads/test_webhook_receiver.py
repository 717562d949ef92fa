"""Road 1: `POST /webhooks/{provider}/{job_id}` against hostile senders.

Real PostgreSQL, the web app over real HTTP, jobs made running by a real
settler against the real simulator (its own webhooks dropped, so every
webhook here is one the test sends). Every refused request must answer the
one uniform 401 (or 413 / 404) and change no row at all.
"""
from __future__ import annotations

import asyncio
import base64
import math
import os
import secrets
import time
from dataclasses import dataclass

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.config import load_settings
from app.domain import owners
from app.signing.tokens import make_capability_token
from app.signing.webhooks import sign_fal, sign_standard_webhooks
from app.web.body import MAX_BODY
from outbox.context import Context
from outbox.settler import Settler
from tests.conftest import TABLES, serve_app
from tests.roads.conftest import (
    assert_money_balances,
    hook_path,
    job_secret,
    provider_env,
    sim_job,
    sim_task,
    snapshot,
    tv1_headers,
    wait_for_status,
    wait_until,
)
from tests.support.simulator import clear_faults, reset, set_faults, stats

UNAUTHORIZED = {"error": {"code": "unauthenticated", "message": "webhook not accepted"}}
BODY = b'{"id": "sim_claimed", "status": "succeeded", "outputs": [], "cost": 0, "error": null}'


def unknown_job_id() -> str:
    return "job_" + secrets.token_hex(12)


@dataclass
class World:
    url: str
    pool: object
    running: str  # a running sim job
    other: str  # another running sim job
    closed: str  # a job closed (cancelled) after it ran: its secret is erased
    secrets: dict  # job id -> its webhook secret (the closed job's as it was)
    reference_401: bytes  # what an unknown job with no signature gets
    settings: object  # the settler's: its callback URLs carry our capability tokens

    def path(self, job_id: str, provider: str = "sim") -> str:
        return hook_path(self.settings, provider, job_id)


@pytest.fixture(scope="module")
async def world(pool, migrated, sim_server, tmp_path_factory) -> World:
    """Shared by the module's first tests (built once: setting it up costs
    more than they do): a web server, two running sim jobs and one closed
    after it ran. The settler that made them is stopped before any test, so
    nothing moves while a test compares snapshots. Tests that use the `db`
    fixture (which truncates) come after these in this file."""
    from app.web import create_app

    await pool.execute(f"truncate {TABLES} restart identity cascade")
    reset(sim_server.url)
    set_faults(sim_server.url, drop_webhook=1)  # the simulator never calls back by itself
    env = {"DATABASE_URL": migrated, "SECRET_KEY": "test-secret-key-0123456789",
           "STORAGE_URL": f"file://{tmp_path_factory.mktemp('objects')}", **provider_env(sim_server.url)}
    server, server_task, url = await serve_app(create_app(load_settings(env)))
    settings = load_settings({**env, "PUBLIC_URL": url})
    ctx = await Context.open(settings, provider_timeout_s=2.0)
    settler = Settler(ctx, 8, sweep_interval_s=0)
    settler_task = asyncio.create_task(settler.run())
    try:
        async with pool.acquire() as conn:
            owner = await owners.create_owner(conn, "roads", 100, 10)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {owner.api_key}"}) as c:
            ids = [(await c.post("/v1/jobs", json=sim_job(duration_s=600))).json()["id"] for _ in range(3)]
            rows = [await wait_for_status(pool, job_id, "running") for job_id in ids]
            for job_id in ids:  # their submit intents are deleted just after (see _running_job)
                await wait_until(lambda job_id=job_id: _no_intent(pool, job_id, "submit"), timeout=30)
            keys = {r["id"]: job_secret(settings, r) for r in rows}
            running, other, closed = ids
            assert (await c.post(f"/v1/jobs/{closed}/cancel")).status_code == 200
        await wait_until(lambda: _no_intent(pool, closed, "cancel"))  # the provider cancel went out
        settler.stop()
        await asyncio.wait_for(settler_task, 30)
        assert await pool.fetchval("select webhook_secret from jobs where id = $1", closed) is None
        async with httpx.AsyncClient(base_url=url) as anon:
            ref = await anon.post(f"/webhooks/sim/{unknown_job_id()}", content=BODY)
        assert ref.status_code == 401 and ref.json() == UNAUTHORIZED
        yield World(url, pool, running, other, closed, keys, ref.content, settings)
    finally:
        settler.stop()
        await asyncio.wait_for(settler_task, 30)
        await ctx.close()
        server.should_exit = True
        await server_task
        clear_faults(sim_server.url)


async def _no_intent(pool, job_id: str, kind: str) -> bool:
    return await pool.fetchval("select count(*) from outbox where job_id = $1 and kind = $2",
                               job_id, kind) == 0


def _flip(text: str, index: int) -> str:
    """Change one character of a hex string (still hex)."""
    c = text[index]
    return text[:index] + ("0" if c != "0" else "1") + text[index + 1:]


def _hmac_hex(secret: str, body: bytes, t: int) -> str:
    return tv1_headers(secret, body, t)["x-signature"].split("v1=")[1]


# Each case: world -> (job id to post to, raw body, headers). All on the sim
# (t/v1) scheme unless the path says otherwise.
def forged(w):
    return w.running, BODY, tv1_headers("a-secret-we-made-up", BODY)


def body_byte_changed(w):
    headers = tv1_headers(w.secrets[w.running], BODY)
    tampered = bytearray(BODY)
    tampered[BODY.index(b"succeeded")] ^= 0x01
    return w.running, bytes(tampered), headers


def signature_byte_changed(w):
    t = int(time.time())
    sig = _hmac_hex(w.secrets[w.running], BODY, t)
    return w.running, BODY, {"x-signature": f"t={t},v1={_flip(sig, 17)}"}


def stale_301s(w):
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY, int(time.time()) - 301)


def future_360s(w):
    # Far enough ahead that no delay before the receiver reads its clock brings
    # it inside the window (the exact edge is tested in tests/signing).
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY, math.ceil(time.time()) + 360)


def missing_header(w):
    return w.running, BODY, {"content-type": "application/json"}


def non_numeric_t(w):
    t = int(time.time())
    return w.running, BODY, {"x-signature": f"t=abc,v1={_hmac_hex(w.secrets[w.running], BODY, t)}"}


def signed_numeric_t(w):
    # "+1712345678" is what int() accepts; the scheme's timestamp is digits only.
    t = int(time.time())
    sig = tv1_headers(w.secrets[w.running], BODY, t)["x-signature"].split("v1=")[1]
    return w.running, BODY, {"x-signature": f"t=+{t},v1={sig}"}


def no_v1(w):
    return w.running, BODY, {"x-signature": f"t={int(time.time())}"}


def only_v2_downgrade(w):
    # A valid HMAC offered under a version we do not know: never counts.
    t = int(time.time())
    return w.running, BODY, {"x-signature": f"t={t},v2={_hmac_hex(w.secrets[w.running], BODY, t)}"}


def non_hex(w):
    return w.running, BODY, {"x-signature": f"t={int(time.time())},v1={'zz' * 32}"}


def empty_header(w):
    return w.running, BODY, {"x-signature": ""}


def two_timestamps(w):
    # An old, validly signed t and a fresh one: ambiguous, refused.
    old = int(time.time()) - 3600
    sig = _hmac_hex(w.secrets[w.running], BODY, old)
    return w.running, BODY, {"x-signature": f"t={old},t={int(time.time())},v1={sig}"}


def another_jobs_signature(w):
    return w.running, BODY, tv1_headers(w.secrets[w.other], BODY)


def valid_signature_unknown_job(w):
    return unknown_job_id(), BODY, tv1_headers(w.secrets[w.running], BODY)


def closed_job(w):
    return w.closed, BODY, tv1_headers(w.secrets[w.closed], BODY)


# Correctly signed by the provider, but without our capability token (or
# with one that is not this job's): the URL did not come from us.
def signed_without_our_token(w):
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY), f"/webhooks/sim/{w.running}"


def signed_with_an_empty_token(w):
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY), f"/webhooks/sim/{w.running}?token="


def signed_with_another_jobs_token(w):
    other = w.path(w.other).partition("?")[2]
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY), f"/webhooks/sim/{w.running}?{other}"


def signed_with_another_providers_token(w):
    kie = w.path(w.running, "kie").partition("?")[2]
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY), f"/webhooks/sim/{w.running}?{kie}"


def signed_with_another_servers_token(w):
    token = make_capability_token("sim", w.running, b"another-server-secret-key")
    return w.running, BODY, tv1_headers(w.secrets[w.running], BODY), f"/webhooks/sim/{w.running}?token={token}"


HOSTILE = [forged, body_byte_changed, signature_byte_changed, stale_301s, future_360s, missing_header,
           non_numeric_t, signed_numeric_t, no_v1, only_v2_downgrade, non_hex, empty_header,
           two_timestamps, another_jobs_signature, valid_signature_unknown_job, closed_job,
           signed_without_our_token, signed_with_an_empty_token, signed_with_another_jobs_token,
           signed_with_another_providers_token, signed_with_another_servers_token]


@pytest.mark.parametrize("case", HOSTILE, ids=[c.__name__ for c in HOSTILE])
async def test_hostile_sim_webhook_is_401_and_changes_nothing(world, case):
    job_id, body, headers, *path = case(world)
    before = await snapshot(world.pool)
    async with httpx.AsyncClient(base_url=world.url) as anon:
        # with our token for that job, unless the case says where to post
        r = await anon.post(path[0] if path else world.path(job_id), content=body, headers=headers)
    assert r.status_code == 401
    assert r.content == world.reference_401  # one uniform answer, whatever went wrong
    assert await snapshot(world.pool) == before


async def test_a_genuine_sim_webhook_is_accepted_and_only_asks_for_a_settle(world):
    """The control for the cases above: the same request, correctly signed,
    is a 204 whose only effect is a settle request coalesced into the job's
    open settle intent."""
    before = await snapshot(world.pool)
    t = int(time.time())
    valid = _hmac_hex(world.secrets[world.running], BODY, t)
    variants = [
        tv1_headers(world.secrets[world.running], BODY),
        # inside the window (the exact ±300 s edge is tested in tests/signing)
        tv1_headers(world.secrets[world.running], BODY, t - 240),
        tv1_headers(world.secrets[world.running], BODY, t + 240),
        # rotation: any one of several v1 signatures; unknown versions ignored
        {"x-signature": f"t={t},v0=deadbeef,v1={'0' * 64},v1={valid}"},
    ]
    async with httpx.AsyncClient(base_url=world.url) as anon:
        for headers in variants:
            r = await anon.post(world.path(world.running), content=BODY, headers=headers)
            assert r.status_code == 204, r.text
    after = await snapshot(world.pool)
    intent = [o for o in after["outbox"] if o["job_id"] == world.running]
    old = [o for o in before["outbox"] if o["job_id"] == world.running]
    # still the one settle intent, asked for again by each webhook, due now
    # instead of at its 30 s lost-webhook timer
    assert len(intent) == len(old) == 1 and intent[0]["kind"] == "settle"
    assert intent[0]["generation"] == old[0]["generation"] + len(variants)
    assert intent[0]["not_before"] < old[0]["not_before"]
    assert await world.pool.fetchval("select $1::timestamptz <= now()", intent[0]["not_before"])
    for table in ("jobs", "ledger", "assets", "owners"):
        assert after[table] == before[table]


async def test_an_accepted_webhooks_request_does_not_wait_for_the_wal_flush(world, monkeypatch):
    """The plain accept path asks for its settle with the unflushed write
    (outbox/intents.REQUEST_UNFLUSHED): lost in a database crash it is a lost
    webhook, which the job's timer recovers. Recorded around the real call."""
    from outbox import intents

    asked, real = [], intents.request

    async def recording(*args, **kw):
        asked.append(kw.get("wait_for_flush", True))
        return await real(*args, **kw)

    monkeypatch.setattr(intents, "request", recording)
    async with httpx.AsyncClient(base_url=world.url) as anon:
        r = await anon.post(world.path(world.other), content=BODY,
                            headers=tv1_headers(world.secrets[world.other], BODY))
    assert r.status_code == 204, r.text
    assert asked == [False]


async def test_a_webhook_verified_offline_takes_one_pool_checkout(world, monkeypatch):
    """t/v1 is keyed with the job's own secret and never waits on the
    network, so the load, the verify and the write share one connection (a
    pool call each is two checkouts). Counted around the real pool; fal's,
    which may fetch keys, holds none while it verifies (the slow key fetch
    test below)."""
    import asyncpg

    checkouts, real = [], asyncpg.Pool.acquire

    def counting(self, *args, **kw):
        checkouts.append(self)
        return real(self, *args, **kw)

    monkeypatch.setattr(asyncpg.Pool, "acquire", counting)
    async with httpx.AsyncClient(base_url=world.url) as anon:
        r = await anon.post(world.path(world.other), content=BODY,
                            headers=tv1_headers(world.secrets[world.other], BODY))
    assert r.status_code == 204, r.text
    assert len(checkouts) == 1


@pytest.mark.parametrize("chunked", [False, True], ids=["with_content_length", "chunked"])
async def test_oversized_webhook_is_413_and_writes_nothing(world, chunked):
    big = b'{"pad": "' + b"x" * MAX_BODY + b'"}'
    headers = tv1_headers(world.secrets[world.running], big)  # even a valid signature

    async def stream():
        for i in range(0, len(big), 64 * 1024):
            yield big[i:i + 64 * 1024]

    before = await snapshot(world.pool)
    async with httpx.AsyncClient(base_url=world.url) as anon:
        r = await anon.post(world.path(world.running), content=stream() if chunked else big,
                            headers=headers)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert await snapshot(world.pool) == before
    # exactly at the cap is not too large (it is merely unsigned here)
    exact = b"x" * MAX_BODY
    async with httpx.AsyncClient(base_url=world.url) as anon:
        r = await anon.post(world.path(world.running), content=exact)
    assert r.status_code == 401


@pytest.mark.parametrize("path", [
    "/webhooks/nope/{running}",
    "/webhooks/SIM/{running}",
    "/webhooks/sim/job_ABCDEF0123456789abcdef01",
    "/webhooks/sim/job_0123",
    "/webhooks/sim/{running}0",
    "/webhooks/sim/{running}%0A",  # a trailing newline is not part of an id
    "/webhooks/sim/run_0123456789abcdef01234567",
    "/webhooks/sim",
    "/webhooks/sim/{running}/extra",
], ids=["unknown_provider", "provider_case", "upper_hex", "short_id", "long_id", "trailing_newline",
        "wrong_prefix", "no_job", "extra_segment"])
async def test_bad_route_shape_is_404_and_writes_nothing(world, path):
    path = path.format(running=world.running)
    before = await snapshot(world.pool)
    async with httpx.AsyncClient(base_url=world.url) as anon:
        r = await anon.post(path, content=BODY, headers=tv1_headers(world.secrets[world.running], BODY))
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found"
    assert await snapshot(world.pool) == before


# CONTRACT's providers table: Gemini and ElevenLabs are polled, the LLM
# APIs answer in the call. We register no callback for them, so no route.
TAKES_NO_WEBHOOKS = ("gemini", "elevenlabs", "anthropic", "openai")


async def test_a_provider_that_takes_no_webhooks_has_no_webhook_route(web, make_settings, db):
    """404 like an unknown provider (CONTRACT), though the provider is
    configured and the URL carries our own valid token: nothing there can
    ever be a delivery of ours."""
    env = {**provider_env("http://127.0.0.1:9"), "GEMINI_API_KEY": "gemini-key",
           "ELEVENLABS_API_KEY": "elevenlabs-key", "ANTHROPIC_API_KEY": "anthropic-key",
           "OPENAI_API_KEY": "openai-key"}
    server = await web(**env)
    settings = make_settings(**env, PUBLIC_URL=server.url)
    providers = server.app.state.providers
    assert set(TAKES_NO_WEBHOOKS) <= set(providers)
    assert {name for name, p in providers.items() if p.facts.webhook_scheme == "none"} == set(TAKES_NO_WEBHOOKS)
    job_id = unknown_job_id()
    before = await snapshot(db)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        for provider in TAKES_NO_WEBHOOKS:
            r = await anon.post(hook_path(settings, provider, job_id), content=BODY,
                                headers={"webhook-signature": "v1,abc"})
            assert r.status_code == 404, (provider, r.text)
            assert r.json()["error"]["code"] == "not_found"
        # the control: the same request to a provider that takes webhooks is the uniform 401
        r = await anon.post(hook_path(settings, "kie", job_id), content=BODY)
        assert r.status_code == 401 and r.json() == UNAUTHORIZED
    assert await snapshot(db) == before


async def test_a_sim_signature_on_another_providers_route_is_401(world):
    """The job exists but belongs to `sim`: another provider's route is a
    stranger's job there, and gets the same 401."""
    before = await snapshot(world.pool)
    async with httpx.AsyncClient(base_url=world.url) as anon:
        for provider in ("replicate", "fal", "kie"):  # each with our token for that route
            r = await anon.post(world.path(world.running, provider), content=BODY,
                                headers=tv1_headers(world.secrets[world.running], BODY))
            assert r.status_code == 401 and r.content == world.reference_401
    assert await snapshot(world.pool) == before


# --- the other providers' schemes ---------------------------------------------

async def _running_job(server, settings, db, settlers, owner, provider: str, model: str) -> dict:
    await settlers(settings)
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json={"provider": provider, "model": model,
                                           "input": {"duration_s": 600}, "max_credits": 10})
        assert r.status_code == 202, r.text
    row = await wait_for_status(db, r.json()["id"], "running")
    # The settler deletes the finished submit intent just after the job turns
    # running: wait for it, or a snapshot taken now may race that delete.
    await wait_until(lambda: _no_intent(db, row["id"], "submit"), timeout=30)
    return row


async def _post_each(url: str, path: str, requests: list[tuple[bytes, dict]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url) as anon:
        return [await anon.post(path, content=body, headers=headers) for body, headers in requests]


async def test_replicate_standard_webhooks(web, make_settings, make_owner, sim, settlers, db):
    set_faults(sim.url, drop_webhook=1)
    server = await web(**provider_env(sim.url))
    settings = make_settings(**provider_env(sim.url, PUBLIC_URL=server.url))
    row = await _running_job(server, settings, db, settlers, await make_owner(), "replicate", "acme/painter")
    path = hook_path(settings, "replicate", row["id"])
    secret = httpx.get(f"{sim.url}/replicate/v1/webhooks/default/secret", trust_env=False,
                       headers={"Authorization": "Bearer r8_roads_test_token"}).json()["key"]
    other_secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    body = b'{"id": "p1", "status": "succeeded", "output": ["https://replicate.delivery/x.png"]}'
    now = int(time.time())

    def signed(key, t=now, msg_id="msg_1", payload=body):
        return {"webhook-id": msg_id, "webhook-timestamp": str(t),
                "webhook-signature": sign_standard_webhooks(key, msg_id, t, payload)}

    good = signed(secret)
    hostile = [
        (body, signed(other_secret)),  # another account's secret
        (body, signed(secret, t=int(time.time()) - 301)),
        (body, signed(secret, t=math.ceil(time.time()) + 360)),
        (body + b" ", good),  # one byte more
        (body, {**good, "webhook-id": "msg_2"}),  # the id is signed too
        (body, {**good, "webhook-signature": good["webhook-signature"].replace("v1,", "v2,")}),
        (body, {k: v for k, v in good.items() if k != "webhook-signature"}),
        (body, {**good, "webhook-timestamp": "soon"}),
        (body, {**good, "webhook-signature": "v1,not base64!"}),
    ]
    before = await snapshot(db)
    answers = await _post_each(server.url, path, hostile)
    assert [r.status_code for r in answers] == [401] * len(hostile)
    assert {r.content for r in answers} == {answers[0].content} and answers[0].json() == UNAUTHORIZED
    assert await snapshot(db) == before
    # correctly signed by Replicate, but not at the URL we registered: no
    # token, or another job's
    another = hook_path(settings, "replicate", unknown_job_id()).partition("?")[2]
    for elsewhere in (f"/webhooks/replicate/{row['id']}", f"/webhooks/replicate/{row['id']}?{another}"):
        [refused] = await _post_each(server.url, elsewhere, [(body, good)])
        assert refused.status_code == 401 and refused.content == answers[0].content
    assert await snapshot(db) == before

    # the control: signed with the simulator's account secret, with a
    # rotated-out signature beside it
    rotated = {**good, "webhook-signature": signed(other_secret)["webhook-signature"] + " "
               + good["webhook-signature"]}
    [accepted] = await _post_each(server.url, path, [(body, rotated)])
    assert accepted.status_code == 204
    intent = await db.fetchrow("select * from outbox where job_id = $1 and kind = 'settle'", row["id"])
    assert intent["generation"] >= 1


async def test_fal_ed25519_with_a_key_not_in_the_jwks(web, make_settings, make_owner, sim, settlers, db):
    server = await web(**provider_env(sim.url))
    settings = make_settings(**provider_env(sim.url, PUBLIC_URL=server.url))
    row = await _running_job(server, settings, db, settlers, await make_owner(), "fal", "fal-ai/flux/dev")
    request_id = row["provider_task_id"]
    body = b'{"request_id": "%s", "status": "OK", "payload": {"images": []}}' % request_id.encode()
    stranger = Ed25519PrivateKey.generate()
    now = int(time.time())

    def signed(key, t=now, user="longcall-sim", payload=body):
        return {"x-fal-webhook-request-id": request_id, "x-fal-webhook-user-id": user,
                "x-fal-webhook-timestamp": str(t),
                "x-fal-webhook-signature": sign_fal(key, request_id, user, t, payload)}

    hostile = [
        (body, signed(stranger)),
        (body, {**signed(stranger), "x-fal-webhook-signature": "00" * 64}),
        (body, {k: v for k, v in signed(stranger).items() if k != "x-fal-webhook-timestamp"}),
        (body, {**signed(stranger), "x-fal-webhook-signature": "not hex"}),
    ]
    before = await snapshot(db)
    answers = await _post_each(server.url, hook_path(settings, "fal", row["id"]), hostile)
    assert [r.status_code for r in answers] == [401] * len(hostile)
    assert all(r.json() == UNAUTHORIZED for r in answers)
    assert await snapshot(db) == before

    # The control: the simulator's own signed webhook, sent now because we
    # cancel the request at the provider. The lost-webhook check is 60 s
    # away, so only that webhook, verified against the JWKS, closes the job.
    r = httpx.put(f"{sim.url}/fal/fal-ai/flux/requests/{request_id}/cancel",
                  headers={"Authorization": "Key fal-roads-test-key"}, trust_env=False)
    assert r.status_code == 202
    closed = await wait_for_status(db, row["id"], "failed", timeout=10)
    assert closed["error_code"] == "provider_failed" and closed["credits_refunded"] == 10
    assert (closed["finished_at"] - closed["created_at"]).total_seconds() < 30
    await assert_money_balances(db)


async def test_kie_capability_token(web, make_settings, make_owner, sim, settlers, db):
    set_faults(sim.url, drop_webhook=1)
    server = await web(**provider_env(sim.url))
    settings = make_settings(**provider_env(sim.url, PUBLIC_URL=server.url))
    row = await _running_job(server, settings, db, settlers, await make_owner(), "kie", "kie-image")
    job_id = row["id"]
    key = settings.secret_key
    body = b'{"code": 200, "msg": "success", "data": {"state": "success"}}'
    plain = {"content-type": "application/json"}
    hostile_queries = [
        "",  # no token
        "?token=",
        "?token=garbage",
        f"?token={make_capability_token('kie', unknown_job_id(), key)}",  # another job's token
        f"?token={make_capability_token('sim', job_id, key)}",  # another provider's token
        f"?token={make_capability_token('kie', job_id, b'another-server-secret-key')}",
    ]
    before = await snapshot(db)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        answers = [await anon.post(f"/webhooks/kie/{job_id}{q}", content=body, headers=plain)
                   for q in hostile_queries]
    assert [r.status_code for r in answers] == [401] * len(hostile_queries)
    assert all(r.json() == UNAUTHORIZED for r in answers)
    assert await snapshot(db) == before
    # the control: the token the settler put in the callback URL
    token = make_capability_token("kie", job_id, key)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        r = await anon.post(f"/webhooks/kie/{job_id}", params={"token": token}, content=body, headers=plain)
    assert r.status_code == 204
    assert stats(sim.url)["creates_by_callback_url"] == {
        f"{server.url}/webhooks/kie/{job_id}": 1}  # keyed without the query string


async def test_slow_key_fetch_does_not_hold_database_connections(web, make_owner, make_settings, sim,
                                                                settlers, db):
    """A flood of forged fal webhooks while fal's key set is slow to fetch:
    each request waits on the key fetch, and must not sit on a database
    connection meanwhile, or the web tier's pool runs dry and owners'
    reads stall behind the forgers."""
    fetched = []

    async def slow_jwks(request):
        fetched.append(time.monotonic())
        await asyncio.sleep(2)
        return JSONResponse({"keys": []})

    jwks_server, jwks_task, jwks_url = await serve_app(
        Starlette(routes=[Route("/jwks.json", slow_jwks)]))
    try:
        env = provider_env(sim.url, FAL_JWKS_URL=f"{jwks_url}/jwks.json")
        server = await web(**env)
        settings = make_settings(**env, PUBLIC_URL=server.url)
        owner = await make_owner()
        row = await _running_job(server, settings, db, settlers, owner, "fal", "fal-ai/flux/dev")
        forged = {"x-fal-webhook-request-id": "r", "x-fal-webhook-user-id": "u",
                  "x-fal-webhook-timestamp": str(int(time.time())), "x-fal-webhook-signature": "00" * 64}
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     limits=httpx.Limits(max_connections=100)) as anon, \
                server.client(owner.api_key) as c:
            # with our token: the forgery is the signature, so each waits on the keys
            flood = [asyncio.create_task(anon.post(hook_path(settings, "fal", row["id"]), content=b"{}",
                                                   headers=forged)) for _ in range(40)]
            await wait_until(lambda: _true(fetched))
            await asyncio.sleep(0.3)  # the flood is in, waiting on the key fetch
            started = time.monotonic()
            read = await c.get(f"/v1/jobs/{row['id']}")
            took = time.monotonic() - started
            answers = await asyncio.gather(*flood)
        assert read.status_code == 200
        assert took < 1.0, f"an owner's read waited {took:.1f}s behind forged webhooks"
        assert {r.status_code for r in answers} == {401}
    finally:
        jwks_server.should_exit = True
        await jwks_task


async def _true(value) -> bool:
    return bool(value)


# --- duplicates and a lying body --------------------------------------------------

async def _job_done_at_provider(server, settings, db, settlers, owner, **input) -> tuple[dict, object]:
    """A running sim job whose task has already finished at the simulator
    (its own webhook dropped): only our deliveries or a timer can close it."""
    settler = await settlers(settings)
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json=sim_job(**input))
        assert r.status_code == 202, r.text
    row = await wait_for_status(db, r.json()["id"], "running")
    sim_url = settings.sim_url
    await wait_until(lambda: _finished_at_sim(sim_url, row["provider_task_id"]))
    return row, settler


async def _finished_at_sim(sim_url: str, task_id: str) -> bool:
    return sim_task(sim_url, task_id)["status"] in ("succeeded", "failed")


async def test_duplicate_deliveries_coalesce_and_the_job_settles_once(web, make_settings, make_owner, sim,
                                                                      settlers, db):
    """100 sequential and 100 concurrent deliveries of one valid webhook
    while no settler runs: every one is a 204 (the job is open), all of them
    land in the one open settle intent (its generation counts them), and the
    job settles once when a settler comes. After that the same webhook is a
    401 (a closed job) and changes nothing."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url)
    settings = make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url)
    owner = await make_owner(credits=100)
    row, settler = await _job_done_at_provider(server, settings, db, settlers, owner, outputs=2, cost=3)
    await settler.stop()
    job_id = row["id"]
    headers = tv1_headers(job_secret(settings, row), BODY)  # one webhook, delivered 200 times
    generation = await db.fetchval("select generation from outbox where job_id = $1", job_id)
    async with httpx.AsyncClient(base_url=server.url, limits=httpx.Limits(max_connections=100)) as anon:
        sequential = [await anon.post(hook_path(settings, "sim", job_id), content=BODY, headers=headers)
                      for _ in range(100)]
        concurrent = await asyncio.gather(*[anon.post(hook_path(settings, "sim", job_id), content=BODY, headers=headers)
                                            for _ in range(100)])
    assert [r.status_code for r in sequential + list(concurrent)] == [204] * 200
    intents = await db.fetch("select kind, generation from outbox where job_id = $1", job_id)
    assert [(i["kind"], i["generation"]) for i in intents] == [("settle", generation + 200)]

    status_calls = stats(sim.url)["status_calls"]
    await settlers(settings)
    done = await wait_for_status(db, job_id, "succeeded", timeout=10)
    assert stats(sim.url)["status_calls"] == status_calls + 1  # the provider was asked once
    assert done["credits_charged"] == 3 and done["credits_refunded"] == 7
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", job_id) == 1
    assert await db.fetchval("select count(*) from assets where job_id = $1", job_id) == 2
    await wait_until(lambda: _no_intents(db, job_id))

    before = await snapshot(db)
    async with httpx.AsyncClient(base_url=server.url) as anon:
        late = await asyncio.gather(*[anon.post(hook_path(settings, "sim", job_id), content=BODY, headers=headers)
                                      for _ in range(20)])
    assert {r.status_code for r in late} == {401}
    assert await snapshot(db) == before
    await assert_money_balances(db)


async def _no_intents(pool, job_id: str) -> bool:
    return await pool.fetchval("select count(*) from outbox where job_id = $1", job_id) == 0


async def test_deliveries_racing_the_settle_close_the_job_once(web, make_settings, make_owner, sim, settlers,
                                                               db):
    """The same storm with a settler running: the first accepted delivery
    starts the settle while the others keep arriving. Each answer is a 204
    while the job is open and a 401 once it has closed — never a 401 before
    the close, never a 204 after a 401 in a sequence — and the job is
    charged once, its outputs stored once."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url)
    settings = make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url)
    owner = await make_owner(credits=100)
    row, _ = await _job_done_at_provider(server, settings, db, settlers, owner, outputs=2, cost=3)
    job_id = row["id"]
    headers = tv1_headers(job_secret(settings, row), BODY)
    status_calls = stats(sim.url)["status_calls"]

    async def deliver(client, after_s: float = 0.0):
        await asyncio.sleep(after_s)
        r = await client.post(hook_path(settings, "sim", job_id), content=BODY, headers=headers)
        return r.status_code, time.time()

    async def one_after_another(client):
        return [await deliver(client) for _ in range(100)]

    # Both spread over the settle: the concurrent ones start 10 ms apart,
    # the sequential ones back to back, all from the same moment.
    async with httpx.AsyncClient(base_url=server.url, limits=httpx.Limits(max_connections=100)) as anon:
        sequential, *concurrent = await asyncio.gather(
            one_after_another(anon), *[deliver(anon, i * 0.01) for i in range(100)])
    done = await wait_for_status(db, job_id, "succeeded", timeout=10)
    closed_at = done["finished_at"].timestamp()
    answers = concurrent + sequential
    assert {code for code, _ in answers} <= {204, 401}
    assert any(code == 204 for code, _ in concurrent)
    # a 401 is only ever answered once the job has closed
    assert all(at >= closed_at - 0.01 for code, at in answers if code == 401)
    codes = [code for code, _ in sequential]
    assert codes == sorted(codes)  # 204 ... 204 401 ... 401
    assert stats(sim.url)["status_calls"] == status_calls + 1
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", job_id) == 1
    assert await db.fetchval("select count(*) from assets where job_id = $1", job_id) == 2
    await wait_until(lambda: _no_intents(db, job_id))
    await assert_money_balances(db)


async def test_a_body_claiming_success_is_not_believed(web, make_settings, make_owner, sim, settlers, db):
    """A validly signed webhook whose body says `succeeded`, for a task the
    provider says failed: the settle asks the provider, and the job fails
    with a full refund."""
    set_faults(sim.url, drop_webhook=1)
    server = await web(SIM_URL=sim.url)
    settings = make_settings(SIM_URL=sim.url, PUBLIC_URL=server.url)
    owner = await make_owner(credits=100)
    row, _ = await _job_done_at_provider(server, settings, db, settlers, owner, outcome="failed")
    assert sim_task(sim.url, row["provider_task_id"])["status"] == "failed"
    lie = (b'{"id": "%s", "status": "succeeded", "outputs": ["%s/outputs/%s/0"], "cost": 1, "error": null}'
           % (row["provider_task_id"].encode(), sim.url.encode(), row["provider_task_id"].encode()))
    async with httpx.AsyncClient(base_url=server.url) as anon:
        r = await anon.post(hook_path(settings, "sim", row["id"]), content=lie,
                            headers=tv1_headers(job_secret(settings, row), lie))
    assert r.status_code == 204
    done = await wait_for_status(db, row["id"], ("succeeded", "failed"), timeout=10)
    assert done["status"] == "failed" and done["error_code"] == "provider_failed"
    assert (done["credits_charged"], done["credits_refunded"]) == (0, 10)
    assert await db.fetchval("select count(*) from assets where job_id = $1", row["id"]) == 0
    await assert_money_balances(db)
