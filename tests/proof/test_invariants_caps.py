"""The invariants on caps: "no provider ever had more in flight than its
cap", held to the simulator's own peak per protocol prefix where a cap
covers a whole prefix, and to samples of the database (CAP_SAMPLE read from
a real database, tallied per cap: an entry's cap counts only the jobs whose
first matching entry it is). Each passes a system under its caps and fails
one over a cap by one."""
from __future__ import annotations

import pytest

from app.domain import jobs
from app.models_file import parse
from app.vocabulary import TERMINAL, JobStatus
from proof import invariants
from proof.invariants import Cap, CapTally

SIM_CHECK = "no provider had more in flight than its cap (simulator)"
DB_CHECK = "no cap exceeded in the database (sampled)"
MODELS = parse("""
[[models]]
provider = "elevenlabs"
model = "text-to-speech/*"
max_in_flight = 2

[[models]]
provider = "sim"
model = "image-*"
max_in_flight = 3

[[models]]
provider = "sim"
model = "*"
""")
FAL = Cap("fal", 4)
SPEECH = Cap("elevenlabs", 2, "text-to-speech/*")
SIM_IMAGES = Cap("sim", 3, "image-*")


def test_the_caps_of_a_models_file_and_an_environment():
    assert invariants.caps_of(MODELS, {"MAX_IN_FLIGHT_FAL": "4", "MAX_IN_FLIGHT_BOGUS": "1"}) == [
        FAL, SPEECH, SIM_IMAGES]
    assert [c.name for c in (FAL, SPEECH)] == ["MAX_IN_FLIGHT_FAL=4",
                                               "elevenlabs text-to-speech/* max_in_flight=2"]


@pytest.mark.parametrize("cap, provider, model, covered", [
    (FAL, "fal", "anything", True),
    (FAL, "sim", "image-fast", False),
    (SPEECH, "elevenlabs", "text-to-speech/voice", True),
    (SPEECH, "elevenlabs", "sound-generation", False),
    (SIM_IMAGES, "sim", "image-fast", True),
    (SIM_IMAGES, "sim", "video-slow", False),  # its first match is `*`, which has no cap
])
def test_which_jobs_a_cap_counts(cap, provider, model, covered):
    assert cap.covers(MODELS, provider, model) is covered


def _row(provider: str, model: str, status: str, n: int) -> dict:
    return {"provider": provider, "model": model, "status": status, "n": n}


def test_a_tally_counts_submitted_jobs_and_when_the_cap_bound():
    tally = CapTally(SIM_IMAGES)
    tally.add(MODELS, [_row("sim", "image-fast", "running", 2), _row("sim", "image-fast", "queued", 5)], 1.0)
    # full: 1 submitting + 1 running + 1 uncertain, with a job waiting; the other sim model is not counted
    tally.add(MODELS, [_row("sim", "image-fast", "submitting", 1), _row("sim", "image-fast", "running", 1),
                       _row("sim", "image-fast", "uncertain", 1), _row("sim", "video-slow", "running", 9),
                       _row("sim", "image-fast", "queued", 1)], 2.0)
    tally.add(MODELS, [_row("sim", "image-x", "running", 3)], 3.0)  # full, nobody waiting
    assert (tally.samples, tally.peak, tally.peak_at_s, tally.bound) == (3, 3, 2.0, 1)
    assert invariants.caps_in_database([tally]).ok
    tally.add(MODELS, [_row("sim", "image-fast", "running", 4)], 4.0)
    check = invariants.caps_in_database([tally])
    assert check.violations == ["sim image-* max_in_flight=3: 4 jobs submitted at once (at 4.0 s)"]
    assert check.checked == 4


async def _job(pool, owner_id: str, n: int, provider: str, model: str, status: str) -> str:
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=f"c{n}", provider=provider, model=model,
                                    input={}, max_credits=1, give_up_after_s=3600)
    if status != JobStatus.QUEUED:
        await _set(pool, created.job_id, status)
    return created.job_id


async def _set(pool, job_id: str, status: str) -> None:
    """The job's status changed by hand (a closed one finished now): only what the caps count matters here."""
    closed = status in TERMINAL
    await pool.execute("update jobs set status = $2, finished_at = case when $3 then now() end, "
                       "credits_refunded = case when $3 then credits_reserved else 0 end where id = $1",
                       job_id, status, closed)


@pytest.fixture
async def capped(db, make_owner):
    """Jobs of the capped providers, each cap full: 4 fal jobs submitted
    (and one waiting), 2 speech calls running beside a sound effect (not
    under the speech cap) and a dub, 3 sim images submitted beside a sim
    job of another model."""
    owner = await make_owner(credits=1000, max_active=100)
    made = [("fal", "fal-ai/flux/dev", s) for s in ("submitting", "running", "running", "uncertain", "queued")]
    made += [("elevenlabs", "text-to-speech/v", "submitting"), ("elevenlabs", "text-to-speech/v", "submitting"),
             ("elevenlabs", "sound-generation", "submitting"), ("elevenlabs", "dubbing", "running")]
    made += [("sim", "image-fast", "running")] * 3 + [("sim", "video-slow", "running")]
    made += [("fal", "fal-ai/flux/dev", "cancelled")] * 2  # closed: not counted
    ids = [await _job(db, owner.owner_id, n, *m) for n, m in enumerate(made)]
    return db, ids


async def _sample(db, caps) -> list[CapTally]:
    tallies = [CapTally(c) for c in caps]
    rows = await db.fetch(invariants.CAP_SAMPLE, sorted({c.provider for c in caps}))
    for t in tallies:
        t.add(MODELS, rows, 0.5)
    return tallies


async def test_database_samples_of_full_caps_pass_and_one_more_fails(capped):
    db, _ = capped
    tallies = await _sample(db, [FAL, SPEECH, SIM_IMAGES])
    assert [(t.peak, t.bound) for t in tallies] == [(4, 1), (2, 0), (3, 0)]
    assert invariants.caps_in_database(tallies).ok
    owner_id = await db.fetchval("select owner_id from jobs limit 1")
    for n, (cap, model) in enumerate([(FAL, "fal-ai/flux/dev"), (SPEECH, "text-to-speech/v"),
                                      (SIM_IMAGES, "image-fast")]):
        one_more = await _job(db, owner_id, 100 + n, cap.provider, model, "running")
        check = invariants.caps_in_database(await _sample(db, [FAL, SPEECH, SIM_IMAGES]))
        assert [v.split(":")[0] for v in check.violations] == [cap.name]
        await _set(db, one_more, JobStatus.CANCELLED)


@pytest.mark.parametrize("peaks, violations", [
    ({"/fal": 4, "/v1": 3, "/elevenlabs": 9}, 0),  # /elevenlabs has dubs and sound too: not the speech cap's
    ({"/fal": 5, "/v1": 3}, 1),
    ({"/fal": 4, "/v1": 4}, 0),  # sim has a model not under its entry cap: /v1 is not the cap's alone
    ({}, 0),
])
async def test_the_simulator_peak_of_a_prefix_a_cap_covers(capped, peaks, violations):
    db, _ = capped
    async with db.acquire() as conn:
        check = await invariants.caps_at_provider(conn, {"peak_concurrent": peaks}, [FAL, SPEECH, SIM_IMAGES],
                                                  MODELS)
    assert len(check.violations) == violations
    assert check.checked == 1  # only MAX_IN_FLIGHT_FAL speaks for a whole prefix here


async def test_an_entry_cap_over_every_model_of_its_provider_speaks_for_its_prefix(capped):
    db, _ = capped
    await db.execute("update jobs set model = 'image-slow' where model = 'video-slow'")
    async with db.acquire() as conn:
        ok = await invariants.caps_at_provider(conn, {"peak_concurrent": {"/v1": 3}}, [SIM_IMAGES], MODELS)
        over = await invariants.caps_at_provider(conn, {"peak_concurrent": {"/v1": 4}}, [SIM_IMAGES], MODELS)
    assert ok.ok and ok.checked == 1 and ok.note == "/v1 peak 3 (sim image-* max_in_flight=3)"
    assert over.violations == ["/v1: 4 tasks and calls in flight at once at the provider, "
                               "over sim image-* max_in_flight=3"]


async def test_the_simulator_check_runs_with_the_system_checks(capped, tmp_objects):
    """system_checks holds the simulator's peaks to the caps it is given."""
    from app.storage import FileStorage

    db, _ = capped
    for job_id in await db.fetch("select id from jobs where status <> 'cancelled'"):
        await _set(db, job_id["id"], JobStatus.CANCELLED)
    async with db.acquire() as conn:
        checks = await invariants.system_checks(conn, sim_stats={"peak_concurrent": {"/fal": 5}},
                                                storage=FileStorage(str(tmp_objects)), models=MODELS, caps=[FAL])
    assert [c.violations for c in checks if c.name == SIM_CHECK] == [
        ["/fal: 5 tasks and calls in flight at once at the provider, over MAX_IN_FLIGHT_FAL=4"]]
