"""Recovery of `uncertain` jobs: a submit whose outcome is unknown and could
not be looked up. An operator attaches the task found by hand (the job runs
and settles normally) or declares it failed (refund)."""
from __future__ import annotations

from app.capacity import is_capped
from app.config import Settings
from app.domain import jobs
from app.vocabulary import JobError, JobStatus

# An operator's `provider_task_id`. app/web/body.py holds the same for the
# console's pure form checks and the API's documents (a pure module cannot
# import this one); tests/web/test_edge_rules.py holds them equal.
MAX_PROVIDER_TASK_ID = 500


class InvalidState(Exception):
    pass


def is_task_id(task_id: str) -> bool:
    """An operator's provider task id: 1 to 500 printable characters, not
    blank (the settle step would ask the provider for a task named by
    nothing, or by a line break no provider's ids hold). One rule for the
    admin API, the console and `longcall jobs resolve`."""
    return 0 < len(task_id) <= MAX_PROVIDER_TASK_ID and task_id.isprintable() and not task_id.isspace()


async def resolve_with_task(conn, job_id: str, task_id: str, first_check_after_s: float = 0.0) -> None:
    if not is_task_id(task_id):
        raise ValueError(f"a provider task id is 1 to {MAX_PROVIDER_TASK_ID} printable characters, not blank")
    async with conn.transaction():
        # Checked under the row lock first: save_task also records a task id
        # on a job closed meanwhile (and asks the provider to cancel it),
        # which is right for a submit's answer but not for an operator's
        # id given for a job that is no longer uncertain.
        status = await conn.fetchval("select status from jobs where id = $1 for update", job_id)
        if status is None:
            raise LookupError(job_id)
        if status != JobStatus.UNCERTAIN:
            raise InvalidState(status)
        result = await jobs.save_task(conn, job_id, task_id=task_id, operation=None, webhook_secret=None,
                                      callback_registered=False, first_check_after_s=first_check_after_s,
                                      from_statuses=(JobStatus.UNCERTAIN,), by="operator")
    if result is not jobs.Saved.RUNNING:
        raise InvalidState(await _status(conn, job_id))


async def resolve_failed(conn, job_id: str, settings: Settings) -> jobs.Closed:
    """`settings`: whether the job's provider is capped, so that the place
    it held wakes a job waiting for it (not the 60 s safety net)."""
    job = await jobs.load(conn, job_id)
    if job is None:
        raise LookupError(job_id)
    closed = await jobs.close(conn, job_id, JobStatus.FAILED, error_code=JobError.RESOLVED_FAILED,
                              error_message="resolved as failed by an operator",
                              from_statuses=(JobStatus.UNCERTAIN,), wake_capacity=is_capped(settings, job["provider"]))
    if closed is None:
        raise InvalidState(await _status(conn, job_id))
    return closed


async def _status(conn, job_id: str) -> str:
    status = await jobs.status_of(conn, job_id)
    if status is None:
        raise LookupError(job_id)
    return status
