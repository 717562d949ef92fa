"""The simulator's process-wide state: the task store, the webhook sender,
the account keys, and the two things every protocol does (create, cancel)."""
from __future__ import annotations

import base64
import hashlib
import os
import random
import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.simulator.controls import Controls
from app.simulator.faults import draw_webhook_plan, roll
from app.simulator.state import Store, Task
from app.simulator.webhooks import DEFAULT_RETRY_DELAYS, OutgoingWebhook, WebhookSender

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
