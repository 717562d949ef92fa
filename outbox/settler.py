"""The drain loop (`longcall settler`): claims due intents and runs their
steps — submit (outbox/submit.py), settle (outbox/settle.py, the one
closer), cancel (outbox/cancel.py) — up to `concurrency` at once.

It never polls: it LISTENs for intents that become due (or due sooner) and
otherwise sleeps until the earliest `not_before` it knows of, or the next
backstop sweep. Claims are leases (FOR UPDATE SKIP LOCKED), renewed while
their work runs, so several settlers can run side by side and a crashed
settler's claims come back when their leases end. No transaction is held
across a provider call or a download.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from app.capacity import capped_providers, is_capped
from app.config import Settings
from app.db import OUTBOX_CHANNEL
from app.domain import jobs
from app.domain.record import JobRecord
from app.listen import listen_forever
from app.metrics import INTENTS, metrics_app
from app.vocabulary import IntentKind, JobStatus
from outbox import decide, intents, notify, policy
from outbox.cancel import cancel
from outbox.context import Context
from outbox.outcome import Done, Later, Outcome
from outbox.roads.sweep import sweep_once
from outbox.settle import settle
from outbox.submit import mark_uncertain, submit

# What an exhausted intent's close may start from: never uncertain (a
# close racing a transition there would take its hold; decide.exhausted).
EXHAUSTIBLE = (JobStatus.QUEUED, JobStatus.SUBMITTING, JobStatus.RUNNING)

log = logging.getLogger("longcall.settler")

STEPS = {IntentKind.SUBMIT: submit, IntentKind.SETTLE: settle, IntentKind.CANCEL: cancel}
CLAIM_BATCH = 256  # the most one claim takes (slots and waiting room), as one statement
SHUTDOWN_GRACE_S = 25.0


def _epoch(value) -> float | None:
    return value.timestamp() if isinstance(value, dt.datetime) else value


class Settler:
    def __init__(self, ctx: Context, concurrency: int, *, sweep_interval_s: float | None = None,
                 lease_s: float | None = None):
        self.ctx = ctx
        self.concurrency = concurrency
        # Deliveries run in slots of their own (outbox/notify.py): a dead
        # endpoint's 15 s timeouts never hold up submits and settles.
        self.notify_concurrency = max(4, concurrency // 2)
        self.notifying = 0
        self.lease_s = lease_s or ctx.settings.settler_lease_s
        self.sweep_interval_s = ctx.settings.sweep_interval_s if sweep_interval_s is None else sweep_interval_s
        self.running: dict[int, tuple[intents.Intent, asyncio.Task]] = {}
        # Claimed (leased) intents waiting for a work slot, with their jobs'
        # rows: while steps are short a claim takes more than the free slots
        # (policy.waiting_room).
        self.waiting: collections.deque[tuple[intents.Intent, Any]] = collections.deque()
        self.mean_step_s: float | None = None
        self.wake = asyncio.Event()
        self.due_now = True  # scan once at start
        self.next_wake: float | None = None  # epoch seconds of the earliest known timer
        self.stopping = False
        # Finished intents wait here a moment to be deleted together (group
        # commit): one statement for many, instead of one each.
        self.finished: list[intents.Intent] = []
        self.finished_ready = asyncio.Event()

    # -- signals from elsewhere --------------------------------------------------
    def _due(self) -> None:
        self.due_now = True
        self.wake.set()

    def _timer(self, at: float | None) -> None:
        if at is not None and (self.next_wake is None or at < self.next_wake):
            self.next_wake = at
            self.wake.set()

    def _on_notify(self, payload: str) -> None:
        if not payload:
            self._due()
        else:
            with contextlib.suppress(ValueError):
                self._timer(float(payload))

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    # -- the loop ------------------------------------------------------------------
    async def run(self) -> None:
        dsn = self.ctx.settings.dsn
        # `_due` after each (re)connect: anything may have become due while no one listened.
        listener = asyncio.create_task(listen_forever(dsn, OUTBOX_CHANNEL, self._on_notify, role="settler-listen",
                                                      on_connected=self._due))
        leases = asyncio.create_task(self._keep_leases())
        finisher = asyncio.create_task(self._finish_batches())
        next_sweep = time.time() + (self.sweep_interval_s or 0)
        try:
            while not self.stopping:
                try:
                    now = time.time()
                    if self.due_now or (self.next_wake is not None and now >= self.next_wake):
                        await self._drain()
                    if self.sweep_interval_s and time.time() >= next_sweep:
                        report = await sweep_once(self.ctx.pool, self.ctx.settings)
                        next_sweep = time.time() + self.sweep_interval_s
                        self.next_wake = _epoch(report.next_due)
                        if report.queued_submit or report.queued_settle:
                            self.due_now = True
                        continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # database restarting, say: back off, rescan
                    log.warning("drain loop error; retrying", extra={"error": type(e).__name__})
                    self.due_now = True
                    await asyncio.sleep(1.0)
                    continue
                await self._sleep(next_sweep if self.sweep_interval_s else None)
        finally:
            listener.cancel()
            await self._shutdown()
            finisher.cancel()
            with contextlib.suppress(BaseException):
                await finisher
            await self._flush_finished()
            leases.cancel()
            for t in (listener, leases):
                with contextlib.suppress(BaseException):
                    await t

    async def _sleep(self, next_sweep: float | None) -> None:
        if self.due_now and self._has_free_slot():
            return
        now = time.time()
        targets = [t for t in (self.next_wake, next_sweep) if t is not None]
        if not self._has_free_slot():
            # Full: a due time already passed is work there is no slot for
            # (a step that finishes asks for the next drain). Waking for it
            # now would only claim nothing, again and again.
            targets = [t for t in targets if t > now]
        timeout = max(0.0, min(targets) - now) if targets else None
        self.wake.clear()
        # stop() may have set `wake` while we were draining: the clear above
        # must not swallow it (the next timer may be minutes away).
        if self.stopping or (self.due_now and self._has_free_slot()):
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    def _free_slots(self) -> tuple[int, int]:
        """(free slots for submits, settles and cancels; free slots for deliveries)."""
        return (self.concurrency - (len(self.running) - self.notifying),
                self.notify_concurrency - self.notifying)

    def _has_free_slot(self) -> bool:
        # The work slots only: a drain with them full still claims deliveries
        # (and a finishing task asks for the next drain), so waiting on a
        # free delivery slot here would only spin.
        return self._free_slots()[0] > 0

    async def _drain(self) -> None:
        self.due_now = False
        self._start_waiting()
        async with self.ctx.pool.acquire() as conn:
            while not self.stopping:
                free, free_notify = self._free_slots()
                # Claimed batches may be larger than the free slots: the rest
                # wait here, leased, and start as slots free up, without a
                # claim each (a claim is a round trip and a commit).
                room = free + self._waiting_room() - len(self.waiting)
                if free <= 0:
                    self.due_now = True  # full: a finishing task asks for the next drain
                if room <= 0 and free_notify <= 0:
                    return
                asked, asked_notify = max(0, min(room, CLAIM_BATCH)), max(0, min(free_notify, CLAIM_BATCH))
                # Each job is loaded by the claim. A row that waits here may be
                # a moment older when its step starts; every transition is
                # guarded by the status it expects, so an old row can only
                # lose a race, never win a wrong one.
                # A capped provider's submit reads its job's caps before the claim.
                claimed = await intents.claim(conn, asked, self.lease_s, asked_notify,
                                              load_submits=self.ctx.capacity_limited)
                for intent in claimed.intents:
                    if intent.kind is IntentKind.NOTIFY:
                        self._start(intent, None)  # its own slots, claimed only as many as free
                    else:
                        self.waiting.append((intent, claimed.jobs.get(intent.id)))
                self._start_waiting()
                notifies = sum(1 for i in claimed.intents if i.kind is IntentKind.NOTIFY)
                if not policy.claim_again(asked, len(claimed.intents) - notifies, asked_notify, notifies):
                    # Nothing more to claim now: sleep until the next due
                    # time. (A due time that passed while every slot is
                    # taken is left out by _sleep: the steps that finish
                    # ask for the next drain.)
                    self.next_wake = _epoch(claimed.next_due)
                    break

    def _waiting_room(self) -> int:
        return policy.waiting_room(self.concurrency, self.mean_step_s)

    def _start(self, intent: intents.Intent, job) -> None:
        if intent.kind is IntentKind.NOTIFY:
            self.notifying += 1
        task = asyncio.create_task(self._handle(intent, job))
        self.running[intent.id] = (intent, task)

    def _start_waiting(self) -> None:
        """Start claimed intents that wait, into the free work slots."""
        while self.waiting and not self.stopping and self._free_slots()[0] > 0:
            self._start(*self.waiting.popleft())

    async def _handle(self, intent: intents.Intent, job=None) -> None:
        outcome: Outcome
        started = time.monotonic()
        try:
            if policy.exhausted(intent.kind, intent.attempts):
                outcome = await self._exhaust(intent)
            elif intent.kind is IntentKind.NOTIFY:
                assert intent.delivery_id is not None  # the table's check says so
                outcome = await notify.notify(self.ctx, intent.delivery_id)
            else:
                outcome = await STEPS[intent.kind](self.ctx, intent.job_id, intent.attempts, job)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("step failed", extra={"job_id": intent.job_id, "intent": intent.kind})
            outcome = Later(policy.backoff(intent.attempts), failed=True, reason=type(e).__name__)
        try:
            if isinstance(outcome, Done):
                if not outcome.deleted:
                    # Still claimed (its lease runs) until the batch is written.
                    self.finished.append(intent)
                    self.finished_ready.set()
            else:
                async with self.ctx.pool.acquire() as conn:
                    # (A delivery's errors are its own: the job, closed, is not touched.)
                    if (outcome.failed or outcome.error) and outcome.reason \
                            and intent.kind is not IntentKind.NOTIFY:
                        # Operators see why (longcall status, the job's error on exhaustion).
                        await jobs.note_error(conn, intent.job_id, f"{intent.kind}: {outcome.reason}")
                    row = await intents.retry(conn, intent, outcome.delay_s, failed=outcome.failed)
                if row is not None:
                    if row["requested_meanwhile"]:
                        self._due()
                    else:
                        self._timer(row["not_before"].timestamp())
            INTENTS.labels(intent.kind, "done" if isinstance(outcome, Done) else
                           ("retry" if outcome.failed else "wait")).inc()
        except Exception as e:  # the lease will bring the intent back
            log.warning("could not record an intent's outcome",
                        extra={"job_id": intent.job_id, "intent": intent.kind, "error": type(e).__name__})
        finally:
            if self.running.pop(intent.id, None) is not None and intent.kind is IntentKind.NOTIFY:
                self.notifying -= 1
            if intent.kind is not IntentKind.NOTIFY:  # deliveries have slots (and no waiting room) of their own
                self.mean_step_s = policy.mean_step_s(self.mean_step_s, time.monotonic() - started)
            self._start_waiting()
            # Claim again once a quarter of the slots (or of the waiting
            # room) are free, so claims stay batched under load, or when
            # the last one finished.
            free, free_notify = self._free_slots()
            room = free + self._waiting_room() - len(self.waiting)
            if room >= max(1, (self.concurrency + self._waiting_room()) // 4) \
                    or free_notify >= max(1, self.notify_concurrency // 4) or not self.running:
                self._due()

    async def _finish_batches(self) -> None:
        while True:
            await self.finished_ready.wait()
            await asyncio.sleep(0.002)  # let the finishing tasks of this moment join the batch
            await self._flush_finished()

    async def _flush_finished(self) -> None:
        self.finished_ready.clear()
        batch, self.finished = self.finished, []
        if not batch:
            return
        try:
            async with self.ctx.pool.acquire() as conn:
                if await intents.finish_many(conn, batch):
                    self._due()  # asked again while we worked: run them again
        except asyncio.CancelledError:
            # Shutdown cancels the batch writer, maybe mid-write: the batch goes
            # back for the final flush (deleting twice is harmless), else these
            # intents would wait out their leases and run again for nothing.
            self.finished = batch + self.finished
            raise
        except Exception as e:  # their leases will bring them back; the steps are idempotent
            log.warning("could not delete finished intents", extra={"count": len(batch),
                                                                    "error": type(e).__name__})

    async def _exhaust(self, intent: intents.Intent) -> Outcome:
        """An intent that failed too often (decide.exhausted): its job fails
        with a refund (never a silent drop), unless a task may exist that
        nothing would then find or stop. A cancel intent is simply dropped."""
        if intent.kind == IntentKind.CANCEL:
            return Done()
        if intent.kind == IntentKind.NOTIFY:
            assert intent.delivery_id is not None
            await notify.give_up(self.ctx, intent.delivery_id, intent.job_id)
            return Done()
        async with self.ctx.pool.acquire() as conn:
            row = await jobs.load(conn, intent.job_id)
        job = JobRecord.from_row(row) if row is not None else None
        provider = self.ctx.providers.get(job.provider) if job is not None else None
        now = dt.datetime.now(dt.UTC)
        decision = decide.exhausted(intent.kind, job, submit_in_doubt=bool(row and row["submit_in_doubt"]),
                                    last_error=row["last_error"] if row is not None else None,
                                    attempts=intent.attempts, now=now,
                                    facts=self.ctx.facts_for(provider, job.model) if provider and job else None)
        log.warning("intent exhausted", extra={"job_id": intent.job_id, "intent": intent.kind})
        if isinstance(decision, Done):
            return decision
        assert job is not None
        if isinstance(decision, decide.Wait):
            return decide.later(decision)
        if isinstance(decision, decide.MarkUncertain):
            return await mark_uncertain(self.ctx, job, decision)
        async with self.ctx.pool.acquire() as conn:
            closed = await jobs.close(conn, job.id, decision.status, error_code=decision.error_code,
                                      error_message=decision.message, cancel_at_provider=decision.cancel_at_provider,
                                      from_statuses=EXHAUSTIBLE,
                                      wake_capacity=is_capped(self.ctx.settings, job.provider))
        if closed is not None:
            self.ctx.metrics.job_finished(job.provider, decision.status, closed)
        return Done()

    async def _keep_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            held = [*(intent for intent, _ in self.running.values()), *(intent for intent, _ in self.waiting)]
            if not held:
                continue
            with contextlib.suppress(Exception):
                await intents.renew(self.ctx.pool, held, self.lease_s)

    async def _shutdown(self) -> None:
        # Claimed intents that never started go back at once (due again).
        held = [intent for intent, _ in self.waiting]
        self.waiting.clear()
        if self.running:
            tasks = [t for _, t in self.running.values()]
            done, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
            held += [intent for intent, t in self.running.values() if t in pending]
            for t in pending:
                t.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*pending, return_exceptions=True)
        if held:
            with contextlib.suppress(Exception):
                async with self.ctx.pool.acquire() as conn:
                    for intent in held:
                        await intents.release(conn, intent)


async def _serve_metrics(pool, port: int, caps) -> None:
    import uvicorn

    from app.embedded_server import EmbeddedServer

    # The settler owns SIGTERM and SIGINT (it drains its claims on them).
    server = EmbeddedServer(uvicorn.Config(metrics_app(pool, caps), host="0.0.0.0", port=port,
                                          log_level="warning", access_log=False, lifespan="off"))
    await server.serve()


async def run_settler(settings: Settings, *, concurrency: int = 16, metrics_port: int | None = None,
                      stopped_before_start: Callable[[], bool] = lambda: False) -> int:
    """Run until SIGTERM or SIGINT, then drain the claims and return 0.

    A stop that comes while the settler is still starting (`stopped_before_start`
    says whether one came before the event loop took the signals over; one
    during the connect cancels it) is a clean exit too: nothing is claimed yet.
    """
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()
    settler: Settler | None = None

    def stop() -> None:
        if settler is not None:
            settler.stop()
        elif starting is not None:
            starting.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    if stopped_before_start():
        log.info("settler stopped before it started")
        return 0
    try:
        ctx = await Context.open(settings, pool_size=min(concurrency + 4, 50), connect_all=True)
    except asyncio.CancelledError:
        log.info("settler stopped before it started")
        return 0
    metrics_task = (asyncio.create_task(_serve_metrics(ctx.pool, metrics_port, capped_providers(settings)))
                    if metrics_port else None)
    settler = Settler(ctx, concurrency)
    log.info("settler started", extra={"concurrency": concurrency})
    try:
        await settler.run()
    finally:
        if metrics_task is not None:
            metrics_task.cancel()
            with contextlib.suppress(BaseException):
                await metrics_task
        await ctx.close()
    log.info("settler stopped")
    return 0
