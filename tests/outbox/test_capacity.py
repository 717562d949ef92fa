"""Provider capacity shared by all settlers: caps counted in the database
(two settler processes never exceed them), a place that frees wakes a
waiting job at once, a provider's 429 pauses its submits everywhere while
other providers flow, and per-model give-up deadlines. Real PostgreSQL,
real settlers (in-process and as processes), the simulator, and a scripted
provider for the 429."""
from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time

import pytest

from app.capacity import CAPACITY_BACKSTOP_S, Caps, capped_providers, caps_for, is_capped
from app.config import load_settings
from app.domain import recovery
from app.models_file import parse
from app.vocabulary import IntentKind, JobError, JobStatus
from outbox import decide, policy
from outbox.roads.sweep import sweep_once
from tests.outbox.conftest import assert_money_balances, server_now, wait_for_settlers, wait_for_status
from tests.outbox.test_races import env_of, settler_process
from tests.providers.scripted import Script
from tests.roads.conftest import provider_env
from tests.support.loopback import LoopbackServer
from tests.support.simulator import clear_faults, set_faults, stats

S = JobStatus
SUBMITTED = ("submitting", "running", "uncertain")
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def settings_with(models: str = "", **env):
    base = {"DATABASE_URL": "postgresql://x/y", "SECRET_KEY": "k" * 32}
    settings = load_settings({**base, **env})
    return settings if not models else settings.__class__(**{**settings.__dict__, "models": parse(models)})


CAPPED_MODELS = '[[models]]\nprovider = "kie"\nmodel = "veo/*"\nmax_in_flight = 2\n' \
                '[[models]]\nprovider = "kie"\nmodel = "*"\n'


@pytest.mark.parametrize(("env", "models", "provider", "model", "caps"), [
    ({}, "", "kie", "veo/x", Caps()),
    ({"MAX_IN_FLIGHT_KIE": "5"}, "", "kie", "veo/x", Caps(provider_cap=5)),
    ({}, CAPPED_MODELS, "kie", "veo/x", Caps(entry="veo/*", entry_cap=2)),
    ({}, CAPPED_MODELS, "kie", "flux-kontext/x", Caps()),  # its first match has no cap
    ({"MAX_IN_FLIGHT_KIE": "5"}, CAPPED_MODELS, "kie", "veo/x", Caps(provider_cap=5, entry="veo/*", entry_cap=2)),
    ({"MAX_IN_FLIGHT_KIE": "5"}, "", "fal", "x", Caps()),
])
def test_which_caps_hold_for_a_job(env, models, provider, model, caps):
    assert caps_for(settings_with(models, **env), provider, model) == caps


def test_capped_providers_and_a_bad_cap():
    settings = settings_with(CAPPED_MODELS, MAX_IN_FLIGHT_ELEVENLABS="2")
    assert capped_providers(settings) == {"elevenlabs": 2, "kie": None}
    assert is_capped(settings, "kie") and is_capped(settings, "elevenlabs") and not is_capped(settings, "fal")
    with pytest.raises(Exception, match="MAX_IN_FLIGHT_FAL must be at least 1"):
        load_settings({"DATABASE_URL": "postgresql://x/y", "SECRET_KEY": "k" * 32, "MAX_IN_FLIGHT_FAL": "0"})


@pytest.mark.parametrize(("status", "has_task", "paused_until", "expected"), [
    (S.CANCELLED, False, None, decide.DONE),
    (S.RUNNING, True, None, decide.DONE),
    (S.SUBMITTING, True, None, decide.DONE),
    (S.QUEUED, False, NOW + dt.timedelta(seconds=12), decide.Wait(12.0, decide.PAUSED)),
    (S.QUEUED, False, None, decide.Wait(60.0, decide.WAITING_FOR_CAPACITY)),
    (S.QUEUED, False, NOW - dt.timedelta(seconds=1), decide.Wait(60.0, decide.WAITING_FOR_CAPACITY)),
])
def test_what_a_claim_that_took_nothing_means(status, has_task, paused_until, expected):
    assert decide.not_claimed(status, has_task, paused_until, now=NOW, backstop_s=60.0) == expected


async def _peak_submitted(db, provider: str, stop: asyncio.Event) -> int:
    """The most jobs of `provider` the database ever showed submitted at once."""
    peak = 0
    while not stop.is_set():
        n = await db.fetchval("select count(*) from jobs where provider = $1 and status = any($2::text[])",
                              provider, list(SUBMITTED))
        peak = max(peak, n)
        await asyncio.sleep(0.01)
    return peak


async def test_two_settler_processes_never_exceed_a_cap_of_3_and_all_30_jobs_succeed(
        web, make_owner, db, sim, make_settings, tmp_objects):
    server = await web(SIM_URL=sim.url)
    owner = await make_owner(credits=10_000, max_active=100)
    # Webhooks close each job as its task ends: a place frees within a second
    # of the task, far inside the 60 s backstop a lost wake would cost.
    env = env_of(make_settings, sim, tmp_objects, MAX_IN_FLIGHT_SIM=3, PUBLIC_URL=server.url)
    since = await server_now(db)
    procs = [settler_process(env) for _ in range(2)]
    stop = asyncio.Event()
    watcher = asyncio.create_task(_peak_submitted(db, "sim", stop))
    started = time.monotonic()
    try:
        await wait_for_settlers(db, 2, started_after=since)
        async with server.client(owner.api_key) as c:
            ids = [(await c.post("/v1/jobs", json={"provider": "sim", "model": "m", "max_credits": 5,
                                                   "input": {"duration_s": 0.5}})).json()["id"]
                   for _ in range(30)]
        for job_id in ids:
            # Woken as places free, not after the 60 s backstop: 30 jobs of
            # about a second (a 0.5 s task and its webhook), 3 at a time.
            await wait_for_status(db, job_id, S.SUCCEEDED, timeout=120)
        took = time.monotonic() - started
    finally:
        stop.set()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
    peak = await watcher
    assert peak == 3, f"at most 3 submitted at once, the database showed {peak}"
    # The provider's own count: never more than 3 of its tasks running at once.
    assert 1 <= stats(sim.url)["peak_concurrent"]["/v1"] <= 3
    assert took < 55, f"30 jobs took {took:.0f} s: waiting jobs were not woken"
    await assert_money_balances(db)


async def test_a_models_file_entry_caps_its_models_and_not_the_others(web, make_owner, db, sim, make_settings,
                                                                      start_settler, tmp_path):
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nprovider = "sim"\nmodel = "capped-*"\nmax_in_flight = 2\n')
    env = {"SIM_URL": sim.url, "MODELS_FILE": str(models)}
    server = await web(**env)
    await start_settler(make_settings(**env), concurrency=16)
    owner = await make_owner(credits=10_000, max_active=100)
    stop = asyncio.Event()

    async def peak_of(model_like: str) -> int:
        peak = 0
        while not stop.is_set():
            n = await db.fetchval("select count(*) from jobs where model like $1 and status = any($2::text[])",
                                  model_like, list(SUBMITTED))
            peak = max(peak, n)
            await asyncio.sleep(0.01)
        return peak

    capped, free = asyncio.create_task(peak_of("capped-%")), asyncio.create_task(peak_of("free"))
    async with server.client(owner.api_key) as c:
        ids = [(await c.post("/v1/jobs", json={"provider": "sim", "model": model, "max_credits": 5,
                                               "input": {"duration_s": 1.0}})).json()["id"]
               for model in ["capped-a", "capped-b"] * 4 + ["free"] * 6]
    for job_id in ids:
        await wait_for_status(db, job_id, S.SUCCEEDED, timeout=90)
    stop.set()
    assert await capped == 2
    assert await free == 6  # not held back by the other model's cap



async def test_a_freed_place_goes_to_a_waiting_job_that_can_take_it(web, make_owner, db, sim, make_settings,
                                                                   start_settler, tmp_path):
    """The provider holds 2; `held-*` 1 of them. With `held-a` running long
    and `other-b` closing, the oldest waiting job (`held-c`, its entry
    full) cannot take the freed place, the younger `other-d` can: it is
    woken by the close, not by the 60 s safety net."""
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nprovider = "sim"\nmodel = "held-*"\nmax_in_flight = 1\n')
    env = {"SIM_URL": sim.url, "MODELS_FILE": str(models), "MAX_IN_FLIGHT_SIM": "2"}
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=10_000, max_active=100)

    async with server.client(owner.api_key) as c:
        async def create(model: str, duration_s: float) -> str:
            return (await c.post("/v1/jobs", json={"provider": "sim", "model": model, "max_credits": 5,
                                                   "input": {"duration_s": duration_s}})).json()["id"]

        held_a = await create("held-a", 120.0)
        await wait_for_status(db, held_a, S.RUNNING, timeout=30)
        other_b = await create("other-b", 3.0)
        await wait_for_status(db, other_b, S.RUNNING, timeout=30)
        held_c = await create("held-c", 1.0)
        other_d = await create("other-d", 1.0)
        await wait_for_status(db, other_b, S.SUCCEEDED, timeout=30)
        closed_at = time.monotonic()
        await wait_for_status(db, other_d, S.SUCCEEDED, timeout=90)
        waited = time.monotonic() - closed_at
        assert await db.fetchval("select status from jobs where id = $1", held_c) == S.QUEUED
        await c.post(f"/v1/jobs/{held_a}/cancel")
    # Woken by other-b's close, then its own second; the safety net would take about 57 s here.
    assert waited < CAPACITY_BACKSTOP_S / 2, f"other-d waited {waited:.1f} s for a free place"
    await wait_for_status(db, held_c, S.SUCCEEDED, timeout=30)

@pytest.mark.parametrize("closed_by", ["operator", "sweep"])
async def test_an_uncertain_jobs_place_wakes_a_waiting_job_when_it_is_closed(closed_by, web, make_owner, db, sim,
                                                                           make_settings, start_settler):
    """fal capped at 1; its one place held by an uncertain job (its submit's
    answer lost, fal has no look-up). Closing it, whether an operator
    resolves it as failed or the backstop sweep expires it past its
    deadline, wakes the job waiting for the place: it runs at once, not
    after the 60 s safety net."""
    set_faults(sim.url, submit_timeout_after_create=1, drop_webhook=1)
    env = provider_env(sim.url, MAX_IN_FLIGHT_FAL="1")
    server = await web(**env)
    settings = make_settings(**env)
    await start_settler(settings, provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        async def create() -> str:
            r = await c.post("/v1/jobs", json={"provider": "fal", "model": "fal-ai/flux/dev", "max_credits": 10,
                                               "input": {"duration_s": 0.2}})
            assert r.status_code == 202, r.text
            return r.json()["id"]

        held = await create()
        await wait_for_status(db, held, S.UNCERTAIN, timeout=30)
        clear_faults(sim.url)
        waiting = await create()
        await wait_until_waiting(db, waiting)

    closed_at = time.monotonic()
    if closed_by == "operator":
        async with db.acquire() as conn:
            await recovery.resolve_failed(conn, held, settings)
    else:
        await db.execute("update jobs set deadline_at = now() - interval '1 second' where id = $1", held)
        assert (await sweep_once(db, settings)).expired == [held]
    await wait_for_status(db, waiting, S.SUCCEEDED, timeout=CAPACITY_BACKSTOP_S + 30)
    waited = time.monotonic() - closed_at
    assert waited < CAPACITY_BACKSTOP_S / 2, f"the waiting job waited {waited:.1f} s for the freed place"
    await assert_money_balances(db)


async def wait_until_waiting(db, job_id: str) -> None:
    """The job's submit claimed it, found the cap full and went back to
    wait (its intent unclaimed and due later: the safety net's time)."""
    for _ in range(300):
        row = await db.fetchrow("select o.claimed_until, o.not_before > now() + interval '30 seconds' as later"
                                " from outbox o join jobs j on j.id = o.job_id"
                                " where o.job_id = $1 and o.kind = 'submit' and j.status = 'queued'", job_id)
        if row and row["claimed_until"] is None and row["later"]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job_id} never waited for a place")


async def test_a_429_pauses_that_provider_in_every_settler_while_others_flow(
        web, make_owner, db, sim, make_settings, start_settler, serve_script):
    # Replicate answers 429 with Retry-After: 30; the simulator's jobs keep going.
    script = Script()
    script.answer(429, {"title": "Too Many Requests", "detail": "slow down", "status": 429},
                  headers={"retry-after": "30"})
    replicate = serve_script(script)
    env = {"SIM_URL": sim.url, "REPLICATE_BASE_URL": replicate.url, "REPLICATE_API_TOKEN": "r8_pause_test"}
    server = await web(**env)
    for _ in range(2):
        await start_settler(make_settings(**env))
    owner = await make_owner(credits=10_000, max_active=100)
    async def replicate_job(i: int) -> str:
        return (await c.post("/v1/jobs", json={"provider": "replicate", "model": "acme/model",
                                               "input": {"prompt": str(i)}, "max_credits": 5})).json()["id"]

    async with server.client(owner.api_key) as c:
        paused = [await replicate_job(0)]
        deadline = time.monotonic() + 15
        while not await db.fetchval("select count(*) from provider_pauses where provider = 'replicate'"):
            assert time.monotonic() < deadline, "the 429 paused nothing"
            await asyncio.sleep(0.02)
        paused += [await replicate_job(i) for i in range(1, 4)]
        flowing = [(await c.post("/v1/jobs", json={"provider": "sim", "model": "m", "max_credits": 5,
                                                   "input": {"duration_s": 0.3}})).json()["id"] for _ in range(4)]
    for job_id in flowing:
        await wait_for_status(db, job_id, S.SUCCEEDED, timeout=30)
    creates = [s for s in script.seen if s.method == "POST"]
    assert len(creates) == 1, f"{len(creates)} creates reached a provider that asked us to wait"
    until = await db.fetchval("select until - now() from provider_pauses where provider = 'replicate'")
    assert dt.timedelta(0) < until <= dt.timedelta(seconds=30)  # still paused, no longer than it asked
    statuses = sorted(r["status"] for r in await db.fetch("select status from jobs where id = any($1::text[])",
                                                           paused))
    # Waiting, nothing failed: the one that was answered 429 keeps its claim.
    assert statuses == [S.QUEUED, S.QUEUED, S.QUEUED, S.SUBMITTING]
    attempts = await db.fetch("select attempts from outbox where job_id = any($1::text[])", paused)
    assert all(r["attempts"] <= 1 for r in attempts)  # a pause is not a failed attempt



async def test_a_provider_that_keeps_answering_429_delays_a_job_and_never_fails_it(
        web, make_owner, db, make_settings, start_settler, serve_script):
    """Each 429 with Retry-After is waited out and counts as no failed
    attempt: more of them than the submit's attempt cap (8) leave the job
    waiting, its give-up deadline the bound, not `settle_exhausted`."""
    script = Script()
    script.answer(429, {"title": "Too Many Requests", "detail": "slow down", "status": 429},
                  headers={"retry-after": "0.1"})
    replicate = serve_script(script)
    env = {"REPLICATE_BASE_URL": replicate.url, "REPLICATE_API_TOKEN": "r8_throttle_test"}
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json={"provider": "replicate", "model": "acme/model",
                                                 "input": {"prompt": "x"}, "max_credits": 5})).json()["id"]
        wanted = policy.MAX_ATTEMPTS[IntentKind.SUBMIT] + 2  # each a second apart (policy.MIN_ASKED_WAIT_S)
        deadline = time.monotonic() + 90
        while len([s for s in script.seen if s.method == "POST"]) < wanted:
            assert time.monotonic() < deadline, f"{len(script.seen)} requests, then none"
            row = await db.fetchrow("select status, error_code from jobs where id = $1", job_id)
            assert row["status"] in (S.QUEUED, S.SUBMITTING), dict(row)
            await asyncio.sleep(0.05)
        row = await db.fetchrow("select status, error_code from jobs where id = $1", job_id)
        assert row["status"] in (S.QUEUED, S.SUBMITTING) and row["error_code"] is None, dict(row)
        assert await db.fetchval("select attempts from outbox where job_id = $1 and kind = 'submit'",
                                 job_id) <= 1
        cancelled = (await c.post(f"/v1/jobs/{job_id}/cancel")).json()
    assert cancelled["status"] == S.CANCELLED and cancelled["credits"]["refunded"] == 5
    await assert_money_balances(db)

async def test_a_models_give_up_expires_its_job_while_another_models_job_runs_on(
        web, make_owner, db, sim, make_settings, start_settler, tmp_path):
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nprovider = "sim"\nmodel = "short"\ngive_up_after_s = 2\n')
    env = {"SIM_URL": sim.url, "MODELS_FILE": str(models)}
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        short = (await c.post("/v1/jobs", json={"provider": "sim", "model": "short", "max_credits": 5,
                                                "input": {"duration_s": 30}})).json()
        # Long enough that it is surely still running when the other expires.
        long = (await c.post("/v1/jobs", json={"provider": "sim", "model": "long", "max_credits": 5,
                                               "input": {"duration_s": 12}})).json()
    row = await wait_for_status(db, short["id"], S.EXPIRED, timeout=30)
    assert row["error_code"] == JobError.GIVE_UP
    assert (await db.fetchval("select status from jobs where id = $1", long["id"])) in (S.RUNNING, S.SUBMITTING)
    await wait_for_status(db, long["id"], S.SUCCEEDED, timeout=60)
    await assert_money_balances(db)


@pytest.fixture
def serve_script():
    servers: list[LoopbackServer] = []

    def start(script: Script) -> Script:
        server = LoopbackServer(script.app()).start()
        servers.append(server)
        script.url = server.url
        return script

    yield start
    for server in servers:
        server.stop()


async def test_status_shows_each_capped_provider_and_its_pause(db, make_settings):
    from app.status import collect, render

    await db.execute("insert into provider_pauses (provider, until, reason) values ('kie', now() + interval '40 s', "
                     "'kie: not now (HTTP 429)')")
    try:
        async with db.acquire() as conn:
            text = render(await collect(conn, {"kie": 5, "fal": None}))
    finally:
        await db.execute("delete from provider_pauses")
    assert "provider: kie 0 in flight of 5, paused" in text
    assert "provider: fal 0 in flight (capped per model)" in text



async def test_metrics_show_each_capped_providers_jobs_cap_and_pause(web, db):
    server = await web(MAX_IN_FLIGHT_FAL="8")
    await db.execute("insert into provider_pauses (provider, until, reason) values ('fal', now() + interval '40 s', "
                     "'fal: rate limited (HTTP 429)')")
    async with server.client() as c:
        text = (await c.get("/metrics")).text
    assert 'longcall_provider_max_in_flight{provider="fal"} 8.0' in text
    assert 'longcall_provider_submitted_jobs{provider="fal"} 0.0' in text
    paused = [line for line in text.splitlines() if line.startswith('longcall_provider_paused_seconds{provider="fal"}')]
    assert paused and 0 < float(paused[0].rsplit(" ", 1)[1]) <= 40
