"""The owners API (`client.owners`) and acting for an owner (`owner=`), against
the real longcall: a platform owner's key makes owners, lists them, grants
and claws back their credits, and runs jobs as them. Every test runs with the
sync Client and the AsyncClient."""
from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from typing import Any

import httpx
import pytest
import pytest_asyncio
from client_support import FAST, FORWARD, FORWARD_THEN_DROP, SLOW, WAIT_S
from longcall_client import (
    IdempotencyConflict,
    InsufficientCredits,
    LongcallError,
    NotFound,
    Owner,
    OwnerCredits,
    OwnerPage,
    verify_webhook,
)
from longcall_client import _core as core

OWNER_ID = re.compile(r"own_[0-9a-f]{24}")
DELIVERY_WITHIN_S = 60  # the settler delivers at once; the margin is for a loaded machine


def credits_of(owner: Owner) -> tuple[int, int, int, int]:
    c = owner.credits
    return c.granted, c.balance, c.reserved, c.charged


@pytest_asyncio.fixture
async def recording(make_api):
    """recording(api_key, **kw) -> (Api, answers): every answer the client got, as
    (method, path, status, Location), seen by an httpx event hook on a client of ours."""
    opened: list[httpx.Client | httpx.AsyncClient] = []

    def make(api_key: str, **kwargs: Any):
        answers: list[tuple[str, str, int, str | None]] = []

        def note(response: httpx.Response) -> None:
            answers.append((response.request.method, response.request.url.path, response.status_code,
                            response.headers.get("location")))

        async def anote(response: httpx.Response) -> None:
            note(response)

        is_async = make_api().is_async  # which kind this test runs (the probe sends nothing)
        http: httpx.Client | httpx.AsyncClient = (httpx.AsyncClient(event_hooks={"response": [anote]}) if is_async
                                                  else httpx.Client(event_hooks={"response": [note]}))
        opened.append(http)
        return make_api(api_key, http_client=http, **kwargs), answers

    yield make
    for http in opened:  # the client never closes an http_client it was given
        if isinstance(http, httpx.AsyncClient):
            await http.aclose()
        else:
            http.close()


def lose_first_answer(method: str, path_suffix: str):
    """Pass the first `method` request whose path ends in `path_suffix` on, then drop its
    answer (the server acted, the client never hears); forward everything else."""
    state = {"done": False}

    def decide(seen):
        if seen.method == method and seen.path.endswith(path_suffix) and not state["done"]:
            state["done"] = True
            return FORWARD_THEN_DROP
        return FORWARD
    return decide


# ------------------------------------------------------------ the owners

async def test_create_201_then_the_same_key_is_the_same_owner(make_platform, recording):
    platform = make_platform()
    api, answers = recording(platform.api_key)
    key = f"owner-{uuid.uuid4()}"
    created = await api.owners.create("alice", credits=50, max_active=3, idempotency_key=key)
    assert isinstance(created, Owner) and OWNER_ID.fullmatch(created.owner_id), created
    assert created.name == "alice" and created.max_active == 3 and created.active == 0
    assert created.credits == OwnerCredits(granted=50, balance=50, reserved=0, charged=0)
    assert created.created_at is not None and created.created_at.utcoffset() is not None
    assert created.raw["owner_id"] == created.owner_id
    assert answers == [("POST", "/v1/owners", 201, f"/v1/owners/{created.owner_id}")]

    again = await api.owners.create("alice", credits=50, max_active=3, idempotency_key=key)
    assert again == created  # the same owner, as it is now
    assert answers[1][:3] == ("POST", "/v1/owners", 200)
    with pytest.raises(IdempotencyConflict) as caught:
        await api.owners.create("alice", credits=51, max_active=3, idempotency_key=key)
    assert caught.value.status == 409 and caught.value.code == "idempotency_conflict"
    assert [o.owner_id for o in await api.all_owners()] == [created.owner_id]  # one owner, for three creates

    fetched = await api.owners.get(created.owner_id)
    assert fetched == created


async def test_defaults_and_a_generated_key_per_create(make_platform, make_api):
    api = make_api(make_platform().api_key)
    one = await api.owners.create("same")
    two = await api.owners.create("same")
    assert one.owner_id != two.owner_id  # the same body, two creates: two owners
    assert credits_of(one) == (0, 0, 0, 0) and one.max_active == 10


async def test_list_pages_and_iterate(make_platform, make_api):
    api = make_api(make_platform().api_key)
    assert await api.owners.list() == OwnerPage(owners=[], next_cursor=None)
    created = [await api.owners.create(f"user-{n}", credits=n) for n in range(5)]
    newest_first = [o.owner_id for o in reversed(created)]

    page = await api.owners.list(limit=2)
    assert [o.owner_id for o in page.owners] == newest_first[:2] and page.next_cursor
    page2 = await api.owners.list(limit=2, cursor=page.next_cursor)
    assert [o.owner_id for o in page2.owners] == newest_first[2:4] and page2.next_cursor
    page3 = await api.owners.list(limit=2, cursor=page2.next_cursor)
    assert [o.owner_id for o in page3.owners] == newest_first[4:] and page3.next_cursor is None
    assert [o.name for o in page3.owners] == ["user-0"]

    assert [o.owner_id for o in await api.all_owners(page_size=2)] == newest_first
    assert await api.all_owners() == list(reversed(created))  # the default page holds all five, as made


async def test_another_platforms_owner_is_not_found(make_platform, make_api, longcall):
    mine = make_api(make_platform().api_key)
    theirs = await make_api(longcall.platform_api_key).owners.create("not yours")
    for owner_id in (theirs.owner_id, longcall.owner_id, "own_" + "0" * 24, "own_nope"):
        with pytest.raises(NotFound) as caught:
            await mine.owners.get(owner_id)
        assert caught.value.message == "no such owner"
        with pytest.raises(NotFound):
            await mine.owners.grant(owner_id, 5)
    # An id with a slash stays one escaped segment; the server decodes it and finds no route (404 all the same).
    with pytest.raises(NotFound):
        await mine.owners.get("../account")
    assert credits_of(await make_api(longcall.platform_api_key).owners.get(theirs.owner_id)) == (0, 0, 0, 0)


async def test_a_non_platform_key_gets_not_found(make_api, longcall):
    api = make_api(longcall.api_key)
    for call in (lambda: api.owners.create("x"), lambda: api.owners.list(),
                 lambda: api.owners.get(longcall.owner_id), lambda: api.owners.grant(longcall.owner_id, 5)):
        with pytest.raises(LongcallError) as caught:
            await call()
        assert type(caught.value) is NotFound and caught.value.status == 404, repr(caught.value)
        assert longcall.api_key not in str(caught.value)


# ---------------------------------------------------------------- grants

async def test_grant_then_claw_back(make_api, longcall):
    api = make_api(longcall.platform_api_key)
    owner = await api.owners.create("grants")
    given = await api.owners.grant(owner.owner_id, 100, reason="welcome")
    assert given.owner_id == owner.owner_id and credits_of(given) == (100, 100, 0, 0)
    taken = await api.owners.grant(owner.owner_id, -30)
    assert credits_of(taken) == (70, 70, 0, 0)
    assert await api.owners.get(owner.owner_id) == taken
    assert (await api.account.get(owner=owner.owner_id)).credits.balance == 70

    with pytest.raises(LongcallError) as caught:
        await api.owners.grant(owner.owner_id, -71)
    assert type(caught.value) is InsufficientCredits and caught.value.status == 402
    assert caught.value.code == "insufficient_credits"
    assert credits_of(await api.owners.get(owner.owner_id)) == (70, 70, 0, 0)  # nothing moved

    assert credits_of(await api.owners.grant(owner.owner_id, -70)) == (0, 0, 0, 0)  # all of it may go


async def test_a_grant_key_moves_the_money_once(make_api, longcall):
    api = make_api(longcall.platform_api_key)
    owner = await api.owners.create("once")
    key = f"grant-{uuid.uuid4()}"
    first = await api.owners.grant(owner.owner_id, 5, reason="r", idempotency_key=key)
    second = await api.owners.grant(owner.owner_id, 5, reason="r", idempotency_key=key)
    assert credits_of(first) == credits_of(second) == (5, 5, 0, 0)
    with pytest.raises(IdempotencyConflict):
        await api.owners.grant(owner.owner_id, 6, reason="r", idempotency_key=key)
    # Without a key each grant gets a fresh one: two grants, both move.
    await api.owners.grant(owner.owner_id, 1)
    assert credits_of(await api.owners.grant(owner.owner_id, 1)) == (7, 7, 0, 0)


async def test_a_lost_create_answer_is_retried_with_the_same_key(make_platform, make_api, proxy):
    platform = make_platform()
    server = proxy(lose_first_answer("POST", "/v1/owners"))
    created = await make_api(platform.api_key, base_url=server.url).owners.create("retried", credits=9)
    sent = server.requests_to("POST", "/v1/owners")
    assert len(sent) == 2 and len({s.headers["idempotency-key"] for s in sent}) == 1
    assert sent[0].body == sent[1].body
    assert [o.owner_id for o in await make_api(platform.api_key).all_owners()] == [created.owner_id]
    assert credits_of(created) == (9, 9, 0, 0)


async def test_a_lost_grant_answer_is_retried_and_moves_once(make_api, longcall, proxy):
    owner = await make_api(longcall.platform_api_key).owners.create("retried grant")
    server = proxy(lose_first_answer("POST", "/grants"))
    after = await make_api(longcall.platform_api_key, base_url=server.url).owners.grant(owner.owner_id, 40)
    sent = server.requests_to("POST", f"/v1/owners/{owner.owner_id}/grants")
    assert len(sent) == 2 and len({s.headers["idempotency-key"] for s in sent}) == 1
    assert credits_of(after) == (40, 40, 0, 0)
    assert credits_of(await make_api(longcall.platform_api_key).owners.get(owner.owner_id)) == (40, 40, 0, 0)


# ------------------------------------------------------ acting for an owner

async def test_a_job_for_an_owner_is_charged_to_it(make_api, longcall, tmp_path):
    platform = make_api(longcall.platform_api_key)
    owner = await platform.owners.create("runs jobs", credits=20, max_active=2)
    oid = owner.owner_id
    job = await platform.jobs.create("sim", "image-fast", FAST, max_credits=5, owner=oid)
    assert job.owner_id == oid and job.credits.reserved == 5
    assert (await platform.jobs.get(job.id, owner=oid)).id == job.id
    with pytest.raises(NotFound):
        await platform.jobs.get(job.id)  # the platform's own jobs are another scope
    assert [j.id for j in await platform.all_jobs(owner=oid)] == [job.id]

    done = await platform.jobs.wait(job.id, WAIT_S, owner=oid)
    assert done.status == "succeeded" and done.credits.charged == 1, done.raw
    after = await platform.owners.get(oid)
    assert credits_of(after) == (20, 19, 0, 1) and after.active == 0
    account = await platform.account.get(owner=oid)
    assert (account.owner_id, account.credits.balance, account.credits.charged, account.max_active) == (oid, 19, 1, 2)
    types = [e.type for e in await platform.jobs.events(job.id, owner=oid)]
    assert types[0] == "created" and "closed" in types
    saved = await platform.jobs.download(job.id, 0, tmp_path / "out.png", owner=oid)
    assert saved.sha256 == done.outputs[0].sha256 == hashlib.sha256((tmp_path / "out.png").read_bytes()).hexdigest()

    slow = await platform.jobs.create("sim", "image-slow", SLOW, max_credits=4, owner=oid)
    cancelled = await platform.jobs.cancel(slow.id, owner=oid)
    assert cancelled.status == "cancelled" and cancelled.credits.refunded == 4
    assert credits_of(await platform.owners.get(oid)) == (20, 19, 0, 1)


async def test_the_clients_owner_goes_on_every_call_but_the_owners_api(make_api, longcall, receiver):
    platform = make_api(longcall.platform_api_key)
    owner = await platform.owners.create("client-wide", credits=10)
    api = make_api(longcall.platform_api_key, owner=owner.owner_id)
    job = await api.jobs.create("sim", "image-slow", SLOW, max_credits=3)
    assert job.owner_id == owner.owner_id
    assert (await api.account.get()).owner_id == owner.owner_id
    # The owners calls never carry it (the server refuses Longcall-Owner there).
    assert (await api.owners.get(owner.owner_id)).credits.reserved == 3
    assert owner.owner_id in [o.owner_id for o in (await api.owners.list(limit=100)).owners]
    # A per-call owner=None keeps the client's; the platform's own scope is the other client.
    assert [j.id for j in (await api.jobs.list()).jobs] == [job.id]
    assert job.id not in [j.id for j in (await platform.jobs.list(limit=100)).jobs]
    await api.jobs.cancel(job.id)

    assert await api.models.list() == [] and await platform.models.list(owner=owner.owner_id) == []
    endpoint = await platform.webhook_endpoints.create(f"{receiver.url}/hooks/owned", events=["job.cancelled"],
                                                       owner=owner.owner_id)
    assert [e.id for e in await api.webhook_endpoints.list()] == [endpoint.id]
    assert endpoint.id not in [e.id for e in await platform.webhook_endpoints.list()]
    assert (await api.notifications.list()).next_cursor is None
    await platform.webhook_endpoints.delete(endpoint.id, owner=owner.owner_id)
    assert await platform.webhook_endpoints.list(owner=owner.owner_id) == []


async def test_acting_for_an_owner_not_yours_is_not_found(make_api, make_platform, longcall):
    other = make_api(make_platform().api_key)
    theirs = await other.owners.create("theirs")
    platform = make_api(longcall.platform_api_key)
    ordinary = make_api(longcall.api_key)
    cases = [(platform, theirs.owner_id), (platform, longcall.owner_id), (platform, "own_" + "0" * 24),
             (platform, "own_nope"), (ordinary, longcall.owner_id), (ordinary, theirs.owner_id)]
    for api, owner_id in cases:
        calls = [(api.account.get, (), {}), (api.jobs.list, (), {}),
                 (api.jobs.create, ("sim", "image-fast", FAST), {"max_credits": 1})]
        for call, args, kwargs in calls:
            with pytest.raises(NotFound) as caught:
                await call(*args, owner=owner_id, **kwargs)
            assert (caught.value.status, caught.value.message) == (404, "no such owner"), owner_id
    assert await other.all_jobs(owner=theirs.owner_id) == []  # nothing was made on the way


async def test_a_platforms_endpoint_gets_its_owners_notifications(make_platform, make_api, receiver):
    platform = make_api(make_platform().api_key)
    endpoint = await platform.webhook_endpoints.create(f"{receiver.url}/hooks/platform", events=["job.succeeded"])
    owner = await platform.owners.create("notified", credits=5)
    job = await platform.jobs.create("sim", "image-fast", FAST, max_credits=2, owner=owner.owner_id)
    assert (await platform.jobs.wait(job.id, WAIT_S, owner=owner.owner_id)).status == "succeeded"

    deadline = time.monotonic() + DELIVERY_WITHIN_S
    while not (mine := [s for s in receiver.seen if s.path == "/hooks/platform" and job.id.encode() in s.body]):
        assert time.monotonic() < deadline, "no delivery to the platform's endpoint"
        await asyncio.sleep(0.1)
    [delivery] = mine
    payload = verify_webhook(delivery.headers, delivery.body, endpoint.secret)
    assert payload["type"] == "job.succeeded" and payload["data"]["id"] == job.id
    assert payload["data"]["owner_id"] == owner.owner_id

    [notification] = (await platform.notifications.list(job_id=job.id)).notifications
    assert notification.id == payload["id"] and [d.endpoint_id for d in notification.deliveries] == [endpoint.id]
    await platform.webhook_endpoints.delete(endpoint.id)


# ------------------------------------------------ the requests (pure, no network)

def test_the_owners_calls_never_send_the_clients_owner():
    config = core.Config(base_url="http://h:1", api_key="lc_pure", owner="own_client")
    for call in (core.create_owner("n", None, None, None), core.list_owners(None, None),
                 core.get_owner("own_x"), core.grant_credits("own_x", 5, None, None)):
        assert "Longcall-Owner" not in core.headers_of(config, call), call
    for call in (core.list_models(None), core.list_endpoints(None), core.list_notifications(None, None, None, None),
                 core.create_endpoint("u", None, None), core.delete_endpoint("we_x", None),
                 core.redeliver_notification("evt_x", None), core.job_output("job_x", 0, None)):
        assert core.headers_of(config, call)["Longcall-Owner"] == "own_client", call
    assert core.headers_of(config, core.list_models("own_call"))["Longcall-Owner"] == "own_call"


def test_the_owners_request_bodies():
    create = core.create_owner("n", None, None, None)
    assert create.body == {"name": "n"} and create.resend == "safe" and len(create.headers["Idempotency-Key"]) == 36
    assert core.create_owner("n", 0, 3, "k").body == {"name": "n", "credits": 0, "max_active": 3}
    assert core.create_owner("n", 0, 3, "k").headers == {"Idempotency-Key": "k"}
    grant = core.grant_credits("own_x", -30, None, None)
    assert grant.path == "/v1/owners/own_x/grants" and grant.body == {"credits": -30} and grant.resend == "safe"
    assert grant.headers["Idempotency-Key"] != core.grant_credits("own_x", -30, None, None).headers["Idempotency-Key"]
    assert core.grant_credits("own_x", 5, "why", "k").body == {"credits": 5, "reason": "why"}
    assert core.get_owner("../v1/account").path == "/v1/owners/%2E%2E%2Fv1%2Faccount"
    assert core.list_owners(5, "c").params == {"limit": "5", "cursor": "c"}
