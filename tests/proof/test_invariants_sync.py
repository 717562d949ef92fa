"""The invariants on sync jobs (one call, its answer output 0): each check
passes a system that kept them and fails one broken the way it guards
against — a call made twice, an answer no call gave, speech that is not the
provider's bytes for that call, a sync job with a task."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from app.domain import jobs
from app.simulator.outputs import output_bytes_iter, output_sha256
from app.storage import FileStorage, object_key
from app.vocabulary import JobError, JobStatus
from proof import invariants

SPEECH = "text-to-speech/JBFqnCBsd6RMkjVDRZzb"
SYNC_CHECK = "no sync call made twice for one job"
OUTPUTS_CHECK = "succeeded outputs stored with their sha256 and size"
TASKS_CHECK = "one provider task per job"


async def _store(storage: FileStorage, key: str, data: bytes, content_type: str) -> jobs.Asset:
    path = os.path.join(storage.root, "upload")
    with open(path, "wb") as f:
        f.write(data)
    sha = hashlib.sha256(data).hexdigest()
    await storage.put_file(key, path, content_type, sha, len(data))
    return jobs.Asset(0, key, len(data), sha, content_type)


async def _sync_job(pool, storage: FileStorage, owner_id: str, n: int, provider: str, model: str,
                    input_: dict, *, answer: str | None) -> str:
    """A sync job taken to the end the way the settler does: claimed
    (queued -> submitting), its call's start saved, then closed with its
    answer as output 0 and the call's request id (`answer`: "llm",
    "speech"), or failed `call_lost` (None)."""
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=f"s{n}", provider=provider,
                                    model=model, input=input_, max_credits=10, give_up_after_s=3600)
    job_id = created.job_id
    request_id = f"req-{n}"
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, job_id)
        assert await jobs.start_call(conn, job_id)
        key = object_key(owner_id, job_id, 0)
        if answer == "llm":
            body = json.dumps({"id": f"msg_{n}", "type": "message", "content": [{"type": "text", "text": "hi"}]})
            asset = await _store(storage, key, body.encode(), "application/json")
        elif answer == "speech":
            size = input_["output_bytes"]
            asset = await _store(storage, key, b"".join(output_bytes_iter(request_id, 0, size)), "audio/mpeg")
            assert asset.sha256 == output_sha256(request_id, 0, size)
        else:
            assert await jobs.close(conn, job_id, JobStatus.FAILED, error_code=JobError.CALL_LOST,
                                    error_message="the call was lost")
            return job_id
        assert await jobs.close(conn, job_id, JobStatus.SUCCEEDED, charge=10, assets=[asset],
                                operation={"request_id": request_id}, from_statuses=(JobStatus.SUBMITTING,))
    return job_id


@pytest.fixture
async def system(db, make_owner, tmp_objects):
    """Four sync jobs that each made one call (an Anthropic answer, an OpenAI
    answer, speech; a sound effect whose call was lost), one whose call never
    started, and the simulator's count of those four calls."""
    storage = FileStorage(str(tmp_objects))
    owner = await make_owner(credits=1000, max_active=10)
    made = {
        "anthropic": await _sync_job(db, storage, owner.owner_id, 0, "anthropic", "claude-sonnet-4-5",
                                     {"max_tokens": 64, "messages": [{"role": "user", "content": "job 0"}]},
                                     answer="llm"),
        "openai": await _sync_job(db, storage, owner.owner_id, 1, "openai", "gpt-4o-mini",
                                  {"messages": [{"role": "user", "content": "job 1"}]}, answer="llm"),
        "speech": await _sync_job(db, storage, owner.owner_id, 2, "elevenlabs", SPEECH,
                                  {"text": "job 2", "output_bytes": 700}, answer="speech"),
        "sound": await _sync_job(db, storage, owner.owner_id, 3, "elevenlabs", "sound-generation",
                                 {"text": "job 3", "output_bytes": 500}, answer=None),
    }
    never = await jobs.create_job(db, owner_id=owner.owner_id, request_key="s4", provider="openai",
                                  model="gpt-4o-mini", input={"messages": []}, max_credits=5,
                                  give_up_after_s=3600)
    async with db.acquire() as conn:  # refused before any call: no call on record
        assert await jobs.close(conn, never.job_id, JobStatus.FAILED, error_code=JobError.SUBMIT_REJECTED,
                                error_message="refused")
    stats = {"tasks_created": 0, "sync_calls_by_body": {hashlib.sha256(b"%d" % n).hexdigest(): 1
                                                        for n in range(4)}}
    return db, storage, owner.owner_id, made, stats


async def _failing(db, storage, stats) -> set[str]:
    async with db.acquire() as conn:
        checks = await invariants.system_checks(conn, sim_stats=stats, storage=storage)
    # Without the timeline check: these tests change a job's row by hand, so
    # its timeline (which recorded the truth) disagrees too; it has its own
    # tests (test_invariants_timeline.py).
    return {c.name for c in checks if c.violations and c.name != invariants.TIMELINE_CHECK}


async def test_a_kept_system_passes_every_check(system):
    db, storage, _, made, stats = system
    async with db.acquire() as conn:
        checks = {c.name: c for c in await invariants.system_checks(conn, sim_stats=stats, storage=storage)}
    assert {name for name, c in checks.items() if c.violations} == set()
    # Not vacuous: the five sync jobs were looked at, the three answers read back.
    assert checks[SYNC_CHECK].checked == 5
    assert checks[SYNC_CHECK].note == "4 calls for 4 sync jobs that started one (3 succeeded)"
    assert checks[OUTPUTS_CHECK].checked == 3


def _twice(stats: dict) -> None:
    first = next(iter(stats["sync_calls_by_body"]))
    stats["sync_calls_by_body"][first] = 2


def _one_call_more(stats: dict) -> None:
    stats["sync_calls_by_body"][hashlib.sha256(b"extra").hexdigest()] = 1


def _two_calls_fewer(stats: dict) -> None:  # three answers, two calls: one answer no call gave
    for digest in list(stats["sync_calls_by_body"])[:2]:
        del stats["sync_calls_by_body"][digest]


@pytest.mark.parametrize("breakage", [_twice, _one_call_more, _two_calls_fewer])
async def test_calls_counted_against_the_sync_jobs(system, breakage):
    db, storage, _, _, stats = system
    breakage(stats)
    assert await _failing(db, storage, stats) == {SYNC_CHECK}


async def test_the_calls_of_the_lost_one_and_the_uncalled_one(system):
    """The lost call counts among the calls that may have been made; the job
    refused before its call never could have made one."""
    db, storage, _, _, stats = system
    del stats["sync_calls_by_body"][next(iter(stats["sync_calls_by_body"]))]  # 3 calls, 3 answers: fine
    assert await _failing(db, storage, stats) == set()
    await db.execute("update jobs set provider_call_started_at = null where error_code = $1", JobError.CALL_LOST)
    stats["sync_calls_by_body"]["x"] = 1  # 4 calls, 3 started
    assert await _failing(db, storage, stats) == {SYNC_CHECK}


async def test_a_succeeded_sync_job_without_a_call_on_record(system):
    db, storage, _, made, stats = system
    await db.execute("update jobs set provider_call_started_at = null where id = $1", made["openai"])
    stats["sync_calls_by_body"].popitem()  # the calls still fit the jobs that started one
    async with db.acquire() as conn:
        check = await invariants.no_sync_call_twice(conn, stats)
    assert check.violations == [f"{made['openai']} (succeeded): a sync job with no call on record"]


@pytest.mark.parametrize("sql, args_of", [
    # speech that is not the simulator's bytes for this call
    ("update jobs set provider_operation = '{\"request_id\": \"req-other\"}' where id = $1", "speech"),
    # speech with no request id recorded: nothing says which call made it
    ("update jobs set provider_operation = null where id = $1", "speech"),
    # an LLM answer recorded as something else than JSON
    ("update assets set content_type = 'text/plain' where job_id = $1", "anthropic"),
    # an LLM answer whose recorded digest is not the stored bytes'
    ("update assets set sha256 = repeat('0', 64) where job_id = $1", "openai"),
    # a sync job with a second output
    ("insert into assets (job_id, index, storage_key, bytes, sha256, content_type) "
     "select job_id, 1, storage_key, bytes, sha256, content_type from assets where job_id = $1", "anthropic"),
])
async def test_sync_answers_stored(system, sql, args_of):
    db, storage, _, made, stats = system
    await db.execute(sql, made[args_of])
    assert await _failing(db, storage, stats) == {OUTPUTS_CHECK}


async def test_an_llm_answer_is_not_held_to_simulator_bytes(system):
    """The LLMs' answers are the adapter's JSON: any request id (or none)
    leaves them fine, where speech would fail."""
    db, storage, _, made, stats = system
    await db.execute("update jobs set provider_operation = null where id = any($1::text[])",
                     [made["anthropic"], made["openai"]])
    assert await _failing(db, storage, stats) == set()


async def test_a_sync_job_has_no_task(system):
    db, storage, _, made, stats = system
    await db.execute("update jobs set provider_task_id = 'task-1' where id = $1", made["sound"])
    assert await _failing(db, storage, stats) == {TASKS_CHECK}
    await db.execute("update jobs set provider_task_id = null")
    stats["tasks_created"] = 1
    stats["creates_by_callback_url"] = {f"http://127.0.0.1:9/webhooks/sim/{made['speech']}": 1}
    assert await _failing(db, storage, stats) == {TASKS_CHECK}
