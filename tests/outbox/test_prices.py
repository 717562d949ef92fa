"""Prices on what was measured, end to end: a models file, the web API, the
settler, real PostgreSQL, files storage and the simulator. Seconds are read
from the stored WAV by mutagen; tokens come from the LLM's usage; the charge
is capped at the reservation and the job keeps how it was reached."""
from __future__ import annotations

import pytest

from app.vocabulary import JobStatus
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.outbox.test_sync_jobs import as_json, claude_job, speech_job, sync_env

MODELS = """
[[models]]
provider = "elevenlabs"
model = "text-to-speech/*"
price = { credits = 3, per = "second" }

[[models]]
provider = "anthropic"
model = "claude-*"
price = { credits = 0.8, per = "1k_tokens" }

[[models]]
provider = "sim"
model = "per-output"
price = { credits = 2.5, per = "output" }
give_up_after_s = 900

[[models]]
provider = "sim"
model = "per-second"
price = { credits = 3, per = "second" }
"""


@pytest.fixture
def models_file(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(MODELS)
    return str(path)


async def _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job: dict):
    env = sync_env(sim.url, MODELS_FILE=models_file)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=1000)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job)).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED), timeout=30)
        assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    await assert_money_balances(db)
    return row, got


async def test_a_per_second_price_on_a_7_5_s_wav_charges_the_rounded_up_credits(
        web, make_owner, db, sim, make_settings, start_settler, models_file):
    job = {**speech_job(output_duration_s=7.5), "max_credits": 100}
    row, got = await _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job)
    assert got["outputs"][0]["content_type"] == "audio/wav"
    assert got["credits"] == {"reserved": 100, "charged": 23, "refunded": 77}  # ceil(3 x 7.5)
    assert as_json(row["price_applied"]) == {"price": {"credits": 3, "per": "second"}, "reserved": 100,
                                             "measure": 7.5, "charged": 23}


async def test_a_price_above_the_reservation_is_capped_and_says_so(
        web, make_owner, db, sim, make_settings, start_settler, models_file):
    job = {**speech_job(output_duration_s=7.5), "max_credits": 20}
    row, got = await _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job)
    assert got["credits"] == {"reserved": 20, "charged": 20, "refunded": 0}
    assert as_json(row["price_applied"])["note"] == "23 credits by the price, capped at the reservation"


async def test_audio_no_library_can_read_is_charged_the_reservation_and_says_so(
        web, make_owner, db, sim, make_settings, start_settler, models_file):
    # Without output_duration_s the simulator's audio is bytes, not a WAV.
    job = {**speech_job(output_bytes=5000), "max_credits": 40}
    row, got = await _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job)
    assert got["credits"] == {"reserved": 40, "charged": 40, "refunded": 0}
    applied = as_json(row["price_applied"])
    assert applied["measure"] is None and "could not be read" in applied["note"]


async def test_a_per_second_price_with_no_audio_or_video_output_is_0_seconds(
        web, make_owner, db, sim, make_settings, start_settler, models_file):
    """CONTRACT: `second` is the summed duration of the stored audio/video
    outputs; of none, that is 0 (it was charged the reservation)."""
    job = {"provider": "sim", "model": "per-second", "input": {"duration_s": 0, "outputs": 2}, "max_credits": 30}
    row, got = await _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job)
    assert [o["content_type"] for o in got["outputs"]] == ["image/png", "image/png"]
    assert got["credits"] == {"reserved": 30, "charged": 0, "refunded": 30}
    assert as_json(row["price_applied"]) == {"price": {"credits": 3, "per": "second"}, "reserved": 30,
                                             "measure": 0, "charged": 0}


async def test_tokens_from_a_sync_llm_call_are_priced(web, make_owner, db, sim, make_settings, start_settler,
                                                      models_file):
    job = {**claude_job(input_tokens=1200, output_tokens=345), "max_credits": 10}
    job["input"]["max_tokens"] = 1000  # the simulator reports no more output tokens than asked for
    row, got = await _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job)
    assert got["credits"] == {"reserved": 10, "charged": 2, "refunded": 8}  # ceil(0.8 x 1.545)
    assert as_json(row["price_applied"])["measure"] == 1.545


async def test_an_async_job_priced_per_output_and_its_own_give_up(web, make_owner, db, sim, make_settings,
                                                                  start_settler, models_file):
    job = {"provider": "sim", "model": "per-output", "input": {"duration_s": 0.2, "outputs": 3, "cost": 1},
           "max_credits": 10}
    row, got = await _run(web, make_owner, db, sim, make_settings, start_settler, models_file, job)
    assert got["credits"] == {"reserved": 10, "charged": 8, "refunded": 2}  # ceil(2.5 x 3), not the cost
    assert round((row["deadline_at"] - row["created_at"]).total_seconds()) == 900


async def test_the_models_route_shows_owners_the_entries(web, make_owner, models_file, sim):
    server = await web(**sync_env(sim.url, MODELS_FILE=models_file))
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        r = await c.get("/v1/models")
        anonymous = await server.client().__aenter__()
        try:
            assert (await anonymous.get("/v1/models")).status_code == 401
        finally:
            await anonymous.aclose()
    assert r.status_code == 200
    assert r.json() == {"models": [
        {"provider": "elevenlabs", "model": "text-to-speech/*", "price": {"credits": 3, "per": "second"},
         "give_up_after_s": 7200.0, "kind": "sync"},
        {"provider": "anthropic", "model": "claude-*", "price": {"credits": 0.8, "per": "1k_tokens"},
         "give_up_after_s": 7200.0, "kind": "sync"},
        {"provider": "sim", "model": "per-output", "price": {"credits": 2.5, "per": "output"},
         "give_up_after_s": 900.0, "kind": "async"},
        {"provider": "sim", "model": "per-second", "price": {"credits": 3, "per": "second"},
         "give_up_after_s": 7200.0, "kind": "async"},
    ]}


async def test_without_a_models_file_the_route_lists_nothing(web, make_owner):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        assert (await c.get("/v1/models")).json() == {"models": []}
