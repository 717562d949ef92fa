"""The timeline check (proof/invariants.timeline_problems): a job's story
passes as written by the real statements, and each way a timeline can lie
about its job is caught."""
from __future__ import annotations

import pytest

from app.domain import events, jobs
from app.vocabulary import JobStatus
from proof import invariants
from proof.invariants import Line, StoryJob

SHA = "a" * 64
SUCCEEDED = StoryJob("job_1", "succeeded", "sim", "image-fast", 10, 4, 6, None, "task-1", 1, ((0, 100, SHA),), 1, 0)
STORY = [
    Line("created", {"provider": "sim", "model": "image-fast", "max_credits": 10, "metadata": {}}),
    Line("submit_sent", {"attempt": 1, "in_doubt": False}),
    Line("task_saved", {"task_id": "task-1", "job_was_closed": False}),
    Line("status_checked", {"state": "running", "error": None}),
    Line("webhook_accepted", {}),
    Line("status_checked", {"state": "succeeded", "error": None}),
    Line("output_stored", {"index": 0, "bytes": 100, "sha256": SHA}),
    Line("closed", {"status": "succeeded", "charged": 4, "refunded": 6, "error_code": None}),
    Line("notification_delivered", {}),
]


def test_a_true_story_passes():
    assert invariants.timeline_problems(SUCCEEDED, STORY) == []


def test_a_job_cancelled_while_submitting_may_save_its_task_after_the_close():
    job = SUCCEEDED._replace(status="cancelled", credits_charged=0, credits_refunded=10, assets=(), delivered=0)
    lines = [STORY[0], STORY[1], Line("closed", {"status": "cancelled", "charged": 0, "refunded": 10,
                                                 "error_code": None}),
             Line("task_saved", {"task_id": "task-1", "job_was_closed": True}), Line("status_checked", {})]
    assert invariants.timeline_problems(job, lines) == []


def _without(i):
    return STORY[:i] + STORY[i + 1:]


@pytest.mark.parametrize("lines, job, says", [
    (_without(0), SUCCEEDED, "does not start with one `created`"),
    ([STORY[0]] + STORY, SUCCEEDED, "does not start with one `created`"),
    ([Line("created", {"provider": "fal", "model": "image-fast", "max_credits": 10})] + STORY[1:], SUCCEEDED,
     "`created` says"),
    (_without(1), SUCCEEDED, "0 submit_sent lines for 1 submit claims"),
    (_without(2), SUCCEEDED, "task_saved lines []"),
    (STORY[:2] + [Line("task_saved", {"task_id": "task-2"})] + STORY[3:], SUCCEEDED, "task_saved lines ['task-2']"),
    (STORY, SUCCEEDED._replace(provider_task_id=None), "a task_saved line on a job with no task"),
    (STORY[:3] + [Line("call_started", {})] + STORY[3:], SUCCEEDED, "call_started on an async job"),
    (_without(6), SUCCEEDED, "output_stored lines []"),
    (STORY[:6] + [Line("output_stored", {"index": 0, "bytes": 99, "sha256": SHA})] + STORY[7:], SUCCEEDED,
     "are not its outputs"),
    (_without(7), SUCCEEDED, "0 closed lines"),
    (STORY + [STORY[7]], SUCCEEDED, "2 closed lines"),
    (STORY[:7] + [Line("closed", {"status": "succeeded", "charged": 10, "refunded": 0, "error_code": None})]
     + STORY[8:], SUCCEEDED, "`closed` says"),
    (STORY[:6] + [STORY[7], STORY[6]] + STORY[8:], SUCCEEDED, "an output stored after the close"),
    (STORY + [Line("webhook_accepted", {})], SUCCEEDED, "after the close: ['webhook_accepted']"),
    (STORY[:6], SUCCEEDED._replace(status="running", assets=(), delivered=0), None),  # in flight: a true story
    (STORY, SUCCEEDED._replace(status="running"), "a closed line on a job still in flight"),
    (STORY[:-1], SUCCEEDED, "0 delivered and 0 failed lines for 1 delivered"),
])
def test_each_lie_is_caught(lines, job, says):
    problems = invariants.timeline_problems(job, lines)
    if says is None:
        assert problems == []
    else:
        assert any(says in p for p in problems), problems


async def test_the_statements_write_a_story_the_check_accepts(db, make_owner):
    owner = await make_owner(credits=100)
    created = await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim",
                                    model="image-fast", input={}, max_credits=10, give_up_after_s=3600,
                                    metadata={"order": "7"})
    async with db.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)
        assert await jobs.save_task(conn, created.job_id, task_id="task-9", operation=None, webhook_secret=None,
                                    callback_registered=False, first_check_after_s=30) is jobs.Saved.RUNNING
        await events.status_checked(conn, created.job_id, {"state": "running", "error": None})
        await events.status_checked(conn, created.job_id, {"state": "running", "error": None})  # said again: no line
        # The check that closes the job: its line is written by the close, before the outputs.
        assert await jobs.close(conn, created.job_id, JobStatus.SUCCEEDED, charge=3,
                                assets=[jobs.Asset(0, "k0", 100, SHA, "image/png"),
                                        jobs.Asset(1, "k1", 200, "b" * 64, "image/png")],
                                checked={"state": "succeeded", "error": None})
        check = await invariants.timelines_tell_the_story(conn)
        lines = await events.timeline(conn, created.job_id)
    assert check.ok and check.checked == 1, check.violations
    assert [r["type"] for r in lines] == ["created", "submit_sent", "task_saved", "status_checked", "status_checked",
                                          "output_stored", "output_stored", "closed"]
    assert [r["detail"]["state"] for r in lines if r["type"] == "status_checked"] == ["running", "succeeded"]
    # broken by hand, the check says so
    await db.execute("delete from job_events where type = 'output_stored' and (detail->>'index')::int = 1")
    async with db.acquire() as conn:
        check = await invariants.timelines_tell_the_story(conn)
    assert not check.ok and "are not its outputs" in check.violations[0]


async def test_a_line_for_no_job_is_caught(db, make_owner):
    """No foreign key holds a line to its job (migrations/011); the check does."""
    await db.execute("insert into job_events (job_id, type) values ('job_000000000000000000000000', 'closed')")
    async with db.acquire() as conn:
        check = await invariants.timelines_tell_the_story(conn)
    assert check.violations == ["job_000000000000000000000000: 1 timeline lines and no such job"]


async def test_a_status_line_for_no_job_writes_nothing(db):
    async with db.acquire() as conn:
        await events.status_checked(conn, "job_000000000000000000000000", {"state": "running", "error": None})
    assert await db.fetchval("select count(*) from job_events") == 0


async def test_a_closing_check_that_says_what_the_last_one_said_writes_no_line(db, make_owner):
    owner = await make_owner(credits=100)
    created = await jobs.create_job(db, owner_id=owner.owner_id, request_key=None, provider="sim",
                                    model="image-fast", input={}, max_credits=10, give_up_after_s=3600)
    failed = {"state": "failed", "error": "boom"}
    async with db.acquire() as conn:
        assert await jobs.begin_submit(conn, created.job_id)
        await jobs.save_task(conn, created.job_id, task_id="task-1", operation=None, webhook_secret=None,
                             callback_registered=False, first_check_after_s=30)
        await events.status_checked(conn, created.job_id, failed)  # an earlier check whose close was lost
        assert await jobs.close(conn, created.job_id, JobStatus.FAILED, error_code="provider_failed",
                                error_message="boom", checked=failed)
        lines = await events.timeline(conn, created.job_id)
    assert [r["type"] for r in lines] == ["created", "submit_sent", "task_saved", "status_checked", "closed"]
