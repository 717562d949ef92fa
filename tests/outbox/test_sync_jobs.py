"""Sync jobs end to end (LLM messages, speech): the web API, settlers
in-process and as processes killed mid-call, real PostgreSQL, files storage,
the real adapters and sync step, against the simulator's /anthropic,
/openai and /elevenlabs protocols. The simulator counts every call that
did its work by its raw body (`sync_calls_by_body`): the proof that no call
is made twice."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from app.vocabulary import JobError, JobStatus
from tests.download.download_servers import PeakRss
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.outbox.test_races import env_of, settler_process
from tests.support.simulator import clear_faults, set_faults, stats

MiB = 1024 * 1024
KEYS = {"ANTHROPIC_API_KEY": "sk-ant-sync-jobs-test", "OPENAI_API_KEY": "sk-openai-sync-jobs-test",
        "ELEVENLABS_API_KEY": "sk_elevenlabs_sync_jobs_test"}


def sync_env(sim_url: str, **extra) -> dict[str, str]:
    return {"SIM_URL": sim_url, "ANTHROPIC_BASE_URL": f"{sim_url}/anthropic",
            "OPENAI_BASE_URL": f"{sim_url}/openai/v1", "ELEVENLABS_BASE_URL": f"{sim_url}/elevenlabs",
            **KEYS, **{k: str(v) for k, v in extra.items()}}


def claude_job(text: str = "Say hello.", *, stream: bool = False, **controls) -> dict:
    body = {"max_tokens": 64, "messages": [{"role": "user", "content": text}],
            "metadata": {"duration_s": 0.2, **controls}}
    if stream:
        body["stream"] = True
    return {"provider": "anthropic", "model": "claude-sonnet-4-5", "input": body, "max_credits": 10}


def speech_job(text: str = "Hello from longcall.", **controls) -> dict:
    return {"provider": "elevenlabs", "model": "text-to-speech/JBFqnCBsd6RMkjVDRZzb",
            "input": {"text": text, "model_id": "eleven_multilingual_v2", "duration_s": 0.2, **controls},
            "max_credits": 10}


def as_json(value):
    """A jsonb column as read (the test pool decodes JSON; a bare connection does not)."""
    return json.loads(value) if isinstance(value, str) else value


def calls(sim_url: str) -> dict[str, int]:
    return stats(sim_url)["sync_calls_by_body"]


async def wait_for_call(sim_url: str, timeout: float = 15.0) -> None:
    """Until the simulator has begun the work of one call."""
    deadline = time.monotonic() + timeout
    while not calls(sim_url):
        assert time.monotonic() < deadline, "the call never reached the provider"
        await asyncio.sleep(0.02)


async def job_json(server, api_key: str, job_id: str) -> dict:
    async with server.client(api_key) as c:
        return (await c.get(f"/v1/jobs/{job_id}")).json()


@pytest.mark.parametrize("stream", [False, True])
async def test_an_llm_answer_is_stored_with_its_usage_and_charged_once(web, make_owner, db, sim, make_settings,
                                                                       start_settler, stream):
    env = sync_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=claude_job(stream=stream, output_text="Hello!",
                                                            input_tokens=12, output_tokens=3))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
        (out,) = got["outputs"]
        message = json.loads((await c.get(out["url"])).content)
    assert out["content_type"] == "application/json"
    assert message["type"] == "message" and message["content"][0]["text"] == "Hello!"
    assert message["usage"]["input_tokens"] == 12 and message["usage"]["output_tokens"] == 3
    assert as_json(row["usage"]) == [{"unit": "input_tokens", "amount": 12}, {"unit": "output_tokens", "amount": 3}]
    assert as_json(row["provider_operation"])["request_id"].startswith("req_")
    assert row["provider_task_id"] is None  # a sync call never has a task
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}  # no price yet: the reservation
    assert list(calls(sim.url).values()) == [1]
    await assert_money_balances(db)


async def test_an_openai_compatible_answer_is_stored(web, make_owner, db, sim, make_settings, start_settler):
    env = sync_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "metadata": {"duration_s": "0.2"}}
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json={"provider": "openai", "model": "gpt-4o-mini", "input": body,
                                                  "max_credits": 5})).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
        (out,) = (await c.get(f"/v1/jobs/{created['id']}")).json()["outputs"]
        completion = json.loads((await c.get(out["url"])).content)
    assert completion["object"] == "chat.completion" and completion["choices"][0]["message"]["role"] == "assistant"
    assert {u["unit"] for u in as_json(row["usage"])} == {"input_tokens", "output_tokens"}
    assert list(calls(sim.url).values()) == [1]


@pytest.mark.parametrize(("model", "content_type"), [("text-to-speech/JBFqnCBsd6RMkjVDRZzb", "audio/mpeg"),
                                                      ("sound-generation", "audio/mpeg")])
async def test_speech_and_sound_are_stored_with_their_characters(web, make_owner, db, sim, make_settings,
                                                                 start_settler, model, content_type):
    env = sync_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    job = {**speech_job("Rain on a tin roof.", output_bytes=40_000), "model": model}
    if model == "sound-generation":
        job["input"].pop("model_id")
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job)).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
        (out,) = (await c.get(f"/v1/jobs/{created['id']}")).json()["outputs"]
    assert (out["content_type"], out["bytes"]) == (content_type, 40_000)
    # The text's characters (CONTRACT.md's 1k_characters), not the
    # character-cost header: a sound effect's is ElevenLabs' credits for
    # its length (the simulator's 20 a second, 100 for this one).
    assert as_json(row["usage"]) == [{"unit": "characters", "amount": float(len("Rain on a tin roof."))}]
    assert list(calls(sim.url).values()) == [1]


async def test_a_529_then_success_is_one_call_after_a_wait(web, make_owner, db, sim, make_settings, start_settler):
    env = sync_env(sim.url)
    server = await web(**env)
    set_faults(sim.url, overloaded=1)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=claude_job())).json()
    deadline = time.monotonic() + 15
    while "529" not in (await db.fetchval("select coalesce(last_error, '') from jobs where id = $1", created["id"])):
        assert time.monotonic() < deadline, "no 529 was answered"
        await asyncio.sleep(0.02)
    assert calls(sim.url) == {}  # the 529 did no work
    clear_faults(sim.url)
    row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
    assert row["status"] == JobStatus.SUCCEEDED and row["submit_attempts"] >= 2
    assert list(calls(sim.url).values()) == [1]
    await assert_money_balances(db)


async def test_a_rejected_call_fails_refunded(web, make_owner, db, sim, make_settings, start_settler):
    env = sync_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=claude_job(outcome="failed"))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.FAILED and got["error"]["code"] == JobError.SUBMIT_REJECTED
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    await assert_money_balances(db)


async def test_an_answer_dropped_after_the_work_is_call_lost_refunded(web, make_owner, db, sim, make_settings,
                                                                      start_settler, tmp_path):
    # The simulator does the work, then holds the answer and drops it: the
    # call's own timeout (3 s, from the models file) ends the wait.
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nprovider = "anthropic"\nmodel = "*"\ntimeout_s = 3\n')
    env = sync_env(sim.url, MODELS_FILE=models)
    server = await web(**env)
    set_faults(sim.url, submit_timeout_after_create=1)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=claude_job())).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED), timeout=30)
        got = (await c.get(f"/v1/jobs/{created['id']}")).json()
    assert row["status"] == JobStatus.FAILED and got["error"]["code"] == JobError.CALL_LOST
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    assert list(calls(sim.url).values()) == [1]  # made once, never again
    await assert_money_balances(db)


async def test_an_answer_over_the_cap_fails_output_too_large_refunded(web, make_owner, db, sim, make_settings,
                                                                      start_settler, tmp_path):
    env = sync_env(sim.url, MAX_OUTPUT_BYTES=10_000)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=speech_job(output_bytes=50_000))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED))
    assert row["status"] == JobStatus.FAILED and row["error_code"] == JobError.OUTPUT_TOO_LARGE
    assert (row["credits_charged"], row["credits_refunded"]) == (0, 10)
    await assert_money_balances(db)


async def test_a_50_mib_audio_answer_settles_with_flat_memory(web, make_owner, db, sim, make_settings,
                                                              start_settler):
    env = sync_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    with PeakRss() as rss:
        async with server.client(owner.api_key) as c:
            created = (await c.post("/v1/jobs", json=speech_job(output_bytes=50 * MiB))).json()
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED), timeout=60)
    assert row["status"] == JobStatus.SUCCEEDED, row["last_error"]
    assert await db.fetchval("select bytes from assets where job_id = $1", created["id"]) == 50 * MiB
    assert rss.growth < 24 * MiB, f"memory grew {rss.growth / MiB:.1f} MiB for a 50 MiB answer"


async def test_two_steps_racing_one_sync_job_make_one_call(web, make_owner, db, sim, make_settings):
    """Two sync steps for one job at the same moment (two settlers that
    both hold its intent: one lost its lease mid-call): one calls, the
    other finds the call in doubt and waits; one charge."""
    from outbox.context import Context
    from outbox.submit import submit

    env = sync_env(sim.url)
    server = await web(**env)
    settings = make_settings(**env)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=claude_job(duration_s=1.0))).json()
    ctx = await Context.open(settings, provider_timeout_s=5)
    try:
        outcomes = await asyncio.gather(*[submit(ctx, created["id"], 1) for _ in range(2)])
    finally:
        await ctx.close()
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == JobStatus.SUCCEEDED
    assert sorted(type(o).__name__ for o in outcomes) == ["Done", "Later"]
    assert list(calls(sim.url).values()) == [1]
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", row["id"]) == 1


MODELS = """
[[models]]
provider = "anthropic"
model = "*"
timeout_s = 10
stale_after_s = 12

[[models]]
provider = "elevenlabs"
model = "text-to-speech/*"
timeout_s = 10
stale_after_s = 30
"""


async def _kill_mid_call(web, make_owner, db, sim, make_settings, tmp_objects, tmp_path, job: dict, *,
                         deadline_passed: bool = False) -> tuple:
    """`deadline_passed`: the job's give-up deadline is behind it by the time a settler looks again."""
    models = tmp_path / "models.toml"
    models.write_text(MODELS)
    env = env_of(make_settings, sim, tmp_objects, SETTLER_LEASE_S=2, MODELS_FILE=models,
                 **sync_env(sim.url))
    server = await web(**sync_env(sim.url), MODELS_FILE=str(models))
    owner = await make_owner(credits=100)
    first = settler_process(env)
    async with server.client(owner.api_key) as c:
        created = (await c.post("/v1/jobs", json=job)).json()
    await wait_for_call(sim.url)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    row = await db.fetchrow("select * from jobs where id = $1", created["id"])
    assert row["status"] == JobStatus.SUBMITTING and row["provider_call_started_at"] is not None
    if deadline_passed:
        await db.execute("update jobs set deadline_at = now() - interval '1 second' where id = $1", created["id"])
    second = settler_process(env)
    try:
        row = await wait_for_status(db, created["id"], (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.EXPIRED),
                                    timeout=60)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    return row, await job_json(server, owner.api_key, created["id"])


async def test_a_settler_killed_mid_call_leaves_call_lost_refunded_after_the_threshold(
        web, make_owner, db, sim, make_settings, tmp_objects, tmp_path):
    row, got = await _kill_mid_call(web, make_owner, db, sim, make_settings, tmp_objects, tmp_path,
                                    claude_job(duration_s=5.0))
    assert row["status"] == JobStatus.FAILED and got["error"]["code"] == JobError.CALL_LOST, row["last_error"]
    # Not before the threshold: 12 s after the call started.
    assert (row["finished_at"] - row["provider_call_started_at"]).total_seconds() >= 12
    assert got["credits"] == {"reserved": 10, "charged": 0, "refunded": 10}
    assert list(calls(sim.url).values()) == [1]  # never made again
    await assert_money_balances(db)


@pytest.mark.parametrize("deadline_passed", [False, True], ids=["before the deadline", "past the deadline"])
async def test_a_settler_killed_mid_speech_is_recovered_from_history_charged_once(
        deadline_passed, web, make_owner, db, sim, make_settings, tmp_objects, tmp_path):
    """Past the give-up deadline too: the speech was made, and billed; its
    audio in the provider's history is the user's, not thrown away expired."""
    row, got = await _kill_mid_call(web, make_owner, db, sim, make_settings, tmp_objects, tmp_path,
                                    speech_job("Recovered, not repeated.", duration_s=3.0, output_bytes=30_000),
                                    deadline_passed=deadline_passed)
    assert row["status"] == JobStatus.SUCCEEDED, (row["last_error"], row["error_message"])
    (out,) = got["outputs"]
    assert (out["content_type"], out["bytes"]) == ("audio/mpeg", 30_000)
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'charge'", row["id"]) == 1
    assert list(calls(sim.url).values()) == [1]
    await assert_money_balances(db)
