"""The asynchronous client: `_core`'s calls over an `httpx.AsyncClient` (the same calls as `_sync.py`)."""
from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from longcall_client import _core as core
from longcall_client.errors import LongcallError
from longcall_client.models import (
    Account,
    DownloadedOutput,
    Event,
    Job,
    JobPage,
    Model,
    Notification,
    NotificationPage,
    Owner,
    OwnerPage,
    WebhookEndpoint,
    endpoints_from_json,
    events_from_json,
    models_from_json,
)


class _Transport:
    def __init__(self, config: core.Config, http_client: httpx.AsyncClient | None):
        self.config = config
        self.http = http_client if http_client is not None else httpx.AsyncClient()
        self.owns_http = http_client is None

    async def send(self, call: core.Call, *, stream: bool = False) -> httpx.Response:
        """The answer to `call` once it is a success or a redirect, after the
        retries `_core` allows; any other answer is raised as its LongcallError.
        With `stream`, the caller reads and closes the answer."""
        attempt = 0
        while True:
            request = core.build_request(self.http, self.config, call)
            try:
                response = await self.http.send(request, stream=stream, follow_redirects=False)
            except httpx.TransportError as e:
                delay = core.delay_after_error(call, attempt, self.config.max_retries, e)
                if delay is None:
                    raise core.with_key(core.connection_error(e), call) from e
            else:
                if response.status_code < 400:
                    return response
                try:
                    content = await response.aread()
                finally:
                    await response.aclose()
                delay = core.delay_after_status(call, attempt, self.config.max_retries, response.status_code,
                                                response.headers)
                if delay is None:
                    raise core.with_key(core.answer_error(response.status_code, response.headers, content), call)
            await asyncio.sleep(delay)
            attempt += 1

    async def json(self, call: core.Call) -> Any:
        response = await self.send(call)
        try:
            return core.decode_answer(response.status_code, response.headers, response.content)
        except LongcallError as e:
            raise core.with_key(e, call) from None

    async def open_storage(self, url: str) -> httpx.Response:
        """A streamed GET of a presigned URL, without the API key, redirects followed."""
        try:
            response = await self.http.send(core.storage_request(self.http, self.config, url), stream=True,
                                      follow_redirects=True)
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        if response.status_code != 200:
            await response.aclose()
            raise core.storage_failure(response.status_code)
        return response

    async def close(self) -> None:
        if self.owns_http:
            await self.http.aclose()


class AsyncJobs:
    def __init__(self, transport: _Transport):
        self._t = transport

    async def create(self, provider: str, model: str, input: dict[str, Any], max_credits: int,
               metadata: dict[str, Any] | None = None, idempotency_key: str | None = None, *,
               owner: str | None = None) -> Job:
        """Create a job (202), or get the one this `idempotency_key` already made (200).
        Without a key one is generated, and this call's own retries reuse it,
        so a lost answer never creates a second job."""
        call = core.create_job(provider, model, input, max_credits, metadata, idempotency_key, owner)
        return Job.from_json(await self._t.json(call))

    async def get(self, job_id: str, *, wait: float | None = None, owner: str | None = None) -> Job:
        """The job now; with `wait` (≤ 30 s) the server holds the answer until the job changes or `wait` passes."""
        return Job.from_json(await self._t.json(core.get_job(job_id, wait, owner)))

    async def list(self, status: str | None = None, limit: int | None = None, cursor: str | None = None, *,
             owner: str | None = None) -> JobPage:
        """One page of the owner's jobs, newest first."""
        return JobPage.from_json(await self._t.json(core.list_jobs(status, limit, cursor, owner)))

    async def iterate(self, status: str | None = None, page_size: int | None = None, *,
                      owner: str | None = None) -> AsyncIterator[Job]:
        """Every job of the owner, newest first, fetching pages as it goes."""
        cursor = None
        while True:
            page = await self.list(status, page_size, cursor, owner=owner)
            for job in page.jobs:
                yield job
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def wait(self, job_id: str, timeout: float, *, owner: str | None = None) -> Job:
        """Long-poll the job until it is terminal or `timeout` seconds have passed.
        Returns the job either way: check `job.terminal` (no exception on timeout).
        A poll the network or the server failed (no answer, a 5xx, a 429) is
        polled again until `timeout`; only if no poll ever answered is its
        error raised. An error about the job (NotFound, Unauthenticated) is raised at once."""
        deadline = time.monotonic() + timeout
        seen: Job | None = None
        while True:
            try:
                job = await self.get(job_id, wait=core.poll_seconds(deadline - time.monotonic()), owner=owner)
            except LongcallError as e:
                after = core.after_failed_poll(e, deadline - time.monotonic(), seen)
                if isinstance(after, Job):
                    return after
                await asyncio.sleep(after)
                continue
            if job.terminal or time.monotonic() >= deadline:
                return job
            seen = job

    async def cancel(self, job_id: str, *, owner: str | None = None) -> Job:
        """Cancel a job not yet terminal (fully refunded); InvalidState if it already is."""
        return Job.from_json(await self._t.json(core.cancel_job(job_id, owner)))

    async def events(self, job_id: str, *, owner: str | None = None) -> builtins.list[Event]:
        """The job's timeline, oldest first."""
        return events_from_json(await self._t.json(core.job_events(job_id, owner)))

    async def download(self, job_id: str, index: int, path: str | os.PathLike[str], *,
                 owner: str | None = None) -> DownloadedOutput:
        """Stream output `index` of the job to `path` (replaced only once the
        download is complete). A redirect to storage (a presigned URL) is
        followed without the API key."""
        response = await self._t.send(core.job_output(job_id, index, owner), stream=True)
        try:
            if response.status_code in core.REDIRECTS:
                target = core.redirect_target(response)
                await response.aclose()
                response = await self._t.open_storage(target)
            elif response.status_code != 200:
                raise core.storage_failure(response.status_code)
            # The file's own calls run in a thread: a slow disk must not stall the event loop.
            part = await asyncio.to_thread(core.PartFile, path)
            try:
                async for chunk in response.aiter_bytes(core.CHUNK):
                    await asyncio.to_thread(part.write, chunk)
                return await asyncio.to_thread(part.finish, response.headers)
            except BaseException:
                part.abort()  # at once, not in a thread: a cancelled task must still leave no file behind
                raise
        except httpx.TransportError as e:
            raise core.connection_error(e) from e
        finally:
            await response.aclose()


class AsyncAccountResource:
    def __init__(self, transport: _Transport):
        self._t = transport

    async def get(self, *, owner: str | None = None) -> Account:
        """The owner's credits (balance, reserved, charged) and active slots."""
        return Account.from_json(await self._t.json(core.get_account(owner)))


class AsyncModels:
    def __init__(self, transport: _Transport):
        self._t = transport

    async def list(self, *, owner: str | None = None) -> builtins.list[Model]:
        return models_from_json(await self._t.json(core.list_models(owner)))


class AsyncWebhookEndpoints:
    def __init__(self, transport: _Transport):
        self._t = transport

    async def create(self, url: str, events: builtins.list[str] | None = None, *,
                     owner: str | None = None) -> WebhookEndpoint:
        """Register an endpoint; its `secret` is in this answer only: store it."""
        return WebhookEndpoint.from_json(await self._t.json(core.create_endpoint(url, events, owner)))

    async def list(self, *, owner: str | None = None) -> builtins.list[WebhookEndpoint]:
        """The endpoints, oldest first (without their secrets)."""
        return endpoints_from_json(await self._t.json(core.list_endpoints(owner)))

    async def delete(self, endpoint_id: str, *, owner: str | None = None) -> None:
        await self._t.json(core.delete_endpoint(endpoint_id, owner))


class AsyncNotifications:
    def __init__(self, transport: _Transport):
        self._t = transport

    async def list(self, job_id: str | None = None, limit: int | None = None,
             cursor: str | None = None, *, owner: str | None = None) -> NotificationPage:
        """One page of the owner's notifications, newest first, with each endpoint's delivery state
        (under a platform key without `owner`: its owners' too)."""
        return NotificationPage.from_json(await self._t.json(core.list_notifications(job_id, limit, cursor, owner)))

    async def redeliver(self, notification_id: str, *, owner: str | None = None) -> Notification:
        """Queue the notification again to its endpoints; returns it, its deliveries pending."""
        return Notification.from_json(await self._t.json(core.redeliver_notification(notification_id, owner)))


class AsyncOwners:
    """A platform's owners (a platform owner's key only; any other key gets NotFound).
    These calls never send the client's `owner`: they are the platform's own."""

    def __init__(self, transport: _Transport):
        self._t = transport

    async def create(self, name: str, *, credits: int | None = None, max_active: int | None = None,
                     idempotency_key: str | None = None) -> Owner:
        """A new owner under this platform (201), or the one this `idempotency_key` already
        made (200). Without a key one is generated, and this call's own retries reuse it,
        so a lost answer never makes a second owner."""
        return Owner.from_json(await self._t.json(core.create_owner(name, credits, max_active, idempotency_key)))

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> OwnerPage:
        """One page of this platform's owners, newest first."""
        return OwnerPage.from_json(await self._t.json(core.list_owners(limit, cursor)))

    async def iterate(self, *, page_size: int | None = None) -> AsyncIterator[Owner]:
        """Every owner of this platform, newest first, fetching pages as it goes."""
        cursor = None
        while True:
            page = await self.list(limit=page_size, cursor=cursor)
            for owner in page.owners:
                yield owner
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def get(self, owner_id: str) -> Owner:
        """One owner of this platform; NotFound for any other (or unknown) id."""
        return Owner.from_json(await self._t.json(core.get_owner(owner_id)))

    async def grant(self, owner_id: str, credits: int, *, reason: str | None = None,
                    idempotency_key: str | None = None) -> Owner:
        """Give the owner `credits` (negative: take them back; InsufficientCredits beyond its
        balance, and nothing moves). Returns the owner after it. Without a key one is
        generated and reused by this call's own retries, so the credits move once."""
        return Owner.from_json(await self._t.json(core.grant_credits(owner_id, credits, reason, idempotency_key)))


class AsyncClient:
    """The longcall API, for asyncio (the same calls as `Client`, awaited).

        async with AsyncClient("http://127.0.0.1:8000", "lc_...") as client:
            job = await client.jobs.create("sim", "image-fast", {"prompt": "a lighthouse"}, max_credits=10)

    `owner`: act for an owner under a platform key (header Longcall-Owner);
    every call but the owners API's sends it, and each takes `owner=` to
    override it. `http_client`: an httpx.AsyncClient of your own (its base URL is
    not used, and it is not closed by `close()`).
    `max_retries`: how often one call is sent again after a connection error,
    a 503, or a 429 that says when (reads, creates and grants only; 0 turns it off).
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = core.DEFAULT_TIMEOUT_S,
                 owner: str | None = None, http_client: httpx.AsyncClient | None = None,
                 max_retries: int = core.DEFAULT_MAX_RETRIES):
        self._config = core.Config(base_url=base_url, api_key=api_key, timeout=timeout, owner=owner,
                                   max_retries=max_retries)
        self._transport = _Transport(self._config, http_client)
        self.jobs = AsyncJobs(self._transport)
        self.account = AsyncAccountResource(self._transport)
        self.models = AsyncModels(self._transport)
        self.webhook_endpoints = AsyncWebhookEndpoints(self._transport)
        self.notifications = AsyncNotifications(self._transport)
        self.owners = AsyncOwners(self._transport)

    def __repr__(self) -> str:
        return f"AsyncClient(base_url={self._config.base_url!r})"

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
