"""Where verification keys come from (Replicate's account secret, fal's
JWKS), how often they are fetched, and Replicate's `find` (which
predictions can be a lost submit's, and the list's paging) — over real HTTP
against a scripted loopback provider."""
from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.responses import JSONResponse

from app.providers.base import SubmitRequest, Submitted, Transient, WebhookRequest
from app.providers.fal import FalProvider
from app.providers.kie import KieProvider
from app.providers.replicate import FIND_CLOCK_SKEW_S, ReplicateProvider, made_by, same_json
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

VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
SENT = {"prompt": "a cat", "steps": 4, "guidance": 3.5, "seed": None, "hdr": False, "sizes": [1, 2],
        "extra": {"a": 1, "b": "x"}}

# a listed prediction, the model we submitted (with the input SENT) -> whether it can be ours
MADE_BY_TABLE = [
    ({"id": "p", "model": "acme/model", "version": "h", "input": SENT}, "acme/model", True),
    # key order does not matter; 4 and 4.0 are one JSON number
    ({"id": "p", "model": "acme/model", "version": "h",
      "input": dict(reversed(list({**SENT, "steps": 4.0}.items())))}, "acme/model", True),
    ({"id": "p", "model": "acme/other", "version": "h", "input": SENT}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {**SENT, "prompt": "a dog"}}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {**SENT, "hdr": 0}}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {**SENT, "steps": True}}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {**SENT, "sizes": [2, 1]}}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {**SENT, "more": 1}}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {k: v for k, v in SENT.items() if k != "seed"}},
     "acme/model", False),
    # an hour after it ends the API removes the input: nothing to match on
    ({"id": "p", "model": "acme/model", "version": "h", "input": None, "data_removed": True}, "acme/model", False),
    ({"id": "p", "model": "acme/model", "version": "h", "input": {}, "data_removed": True}, "acme/model", False),
    # a version submit is matched on the version: the answer may name the model otherwise
    ({"id": "p", "model": "replicate/lifeboat", "version": VERSION, "input": SENT}, f"acme/model:{VERSION}", True),
    ({"id": "p", "model": "acme/model", "version": VERSION, "input": SENT}, VERSION, True),
    ({"id": "p", "model": "acme/model", "version": "other", "input": SENT}, f"acme/model:{VERSION}", False),
    ({"id": "p", "model": "acme/model", "version": VERSION, "input": SENT}, "acme/model", True),
    ({"id": "p", "model": "acme/model", "version": VERSION, "input": SENT}, "not a model!", False),
    ({"model": "acme/model", "version": "h", "input": SENT}, "acme/model", False),
    ({"id": "", "model": "acme/model", "version": "h", "input": SENT}, "acme/model", False),
    ({"id": 7, "model": "acme/model", "version": "h", "input": SENT}, "acme/model", False),
    ("p", "acme/model", False),
]


@pytest.mark.parametrize("prediction, model, expected", MADE_BY_TABLE)
def test_made_by(prediction, model, expected):
    assert made_by(prediction, model, SENT) is expected


SAME_JSON_TABLE = [
    (1, 1.0, True), (True, True, True), (True, 1, False), (0, False, False), (None, None, True),
    (None, False, False), ("1", 1, False), ([1, [2]], (1, (2,)), True), ([1], [1, 1], False),
    ({"a": [1]}, {"a": [1.0]}, True), ({"a": 1}, {"b": 1}, False), ({}, [], False),
]


@pytest.mark.parametrize("a, b, expected", SAME_JSON_TABLE)
def test_same_json(a, b, expected):
    assert same_json(a, b) is expected and same_json(b, a) is expected


def prediction(pid: str, input: dict, model: str = "acme/model") -> dict:
    return {"id": pid, "model": model, "version": "h", "input": input, "status": "processing",
            "created_at": "2025-01-01T00:00:00.000000Z"}


def find_request(first_attempt_at: datetime | None, input: dict | None = None) -> SubmitRequest:
    return SubmitRequest(job_id=JOB, model="acme/model", input=input or {"prompt": "ours"}, callback_url=None,
                         first_attempt_at=first_attempt_at)


async def test_replicate_find_lists_from_the_first_attempt_and_follows_pages(script):
    ours = {"prompt": "ours"}
    pages = {
        "1": {"results": [prediction("p9", {"prompt": "theirs"}), prediction("p8", ours, model="acme/other")],
              "next": f"{script.url}/v1/predictions?created_after=x&cursor=2", "previous": None},
        "2": {"results": [prediction("p7", ours), prediction("p6", {"prompt": "theirs"})], "next": None,
              "previous": None},
    }
    script.handler = lambda seen: JSONResponse(pages[seen.query.get("cursor", "1")])
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2)
    started = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    try:
        assert await adapter.find_candidates(find_request(started)) == (Submitted("p7"),)
        assert (await adapter.find(find_request(started))) == Submitted("p7")
        first, second = script.seen[:2]
        # from the first submit call on, less the clock-skew margin; `next` carries the filters
        assert first.path == "/v1/predictions"
        assert datetime.fromisoformat(first.query["created_after"]) == started - timedelta(seconds=FIND_CLOCK_SKEW_S)
        assert second.query == {"created_after": "x", "cursor": "2"}
        assert all(s.headers["authorization"] == "Bearer tok" for s in script.seen)
        # two that can be ours: the adapter cannot tell (the submit step may, by the jobs' task ids)
        pages["1"]["results"].append(prediction("p5", ours))
        assert await adapter.find_candidates(find_request(started)) == (Submitted("p5"), Submitted("p7"))
        assert await adapter.find(find_request(started)) is None
        assert await adapter.find_candidates(find_request(started, {"prompt": "nobody's"})) == ()
        # without the first call's time: the last find_max_age_s
        script.seen.clear()
        await adapter.find_candidates(find_request(None))
        since = datetime.fromisoformat(script.seen[0].query["created_after"])
        assert abs((datetime.now(UTC) - since).total_seconds() - 6 * 3600 - FIND_CLOCK_SKEW_S) < 60
    finally:
        await adapter.aclose()


async def test_replicate_find_with_pages_unread_or_foreign_links_finds_nothing(script):
    ours = {"prompt": "ours"}
    pages = {
        "1": {"results": [prediction("p2", ours)], "next": f"{script.url}/v1/predictions?cursor=2"},
        "2": {"results": [prediction("p1", {"prompt": "theirs"})], "next": f"{script.url}/v1/predictions?cursor=3"},
        "3": {"results": [], "next": None},
    }
    script.handler = lambda seen: JSONResponse(pages[seen.query.get("cursor", "1")])
    started = datetime.now(UTC)
    adapter = ReplicateProvider(script.url, "tok", timeout_s=2, find_max_pages=2)
    try:
        # a third page not read could hold another match: nothing is adopted
        assert await adapter.find_candidates(find_request(started)) == ()
        assert len(script.seen) == 2
        # A `next` link elsewhere is not followed (the token would go with it), and its pages are unread.
        pages["1"]["next"] = "http://evil.example/v1/predictions?cursor=2"
        script.seen.clear()
        assert await adapter.find_candidates(find_request(started)) == ()
        assert len(script.seen) == 1
        pages["1"]["next"] = None
        assert await adapter.find_candidates(find_request(started)) == (Submitted("p2"),)
        script.answer(200, {"next": None})
        with pytest.raises(Transient):
            await adapter.find_candidates(find_request(started))
    finally:
        await adapter.aclose()
