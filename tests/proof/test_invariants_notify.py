"""The invariant on notifications (CONTRACT.md: Notifications to the client):
every notified transition has exactly one notification, with exactly one
delivery per endpoint of its owner that asked for its event, each delivered
or still retrying within its 24 h (failed only when its endpoint was
deleted), and what the receivers got agrees.

A table of rows that kept it passes; each kind of violation, made one at a
time, is caught (and nothing else is). Then the same check over rows the
real statements wrote (app/domain/jobs.py, app/domain/notifications.py),
and the chaos run's receiver over real HTTP with real signatures."""
from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Callable

import httpx
import pytest

from app import delivery
from app.domain import jobs
from app.domain import notifications as domain_notifications
from app.vocabulary import DEFAULT_EVENTS, JobStatus
from proof import invariants
from proof.chaos import ALL_EVENTS, Receiver
from proof.invariants import Delivery, Endpoint, Notification, NotifiedJob, Receipt

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=1)
CLOSES = tuple(DEFAULT_EVENTS)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


class World:
    """Rows that keep the invariant. Owner o1 has endpoint eA (every close),
    eB (every event) and eGone (deleted before any job); o2 has none.
    j1 ran and succeeded; j2 failed before running; j3 is uncertain; j4
    (of o2) succeeded unnotified; j5 was uncertain, then expired. One
    delivery (j5's close to eB) is still retrying; n2 reached eB twice (a
    killed settler) and eB answered each notification's first attempt 500."""

    def __init__(self):
        self.endpoints = [Endpoint("eA", "o1", CLOSES, at(0), None),
                          Endpoint("eB", "o1", ALL_EVENTS, at(0), None),
                          Endpoint("eGone", "o1", ALL_EVENTS, at(0), at(1))]
        self.jobs = [NotifiedJob("j1", "o1", "succeeded", at(2), at(5), 1),
                     NotifiedJob("j2", "o1", "failed", at(2), at(3), 0),
                     NotifiedJob("j3", "o1", "uncertain", at(2), None, 0),
                     NotifiedJob("j4", "o2", "succeeded", at(2), at(4), 1),
                     NotifiedJob("j5", "o1", "expired", at(2), at(50), 0)]
        self.notifications = [Notification("n1", "o1", "j1", "job.running", at(3), "j1", "running"),
                              Notification("n2", "o1", "j1", "job.succeeded", at(5), "j1", "succeeded"),
                              Notification("n3", "o1", "j2", "job.failed", at(3), "j2", "failed"),
                              Notification("n4", "o1", "j3", "job.uncertain", at(4), "j3", "uncertain"),
                              Notification("n5", "o1", "j5", "job.uncertain", at(4), "j5", "uncertain"),
                              Notification("n6", "o1", "j5", "job.expired", at(50), "j5", "expired")]
        self.deliveries = [Delivery("n1", "eB", "delivered", 2, 204, at(3), False),
                           Delivery("n2", "eA", "delivered", 1, 200, at(5), False),
                           Delivery("n2", "eB", "delivered", 2, 204, at(5), False),
                           Delivery("n3", "eA", "delivered", 1, 204, at(3), False),
                           Delivery("n3", "eB", "delivered", 2, 204, at(3), False),
                           Delivery("n4", "eB", "delivered", 2, 204, at(4), False),
                           Delivery("n5", "eB", "delivered", 2, 204, at(4), False),
                           Delivery("n6", "eA", "delivered", 1, 204, at(50), False),
                           Delivery("n6", "eB", "pending", 3, 500, at(50), True)]
        self.receipts = []
        for d in self.deliveries:
            n = self.notification(d.notification_id)
            if d.endpoint_id == "eB":
                self.receipts.append(Receipt("eB", n.id, n.type, n.job_id, True, 500))
            if d.status == "delivered":
                self.receipts.append(Receipt(d.endpoint_id, n.id, n.type, n.job_id, True, d.last_status_code))
        self.receipts.append(Receipt("eB", "n2", "job.succeeded", "j1", True, 204))  # again, after a kill

    def notification(self, notification_id: str) -> Notification:
        return next(n for n in self.notifications if n.id == notification_id)

    def check(self, with_receipts: bool = True):
        return invariants.notification_problems(self.jobs, self.endpoints, self.notifications, self.deliveries,
                                                self.receipts if with_receipts else None, NOW)

    # -- ways to break it (each one at a time) --
    def replace(self, rows: list, match: Callable, **changes) -> None:
        [i] = [i for i, row in enumerate(rows) if match(row)]
        rows[i] = rows[i]._replace(**changes)

    def drop(self, rows: list, match: Callable) -> None:
        rows[:] = [row for row in rows if not match(row)]

    def drop_notification(self, notification_id: str) -> None:
        self.drop(self.notifications, lambda n: n.id == notification_id)
        self.drop(self.deliveries, lambda d: d.notification_id == notification_id)
        self.drop(self.receipts, lambda r: r.webhook_id == notification_id)


def test_rows_that_keep_it_pass_and_are_counted():
    world = World()
    violations, tally = world.check()
    assert violations == []
    assert tally == invariants.NotifyTally(notifications=6, deliveries=9, delivered=8, pending=1, failed=0,
                                           received=15, duplicates=1, bad_signatures=0)
    assert tally.line() == ("6 notifications written, 9 deliveries: 8 delivered, 1 still pending, 0 failed; "
                            "receivers got 15 requests, 1 duplicates, 0 bad signatures")
    violations, tally = world.check(with_receipts=False)
    assert violations == [] and tally.received == 0 and "receivers" not in tally.line()


def _extra_close(w: World) -> None:
    w.notifications.append(Notification("n7", "o1", "j1", "job.succeeded", at(5), "j1", "succeeded"))
    w.deliveries += [Delivery("n7", "eA", "delivered", 1, 204, at(5), False),
                     Delivery("n7", "eB", "delivered", 1, 204, at(5), False)]
    w.receipts += [Receipt("eA", "n7", "job.succeeded", "j1", True, 204),
                   Receipt("eB", "n7", "job.succeeded", "j1", True, 204)]


def _unasked(w: World) -> None:
    w.notifications.append(Notification("n7", "o2", "j4", "job.succeeded", at(4), "j4", "succeeded"))
    w.deliveries.append(Delivery("n7", "eA", "delivered", 1, 204, at(4), False))
    w.receipts.append(Receipt("eA", "n7", "job.succeeded", "j4", True, 204))


def _failed_for_a_dead_endpoint(w: World) -> None:
    """Not a violation on its own: the endpoint was deleted, its delivery ended."""
    w.replace(w.endpoints, lambda e: e.id == "eB", deleted_at=at(49))
    w.replace(w.deliveries, lambda d: (d.notification_id, d.endpoint_id) == ("n6", "eB"), status="failed",
              has_intent=False)


BROKEN = [
    ("a close notified twice", _extra_close, ["j1 (succeeded): 2 job.succeeded notification(s), expected 1"]),
    ("a close not notified", lambda w: w.drop_notification("n3"),
     ["j2 (failed): 0 job.failed notification(s), expected 1"]),
    ("running not notified", lambda w: w.drop_notification("n1"),
     ["j1 (succeeded): 0 job.running notification(s), expected 1"]),
    ("running notified though it never ran",
     lambda w: w.replace(w.jobs, lambda j: j.id == "j1", ran=0),
     ["j1 (succeeded): 1 job.running notification(s), expected 0"]),
    ("an uncertain job not notified", lambda w: w.drop_notification("n4"),
     ["j3 (uncertain): 0 job.uncertain notification(s), expected 1"]),
    ("a job of an owner with no endpoint notified", _unasked,
     ["j4 (succeeded): 1 job.succeeded notification(s), expected 0",
      "n7 (job.succeeded of j4): a delivery to eA, which did not ask for it"]),
    ("a notification whose data is another status",
     lambda w: w.replace(w.notifications, lambda n: n.id == "n3", data_status="succeeded"),
     ["n3 (job.failed of j2): its owner o1 and data (j2, succeeded) are not its job's"]),
    ("a notification of a job that does not exist",
     lambda w: w.notifications.append(Notification("n7", "o1", "j9", "job.failed", at(3), "j9", "failed")),
     ["n7: a notification of j9, a job that does not exist"]),
    ("a notification written with no delivery",
     lambda w: w.notifications.append(Notification("n7", "o2", "j4", "job.running", at(3), "j4", "running")),
     ["j4 (succeeded): 1 job.running notification(s), expected 0", "n7 (job.running of j4): written with no delivery"]),
    ("a matching endpoint without its delivery",
     lambda w: (w.drop(w.deliveries, lambda d: (d.notification_id, d.endpoint_id) == ("n3", "eA")),
                w.drop(w.receipts, lambda r: (r.webhook_id, r.endpoint_id) == ("n3", "eA"))),
     ["n3 (job.failed of j2): no delivery to eA, which asked for it"]),
    ("a delivery to an endpoint that did not ask for the event",
     lambda w: w.deliveries.append(Delivery("n1", "eA", "pending", 0, None, at(3), True)),
     ["n1 (job.running of j1): a delivery to eA, which did not ask for it"]),
    ("a delivery to an endpoint deleted before the job",
     lambda w: w.deliveries.append(Delivery("n3", "eGone", "pending", 0, None, at(3), True)),
     ["n3 (job.failed of j2): a delivery to eGone, which did not ask for it"]),
    ("two deliveries to one endpoint",
     lambda w: w.deliveries.append(Delivery("n3", "eA", "delivered", 1, 204, at(3), False)),
     ["n3 (job.failed of j2): 2 deliveries to eA"]),
    ("still pending after its 24 h",
     lambda w: w.replace(w.deliveries, lambda d: d.status == "pending", retry_from=NOW - dt.timedelta(hours=25)),
     ["n6 to eB: still pending 1 day, 1:00:00 after its retries began"]),
    ("pending with no intent to send it",
     lambda w: w.replace(w.deliveries, lambda d: d.status == "pending", has_intent=False),
     ["n6 to eB: pending with no notify intent (it is never sent)"]),
    ("failed while its endpoint is still there",
     lambda w: w.replace(w.deliveries, lambda d: d.status == "pending", status="failed", has_intent=False),
     ["n6 to eB: failed after 3 attempts, its endpoint still there"]),
    ("delivered on a non-2xx answer",
     lambda w: w.replace(w.deliveries, lambda d: (d.notification_id, d.endpoint_id) == ("n3", "eA"),
                         last_status_code=302),
     ["n3 to eA: delivered after 1 attempts, last answer 302"]),
    ("a bad signature",
     lambda w: w.receipts.append(Receipt("eA", "n3", "job.failed", "j2", False, 400)),
     ["eA got n3: a bad signature"]),
    ("a webhook-id that is no notification of that endpoint",
     lambda w: w.receipts.append(Receipt("eA", "n1", "job.running", "j1", True, 204)),
     ["eA got n1: not a notification of that endpoint"]),
    ("a made-up webhook-id",
     lambda w: w.receipts.append(Receipt("eA", "evt_nope", "job.failed", "j2", True, 204)),
     ["eA got evt_nope: not a notification of that endpoint"]),
    ("a request to a path no endpoint uses",
     lambda w: w.receipts.append(Receipt(None, "n3", "job.failed", "j2", False, 400)),
     ["an unknown path got n3: a bad signature", "an unknown path got n3: not a notification of that endpoint"]),
    ("a body that is not its notification",
     lambda w: w.receipts.append(Receipt("eA", "n3", "job.succeeded", "j2", True, 204)),
     ["eA got n3: the body says job.succeeded of j2, the notification is job.failed of j2"]),
    ("delivered, never received",
     lambda w: w.drop(w.receipts, lambda r: (r.webhook_id, r.endpoint_id) == ("n3", "eA")),
     ["n3 to eA: delivered, but its receiver never accepted it with a valid signature"]),
    ("delivered, but the receiver only ever answered 500",
     lambda w: w.drop(w.receipts, lambda r: (r.webhook_id, r.endpoint_id) == ("n4", "eB") and r.answered == 204),
     ["n4 to eB: delivered, but its receiver never accepted it with a valid signature"]),
]


@pytest.mark.parametrize("name, breaks, expected", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_kind_of_violation_is_caught(name, breaks, expected):
    world = World()
    breaks(world)
    violations, _ = world.check()
    assert sorted(violations) == sorted(expected)


def test_a_bad_signature_is_counted():
    world = World()
    world.receipts.append(Receipt("eA", "n3", "job.failed", "j2", False, 400))
    assert world.check()[1].bad_signatures == 1


def test_a_failed_delivery_to_a_deleted_endpoint_is_no_violation():
    world = World()
    _failed_for_a_dead_endpoint(world)
    violations, tally = world.check()
    assert violations == [] and (tally.failed, tally.pending) == (1, 0)


@pytest.mark.parametrize("created, deleted, notified, ok", [
    (at(60), None, False, True),  # registered after the job closed: nothing was owed
    (at(60), None, True, False),  # ... and yet notified
    (at(3), None, False, True),  # registered during the job's life: either way
    (at(3), None, True, True),
    (at(0), at(3), True, True),  # deleted during the job's life: either way
    (at(0), at(3), False, True),
    (at(0), at(6), False, False),  # deleted after it closed: it was owed the close
])
def test_an_endpoint_that_came_or_went_during_a_job(created, deleted, notified, ok):
    """o2's job j4 ran from minute 2 to 4; o2 gains one endpoint for closes."""
    world = World()
    world.endpoints.append(Endpoint("eC", "o2", CLOSES, created, deleted))
    if notified:
        world.notifications.append(Notification("n7", "o2", "j4", "job.succeeded", at(4), "j4", "succeeded"))
        world.deliveries.append(Delivery("n7", "eC", "delivered", 1, 204, at(4), False))
        world.receipts.append(Receipt("eC", "n7", "job.succeeded", "j4", True, 204))
    violations, _ = world.check()
    assert (violations == []) is ok, violations


def test_an_uncertain_job_that_closed_may_have_been_notified_once():
    world = World()
    world.drop_notification("n5")  # j5's time as uncertain left no line: not notified is fine too
    assert world.check()[0] == []
    world = World()
    world.notifications.append(Notification("n7", "o1", "j5", "job.uncertain", at(4), "j5", "uncertain"))
    world.deliveries.append(Delivery("n7", "eB", "delivered", 1, 204, at(4), False))
    world.receipts.append(Receipt("eB", "n7", "job.uncertain", "j5", True, 204))
    assert world.check()[0] == ["j5 (expired): 2 job.uncertain notification(s), expected 0 to 1"]


# --- over rows the real statements wrote ----------------------------------------------------

async def _endpoint(conn, owner_id: str, events) -> str:
    from app import ids

    endpoint_id = ids.new_endpoint_id()
    await domain_notifications.create_endpoint(conn, endpoint_id=endpoint_id, owner_id=owner_id,
                                               url="https://hooks.example.com/in", events=list(events),
                                               encrypted_secret=b"sealed")
    return endpoint_id


async def _ran_and_closed(pool, owner_id: str, n: int, status: JobStatus) -> str:
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=f"n{n}", provider="sim", model="m",
                                    input={}, max_credits=5, give_up_after_s=3600)
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)
        assert await jobs.save_task(conn, created.job_id, task_id=f"task-{n}", operation=None,
                                    webhook_secret=b"x", callback_registered=True,
                                    first_check_after_s=30) is jobs.Saved.RUNNING
        assert await jobs.close(conn, created.job_id, status, charge=2 if status == JobStatus.SUCCEEDED else 0)
    return created.job_id


async def _check(db, receipts=None):
    async with db.acquire() as conn:
        check, tally = await invariants.notifications_kept(conn, receipts)
        intents = await invariants.no_intent_for_terminal_job(conn)
    return check, tally, intents


async def test_over_the_rows_the_transitions_wrote(db, make_owner):
    """Endpoints for closes and for every event; a job that ran and
    succeeded, one that ran and failed, and a job of an owner without
    endpoints: the statements wrote each notification with its deliveries
    and intents, pending (no settler runs here) — which holds, and no
    intent is left over. Then the deliveries are recorded as the settler
    records them, and broken one at a time."""
    notified, silent = await make_owner(credits=100), await make_owner(credits=100)
    async with db.acquire() as conn:
        closes = await _endpoint(conn, notified.owner_id, CLOSES)
        every = await _endpoint(conn, notified.owner_id, ALL_EVENTS)
    ok = await _ran_and_closed(db, notified.owner_id, 0, JobStatus.SUCCEEDED)
    bad = await _ran_and_closed(db, notified.owner_id, 1, JobStatus.FAILED)
    await _ran_and_closed(db, silent.owner_id, 2, JobStatus.SUCCEEDED)

    check, tally, intents = await _check(db)
    assert check.violations == [] and (tally.notifications, tally.deliveries, tally.pending) == (4, 6, 6)
    assert intents.violations == [] and "6 notification(s) still being delivered" in intents.note
    assert check.checked == 3 + 4 and check.note == tally.line()

    # Delivered, as the settler records it (each attempt's statement); the intents go with the outcome.
    rows = await db.fetch("select d.id, n.job_id, n.id as nid, n.type, d.endpoint_id from deliveries d "
                          "join notifications n on n.id = d.notification_id")
    async with db.acquire() as conn:
        for r in rows:
            await domain_notifications.record_attempt(conn, r["id"], r["job_id"], "delivered", 204, None)
    await db.execute("delete from outbox where kind = 'notify'")
    receipts = [Receipt(r["endpoint_id"], r["nid"], r["type"], r["job_id"], True, 204) for r in rows]
    check, tally, intents = await _check(db, receipts)
    assert check.violations == [] and (tally.delivered, tally.received, tally.duplicates) == (6, 6, 0)
    assert intents.violations == []

    # A delivered notification's intent left behind is a leftover.
    await db.execute("insert into outbox (job_id, kind, delivery_id) values ($1, 'notify', $2)",
                     rows[0]["job_id"], rows[0]["id"])
    assert len((await _check(db, receipts))[2].violations) == 1
    await db.execute("delete from outbox where kind = 'notify'")

    # Given up while its endpoint is still there.
    await db.execute("update deliveries set status = 'failed' where id = $1", rows[0]["id"])
    check = (await _check(db, receipts))[0]
    assert [v for v in check.violations if "its endpoint still there" in v] and len(check.violations) == 1
    await db.execute("update deliveries set status = 'delivered' where id = $1", rows[0]["id"])

    # The all-events endpoint's running notification of `bad` lost its delivery.
    running = await db.fetchval("select d.id from deliveries d join notifications n on n.id = d.notification_id "
                                "where n.job_id = $1 and n.type = 'job.running'", bad)
    await db.execute("delete from delivery_attempts where delivery_id = $1", running)
    await db.execute("delete from deliveries where id = $1", running)
    check = (await _check(db, receipts))[0]
    assert any(f"no delivery to {every}" in v for v in check.violations), check.violations
    assert any("not a notification of that endpoint" in v for v in check.violations)  # its receipt now

    # A close notified twice (another notification, as if a second close wrote one).
    await db.execute("""insert into notifications (id, owner_id, job_id, type, data)
                        select 'evt_' || repeat('0', 32), owner_id, job_id, type, data from notifications
                        where job_id = $1 and type = 'job.succeeded'""", ok)
    check = (await _check(db, receipts))[0]
    assert f"{ok} (succeeded): 2 job.succeeded notification(s), expected 1" in check.violations
    assert f"evt_{'0' * 32} (job.succeeded of {ok}): no delivery to {closes}, which asked for it" in check.violations


# --- the chaos run's receiver, over real HTTP -------------------------------------------

def _signed(secret: str, notification_id: str, body: dict) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    return raw, delivery.signed_headers(secret, notification_id, int(time.time()), raw)


def test_the_receiver_verifies_fails_first_attempts_and_records_each_request():
    receiver = Receiver("failing", random.Random(1), fail_first=2)
    receiver.server.start()
    try:
        secret = delivery.new_secret()
        receiver.register(0, "we_a", secret)
        body = {"id": "evt_1", "type": "job.succeeded", "created_at": "x", "data": {"id": "job_1"}}
        raw, headers = _signed(secret, "evt_1", body)
        with httpx.Client(trust_env=False, timeout=10) as client:
            answers = [client.post(receiver.url(0), content=raw, headers=headers).status_code for _ in range(3)]
            forged_raw, forged = _signed(delivery.new_secret(), "evt_1", body)
            answers.append(client.post(receiver.url(0), content=forged_raw, headers=forged).status_code)
            answers.append(client.post(receiver.url(7), content=raw, headers=headers).status_code)
    finally:
        receiver.server.stop()
    assert answers == [500, 500, 204, 400, 400]
    ok = Receipt("we_a", "evt_1", "job.succeeded", "job_1", True, 500)
    assert receiver.receipts() == [ok, ok, ok._replace(answered=204), ok._replace(signature_ok=False, answered=400),
                                   ok._replace(endpoint_id=None, signature_ok=False, answered=400)]
    assert receiver.answers() == ({500: 2, 204: 1, 400: 2}, 0)


def test_the_slow_receiver_answers_late_but_in_time():
    receiver = Receiver("slow", random.Random(1), slow_share=1.0, slow_s=(1.0, 1.0))
    receiver.server.start()
    try:
        secret = delivery.new_secret()
        receiver.register(0, "we_s", secret)
        raw, headers = _signed(secret, "evt_2", {"id": "evt_2", "type": "job.running", "data": {"id": "job_2"}})
        started = time.monotonic()
        with httpx.Client(trust_env=False, timeout=10) as client:
            assert client.post(receiver.url(0), content=raw, headers=headers).status_code == 204
        took = time.monotonic() - started
    finally:
        receiver.server.stop()
    assert 1.0 <= took < delivery.SEND_TIMEOUT_S
    assert receiver.answers() == ({204: 1}, 1)


# --- a platform's endpoints receive its owners' notifications (Apps with many users) ----------

def _platform_world() -> World:
    """World, plus platform p (endpoint ePlat: every event) with owners o3
    (endpoint eO3: closes) and o4 (none) under it: o3's j6 ran and
    succeeded (its running to ePlat, its close to both), o4's j7 failed
    before running (its close to ePlat alone). p2 is another platform
    (endpoint eP2: every event) with no owners."""
    w = World()
    w.endpoints += [Endpoint("ePlat", "p", ALL_EVENTS, at(0), None),
                    Endpoint("eO3", "o3", CLOSES, at(0), None),
                    Endpoint("eP2", "p2", ALL_EVENTS, at(0), None)]
    w.jobs += [NotifiedJob("j6", "o3", "succeeded", at(2), at(5), 1, "p"),
               NotifiedJob("j7", "o4", "failed", at(2), at(3), 0, "p")]
    w.notifications += [Notification("n8", "o3", "j6", "job.running", at(3), "j6", "running", "p"),
                        Notification("n9", "o3", "j6", "job.succeeded", at(5), "j6", "succeeded", "p"),
                        Notification("n10", "o4", "j7", "job.failed", at(3), "j7", "failed", "p")]
    added = [Delivery("n8", "ePlat", "delivered", 1, 204, at(3), False),
             Delivery("n9", "ePlat", "delivered", 1, 204, at(5), False),
             Delivery("n9", "eO3", "delivered", 1, 204, at(5), False),
             Delivery("n10", "ePlat", "delivered", 1, 204, at(3), False)]
    w.deliveries += added
    for d in added:
        n = w.notification(d.notification_id)
        w.receipts.append(Receipt(d.endpoint_id, n.id, n.type, n.job_id, True, 204))
    return w


def test_a_platforms_endpoints_get_its_owners_notifications_and_are_counted():
    violations, tally = _platform_world().check()
    assert violations == []
    assert (tally.notifications, tally.deliveries, tally.to_platforms) == (9, 13, 3)
    assert "3 of the deliveries to a platform's endpoints" in tally.line()


def _to_other_platform(w: World) -> None:
    w.deliveries.append(Delivery("n10", "eP2", "delivered", 1, 204, at(3), False))
    w.receipts.append(Receipt("eP2", "n10", "job.failed", "j7", True, 204))


def _plain_owner_to_platform(w: World) -> None:
    w.deliveries.append(Delivery("n3", "ePlat", "delivered", 1, 204, at(3), False))
    w.receipts.append(Receipt("ePlat", "n3", "job.failed", "j2", True, 204))


BROKEN_PLATFORM = [
    ("the platform's endpoint missed its owner's close",
     lambda w: (w.drop(w.deliveries, lambda d: (d.notification_id, d.endpoint_id) == ("n9", "ePlat")),
                w.drop(w.receipts, lambda r: (r.webhook_id, r.endpoint_id) == ("n9", "ePlat"))),
     ["n9 (job.succeeded of j6): no delivery to ePlat, which asked for it"]),
    ("the owner's own endpoint missed the close the platform got",
     lambda w: (w.drop(w.deliveries, lambda d: (d.notification_id, d.endpoint_id) == ("n9", "eO3")),
                w.drop(w.receipts, lambda r: (r.webhook_id, r.endpoint_id) == ("n9", "eO3"))),
     ["n9 (job.succeeded of j6): no delivery to eO3, which asked for it"]),
    ("a job only the platform's endpoint asked for, not notified", lambda w: w.drop_notification("n10"),
     ["j7 (failed): 0 job.failed notification(s), expected 1"]),
    ("another platform's endpoint got it", _to_other_platform,
     ["n10 (job.failed of j7): a delivery to eP2, which did not ask for it"]),
    ("a platform's endpoint got the job of an owner not under it", _plain_owner_to_platform,
     ["n3 (job.failed of j2): a delivery to ePlat, which did not ask for it"]),
    ("a notification that does not name its owner's platform",
     lambda w: w.replace(w.notifications, lambda n: n.id == "n10", platform_id=None),
     ["n10 (job.failed of j7): its platform None, its job's owner's p"]),
    ("a plain owner's notification naming a platform",
     lambda w: w.replace(w.notifications, lambda n: n.id == "n3", platform_id="p"),
     ["n3 (job.failed of j2): its platform p, its job's owner's None"]),
    ("the platform's endpoint given its owner's close twice",
     lambda w: w.deliveries.append(Delivery("n9", "ePlat", "delivered", 1, 204, at(5), False)),
     ["n9 (job.succeeded of j6): 2 deliveries to ePlat"]),
]


@pytest.mark.parametrize("name, breaks, expected", BROKEN_PLATFORM, ids=[b[0] for b in BROKEN_PLATFORM])
def test_each_platform_violation_is_caught(name, breaks, expected):
    world = _platform_world()
    breaks(world)
    violations, _ = world.check()
    assert sorted(violations) == sorted(expected)


def test_a_platform_endpoint_deleted_before_its_owners_job_is_owed_nothing():
    world = _platform_world()
    world.replace(world.endpoints, lambda e: e.id == "ePlat", deleted_at=at(1))
    violations, _ = world.check()
    assert sorted(violations) == ["j6 (succeeded): 1 job.running notification(s), expected 0",
                                  "j7 (failed): 1 job.failed notification(s), expected 0",
                                  "n10 (job.failed of j7): a delivery to ePlat, which did not ask for it",
                                  "n8 (job.running of j6): a delivery to ePlat, which did not ask for it",
                                  "n9 (job.succeeded of j6): a delivery to ePlat, which did not ask for it"]
    world.drop_notification("n8")
    world.drop_notification("n10")
    world.drop(world.deliveries, lambda d: d.endpoint_id == "ePlat")
    world.drop(world.receipts, lambda r: r.endpoint_id == "ePlat")
    violations, tally = world.check()
    assert violations == [] and tally.to_platforms == 0


async def test_over_the_rows_written_for_a_platforms_owner(db, make_owner):
    """A platform with an endpoint for every event, an owner under it (made
    as `POST /v1/owners` makes it) with its own endpoint for closes, and a
    plain owner with none: the transitions wrote the owner's job's
    notifications with the platform named and a delivery to each endpoint
    that asked, the plain owner's job none — which holds; a delivery to the
    platform's endpoint lost is caught."""
    from app.domain import owners

    platform = await make_owner(credits=0, platform=True)
    plain = await make_owner(credits=100)
    async with db.acquire() as conn:
        user, _ = await owners.create_under(conn, platform.owner_id, name="a user", credits=100, max_active=10,
                                            request_key="u1")
        every = await _endpoint(conn, platform.owner_id, ALL_EVENTS)
        await _endpoint(conn, user.id, CLOSES)
    job = await _ran_and_closed(db, user.id, 0, JobStatus.SUCCEEDED)
    await _ran_and_closed(db, plain.owner_id, 1, JobStatus.SUCCEEDED)

    check, tally, _ = await _check(db)
    assert check.violations == []
    assert (tally.notifications, tally.deliveries, tally.to_platforms) == (2, 3, 2)
    named = await db.fetch("select distinct platform_id from notifications where job_id = $1", job)
    assert [r["platform_id"] for r in named] == [platform.owner_id]

    lost = await db.fetchval("""select d.id from deliveries d join notifications n on n.id = d.notification_id
                                where d.endpoint_id = $1 and n.type = 'job.succeeded'""", every)
    await db.execute("delete from outbox where delivery_id = $1", lost)
    await db.execute("delete from deliveries where id = $1", lost)
    check = (await _check(db))[0]
    assert [v for v in check.violations if f"no delivery to {every}" in v] and len(check.violations) == 1
