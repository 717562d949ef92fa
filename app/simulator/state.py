"""Simulated tasks and the in-memory store that holds them.

A task's state is never stored: it is computed from the clock
(`created_at` + `duration_s`), so reading a task costs a dict lookup and a
few comparisons however many tasks exist. Only a cancel writes anything.

`InFlight` keeps what is in flight per protocol prefix (for the
`max_concurrent` fault and the `peak_concurrent` stat): a task from its
creation until it ends at the provider (`finished_at`: done by the clock,
stopped by its deadline, or cancelled), a sync call from the start of its
work until it is released (its answer sent or dropped).
"""
from __future__ import annotations

import enum
import heapq
import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.simulator.controls import Controls
from app.simulator.faults import Faults, WebhookPlan

# The share of a task's duration it spends queued before it runs.
QUEUED_SHARE = 0.1
FAILURE_REASON = "simulated failure (input.outcome = 'failed')"
CANCEL_REASON = "cancelled"


class Phase(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


@dataclass(eq=False, slots=True)  # slots: a benchmark may hold many thousands
class Task:
    id: str
    protocol: str  # "sim", "replicate", "fal", "kie"
    model: str
    input: dict[str, Any]
    controls: Controls
    created_at: float  # unix seconds
    base_url: str  # this server as the creating client addressed it; output URLs hang off it
    seq: int  # creation order, for listings
    callback_url: str | None = None
    webhook_secret: str | None = None
    idempotency_key: str | None = None
    webhook_plan: WebhookPlan = field(default_factory=WebhookPlan)
    webhook_events: tuple[str, ...] = ("completed",)
    extra: dict[str, Any] = field(default_factory=dict)  # protocol-specific facts
    cancelled_at: float | None = None
    # When the provider itself stops the task if it has not finished
    # (Replicate's `Cancel-After`); None: never.
    deadline_at: float | None = None

    @property
    def started_at(self) -> float:
        return self.created_at + QUEUED_SHARE * self.controls.duration_s

    @property
    def done_at(self) -> float:
        """When the task finishes on its own (if not cancelled first)."""
        return self.created_at + self.controls.duration_s

    @property
    def stopped_at(self) -> float | None:
        """When the task was stopped before it finished: cancelled, or its
        deadline came first. None: it runs (or ran) to its end."""
        if self.cancelled_at is not None:
            return self.cancelled_at
        if self.deadline_at is not None and self.deadline_at < self.done_at:
            return self.deadline_at
        return None

    @property
    def stopped_by_deadline(self) -> bool:
        return self.cancelled_at is None and self.stopped_at is not None

    @property
    def finished_at(self) -> float:
        stopped = self.stopped_at
        return stopped if stopped is not None else self.done_at

    @property
    def outputs_expire_at(self) -> float:
        return self.done_at + self.controls.output_ttl_s

    def phase(self, now: float) -> Phase:
        if self.cancelled_at is not None:
            return Phase.CANCELLED
        if self.stopped_by_deadline and now >= self.finished_at:
            return Phase.CANCELLED
        if now >= self.done_at:
            return Phase.SUCCEEDED if self.controls.outcome == "succeeded" else Phase.FAILED
        if now >= self.started_at:
            return Phase.RUNNING
        return Phase.QUEUED

    def error(self, now: float) -> str | None:
        phase = self.phase(now)
        if phase is Phase.FAILED:
            return FAILURE_REASON
        if phase is Phase.CANCELLED:
            return CANCEL_REASON
        return None

    def output_urls(self) -> list[str]:
        return [f"{self.base_url}/outputs/{self.id}/{i}" for i in range(self.controls.outputs)]

    def cancel(self, now: float) -> bool:
        """Cancel unless already finished; True when this call cancelled it."""
        if self.phase(now).terminal:
            return False
        self.cancelled_at = now
        return True


@dataclass
class Stats:
    tasks_created: int = 0
    creates_by_idempotency_key: Counter = field(default_factory=Counter)
    creates_by_callback_url: Counter = field(default_factory=Counter)
    webhooks_sent: int = 0  # every POST attempt, retries and duplicates included
    webhooks_delivered: int = 0  # attempts answered 2xx
    webhooks_failed: int = 0  # deliveries given up after every retry
    status_calls: int = 0
    # Sync calls that did their work, by the sha256 hex of the raw request
    # body (fault answers sent instead of the work are not counted).
    sync_calls_by_body: Counter = field(default_factory=Counter)
    # The most tasks and sync calls of each protocol prefix in flight at
    # once (only prefixes that had any).
    peak_concurrent: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tasks_created": self.tasks_created,
            "creates_by_idempotency_key": dict(self.creates_by_idempotency_key),
            "creates_by_callback_url": dict(self.creates_by_callback_url),
            "webhooks_sent": self.webhooks_sent,
            "webhooks_delivered": self.webhooks_delivered,
            "webhooks_failed": self.webhooks_failed,
            "status_calls": self.status_calls,
            "sync_calls_by_body": dict(self.sync_calls_by_body),
            "peak_concurrent": dict(self.peak_concurrent),
        }


class InFlight:
    """The tasks and sync calls in flight, per protocol prefix, and the
    most of each prefix at once (written into `peaks`).

    A task is added with its end (`finished_at`) and leaves by itself when
    the clock passes it, or early through `end` (a cancel); a sync call is
    added with no end and leaves through `end`. Counting a prefix drops
    what has ended since from a heap of ends: each entry costs O(log n)
    once, however often the prefix is counted."""

    def __init__(self, peaks: dict[str, int]):
        self._peaks = peaks
        self._live: dict[str, dict[object, float]] = {}  # prefix -> key -> when it ends
        self._ends: dict[str, list[tuple[float, int, object]]] = {}  # prefix -> heap of (ends_at, seq, key)
        self._seq = itertools.count()

    def count(self, prefix: str, now: float) -> int:
        live = self._live.get(prefix)
        if not live:
            return 0
        heap = self._ends.get(prefix, [])
        while heap and heap[0][0] <= now:
            ends_at, _, key = heapq.heappop(heap)
            if live.get(key) == ends_at:
                del live[key]
        return len(live)

    def add(self, prefix: str, key: object, now: float, ends_at: float = math.inf) -> None:
        """One more in flight from `now`: it counts towards the peak even
        if it ends at once (a task of `duration_s` 0)."""
        count = self.count(prefix, now) + 1
        if count > self._peaks.get(prefix, 0):
            self._peaks[prefix] = count
        if ends_at <= now:
            return
        self._live.setdefault(prefix, {})[key] = ends_at
        if ends_at != math.inf:
            heapq.heappush(self._ends.setdefault(prefix, []), (ends_at, next(self._seq), key))

    def end(self, prefix: str, key: object) -> None:
        """`key` is no longer in flight (a cancel, a sync call's answer sent or dropped)."""
        live = self._live.get(prefix)
        if live is not None:
            live.pop(key, None)


class Store:
    """Every task of every protocol, the native idempotency keys, the
    counters and the fault rates. One process, one event loop: no locks."""

    def __init__(self, rng: random.Random | None = None):
        self.rng = rng or random.Random()
        self.reset()

    def reset(self) -> None:
        self.tasks: dict[str, Task] = {}
        # Each protocol's keys apart: the same key sent to two protocols is
        # two tasks, as it would be at two providers.
        self.by_idempotency_key: dict[tuple[str, str], Task] = {}
        self.by_protocol: dict[str, list[Task]] = {}  # creation order
        self.stats = Stats()
        self.in_flight = InFlight(self.stats.peak_concurrent)
        self.faults = Faults()
        # What a protocol keeps beside its tasks (ElevenLabs' speech
        # history), forgotten with them.
        self.protocol_state: dict[str, Any] = {}
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def add(self, task: Task) -> None:
        self.tasks[task.id] = task
        self.by_protocol.setdefault(task.protocol, []).append(task)
        self.stats.tasks_created += 1
        if task.idempotency_key is not None:
            self.by_idempotency_key[(task.protocol, task.idempotency_key)] = task
            self.stats.creates_by_idempotency_key[task.idempotency_key] += 1
        if task.callback_url is not None:  # keyed without its query string (a capability token)
            self.stats.creates_by_callback_url[task.callback_url.partition("?")[0]] += 1

    def by_key(self, protocol: str, key: str | None) -> Task | None:
        """The task this protocol created under this idempotency key."""
        return self.by_idempotency_key.get((protocol, key)) if key is not None else None

    def get(self, task_id: str, protocol: str) -> Task | None:
        task = self.tasks.get(task_id)
        return task if task is not None and task.protocol == protocol else None
