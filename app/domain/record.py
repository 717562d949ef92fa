"""A job as the settler's steps see it: a typed, frozen record built once from
its database row, so the decisions (outbox/decide.py) read named fields, not
a row indexed by string."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.providers.base import Task
from app.vocabulary import JobStatus

# The `jobs` columns from_row reads: what a claim loads with each claimed job
# (outbox/intents.CLAIM). Decoding the rest of `select *` (the request key
# and digest, metadata, money, error and time columns) for every claimed job
# was about a third of a claim's client CPU.
COLUMNS = ("id", "owner_id", "status", "provider", "model", "input", "created_at", "deadline_at",
           "credits_reserved", "provider_task_id", "provider_operation", "callback_registered", "submit_attempts",
           "provider_call_started_at", "claimed_task_id", "webhook_secret")


@dataclass(frozen=True)
class JobRecord:
    id: str
    owner_id: str
    status: JobStatus
    provider: str
    model: str
    input: Mapping[str, Any]
    created_at: dt.datetime
    deadline_at: dt.datetime
    credits_reserved: int
    provider_task_id: str | None = None
    provider_operation: Mapping[str, Any] | None = None
    callback_registered: bool = False
    submit_attempts: int = 0
    # Only the claim of a submit (jobs.begin_submit) tells this: an earlier
    # submit call never got a definite answer, so the task may exist.
    was_in_doubt: bool = False
    provider_call_started_at: dt.datetime | None = None
    # A task id a verified webhook named while the submit was in doubt, not
    # yet confirmed with the provider (jobs.claimed_task_id).
    claimed_task_id: str | None = None
    # Encrypted at rest; kept out of repr so a logged record shows no secret.
    webhook_secret: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobRecord:
        """From a `jobs` row (`select *`), or the row begin_submit returns
        (which adds `was_in_doubt`)."""
        return cls(
            id=row["id"], owner_id=row["owner_id"], status=JobStatus(row["status"]),
            provider=row["provider"], model=row["model"], input=row["input"],
            created_at=row["created_at"], deadline_at=row["deadline_at"],
            credits_reserved=row["credits_reserved"],
            provider_task_id=row["provider_task_id"], provider_operation=row["provider_operation"],
            callback_registered=bool(row["callback_registered"]),
            submit_attempts=row["submit_attempts"],
            was_in_doubt=bool(row.get("was_in_doubt", False)),
            provider_call_started_at=row["provider_call_started_at"],
            claimed_task_id=row.get("claimed_task_id"),
            webhook_secret=row["webhook_secret"])

    @property
    def task(self) -> Task:
        """The provider task to ask about or cancel (only once its id is saved)."""
        if self.provider_task_id is None:
            raise ValueError(f"job {self.id} has no provider task yet")
        return Task(task_id=self.provider_task_id, operation=self.provider_operation, model=self.model)

    def age_s(self, now: dt.datetime) -> float:
        return (now - self.created_at).total_seconds()

    def seconds_to_deadline(self, now: dt.datetime) -> float:
        return (self.deadline_at - now).total_seconds()
