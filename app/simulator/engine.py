"""The simulator's process-wide state: the task store, the webhook sender,
the account keys, and the two things every protocol does (create, cancel).

Concurrency, per protocol prefix (`prefixes`: each protocol's, as its routes
are mounted; the native protocol's is "/v1"): a task is in flight from its
creation until it ends at the provider, a sync call from the start of its
work (`sync_call`) until its answer has been sent, or dropped (a
`submit_timeout_after_create` hold that ends, a client that left). With
the `max_concurrent` fault at n, a create (`busy` says so before it) or a
sync call that would make n + 1 of its prefix in flight is refused: the
protocol answers its documented 429 and does nothing (no task, no count in
`sync_calls_by_body`). A create answered from an idempotency key makes
nothing, so it is never refused. `peak_concurrent` in the stats is the most
of each prefix in flight at once since the last reset.
"""
from __future__ import annotations

import base64
import hashlib
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.responses import Response

from app.simulator.controls import Controls
from app.simulator.faults import draw_webhook_plan, roll
from app.simulator.state import InFlight, Store, Task
from app.simulator.webhooks import DEFAULT_RETRY_DELAYS, OutgoingWebhook, WebhookSender
from app.simulator.wire import ReleaseAfter

# A protocol's webhook for (task, event, now), or None when it sends none.
Renderer = Callable[["Simulator", Task, str, float], "OutgoingWebhook | None"]

DEFAULT_HOLD_S = 60.0
FAL_USER_ID = "longcall-sim"


class Simulator:
    def __init__(
        self,
        *,
        webhook_retry_delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS,
        hold_s: float = DEFAULT_HOLD_S,
        replicate_page_size: int = 100,
        rng: random.Random | None = None,
    ):
        self.store = Store(rng)
        self.sender = WebhookSender(lambda: self.store.stats, webhook_retry_delays)
        self.hold_s = hold_s
        self.replicate_page_size = replicate_page_size
        self.renderers: dict[str, Renderer] = {}
        # protocol -> the prefix its routes are mounted under (concurrency is counted per prefix)
        self.prefixes: dict[str, str] = {}
        # One account per process, as a real provider account would have.
        self.replicate_webhook_secret = "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")
        self.fal_private_key = Ed25519PrivateKey.generate()
        self.fal_user_id = FAL_USER_ID
        # KIE's optional `webhookHmacKey` (an account setting there): None
        # sends its callbacks unsigned, as KIE does until a user enables it.
        self.kie_webhook_hmac_key: str | None = None

    def count_sync_call(self, raw_body: bytes) -> None:
        """A sync call did its work (the answer may still be dropped by a
        fault): counted by its body, so a test sees a call made twice."""
        self.store.stats.sync_calls_by_body[hashlib.sha256(raw_body).hexdigest()] += 1

    def fault(self, name: str) -> bool:
        """Roll the dice for one request against the current rate of `name`."""
        return roll(self.store.rng, getattr(self.store.faults, name))

    def busy(self, prefix: str) -> bool:
        """True when one more task or call of `prefix` would be more than
        `max_concurrent` in flight: the create must be refused."""
        limit = self.store.faults.max_concurrent
        return limit is not None and self.store.in_flight.count(prefix, time.time()) >= limit

    def start_call(self, prefix: str) -> CallSlot | None:
        """A sync call of `prefix` starts its work: its slot, to release
        once its answer is sent or dropped; None when `busy` (refused)."""
        if self.busy(prefix):
            return None
        return CallSlot(self.store.in_flight, prefix)

    async def sync_call(self, prefix: str, busy: Callable[[], Response],
                        work: Callable[[], Awaitable[Response]]) -> Response:
        """`busy()` when the call is refused, else the answer of `work()`,
        the call in flight until that answer has gone out (or was dropped)."""
        slot = self.start_call(prefix)
        if slot is None:
            return busy()
        try:
            response = await work()
        except BaseException:
            slot.release()
            raise
        return ReleaseAfter(response, slot.release)

    def create_task(
        self,
        *,
        task_id: str,
        protocol: str,
        model: str,
        input: dict[str, Any],
        controls: Controls,
        base_url: str,
        callback_url: str | None = None,
        webhook_secret: str | None = None,
        idempotency_key: str | None = None,
        webhook_events: tuple[str, ...] = ("completed",),
        extra: dict[str, Any] | None = None,
        lifetime_s: float | None = None,
    ) -> Task:
        """`lifetime_s`: the task is stopped this long after it is created
        if it has not finished by then."""
        store = self.store
        task = Task(
            id=task_id,
            protocol=protocol,
            model=model,
            input=input,
            controls=controls,
            created_at=time.time(),
            base_url=base_url,
            seq=store.next_seq(),
            callback_url=callback_url,
            webhook_secret=webhook_secret,
            idempotency_key=idempotency_key,
            webhook_plan=draw_webhook_plan(store.faults, store.rng),
            webhook_events=webhook_events,
            extra=extra or {},
        )
        if lifetime_s is not None:
            task.deadline_at = task.created_at + lifetime_s
        store.add(task)
        store.in_flight.add(self.prefixes[protocol], ("task", task.id), task.created_at, task.finished_at)
        if callback_url is not None:
            if "start" in webhook_events:
                self.schedule_event(task, "start", task.created_at)
            if "completed" in webhook_events:
                self.schedule_event(task, "completed", task.finished_at)
        return task

    def cancel_task(self, task: Task) -> bool:
        """Cancel unless finished; its terminal webhook goes out now instead
        of at the planned end."""
        now = time.time()
        if not task.cancel(now):
            return False
        self.store.in_flight.end(self.prefixes[task.protocol], ("task", task.id))
        if task.callback_url is not None and "completed" in task.webhook_events:
            self.schedule_event(task, "completed", now)
        return True

    def schedule_event(self, task: Task, event: str, at: float) -> None:
        """Send `task`'s webhook for `event` at `at` (the protocol's renderer
        makes it then; a stage report such as Suno's `first` is one)."""
        def render() -> OutgoingWebhook | None:
            if self.store.tasks.get(task.id) is not task:  # reset since
                return None
            # A timer may fire a hair before the wall clock says the event
            # happened; render the state as of the event, never before it.
            now = time.time()
            if event == "completed":
                now = max(now, task.finished_at)
            return self.renderers[task.protocol](self, task, event, now)

        self.sender.schedule((task.id, event), at, render, task.webhook_plan)

    def reset(self) -> None:
        self.sender.cancel_all()
        self.store.reset()
        self.kie_webhook_hmac_key = None


class CallSlot:
    """One sync call in flight; `release` (once or more) ends it."""

    def __init__(self, in_flight: InFlight, prefix: str):
        # The tracker it was counted in: a reset meanwhile leaves the new one alone.
        self._in_flight = in_flight
        self._prefix = prefix
        self._key = object()
        self._released = False
        in_flight.add(prefix, self._key, time.time())

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._in_flight.end(self._prefix, self._key)
