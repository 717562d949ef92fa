"""The cancel step: ask the provider to stop a task whose job is already
closed (cancelled by its owner, expired, or cancelled while its submit was
out). Best effort: the job was refunded when it closed; this only saves the
provider's compute."""
from __future__ import annotations

from app.domain import jobs
from app.providers.base import ProviderError, Task
from outbox import policy
from outbox.context import Context
from outbox.outcome import DONE, Later, Outcome


async def cancel(ctx: Context, job_id: str, attempts: int, job=None) -> Outcome:
    """`job`: the row as the settler loaded it with its claim, or None to load it here."""
    if job is None:
        async with ctx.pool.acquire() as conn:
            job = await jobs.load(conn, job_id)
    if job is None or job["provider_task_id"] is None:
        # No task id saved (yet): a submit still out saves it on return and
        # queues this intent again.
        return DONE
    provider = ctx.providers[job["provider"]]
    try:
        await provider.cancel(Task(job["provider_task_id"], job["provider_operation"], job["model"]))
    except ProviderError as e:
        ctx.metrics.provider_call(provider.name, "cancel", "error")
        return Later(policy.backoff(attempts), failed=True, reason=f"cancel: {e}")
    ctx.metrics.provider_call(provider.name, "cancel", "ok")
    return DONE
