"""The built-in simulator's native protocol (provider `sim`).

Submit is idempotent (`Idempotency-Key`), each task hands out its own
webhook secret, webhooks are signed t/v1, and the task reports a cost.
"""
from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx

from app.providers.base import (
    Observation,
    OutputValue,
    Provider,
    ProviderFacts,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
    claimed_id,
    json_value,
    text_value,
    webhook_field,
)
from app.providers.http import (
    NO_SECRETS,
    Clients,
    Secrets,
    collect_urls,
    ended,
    host_of,
    json_object,
    read_call,
    submit_call,
)
from app.signing.webhooks import verify_tv1
from app.vocabulary import ProviderName

NAME = ProviderName.SIM

_STATES = {
    "queued": TaskState.RUNNING,
    "running": TaskState.RUNNING,
    "succeeded": TaskState.SUCCEEDED,
    "failed": TaskState.FAILED,
    "cancelled": TaskState.CANCELLED,
    "canceled": TaskState.CANCELLED,
}


def observation_from_task(body: dict, secrets: Secrets) -> Observation:
    """The simulator's task JSON as an Observation (pure)."""
    state = _STATES.get(body.get("status"))  # type: ignore[arg-type]
    if state is None:
        raise Transient(f"{NAME}: unknown task status {secrets.mask(str(body.get('status')), 40)!r}")
    if state is TaskState.RUNNING:
        return Observation(state=state)
    if state is TaskState.FAILED:
        return ended(state, secrets, body.get("error"), fallback="the task failed")
    if state is TaskState.CANCELLED:
        return ended(state, secrets, body.get("error"))
    outputs = body.get("outputs") or []
    items = [u for u in outputs if isinstance(u, str)] if isinstance(outputs, list) else []
    cost = body.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
        cost = None
    urls, values = outputs_of(items)
    return Observation(state=state, output_urls=urls, values=values, cost=int(cost) if cost is not None else None)


def outputs_of(items: list[str]) -> tuple[tuple[str, ...], tuple[OutputValue, ...]]:
    """A task's `outputs` as URLs to download and values to store (pure):
    file URLs are files; one entry that is not a URL is the task's text
    (`output_text`); a list with several entries, any of them not a URL,
    is one JSON output (CONTRACT.md's rule for a list of strings, as
    Replicate's `output`)."""
    if all(collect_urls(item) for item in items):
        return tuple(items), ()
    if len(items) == 1:
        return (), (text_value(items[0]),)
    return (), (json_value(items),)


class SimProvider(Provider):
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
        stale_after_s: float = 30.0,
    ):
        self.base_url = base_url.rstrip("/")
        self._http = Clients(timeout_s, client, idempotent_submit=True)
        # The native protocol takes no credential; the per-task webhook
        # secret is handed to us, never sent.
        self._secrets = NO_SECRETS
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="t/v1",
            idempotent_submit=True,
            can_find=False,
            stale_after_s=stale_after_s,
            output_hosts=(host_of(self.base_url),),
            output_ttl_s=3600.0,
        )

    def __repr__(self) -> str:
        return f"SimProvider({self.base_url!r})"

    def _task_url(self, task_id: str, suffix: str = "") -> str:
        return f"{self.base_url}/v1/tasks/{quote(task_id, safe='')}{suffix}"

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        body: dict[str, Any] = {"model": request.model, "input": dict(request.input)}
        if request.callback_url:
            body["callback_url"] = request.callback_url
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}/v1/tasks",
            json=body, headers={"Idempotency-Key": idempotency_key},
            secrets=self._secrets.plus_callback(request.callback_url),
        )
        data = json_object(response, NAME, Uncertain)
        task_id, secret = data.get("id"), data.get("webhook_secret")
        if not isinstance(task_id, str) or not task_id:
            raise Uncertain(f"{NAME}: submit answer has no task id")
        return Submitted(
            task_id=task_id,
            webhook_secret=secret if isinstance(secret, str) and secret else None,
        )

    async def status(self, task: Task) -> Observation:
        response = await read_call(self._http.reads, NAME, "GET", self._task_url(task.task_id), secrets=self._secrets)
        return observation_from_task(json_object(response, NAME, Transient), self._secrets)

    async def cancel(self, task: Task) -> None:
        try:
            await read_call(
                self._http.reads, NAME, "POST", self._task_url(task.task_id, "/cancel"), secrets=self._secrets,
                pass_statuses=(409,),  # already finished: nothing to cancel
            )
        except Rejected:
            return None  # no such task: nothing to cancel

    async def find(self, request: SubmitRequest) -> Submitted | None:
        # Submit is idempotent: the settler re-submits with the same key.
        return None

    async def verify(self, webhook: WebhookRequest) -> bool:
        if not webhook.job_secret:
            return False
        try:
            return verify_tv1(
                webhook.headers.get("x-signature"), webhook.raw_body, webhook.job_secret, time.time()
            )
        except Exception:
            return False

    def webhook_task_id(self, webhook: WebhookRequest) -> str | None:
        # The task JSON's `id`. (An uncertain sim job is rare — the submit is
        # idempotent — and its deliveries cannot verify without the per-task
        # secret the lost answer carried; this is here for completeness.)
        return claimed_id(webhook_field(webhook.raw_body, "id"))

    async def aclose(self) -> None:
        await self._http.aclose()
