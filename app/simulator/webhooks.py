"""Webhook deliveries: the only scheduled work in the simulator.

A delivery is a timer (loop.call_later) that fires when the task reaches the
event, renders the body at that moment, and POSTs it, retrying a failed
attempt (connection error or non-2xx) after each of `retry_delays`.

Sent with aiohttp alone, without httpx (longcall's own processes send
httpx requests over aiohttp, app/http_transport.py): only the provider's
CPU, not ours, and on the bench's shared cores every simulator
microsecond is one our processes lose. Measured on loopback, 16 POSTs at
once: 97 µs of client CPU per webhook with aiohttp, 284–299 with httpx
over aiohttp, 480 with httpx's own HTTP/1.1 (/tmp probe, 3 rounds each;
README, the e2e row).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import aiohttp

from app.simulator.faults import WebhookPlan
from app.simulator.state import Stats

log = logging.getLogger("longcall.sim.webhooks")

DEFAULT_RETRY_DELAYS = (1.0, 2.0, 4.0)
ATTEMPT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class OutgoingWebhook:
    url: str
    body: bytes
    # Headers for an attempt sent at unix time `t` (each attempt is signed
    # afresh, so a retry carries a current timestamp).
    sign: Callable[[bytes, int], dict[str, str]]


Render = Callable[[], "OutgoingWebhook | None"]


class WebhookSender:
    def __init__(self, stats: Callable[[], Stats], retry_delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS):
        self._stats = stats  # a getter: a reset replaces the Stats object
        self.retry_delays = tuple(retry_delays)
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Task] = set()
        self._client: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._client is None:
            # trust_env=False: a proxy set in the environment must not sit
            # between the simulator and a loopback receiver. No cookies: a
            # provider's webhooks carry none.
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT_S),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(limit=200),
            )
        return self._client

    def schedule(self, key: Hashable, at: float, render: Render, plan: WebhookPlan) -> None:
        """Deliver what `render` returns at unix time `at` (+ the plan's delay)."""
        if plan.drop:
            return
        self.unschedule(key)
        loop = asyncio.get_running_loop()
        delay = max(0.0, at - time.time()) + plan.delay_s
        self._timers[key] = loop.call_later(delay, self._fire, key, render, plan)

    def unschedule(self, key: Hashable) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _fire(self, key: Hashable, render: Render, plan: WebhookPlan) -> None:
        self._timers.pop(key, None)
        task = asyncio.get_running_loop().create_task(self._deliver(render, plan))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _deliver(self, render: Render, plan: WebhookPlan) -> None:
        try:
            hook = render()
            if hook is None:
                return
            for _ in range(2 if plan.duplicate else 1):
                await self._send_with_retries(hook)
        except Exception:  # a bug here must not pass silently, nor stop other deliveries
            log.exception("webhook delivery crashed")

    async def _send_with_retries(self, hook: OutgoingWebhook) -> None:
        client = self._http()
        for attempt in range(len(self.retry_delays) + 1):
            headers = {"content-type": "application/json", **hook.sign(hook.body, int(time.time()))}
            self._stats().webhooks_sent += 1
            try:
                async with client.post(hook.url, data=hook.body, headers=headers, allow_redirects=False) as response:
                    await response.read()  # drained, the connection is kept for the next webhook
                if 200 <= response.status < 300:
                    self._stats().webhooks_delivered += 1
                    return
                reason = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                reason = type(exc).__name__
            if attempt < len(self.retry_delays):
                log.info("webhook attempt %d failed (%s); retrying", attempt + 1, reason)
                await asyncio.sleep(self.retry_delays[attempt])
        self._stats().webhooks_failed += 1
        log.warning("webhook given up after %d attempts", len(self.retry_delays) + 1)

    def cancel_all(self) -> None:
        """Forget every pending and running delivery (a reset)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._running):
            task.cancel()

    async def aclose(self) -> None:
        self.cancel_all()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
