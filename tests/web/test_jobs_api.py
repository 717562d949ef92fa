"""The jobs API over real HTTP against a real PostgreSQL."""
from __future__ import annotations

import asyncio
import time

import pytest

from app.signing.tokens import make_read_token, read_token_expiry

JOB = {"provider": "sim", "model": "image-fast", "input": {"prompt": "a cat"}, "max_credits": 10}


async def counts(pool) -> dict:
    return dict(await pool.fetchrow(
        "select (select count(*) from jobs) as jobs, (select count(*) from outbox) as intents,"
        " (select count(*) from ledger where kind = 'reserve') as reserves"))


async def test_create_read_list_account(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json=JOB)
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["id"].startswith("job_") and job["status"] == "queued"
        assert r.headers["location"] == f"/v1/jobs/{job['id']}"
        assert job["credits"] == {"reserved": 10, "charged": 0, "refunded": 0}
        assert job["outputs"] == [] and job["error"] is None
        assert job["status_url"].startswith(f"/v1/jobs/{job['id']}?token=")
        r = await c.get(f"/v1/jobs/{job['id']}")
        assert r.status_code == 200 and r.json()["id"] == job["id"]
        r = await c.get("/v1/jobs")
        assert [j["id"] for j in r.json()["jobs"]] == [job["id"]] and r.json()["next_cursor"] is None
        r = await c.get("/v1/account")
        assert r.json() == {"owner_id": owner.owner_id,
                            "credits": {"balance": 90, "reserved": 10, "charged": 0},
                            "active": 1, "max_active": 10}
    # one job, one reservation, one submit intent, written together
    assert await counts(db) == {"jobs": 1, "intents": 1, "reserves": 1}


async def test_fifty_concurrent_identical_creates_make_one_job(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=1000, max_active=100)
    async with server.client(owner.api_key) as c:
        responses = await asyncio.gather(*[
            c.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "same-key"}) for _ in range(50)])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 49 + [202]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await counts(db) == {"jobs": 1, "intents": 1, "reserves": 1}
    assert await db.fetchval("select balance from owners") == 990


async def test_same_key_different_payload_is_409_and_writes_nothing(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        assert (await c.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})).status_code == 202
        before = await counts(db)
        r = await c.post("/v1/jobs", json={**JOB, "max_credits": 11}, headers={"Idempotency-Key": "k"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_conflict"
    assert await counts(db) == before
    assert await db.fetchval("select balance from owners") == 90


async def test_idempotency_keys_are_scoped_to_the_owner(web, make_owner, db):
    server = await web()
    a, b = await make_owner(), await make_owner()
    async with server.client(a.api_key) as ca, server.client(b.api_key) as cb:
        ra = await ca.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})
        rb = await cb.post("/v1/jobs", json={**JOB, "max_credits": 5}, headers={"Idempotency-Key": "k"})
    assert ra.status_code == rb.status_code == 202 and ra.json()["id"] != rb.json()["id"]


async def test_two_idempotency_keys_in_one_request_are_refused(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json=JOB, headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert "one Idempotency-Key" in r.json()["error"]["message"]
    assert await db.fetchval("select count(*) from jobs") == 0


async def test_concurrent_creates_never_overdraw_or_exceed_slots(web, make_owner, db):
    server = await web()
    poor = await make_owner(credits=35, max_active=100)   # money runs out: 3 jobs of 10
    busy = await make_owner(credits=10_000, max_active=4)  # slots run out: 4 jobs
    async with server.client(poor.api_key) as cp, server.client(busy.api_key) as cb:
        rs = await asyncio.gather(*[cp.post("/v1/jobs", json=JOB) for _ in range(25)],
                                  *[cb.post("/v1/jobs", json=JOB) for _ in range(25)])
    poor_codes = sorted(r.status_code for r in rs[:25])
    busy_codes = sorted(r.status_code for r in rs[25:])
    assert poor_codes == [202] * 3 + [402] * 22
    assert busy_codes == [202] * 4 + [429] * 21
    assert all(r.headers.get("retry-after") for r in rs[25:] if r.status_code == 429)
    assert {r.json()["error"]["code"] for r in rs if r.status_code == 402} == {"insufficient_credits"}
    rows = {r["id"]: r for r in await db.fetch("select * from owners")}
    assert rows[poor.owner_id]["balance"] == 5 and rows[poor.owner_id]["reserved"] == 30
    assert rows[busy.owner_id]["active"] == 4 and rows[busy.owner_id]["reserved"] == 40
    for row in rows.values():
        assert row["granted"] == row["balance"] + row["reserved"] + row["charged"]
    assert await db.fetchval("select count(*) from jobs") == 7
    assert await db.fetchval("select count(*) from outbox") == 7


@pytest.mark.parametrize("body,code,status", [
    (b"not json", "invalid_request", 400),
    (b"[1]", "invalid_request", 400),
    (b'{"provider": "sim"}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": {}, "max_credits": 1, "extra": 1}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": [], "max_credits": 1}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "", "input": {}, "max_credits": 1}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": {}, "max_credits": 0}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": {}, "max_credits": 1.5}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": {}, "max_credits": true}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": {}, "max_credits": "5"}', "invalid_request", 400),
    (b'{"provider": "sim", "model": "m", "input": {"x": NaN}, "max_credits": 1}', "invalid_request", 400),
    (b'{"provider": "nope", "model": "m", "input": {}, "max_credits": 1}', "unknown_provider", 422),
    (b'\xff\xfe{}', "invalid_request", 400),
])
async def test_bad_input_is_a_clear_4xx_and_writes_nothing(web, make_owner, db, body, code, status):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    assert await counts(db) == {"jobs": 0, "intents": 0, "reserves": 0}


async def test_oversized_body_is_413(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    big = {**JOB, "input": {"prompt": "x" * (1024 * 1024)}}
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

        async def chunks():  # no Content-Length: the cap holds while streaming
            for _ in range(20):
                yield b"x" * 65536 * 2
        r = await c.post("/v1/jobs", content=chunks())
        assert r.status_code == 413
    assert await counts(db) == {"jobs": 0, "intents": 0, "reserves": 0}


async def test_a_route_that_takes_no_body_still_refuses_one_over_the_cap(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=JOB)).json()
        r = await c.post(f"/v1/jobs/{job['id']}/cancel", content=b"x" * (1024 * 1024 + 1))
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

        async def chunks():  # no Content-Length: refused while streaming
            for _ in range(20):
                yield b"x" * 65536 * 2
        r = await c.post(f"/v1/jobs/{job['id']}/cancel", content=chunks())
        assert r.status_code == 413
        assert (await c.get(f"/v1/jobs/{job['id']}")).json()["status"] == "queued"
        r = await c.post(f"/v1/jobs/{job['id']}/cancel", content=b"x" * (1024 * 1024))  # at the cap: taken
        assert r.status_code == 200 and r.json()["status"] == "cancelled"


async def test_authentication(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client() as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {owner.api_key}"},
                        {"Authorization": f"Bearer {owner.api_key}x"}):
            r = await c.get("/v1/account", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
            assert owner.api_key not in r.text


async def test_other_owners_jobs_are_404_everywhere(web, make_owner, db):
    server = await web()
    a, b = await make_owner(), await make_owner()
    async with server.client(a.api_key) as ca, server.client(b.api_key) as cb:
        job = (await ca.post("/v1/jobs", json=JOB)).json()
        for r in (await cb.get(f"/v1/jobs/{job['id']}"),
                  await cb.post(f"/v1/jobs/{job['id']}/cancel"),
                  await cb.get(f"/v1/jobs/{job['id']}/outputs/0"),
                  await cb.get("/v1/jobs/job_000000000000000000000000"),
                  await cb.get("/v1/jobs/not-a-job")):
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert (await cb.get("/v1/jobs")).json()["jobs"] == []
    assert await db.fetchval("select status from jobs") == "queued"


async def test_read_tokens(web, make_owner, db, make_settings):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=JOB)).json()
        other = (await c.post("/v1/jobs", json=JOB)).json()
    async with server.client() as anon:
        r = await anon.get(job["status_url"])
        assert r.status_code == 200 and r.json()["id"] == job["id"]
        assert r.headers["access-control-allow-origin"] == "*"
        key = make_settings().secret_key
        expired = make_read_token(job["id"], key, int(time.time()) - 1)
        forged = make_read_token(job["id"], b"another-secret-key-0123", int(time.time()) + 3600)
        other_token = other["status_url"].split("token=")[1]
        for token in (expired, forged, other_token, "", "garbage"):
            r = await anon.get(f"/v1/jobs/{job['id']}", params={"token": token})
            assert r.status_code == 404, token
        # A token read's errors answer CORS too, so a page's script can read them; a keyed one's do not.
        token = job["status_url"].split("token=")[1]
        for path in (f"/v1/jobs/{job['id']}?token={token}&wait=31", f"/v1/jobs/{job['id']}?token=garbage",
                     f"/v1/jobs/{job['id']}/outputs/0?token={token}", f"/v1/jobs/{job['id']}/events?token=garbage"):
            r = await anon.get(path, headers={"Origin": "https://app.example"})
            assert r.status_code in (400, 404) and r.headers["access-control-allow-origin"] == "*", path
    async with server.client(owner.api_key) as c:
        r = await c.get(f"/v1/jobs/{job['id']}?wait=31")
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    # The token reads whatever key comes with it: another owner's, or one that is no key.
    stranger = await make_owner()
    token = job["status_url"].split("token=")[1]
    for key in (stranger.api_key, "lc_not-a-key"):
        async with server.client(key) as c:
            for path in (job["status_url"], f"/v1/jobs/{job['id']}/events?token={token}"):
                r = await c.get(path)
                assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*", (key, path)
            assert (await c.get(f"/v1/jobs/{job['id']}")).status_code in (401, 404)  # the key alone does not
            assert (await c.get(f"/v1/jobs/{job['id']}?token=garbage")).status_code == 404
    # But a Longcall-Owner not under the key's platform is the contract's 404, token or not.
    platform = await make_owner(platform=True)
    async with server.client(platform.api_key) as c:
        r = await c.get(job["status_url"], headers={"Longcall-Owner": owner.owner_id})
        assert r.status_code == 404 and r.json()["error"]["message"] == "no such owner"
    async with server.client() as anon:
        # A token read hands back a token expiring with the one it came with
        # (a fresh day each read would renew a leaked token for ever).
        short = make_read_token(job["id"], make_settings().secret_key, int(time.time()) + 60)
        read = (await anon.get(f"/v1/jobs/{job['id']}", params={"token": short})).json()
        assert read["status_url"] == f"/v1/jobs/{job['id']}?token={short}"  # the same key: the same token
        # a token reads, never cancels
        r = await anon.post(f"/v1/jobs/{job['id']}/cancel?token={job['status_url'].split('token=')[1]}")
        assert r.status_code == 401


async def test_cancel_refunds_once_and_frees_the_slot(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=100, max_active=1)
    async with server.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=JOB)).json()
        assert (await c.post("/v1/jobs", json=JOB)).status_code == 429
        rs = await asyncio.gather(*[c.post(f"/v1/jobs/{job['id']}/cancel") for _ in range(20)])
        assert sorted(r.status_code for r in rs) == [200] + [409] * 19
        done = next(r.json() for r in rs if r.status_code == 200)
        assert done["status"] == "cancelled" and done["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
        assert {r.json()["error"]["code"] for r in rs if r.status_code == 409} == {"invalid_state"}
        assert (await c.get("/v1/account")).json()["credits"] == {"balance": 100, "reserved": 0, "charged": 0}
        assert (await c.post("/v1/jobs", json=JOB)).status_code == 202  # the slot is free again
    assert await db.fetchval("select count(*) from ledger where kind = 'refund'") == 1
    # a queued job had no provider call: no provider cancel is queued, its submit intent is gone
    assert await db.fetchval("select count(*) from outbox where job_id = $1", job["id"]) == 0


async def test_list_pagination_and_filter(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=1000, max_active=100)
    async with server.client(owner.api_key) as c:
        ids = [(await c.post("/v1/jobs", json=JOB)).json()["id"] for _ in range(7)]
        await c.post(f"/v1/jobs/{ids[0]}/cancel")
        seen, cursor = [], None
        while True:
            params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            page = (await c.get("/v1/jobs", params=params)).json()
            seen += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert seen == list(reversed(ids))
        r = await c.get("/v1/jobs", params={"status": "cancelled"})
        assert [j["id"] for j in r.json()["jobs"]] == [ids[0]]
        for bad in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"status": "nope"}, {"cursor": "zzz"}):
            r = await c.get("/v1/jobs", params=bad)
            assert r.status_code == 400, bad


async def test_a_page_of_large_inputs_stops_near_8_mib_and_the_cursor_goes_on(web, make_owner, db):
    """A hundred inputs of near 1 MiB each made one list request hold over
    100 MB: a page stops after the job that takes its inputs past 8 MiB,
    and the cursor carries on from there; nothing is skipped or repeated."""
    from app.domain.jobs import LIST_PAGE_INPUT_BYTES
    server = await web()
    owner = await make_owner(credits=1000, max_active=100)
    big = {**JOB, "input": {"prompt": "x" * 1_000_000}}
    async with server.client(owner.api_key) as c:
        ids = [(await c.post("/v1/jobs", json=big)).json()["id"] for _ in range(12)]
        pages, cursor = [], None
        while True:
            page = (await c.get("/v1/jobs", params={"limit": 100, **({"cursor": cursor} if cursor else {})})).json()
            pages.append([j["id"] for j in page["jobs"]])
            cursor = page["next_cursor"]
            if not cursor:
                break
    per_job = len('{"prompt": ""}') + 1_000_000
    first = LIST_PAGE_INPUT_BYTES // per_job + 1  # the job that crosses the line comes too
    assert [len(p) for p in pages] == [first, 12 - first]
    assert [i for p in pages for i in p] == list(reversed(ids))


async def test_health_and_openapi(web, db):
    server = await web()
    async with server.client() as c:
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        doc = (await c.get("/openapi.json")).json()
        assert "/v1/jobs" in doc["paths"]
        r = await c.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_secret_key_rotation_accepts_old_tokens(web, make_owner, db):
    old, new = "old-secret-key-0123456789", "new-secret-key-0123456789"
    before = await web(SECRET_KEY=old)
    owner = await make_owner()
    async with before.client(owner.api_key) as c:
        job = (await c.post("/v1/jobs", json=JOB)).json()
    rotating = await web(SECRET_KEY=f"{new},{old}")
    after = await web(SECRET_KEY=new)
    async with rotating.client() as anon:
        assert (await anon.get(job["status_url"])).status_code == 200   # old token, both keys: accepted
        fresh = (await anon.get(job["status_url"])).json()["status_url"]  # re-issued with the new key
        assert read_token_expiry(fresh.split("token=")[1]) == read_token_expiry(job["status_url"].split("token=")[1])
    async with after.client() as anon:
        assert (await anon.get(job["status_url"])).status_code == 404   # old key dropped: refused
        assert (await anon.get(fresh)).status_code == 200


# A job's give-up deadline: GIVE_UP_AFTER_S_<PROVIDER> when set, else the
# adapter's default for the model (a KIE lip-sync: 3 h; a Replicate
# training: 24 h), else GIVE_UP_AFTER_S.
@pytest.mark.parametrize("env, provider, model, give_up_s", [
    ({}, "kie", "kling/ai-avatar-lip-sync", 3 * 3600),
    ({}, "kie", "flux-2/pro-text-to-image", 7200),
    ({}, "replicate", f"train:acme/trainer:{'0' * 64}", 24 * 3600),
    ({"GIVE_UP_AFTER_S": "600"}, "replicate", "acme/image", 600),
    ({"GIVE_UP_AFTER_S_KIE": "900"}, "kie", "kling/ai-avatar-lip-sync", 900),
])
async def test_the_give_up_deadline_is_the_models_unless_the_provider_setting_says(web, make_owner, db, env,
                                                                                   provider, model, give_up_s):
    server = await web(**env)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json={"provider": provider, "model": model,
                                                  "input": {"destination": "acme/tuned"}, "max_credits": 5})).json()
    row = await db.fetchrow("select created_at, deadline_at from jobs where id = $1", created["id"])
    assert (row["deadline_at"] - row["created_at"]).total_seconds() == pytest.approx(give_up_s, abs=1)
