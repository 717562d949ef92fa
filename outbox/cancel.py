"""The cancel step: ask the provider to stop a task whose job is already
closed (cancelled by its owner, expired, or cancelled while its submit was
out). Best effort: the job was refunded when it closed; this only saves the
provider's compute."""
from __future__ import annotations

from app.domain import jobs
from app.domain.record import JobRecord
from app.providers.base import ProviderError
from app.vocabulary import CallOutcome, ProviderCall
from outbox import decide
from outbox.context import Context
from outbox.outcome import DONE, Outcome


async def cancel(ctx: Context, job_id: str, attempts: int, job=None) -> Outcome:
    """`job`: the row as the settler loaded it with its claim, or None to load it here."""
    if job is None:
        async with ctx.pool.acquire() as conn:
            job = await jobs.load(conn, job_id)
    record = JobRecord.from_row(job) if job is not None else None
    if record is None or record.provider_task_id is None:
        # No task id saved (yet): a submit still out saves it on return and
        # queues this intent again.
        return DONE
    provider = ctx.providers[record.provider]
    if not provider.facts.can_cancel:
        # No way to stop it: the job was closed and refunded here; the
        # provider may still run the task, and bill it (README: Providers).
        return DONE
    try:
        await provider.cancel(record.task)
    except ProviderError as e:
        ctx.metrics.provider_call(provider.name, ProviderCall.CANCEL, CallOutcome.ERROR)
        return decide.later(decide.Retry(attempts, f"cancel: {e}"))
    ctx.metrics.provider_call(provider.name, ProviderCall.CANCEL, CallOutcome.OK)
    return DONE
