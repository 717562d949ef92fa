"""Where verification keys come from (Replicate's account secret, fal's
JWKS), how often they are fetched, and Replicate's `find` paging — over
real HTTP against a scripted loopback provider."""
from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.responses import JSONResponse

from app.providers.base import SubmitRequest, WebhookRequest
from app.providers.fal import FalProvider
from app.providers.kie import KieProvider
from app.providers.replicate import ReplicateProvider
from app.signing.tokens import make_capability_token
from app.signing.webhooks import jwk_for, sign_fal, sign_standard_webhooks

JOB = "job_" + "b" * 24
BODY = json.dumps({"id": "p1", "status": "succeeded"}).encode()
SECRET_A = "whsec_" + base64.b64encode(b"a" * 24).decode()
SECRET_B = "whsec_" + base64.b64encode(b"b" * 24).decode()


def flip(body: bytes) -> bytes:
    return body[:-1] + bytes([body[-1] ^ 1])


def tampered(hook: WebhookRequest) -> WebhookRequest:
    return WebhookRequest(job_id=hook.job_id, headers=hook.headers, query=hook.query, raw_body=flip(hook.raw_body))


def standard_webhook(secret: str, body: bytes = BODY) -> WebhookRequest:
    t = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(t),
               "webhook-signature": sign_standard_webhooks(secret, "msg_1", t, body)}
    return WebhookRequest(job_id=JOB, headers=headers, query={}, raw_body=body)


def fal_webhook(key: Ed25519PrivateKey, body: bytes = BODY) -> WebhookRequest:
    t = int(time.time())
    headers = {"x-fal-webhook-request-id": "req-1", "x-fal-webhook-user-id": "user-1",
               "x-fal-webhook-timestamp": str(t), "x-fal-webhook-signature": sign_fal(key, "req-1", "user-1", t, body)}
    return WebhookRequest(job_id=JOB, headers=headers, query={}, raw_body=body)


# ------------------------------------------------------------------ Replicate secret


async def test_replicate_configured_secret_is_used_without_fetching(script):
    adapter = ReplicateProvider(script.url, "tok", webhook_secret=SECRET_A, timeout_s=2)
    try:
        assert await adapter.verify(standard_webhook(SECRET_A))
        assert not await adapter.verify(tampered(standard_webhook(SECRET_A)))
        assert not await adapter.verify(standard_webhook(SECRET_B))
        assert script.seen == []
    finally:
        await adapter.aclose()


async def test_replicate_secret_is_fetched_once_and_cached(script):
    script.answer(200, {"key": SECRET_A})
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2)
    try:
        assert await adapter.verify(standard_webhook(SECRET_A))
        assert await adapter.verify(standard_webhook(SECRET_A))
        # A bad signature may trigger one refetch, but not within the minute.
        assert not await adapter.verify(standard_webhook(SECRET_B))
        assert not await adapter.verify(standard_webhook(SECRET_B))
        fetches = [s for s in script.seen if s.path == "/v1/webhooks/default/secret"]
        assert len(fetches) == 1
        assert fetches[0].headers["authorization"] == "Bearer tok"
    finally:
        await adapter.aclose()


async def test_replicate_rotated_secret_is_refetched(script):
    script.answer(200, {"key": SECRET_A})
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2, secret_refresh_s=0)
    try:
        assert await adapter.verify(standard_webhook(SECRET_A))
        script.answer(200, {"key": SECRET_B})
        assert await adapter.verify(standard_webhook(SECRET_B))
        assert len(script.seen) == 2
    finally:
        await adapter.aclose()


async def test_replicate_unreachable_secret_means_no(script):
    script.answer(503, {"detail": "down"})
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2)
    try:
        assert not await adapter.verify(standard_webhook(SECRET_A))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ fal JWKS


async def test_fal_jwks_is_cached_and_refreshed_for_a_new_key(script):
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    jwks = {"keys": [jwk_for(old.public_key())]}
    script.handler = lambda seen: JSONResponse(jwks)
    adapter = FalProvider(script.url, "k", jwks_url=script.url + "/.well-known/jwks.json", timeout_s=2,
                          jwks_refresh_s=0)
    try:
        assert await adapter.verify(fal_webhook(old))
        assert await adapter.verify(fal_webhook(old))
        assert len(script.seen) == 1 and script.seen[0].path == "/.well-known/jwks.json"
        assert "authorization" not in script.seen[0].headers  # our key never goes to the JWKS host
        assert not await adapter.verify(tampered(fal_webhook(old)))
        jwks["keys"].append(jwk_for(new.public_key()))
        assert await adapter.verify(fal_webhook(new))
    finally:
        await adapter.aclose()


async def test_fal_unknown_key_refetch_is_rate_limited(script):
    known, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    script.handler = lambda seen: JSONResponse({"keys": [jwk_for(known.public_key())]})
    adapter = FalProvider(script.url, "k", jwks_url=script.url + "/jwks", timeout_s=2)
    try:
        assert await adapter.verify(fal_webhook(known))
        for _ in range(5):
            assert not await adapter.verify(fal_webhook(stranger))
        assert len(script.seen) == 1
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ KIE capability URL


async def test_kie_token_is_bound_to_provider_and_job(script):
    keys = (b"new-server-key-0123456789abcdef", b"old-server-key-0123456789abcdef")
    adapter = KieProvider(script.url, "kie-key", secret_keys=keys, timeout_s=2)
    try:
        def hook(token, job=JOB):
            return WebhookRequest(job_id=job, headers={}, query={"token": token} if token else {}, raw_body=b"{}")

        assert await adapter.verify(hook(make_capability_token("kie", JOB, keys[0])))
        assert await adapter.verify(hook(make_capability_token("kie", JOB, keys[1])))  # rotation
        assert not await adapter.verify(hook(make_capability_token("kie", "job_" + "c" * 24, keys[0])))
        assert not await adapter.verify(hook(make_capability_token("fal", JOB, keys[0])))
        assert not await adapter.verify(hook(make_capability_token("kie", JOB, b"someone-else-key-0123456789")))
        assert not await adapter.verify(hook(None))
        assert not await adapter.verify(hook("garbage"))
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ Replicate find


def prediction(pid: str, webhook: str | None, age_s: float) -> dict:
    created = datetime.now(UTC) - timedelta(seconds=age_s)
    return {"id": pid, "status": "processing", "webhook": webhook,
            "created_at": created.isoformat().replace("+00:00", "Z")}


def find_request(callback: str | None) -> SubmitRequest:
    return SubmitRequest(job_id=JOB, model="acme/model", input={}, callback_url=callback)


async def test_replicate_find_follows_pages_to_our_callback(script):
    ours = f"https://longcall.example/webhooks/replicate/{JOB}"
    pages = {
        "1": {"results": [prediction("p9", "https://longcall.example/webhooks/replicate/job_other", 5)],
              "next": f"{script.url}/v1/predictions?cursor=2"},
        "2": {"results": [prediction("p8", None, 10), prediction("p7", ours, 20)], "next": None},
    }
    script.handler = lambda seen: JSONResponse(pages[seen.query.get("cursor", "1")])
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2)
    try:
        found = await adapter.find(find_request(ours))
        assert found is not None and found.task_id == "p7"
        assert [s.query.get("cursor") for s in script.seen] == [None, "2"]
        assert all(s.headers["authorization"] == "Bearer tok" for s in script.seen)
        script.seen.clear()
        assert await adapter.find(find_request(None)) is None
        assert script.seen == []
    finally:
        await adapter.aclose()


async def test_replicate_find_stops_at_old_predictions_and_foreign_links(script):
    ours = f"https://longcall.example/webhooks/replicate/{JOB}"
    pages = {
        "1": {"results": [prediction("p2", None, 7 * 3600)], "next": f"{script.url}/v1/predictions?cursor=2"},
        "2": {"results": [prediction("p1", ours, 8 * 3600)], "next": None},
    }
    script.handler = lambda seen: JSONResponse(pages[seen.query.get("cursor", "1")])
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2, find_max_age_s=6 * 3600)
    try:
        assert await adapter.find(find_request(ours)) is None
        assert len(script.seen) == 1
        # A `next` link elsewhere is not followed: the token would go with it.
        pages["1"] = {"results": [prediction("p2", None, 5)], "next": "http://evil.example/v1/predictions?cursor=2"}
        script.seen.clear()
        assert await adapter.find(find_request(ours)) is None
        assert len(script.seen) == 1
    finally:
        await adapter.aclose()
