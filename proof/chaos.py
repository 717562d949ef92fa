"""`longcall chaos` (`make chaos`): the reliability run.

Everything real, in one temporary directory: an embedded PostgreSQL, file
storage, the provider simulator, the web server and two settlers, each its
own process. N jobs from several owners go in through the HTTP API over
every provider the simulator speaks — async tasks (sim, Replicate, fal, KIE,
the AI Gateway, Gemini, ElevenLabs dubbing) and sync calls (Anthropic,
OpenAI, ElevenLabs speech and sound effects, their timings from a models
file written for the run) — with the simulator's faults on (lost,
duplicated and delayed webhooks, submits and calls that time out after the
work was done, submit/status/download errors), some failing and some long
tasks, client cancels and polling reads — while
settlers and the web server are SIGKILLed at random and restarted, and
PostgreSQL is restarted once. The owners' notification endpoints
(ENDPOINTS, registered through the API) point at receivers the run serves
on loopback — healthy, failing each notification's first attempts, slow —
which verify every signature. A platform owner (CONTRACT.md: Apps with
many users) makes owners through the API and funds them; a share of the
jobs goes in through its key acting for them (`Longcall-Owner`), while its
grants and claw-backs (some past what the owner holds: 402; some sent again
with the same key: 200, nothing moves) race the creates, and its own
endpoint gets its owners' notifications. When every job has closed (or is
`uncertain`) and every notification is delivered, it checks every invariant
(proof/invariants.py), prints a table, and exits 1 on any violation.

The models file priced and capped as a real catalogue would be (issue #14):
Veo through KIE and ElevenLabs' sound effects per second of the media
stored (their jobs ask for real WAVs and MP4s, `output_duration_s`), fal's
Flux per image, Claude and the OpenAI model per 1k tokens, ElevenLabs
speech per 1k characters, the simulator's own model at the cost it reports;
MAX_IN_FLIGHT_FAL and two entries' `max_in_flight` (the simulator's model,
ElevenLabs speech) sized to bind while the creates go in (`run_caps`). The
checks hold every charge to its price on what was measured, and every cap
to the simulator's own peak and to samples of the database taken during the
run.

The client side survives the kills the way a careful client would: every
create carries an Idempotency-Key and is retried with the same key and body
until it gets an answer (402/429 are answers); what it was told is checked
against the database at the end.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import random
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.embedded import EmbeddedPostgres, free_port
from app.models_file import NO_MODELS, ModelsFile
from app.models_file import parse as parse_models
from app.providers import provider_kind
from app.vocabulary import JobStatus, NotificationType, ProviderKind
from proof import invariants
from proof.invariants import Check

REPO_ROOT = Path(__file__).resolve().parents[1]  # holds app/ and proof/
TERMINAL = ("succeeded", "failed", "cancelled", "expired")
SETTLING = ("queued", "submitting", "running")  # `uncertain` waits for an operator, not for us

DEFAULT_FAULTS = {
    "drop_webhook": 0.10,
    "duplicate_webhook": 0.10,
    "delay_webhook_s": 0.5,
    "submit_timeout_after_create": 0.02,
    "submit_error": 0.02,
    "status_error": 0.05,
    "download_error": 0.05,
}
# Each provider's models in the mix, one picked at random per job: KIE's Market
# and two of its families, the Gateway's url videos and (google/) base64 ones,
# ElevenLabs' dubs (async) beside its speech and sound effects (sync calls).
SPEECH_MODEL = "text-to-speech/JBFqnCBsd6RMkjVDRZzb"
MODELS = {
    "sim": ("image-fast",),
    "replicate": ("black-forest-labs/flux-schnell",),
    "fal": ("fal-ai/flux/dev",),
    "kie": ("veo3_fast", "veo/veo3_fast", "suno/V4_5"),
    "gateway": ("klingai/kling-v3.0-t2v", "google/veo-3.1-generate-001"),
    "gemini": ("veo-3.1-generate-preview",),
    "elevenlabs": ("dubbing", SPEECH_MODEL, "sound-generation"),
    "anthropic": ("claude-sonnet-4-5",),
    "openai": ("gpt-4o-mini",),
}
# A provider's models weighted where they are not picked evenly.
MODEL_WEIGHTS = {"elevenlabs": (3, 2, 1)}
# Model names the adapter refuses before any call: the job fails submit_rejected.
REJECTED_MODELS = {"replicate": "not a model", "fal": "../nope", "gateway": "no-creator"}
# Sync calls (Anthropic, OpenAI, ElevenLabs' speech and sound) are about 18%
# of the jobs: 2 + 2 + 3 * 3/6 of 31.
PROVIDER_WEIGHTS = {"sim": 8, "replicate": 4, "fal": 4, "kie": 4, "gateway": 2, "gemini": 2, "elevenlabs": 3,
                    "anthropic": 2, "openai": 2}
LLM_PROVIDERS = ("anthropic", "openai")
LLM_MAX_TOKENS = 64
# The models file's prices, first match first (CONTRACT.md: The models
# file): (provider, model glob) -> (credits, per). Each sync model's entry
# also times its calls (`models_file`); the rest of the mix has no price
# (charged what the provider reports, or the reservation).
PRICES: dict[tuple[str, str], tuple[str, str]] = {
    ("anthropic", "claude-*"): ("2", "1k_tokens"),
    ("openai", "gpt-*"): ("1.5", "1k_tokens"),
    ("elevenlabs", "text-to-speech/*"): ("20", "1k_characters"),
    ("elevenlabs", "sound-generation"): ("2", "second"),
    ("sim", "image-*"): ("1", "provider"),
    ("fal", "fal-ai/flux/*"): ("3", "output"),
    ("kie", "veo/*"): ("1.5", "second"),
}
# The caps (issue #14): MAX_IN_FLIGHT_<PROVIDER> of these providers, and
# `max_in_flight` on these entries; `run_caps` sizes them to the run.
CAPPED_PROVIDERS = ("fal",)
CAPPED_ENTRIES = (("sim", "image-*"), ("elevenlabs", "text-to-speech/*"))
# Of a per-second model's jobs, the share that asks for real media (the
# rest store bytes no reader knows: charged the reservation, the measure
# unreadable), and how long each output plays.
MEDIA_SHARE = {"veo/veo3_fast": 0.85, "sound-generation": 1.0}
MEDIA_SECONDS = (0.5, 3.0)
# Speech text: the job's prompt, then up to this many more words, so the
# characters a call is charged vary.
SPEECH_EXTRA_WORDS = 120


@dataclass
class ChaosConfig:
    jobs: int = 5000
    owners: int = 3  # owners with room to spare, plus one tight owner (402s and 429s)
    tight_share: float = 0.04  # of the jobs go to the tight owner
    settlers: int = 2
    settler_concurrency: int = 32
    clients: int = 16  # creates in flight at once
    create_rate: float | None = 60.0  # creates per second at most (None: as fast as answered)
    cancel_share: float = 0.06
    poll_share: float = 0.10
    poll_for_s: float = 60.0  # a polling client gives up after this long
    failed_share: float = 0.10
    long_share: float = 0.05
    long_duration_s: tuple[float, float] = (15.0, 35.0)
    rejected_share: float = 0.02  # of the Replicate and fal jobs: a model refused at submit
    # fal jobs get a short give-up deadline and a few of them outlive it, so
    # the expire path (and sweep expiry of uncertain jobs) runs too.
    give_up_after_s_fal: float | None = 150.0
    overdue_share: float = 0.05  # of the fal jobs
    faults: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_FAULTS))
    # The killer: while jobs are going in (and while many are in flight), a
    # random settler or the web server is SIGKILLed every so often and
    # restarted after a short outage.
    kill_interval_s: tuple[float, float] = (8.0, 20.0)
    outage_s: tuple[float, float] = (0.3, 2.5)
    max_kills: int = 10
    min_settler_kills: int = 1
    min_web_kills: int = 1
    restart_postgres_at: float | None = 0.5  # share of creates answered; None: no restart
    provider_timeout_s: float = 4.0
    # A killed settler's claims come back when their lease ends, and a lost
    # webhook is noticed by the stale check: both bound how fast a run can
    # finish, so both are shorter than in production.
    settler_lease_s: float = 20.0
    stale_after_s: float = 20.0
    read_recheck_after_s: float = 3.0
    sweep_interval_s: float = 20.0
    give_up_after_s: float = 3600.0
    drain_timeout_s: float = 420.0
    progress_every_s: float = 10.0
    # The caps (`run_caps`): each lets its jobs through in about cap_drain_s
    # (None: 30% of the drain timeout) if each holds its place about
    # cap_hold_s (submit to close, as chaos runs measured it uncapped: a task,
    # a delayed or lost webhook, a download); far fewer places than the
    # creates ask for at once, so they bind. caps=False: no caps at all.
    caps: bool = True
    cap_hold_s: float = 8.0
    cap_drain_s: float | None = None
    cap_sample_every_s: float = 0.25  # the database is sampled this often for the caps check
    # Notifications: endpoints (ENDPOINTS) on receivers the run serves on
    # loopback, retried on a short schedule so that retries end inside the
    # run; the drain waits for every delivery too. notify=False: none.
    notify: bool = True
    notify_retry_s: str = "0.5,1,2"
    receiver_fail_first: int = 2  # the failing receiver's 500s to each notification, then 204
    receiver_slow_share: float = 0.2  # of the slow receiver's answers come after receiver_slow_s
    receiver_slow_s: tuple[float, float] = (3.0, 7.0)  # under the 15 s a delivery waits for an answer
    # A platform acting for owners it makes through the API: this share of
    # the jobs goes in through its key with Longcall-Owner, and while the
    # creates go in it sends grants and claw-backs (grants_per_job of them
    # per job, at least min_grants), grant_workers at a time. Of those:
    # clawback_share take back credits within the balance it last read,
    # overdraw_share more than the owner holds (each must be refused, 402),
    # the rest give; grant_replay_share of the answered ones are sent again
    # with the same key and body. platform_owners=0: no platform.
    platform_share: float = 0.25
    platform_owners: int = 20
    grants_per_job: float = 0.25
    min_grants: int = 60
    grant_workers: int = 4
    clawback_share: float = 0.35
    overdraw_share: float = 0.15
    grant_replay_share: float = 0.2
    seed: int | None = None  # reproduces the job plan (not the timing of kills and faults)
    keep_dir: bool = False  # keep the temp directory (it is always kept on a violation)

    @property
    def platform(self) -> bool:
        return self.platform_owners > 0 and self.platform_share > 0


# --- the plan: what each job asks for, decided up front from the seed ---------------

@dataclass(frozen=True)
class JobPlan:
    index: int
    owner: int
    provider: str
    model: str
    input: dict
    max_credits: int
    cancel_after_s: float | None
    poll: bool
    acting: int | None = None  # the platform's owner it is made for (`owner` is then the platform's key)

    @property
    def key(self) -> str:
        return f"chaos-{self.index}"

    def body(self) -> dict:
        return {"provider": self.provider, "model": self.model, "input": self.input,
                "max_credits": self.max_credits}


def platform_key_index(config: ChaosConfig) -> int:
    """Where the platform's key is among the run's keys: after the owners' and the tight owner's."""
    return config.owners + 1


def plan_jobs(config: ChaosConfig, rng: random.Random) -> list[JobPlan]:
    providers = list(PROVIDER_WEIGHTS)
    weights = list(PROVIDER_WEIGHTS.values())
    plans = []
    for i in range(config.jobs):
        provider = rng.choices(providers, weights)[0]
        model = rng.choices(MODELS[provider], MODEL_WEIGHTS.get(provider))[0]
        roll = rng.random()
        if roll < config.long_share:
            duration = rng.uniform(*config.long_duration_s)
        elif provider == "fal" and config.give_up_after_s_fal and roll < config.long_share + config.overdue_share:
            duration = config.give_up_after_s_fal * 4  # outlives its give-up deadline: expired
        else:
            duration = rng.uniform(0.2, 2.5)
        if rng.random() < config.rejected_share:
            model = REJECTED_MODELS.get(provider, model)
        max_credits = rng.randint(5, 20)
        input_ = {
            "prompt": f"chaos job {i}",
            "duration_s": round(duration, 3),
            "outputs": rng.choices([1, 2, 3], [6, 3, 1])[0],
            "output_bytes": rng.randint(256, 8192),
            # sometimes more than the reservation: the charge is capped
            "cost": rng.randint(1, max_credits + 3),
        }
        if rng.random() < config.failed_share:
            input_["outcome"] = "failed"
        stream = False
        if provider in LLM_PROVIDERS:  # the answer's text and usage, or the simulator's defaults
            if rng.random() < 0.5:
                input_["output_text"] = f"chaos answer {i}"
            if rng.random() < 0.5:
                input_["input_tokens"] = rng.randint(1, 4000)
                input_["output_tokens"] = rng.randint(1, LLM_MAX_TOKENS)
            stream = rng.random() < 0.5
        if rng.random() < MEDIA_SHARE.get(model, 0.0):  # a real WAV/MP4: its seconds are measured
            input_["output_duration_s"] = round(rng.uniform(*MEDIA_SECONDS), 1)
        if model == SPEECH_MODEL:  # charged per character: texts of many lengths
            words = rng.randint(0, SPEECH_EXTRA_WORDS)
            input_["prompt"] = f"chaos job {i}" + "".join(f" word{w}" for w in range(words))
        input_ = shaped_input(provider, model, input_, stream=stream)
        owner = config.owners if rng.random() < config.tight_share else rng.randrange(config.owners)
        cancel = rng.uniform(0.0, 4.0) if rng.random() < config.cancel_share else None
        poll = rng.random() < config.poll_share
        acting = None
        if config.platform and rng.random() < config.platform_share:
            owner, acting = platform_key_index(config), rng.randrange(config.platform_owners)
        plans.append(JobPlan(i, owner, provider, model, input_, max_credits, cancel, poll, acting))
    return plans


# The controls each sync protocol's simulator route applies (the rest it
# validates and ignores, so they are left out): an LLM's in `metadata`, the
# speech and sound routes' in the JSON body.
LLM_CONTROLS = ("duration_s", "outcome", "output_text", "input_tokens", "output_tokens")
AUDIO_CONTROLS = ("duration_s", "output_bytes", "outcome", "output_duration_s")


def shaped_input(provider: str, model: str, controls: dict, *, stream: bool = False) -> dict:
    """A job's input as its provider's protocol takes it, the simulator's
    controls where that protocol reads them (CONTRACT.md). Every sync job's
    prompt carries its job's index, so its call's body is its own: a body the
    simulator counts twice is a call made twice. `stream`: an LLM call
    streamed (server-sent events)."""
    if provider == "gemini":  # the predictLongRunning body: controls in `parameters`
        rest = dict(controls)
        return {"instances": [{"prompt": rest.pop("prompt")}], "parameters": rest}
    if provider in LLM_PROVIDERS:  # the Messages / Chat Completions body without `model`
        metadata: dict[str, Any] = {k: controls[k] for k in LLM_CONTROLS if k in controls}
        if provider == "openai":  # the API's metadata holds strings; the simulator reads numbers in them
            metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
        body: dict[str, Any] = {"max_tokens": LLM_MAX_TOKENS,
                                "messages": [{"role": "user", "content": controls["prompt"]}],
                                "metadata": metadata}
        if stream:
            body["stream"] = True
        return body
    if provider == "elevenlabs" and model != "dubbing":  # speech or sound effects: one audio answer
        body = {"text": controls["prompt"], **{k: controls[k] for k in AUDIO_CONTROLS if k in controls}}
        if model.startswith("text-to-speech/"):
            body["model_id"] = "eleven_multilingual_v2"
        return body
    if provider == "elevenlabs":  # a dub of one language: one output; no cost to report
        rest = {k: v for k, v in controls.items() if k not in ("outputs", "cost")}
        return {"source_url": "https://media.example.com/talk.mp4", "target_lang": "es", **rest}
    if model.startswith("suno/"):
        return {"customMode": False, "instrumental": False, **controls}
    return controls


def expected_jobs(config: ChaosConfig, provider: str, glob: str = "*") -> float:
    """How many of a run's jobs the plan makes of `provider`'s models
    matching `glob`, on average (pure)."""
    models = MODELS[provider]
    weights = MODEL_WEIGHTS.get(provider, (1,) * len(models))
    share = sum(w for m, w in zip(models, weights, strict=True) if fnmatchcase(m, glob)) / sum(weights)
    return config.jobs * PROVIDER_WEIGHTS[provider] / sum(PROVIDER_WEIGHTS.values()) * share


def run_caps(config: ChaosConfig) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """The run's MAX_IN_FLIGHT_<PROVIDER> (CAPPED_PROVIDERS) and entries'
    `max_in_flight` (CAPPED_ENTRIES), each sized so that its jobs pass in
    about `cap_drain_s` if each holds its place `cap_hold_s` (fal's overdue
    jobs hold theirs until their give-up deadline): a few places where the
    creates ask for dozens at once, so every cap binds and the run still
    drains (pure)."""
    if not config.caps:
        return {}, {}
    drain_s = config.cap_drain_s if config.cap_drain_s is not None else 0.3 * config.drain_timeout_s

    def cap(provider: str, glob: str = "*") -> int:
        hold_s = config.cap_hold_s
        if provider == "fal" and config.give_up_after_s_fal:
            hold_s += config.overdue_share * config.give_up_after_s_fal
        return max(1, math.ceil(expected_jobs(config, provider, glob) * hold_s / drain_s))

    return ({p: cap(p) for p in CAPPED_PROVIDERS},
            {(p, glob): cap(p, glob) for p, glob in CAPPED_ENTRIES})


def models_file(config: ChaosConfig) -> str:
    """The models file of a run (TOML): PRICES, the entry caps of
    `run_caps`, and each sync model's call times out a little after the
    longest job's work is done, and a call lost with its worker is given up
    (`call_lost`) soon after, well within the drain."""
    timeout_s = math.ceil(config.long_duration_s[1]) + 10
    stale_after_s = timeout_s + 15
    _, entry_caps = run_caps(config)
    lines = []
    for (provider, glob), (credits, per) in PRICES.items():
        lines += ["[[models]]", f"provider = {json.dumps(provider)}", f"model = {json.dumps(glob)}"]
        if provider_kind(provider, glob) is ProviderKind.SYNC:
            lines += [f"timeout_s = {timeout_s}", f"stale_after_s = {stale_after_s}"]
        if (provider, glob) in entry_caps:
            lines.append(f"max_in_flight = {entry_caps[provider, glob]}")
        lines += [f"price = {{ credits = {credits}, per = {json.dumps(per)} }}", ""]
    return "\n".join(lines)


# --- processes ------------------------------------------------------------------------

class Proc:
    """One service process, killable and restartable, logging to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path):
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.popen: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.popen = subprocess.Popen([sys.executable, "-m", *self.argv], env=self.env, cwd=REPO_ROOT,
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 30.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


async def _wait_http(url: str, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if not proc.alive:
                raise RuntimeError(f"{proc.name} exited while starting (log: {proc.log_path})")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not answer {url} within {timeout:g}s (log: {proc.log_path})")


def _postgres_cpu_s(pg: EmbeddedPostgres) -> float:
    """CPU seconds of the postmaster and the backends it has reaped (Linux
    /proc; 0 elsewhere). Read before a restart and at the end."""
    try:
        pid = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


# --- the client -------------------------------------------------------------------------

@dataclass
class ClientRecord:
    """What the clients were told; checked against the database at the end."""
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    refused: dict[str, int] = field(default_factory=dict)  # key -> 402 / 429
    unexpected: list[str] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)  # cancel answered 200 (status cancelled)
    seen_terminal: dict[str, str] = field(default_factory=dict)
    answers: Counter = field(default_factory=Counter)
    create_retries: int = 0
    reads: int = 0

    def saw(self, job: dict) -> None:
        status = job.get("status")
        if status in TERMINAL:
            previous = self.seen_terminal.setdefault(job["id"], status)
            if previous != status:
                self.unexpected.append(f"{job['id']}: read {previous}, later {status}")


RETRYABLE = (httpx.TransportError,)  # connect refused/reset, timeouts: the web may be down


def _error_code(r: httpx.Response) -> str | None:
    try:
        return (r.json().get("error") or {}).get("code")
    except (ValueError, AttributeError):
        return None


def unavailable_problem(what: str, r: httpx.Response) -> str | None:
    """The only server error the API may give is 503 `unavailable` (its
    database is away); a 500 is a bug, even if a retry then succeeds."""
    if r.status_code != 503 or _error_code(r) != "unavailable":
        return f"{what} answered {r.status_code} {r.text[:200]}"
    return None


class LoadGenerator:
    def __init__(self, config: ChaosConfig, web_url: str, keys: list[str], plans: list[JobPlan],
                 rng: random.Random, acting: list[str] | None = None):
        self.config, self.web_url, self.keys, self.plans, self.rng = config, web_url, keys, plans, rng
        self.acting = acting or []  # the platform's owners, as a plan's `acting` counts them
        self.record = ClientRecord()
        self.answered = 0  # creates that got their final answer (or gave up)
        self._answers = asyncio.Condition()
        self.creates_done_at: float | None = None  # monotonic time of the last create's answer
        self.followups: set[asyncio.Task] = set()
        self.poll_gate = asyncio.Semaphore(100)
        self.client = httpx.AsyncClient(base_url=web_url, trust_env=False,
                                        timeout=httpx.Timeout(15.0, connect=3.0),
                                        limits=httpx.Limits(max_connections=config.clients + 100))

    async def run(self) -> None:
        queue: asyncio.Queue[JobPlan] = asyncio.Queue()
        for plan in self.plans:
            queue.put_nowait(plan)
        started = time.monotonic()

        async def worker() -> None:
            while True:
                try:
                    plan = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if self.config.create_rate:
                    # Spread the creates over time so kills land among them.
                    due = started + plan.index / self.config.create_rate
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())
                await self._create(plan)

        await asyncio.gather(*(worker() for _ in range(self.config.clients)))
        self.creates_done_at = time.monotonic()
        while self.followups:
            await asyncio.gather(*list(self.followups), return_exceptions=True)

    async def until_answered(self, n: float) -> None:
        async with self._answers:
            await self._answers.wait_for(lambda: self.answered >= n)

    async def _count_answer(self) -> None:
        async with self._answers:
            self.answered += 1
            self._answers.notify_all()

    async def aclose(self) -> None:
        for task in list(self.followups):
            task.cancel()
        await self.client.aclose()

    def _expect_unavailable(self, what: str, r: httpx.Response) -> None:
        problem = unavailable_problem(what, r)
        if problem:
            self.record.unexpected.append(problem)

    def _auth(self, plan: JobPlan) -> dict[str, str]:
        """The plan's key; a platform's job also names the owner it acts for."""
        headers = {"Authorization": f"Bearer {self.keys[plan.owner]}"}
        if plan.acting is not None:
            headers["Longcall-Owner"] = self.acting[plan.acting]
        return headers

    async def _create(self, plan: JobPlan) -> None:
        headers = {**self._auth(plan), "Idempotency-Key": plan.key}
        deadline = time.monotonic() + 180
        attempt = 0
        while True:
            attempt += 1
            try:
                r = await self.client.post("/v1/jobs", json=plan.body(), headers=headers)
            except RETRYABLE:
                r = None
            if r is not None and r.status_code < 500:
                break
            if r is not None:  # the web is up but its database may not be
                self.record.answers[f"create {r.status_code} (retried)"] += 1
                self._expect_unavailable(f"key {plan.key}: create", r)
            if time.monotonic() > deadline:
                self.record.unexpected.append(f"key {plan.key}: no answer to its create in 180 s")
                await self._count_answer()
                return
            self.record.create_retries += 1
            await asyncio.sleep(min(2.0, 0.1 * attempt) * (0.5 + self.rng.random()))
        await self._count_answer()
        self.record.answers[f"create {r.status_code}"] += 1
        if r.status_code in (200, 202):
            job = r.json()
            self.record.accepted[plan.key] = job["id"]
            self.record.saw(job)
            if plan.cancel_after_s is not None or plan.poll:
                task = asyncio.create_task(self._follow(plan, job["id"]))
                self.followups.add(task)
                task.add_done_callback(self.followups.discard)
        elif r.status_code in (402, 429):
            self.record.refused[plan.key] = r.status_code
        else:
            self.record.unexpected.append(f"key {plan.key}: create answered {r.status_code} {r.text[:200]}")

    async def _follow(self, plan: JobPlan, job_id: str) -> None:
        if plan.cancel_after_s is not None:
            await asyncio.sleep(plan.cancel_after_s)
            await self._cancel(plan, job_id)
        if plan.poll:
            async with self.poll_gate:  # bounded: polls are most of the read load
                await self._poll(plan, job_id)

    async def _cancel(self, plan: JobPlan, job_id: str) -> None:
        deadline = time.monotonic() + 120
        lost_one = False  # an earlier attempt may have cancelled it already
        while time.monotonic() < deadline:
            try:
                r = await self.client.post(f"/v1/jobs/{job_id}/cancel", headers=self._auth(plan))
            except RETRYABLE:
                r = None
            if r is not None and r.status_code < 500:
                self.record.answers[f"cancel {r.status_code}"] += 1
                if r.status_code == 200:
                    job = r.json()
                    if job.get("status") != "cancelled":
                        self.record.unexpected.append(f"{job_id}: cancel answered 200 with {job.get('status')}")
                    self.record.cancelled.add(job_id)
                    self.record.saw(job)
                elif r.status_code != 409 or (r.json().get("error") or {}).get("code") != "invalid_state":
                    self.record.unexpected.append(f"{job_id}: cancel answered {r.status_code} {r.text[:200]}")
                elif lost_one:
                    self.record.answers["cancel 409 after a lost answer"] += 1
                return
            if r is not None:
                self.record.answers[f"cancel {r.status_code} (retried)"] += 1
                self._expect_unavailable(f"{job_id}: cancel", r)
            lost_one = True
            await asyncio.sleep(0.3 + self.rng.random())
        self.record.unexpected.append(f"{job_id}: no answer to its cancel in 120 s")

    async def _poll(self, plan: JobPlan, job_id: str) -> None:
        """A polling client: reads (often long-polls) until the job closes or
        it runs out of patience. Reads of a job running past
        READ_RECHECK_AFTER_S ask for a settle: road 2."""
        deadline = time.monotonic() + self.config.poll_for_s
        while time.monotonic() < deadline:
            wait = self.rng.choice(["", "", "?wait=5", "?wait=10"])
            try:
                r = await self.client.get(f"/v1/jobs/{job_id}{wait}", headers=self._auth(plan))
            except RETRYABLE:
                r = None
            if r is not None:
                self.record.reads += 1
                self.record.answers[f"read {r.status_code}"] += 1
                if r.status_code == 200:
                    job = r.json()
                    self.record.saw(job)
                    if job["status"] in TERMINAL or job["status"] == "uncertain":
                        return
                elif r.status_code < 500:
                    self.record.unexpected.append(f"{job_id}: read answered {r.status_code} {r.text[:200]}")
                    return
                else:
                    self._expect_unavailable(f"{job_id}: read", r)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))


# --- the platform ------------------------------------------------------------------------

PLATFORM_OPENING = 25  # the opening credits of every other owner the platform makes (its create's body)
REASONS = (None, "chaos grant", "a refund for a failed render", "promo: ünïcode ✓")
MOVED, REFUSED, UNANSWERED = invariants.GRANT_MOVED, invariants.GRANT_REFUSED, invariants.GRANT_UNANSWERED
OWNER_KEYS = {"owner_id", "name", "credits", "active", "max_active", "created_at"}
CREDIT_KEYS = {"granted", "balance", "reserved", "charged"}


@dataclass
class PlatformRecord:
    """What the platform's client was told; checked against the database at the end."""
    made: dict[str, invariants.OwnerMade] = field(default_factory=dict)  # create key -> the owner
    grants: dict[str, invariants.GrantSent] = field(default_factory=dict)  # grant key -> what it came to
    # Each owner's granted as the answers showed it (None: unknown, after a grant no answer came to).
    granted: dict[str, int | None] = field(default_factory=dict)
    answers: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    sure_overdraws: int = 0  # claw-backs of more than balance + reserved: each must be refused
    retried: int = 0  # requests sent again after no answer or a 503 (the web killed, the database away)

    def tally(self) -> Counter:
        """The report's numbers (and a test's)."""
        counts: Counter = Counter()
        for g in self.grants.values():
            counts[f"{'claw-backs' if g.credits < 0 else 'grants'} {g.outcome}"] += 1
        counts["sure overdraws"] = self.sure_overdraws
        counts["replays answered 200"] = self.answers["grant replay 200"]
        counts["replays answered 402"] = self.answers["grant replay 402"]
        counts["200 to a retry after a lost answer"] = self.answers["grant 200"]
        counts["owner creates replayed"] = self.answers["create owner replay 200"]
        counts["retried through an outage"] = self.retried
        return counts


class PlatformClient:
    """The platform's side of the run (CONTRACT.md: Apps with many users).
    It makes its owners through `POST /v1/owners` (every fourth create sent
    again: the same owner, 200) and funds them with grants; then, while the
    creates go in, it sends grants and claw-backs — some past what the owner
    holds (402), some sent again with the same key and body (a replay: 200,
    nothing moves twice) — each retried under its key until it is answered,
    as a careful client does. Grants to one owner go one at a time, so each
    answer's `granted` is known exactly: only grants move it."""

    def __init__(self, config: ChaosConfig, web_url: str, api_key: str, rng: random.Random):
        self.config, self.rng = config, rng
        self.record = PlatformRecord()
        self.owner_ids: list[str] = []  # in the order made: a plan's `acting` indexes it
        self._locks: dict[str, asyncio.Lock] = {}
        self.client = httpx.AsyncClient(base_url=web_url, trust_env=False,
                                        headers={"Authorization": f"Bearer {api_key}"},
                                        timeout=httpx.Timeout(15.0, connect=3.0))

    async def aclose(self) -> None:
        await self.client.aclose()

    def _unexpected(self, line: str) -> None:
        self.record.unexpected.append(line)

    async def _send(self, what: str, method: str, url: str, **kw: Any) -> tuple[httpx.Response | None, bool]:
        """The first answer below 500, the same request retried through
        outages for up to 180 s; and whether an earlier attempt may have
        reached the server (its key may be used already)."""
        deadline = time.monotonic() + 180
        attempt = 0
        while True:
            attempt += 1
            try:
                r = await self.client.request(method, url, **kw)
            except RETRYABLE:
                r = None
            if r is not None and r.status_code < 500:
                self.record.answers[f"{what} {r.status_code}"] += 1
                return r, attempt > 1
            if r is not None:
                self.record.answers[f"{what} {r.status_code} (retried)"] += 1
                problem = unavailable_problem(f"{what} {url}", r)
                if problem:
                    self._unexpected(problem)
            if time.monotonic() > deadline:
                self._unexpected(f"{what} {url}: no answer in 180 s")
                return None, attempt > 1
            self.record.retried += 1
            await asyncio.sleep(min(2.0, 0.1 * attempt) * (0.5 + self.rng.random()))

    def _shape_problems(self, owner: Any) -> list[str]:
        """Where an answer is not the one owner JSON shape (CONTRACT.md)."""
        if not isinstance(owner, dict) or set(owner) != OWNER_KEYS:
            return [f"not an owner: {str(owner)[:200]}"]
        problems = []
        if not isinstance(owner["credits"], dict) or set(owner["credits"]) != CREDIT_KEYS:
            problems.append(f"credits {owner['credits']}")
        if not re.fullmatch(r"own_[0-9a-f]{24}", str(owner["owner_id"])):
            problems.append(f"owner_id {owner['owner_id']!r}")
        if not str(owner["created_at"]).endswith("Z"):
            problems.append(f"created_at {owner['created_at']!r}")
        return problems

    async def make_owners(self, n: int, max_active: int, funds: int) -> None:
        """`n` owners, every other one with PLATFORM_OPENING credits in its
        create, each then funded with a grant of `funds`; the platform's
        list of owners, paged, is then exactly them, newest first."""
        for i in range(n):
            key = f"chaos-owner-{i}"
            body = {"name": f"chaos user {i}", "credits": PLATFORM_OPENING if i % 2 == 0 else 0,
                    "max_active": max_active}
            headers = {"Idempotency-Key": key}
            r, retried = await self._send("create owner", "POST", "/v1/owners", json=body, headers=headers)
            if r is None or r.status_code not in ((200, 201) if retried else (201,)):
                raise RuntimeError(f"creating a platform's owner answered {r.status_code if r else None} "
                                   f"{r.text[:200] if r else ''}")
            owner = r.json()
            problems = self._shape_problems(owner)
            if not problems:
                wanted = (body["name"], body["max_active"], body["credits"], body["credits"], 0, 0, 0)
                got = (owner["name"], owner["max_active"], owner["credits"]["granted"], owner["credits"]["balance"],
                       owner["credits"]["reserved"], owner["credits"]["charged"], owner["active"])
                if got != wanted:
                    problems.append(f"(name, max_active, granted, balance, reserved, charged, active) {got}, "
                                    f"asked {wanted}")
                if r.headers.get("location") != f"/v1/owners/{owner['owner_id']}":
                    problems.append(f"Location {r.headers.get('location')!r}")
            if problems:
                raise RuntimeError(f"creating a platform's owner answered {'; '.join(problems)}")
            owner_id = owner["owner_id"]
            self.owner_ids.append(owner_id)
            self.record.made[key] = invariants.OwnerMade(owner_id, key, body["credits"])
            self.record.granted[owner_id] = body["credits"]
            self._locks[owner_id] = asyncio.Lock()
            if i % 4 == 1:  # a retry of a create whose answer the client lost: the same owner
                again, _ = await self._send("create owner replay", "POST", "/v1/owners", json=body, headers=headers)
                if again is None or again.status_code != 200 or again.json().get("owner_id") != owner_id:
                    self._unexpected(f"create {key} again answered {again.status_code if again else None} "
                                     f"{again.text[:200] if again else ''}, not 200 with {owner_id}")
        for i, owner_id in enumerate(self.owner_ids):
            await self._grant(owner_id, funds, "opening funds", f"chaos-fund-{i}")
        listed = await self._list_owners()
        if listed != self.owner_ids[::-1]:
            self._unexpected(f"GET /v1/owners listed {len(listed)} owners, not the {n} made, newest first")

    async def _list_owners(self) -> list[str]:
        found: list[str] = []
        params = {"limit": "7"}  # several pages
        while True:
            r, _ = await self._send("list owners", "GET", "/v1/owners", params=params)
            if r is None or r.status_code != 200:
                self._unexpected(f"GET /v1/owners answered {r.status_code if r else None}")
                return found
            page = r.json()
            found += [o["owner_id"] for o in page["owners"]]
            if not page["next_cursor"]:
                return found
            params["cursor"] = page["next_cursor"]

    def _body(self, credits: int, reason: str | None) -> dict[str, Any]:
        return {"credits": credits} if reason is None else {"credits": credits, "reason": reason}

    def _check_granted(self, where: str, owner: Any, owner_id: str, granted: int | None) -> None:
        problems = self._shape_problems(owner)
        if not problems:
            if owner["owner_id"] != owner_id:
                problems.append(f"owner {owner['owner_id']}")
            if granted is not None and owner["credits"]["granted"] != granted:
                problems.append(f"granted {owner['credits']['granted']}, the answers so far make it {granted}")
            if owner["credits"]["balance"] < 0:
                problems.append(f"balance {owner['credits']['balance']}")
        if problems:
            self._unexpected(f"{where}: " + "; ".join(problems))

    async def _grant(self, owner_id: str, credits: int, reason: str | None, key: str, *,
                     sure_overdraw: bool = False) -> invariants.GrantSent:
        r, retried = await self._send("grant", "POST", f"/v1/owners/{owner_id}/grants",
                                      json=self._body(credits, reason), headers={"Idempotency-Key": key})
        where = f"grant {key} ({credits:+d} to {owner_id})"
        outcome = UNANSWERED
        if r is None:
            self.record.granted[owner_id] = None  # moved or not: no longer known
        elif r.status_code == 201 or (r.status_code == 200 and retried):  # 200: an earlier attempt moved it
            outcome = MOVED
            before = self.record.granted[owner_id]
            after = None if before is None else before + credits
            self._check_granted(where, r.json(), owner_id, after)
            self.record.granted[owner_id] = after
            if sure_overdraw:
                self._unexpected(f"{where}: more than the owner's balance and reservations, yet moved")
        elif r.status_code == 402 and _error_code(r) == "insufficient_credits":
            outcome = REFUSED
        else:
            self._unexpected(f"{where}: answered {r.status_code} {r.text[:200]}")
        sent = invariants.GrantSent(owner_id, key, credits, reason, outcome)
        self.record.grants[key] = sent
        return sent

    async def _replay(self, sent: invariants.GrantSent) -> None:
        """The grant again, same key and body: a moved one answers 200 and
        moves nothing; a sure overdraw is refused again (402)."""
        r, _ = await self._send("grant replay", "POST", f"/v1/owners/{sent.owner_id}/grants",
                                json=self._body(sent.credits, sent.reason),
                                headers={"Idempotency-Key": sent.request_key})
        want = 200 if sent.outcome == MOVED else 402
        where = f"grant {sent.request_key} sent again ({sent.outcome})"
        if r is None:
            self.record.granted[sent.owner_id] = None
        elif r.status_code != want:
            self._unexpected(f"{where}: answered {r.status_code} {r.text[:200]}, not {want}")
        elif want == 200:
            self._check_granted(where, r.json(), sent.owner_id, self.record.granted[sent.owner_id])

    async def _read(self, owner_id: str) -> dict | None:
        r, _ = await self._send("owner read", "GET", f"/v1/owners/{owner_id}")
        if r is None or r.status_code != 200:
            if r is not None:
                self._unexpected(f"GET /v1/owners/{owner_id} answered {r.status_code} {r.text[:200]}")
            return None
        owner = r.json()
        self._check_granted(f"GET /v1/owners/{owner_id}", owner, owner_id, self.record.granted[owner_id])
        return owner if not self._shape_problems(owner) else None

    async def _one_grant(self, i: int) -> None:
        owner_id = self.rng.choice(self.owner_ids)
        reason = self.rng.choice(REASONS)
        reason = f"{reason} {i}" if reason == "chaos grant" else reason
        async with self._locks[owner_id]:
            roll = self.rng.random()
            sure = False
            if roll < self.config.overdraw_share + self.config.clawback_share:
                owner = await self._read(owner_id)
                if owner is None:
                    return
                credits_now = owner["credits"]
                if roll < self.config.overdraw_share:
                    # Reserves move balance to reserved, charges and refunds take
                    # from reserved: balance + reserved only falls while no grant
                    # comes (and this owner's grants wait for the lock). More than
                    # it is refused however the jobs move meanwhile.
                    credits = -(credits_now["balance"] + credits_now["reserved"] + self.rng.randint(1, 50))
                    sure = True
                    self.record.sure_overdraws += 1
                else:  # within the balance read; a reservation since may still make it a 402
                    credits = -self.rng.randint(1, max(1, min(40, credits_now["balance"])))
            else:
                credits = self.rng.randint(1, 60)
            sent = await self._grant(owner_id, credits, reason, f"chaos-grant-{i}", sure_overdraw=sure)
            replayable = sent.outcome == MOVED or (sure and sent.outcome == REFUSED)
            if replayable and self.rng.random() < self.config.grant_replay_share:
                await self._replay(sent)

    async def race(self, n: int, over_s: float) -> None:
        """`n` grants and claw-backs spread over `over_s` seconds (the
        creates' time), `grant_workers` at a time."""
        started = time.monotonic()
        numbers = iter(range(n))  # shared: each worker takes the next

        async def worker() -> None:
            for i in numbers:
                due = started + i * over_s / max(1, n)
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
                await self._one_grant(i)

        await asyncio.gather(*(worker() for _ in range(self.config.grant_workers)))


# --- notification receivers --------------------------------------------------------------

ALL_EVENTS: tuple[str, ...] = tuple(NotificationType)
# The run's notification endpoints, registered through the API before any
# job: (owner index, receiver, events; None: the default, every close).
# Owners past these (and the tight owner) have none: their jobs are never
# notified. Owner 1's second endpoint asks only for the non-terminal events,
# so each of its transitions goes to one endpoint of two.
ENDPOINTS: tuple[tuple[int, str, tuple[str, ...] | None], ...] = (
    (0, "healthy", None),
    (0, "failing", ALL_EVENTS),
    (1, "slow", None),
    (1, "healthy", (NotificationType.RUNNING, NotificationType.UNCERTAIN)),
)
DELETED_ENDPOINT = (1, "failing", None)  # registered, then deleted before any job: it gets nothing
# The platform's own endpoint (its key, no Longcall-Owner): every event of
# every job of its owners. And one its first owner has (registered by the
# platform acting for it): that owner's closes go to both.
PLATFORM_ENDPOINT: tuple[str, tuple[str, ...] | None] = ("failing", ALL_EVENTS)
ACTING_ENDPOINT: tuple[int, str, tuple[str, ...] | None] = (0, "healthy", None)


class _ThreadServer:
    """An ASGI app served by uvicorn on a loopback port the OS picked, in a
    thread and event loop of its own: a slow answer never waits on the run's
    loop (the clients, the checks), nor the reverse."""

    def __init__(self, app: Any):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("a notification receiver did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)
        self._sock.close()


def _body_fields(body: bytes) -> tuple[str | None, str | None]:
    """The notification's type and job id, as its body says them."""
    try:
        parsed = json.loads(body)
        data = parsed.get("data") or {}
        return parsed.get("type"), data.get("id")
    except (ValueError, AttributeError):
        return None, None


class Receiver:
    """A client's notification receiver, on loopback: each endpoint of the run
    it serves is a path of it (`/e/<slot>`). Every request is recorded as an
    invariants.Receipt, its signature verified with the `standardwebhooks`
    library under that endpoint's secret (a bad one is answered 400). It
    answers 500 to the first `fail_first` attempts of each notification, and
    a share `slow_share` of its answers come after `slow_s` seconds; the rest
    are 204 at once."""

    def __init__(self, name: str, rng: random.Random, *, fail_first: int = 0, slow_share: float = 0.0,
                 slow_s: tuple[float, float] = (0.0, 0.0)):
        self.name, self.rng = name, rng
        self.fail_first, self.slow_share, self.slow_s = fail_first, slow_share, slow_s
        self._lock = threading.Lock()  # the server's thread writes, the run reads
        self._endpoints: dict[str, tuple[str, Any]] = {}  # slot -> (endpoint id, its verifier)
        self._requests: Counter = Counter()  # (slot, webhook-id) -> requests
        self._receipts: list[invariants.Receipt] = []
        self.answered: Counter = Counter()  # status code -> answers
        self.slow_answers = 0
        self.server = _ThreadServer(Starlette(routes=[Route("/e/{slot}", self._hook, methods=["POST"])]))

    def url(self, slot: int) -> str:
        return f"{self.server.url}/e/{slot}"

    def register(self, slot: int, endpoint_id: str, secret: str) -> None:
        import standardwebhooks  # the scheme's reference verifier; `main` checks it is installed

        with self._lock:
            self._endpoints[str(slot)] = (endpoint_id, standardwebhooks.Webhook(secret))

    def receipts(self) -> list[invariants.Receipt]:
        with self._lock:
            return list(self._receipts)

    def answers(self) -> tuple[Counter, int]:
        """How often it answered each status code, and how many answers came slowly."""
        with self._lock:
            return Counter(self.answered), self.slow_answers

    async def _hook(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        slot = request.path_params["slot"]
        webhook_id = headers.get("webhook-id")
        with self._lock:
            endpoint = self._endpoints.get(slot)
        signature_ok = False
        if endpoint is not None:
            try:
                endpoint[1].verify(body, headers)
                signature_ok = True
            except Exception:  # any way a request fails verification is a bad signature
                signature_ok = False
        type_, job_id = _body_fields(body)
        with self._lock:
            self._requests[slot, webhook_id] += 1
            if not signature_ok:
                status = 400
            elif self._requests[slot, webhook_id] <= self.fail_first:
                status = 500
            else:
                status = 204
            delay = self.rng.uniform(*self.slow_s) if self.rng.random() < self.slow_share else 0.0
            if delay:
                self.slow_answers += 1
            self.answered[status] += 1
            self._receipts.append(invariants.Receipt(endpoint[0] if endpoint else None, webhook_id, type_, job_id,
                                                     signature_ok, status))
        if delay:
            await asyncio.sleep(delay)
        return Response(status_code=status)


def make_receivers(config: ChaosConfig, seed: int) -> dict[str, Receiver]:
    """The run's receivers (not started): one healthy, one failing each
    notification's first attempts, one slow; each draws from its own rng
    (its own thread)."""
    return {"healthy": Receiver("healthy", random.Random(seed)),
            "failing": Receiver("failing", random.Random(seed + 1), fail_first=config.receiver_fail_first),
            "slow": Receiver("slow", random.Random(seed + 2), slow_share=config.receiver_slow_share,
                             slow_s=config.receiver_slow_s)}


# --- the run ---------------------------------------------------------------------------------

@dataclass
class ChaosResult:
    checks: list[Check]
    kills: Counter
    statuses: Counter
    elapsed_s: float
    workdir: str
    caps: list[invariants.CapTally] = field(default_factory=list)  # what the database samples saw of each cap
    notifications: invariants.NotifyTally | None = None  # what was written, delivered and received
    receivers: dict[str, Counter] = field(default_factory=dict)  # receiver -> status code answered -> answers
    platform: Counter = field(default_factory=Counter)  # the platform's grants by outcome (PlatformRecord.tally)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


class Chaos:
    def __init__(self, config: ChaosConfig, out: Callable[[str], None]):
        self.config = config
        self.out = out
        seed = config.seed if config.seed is not None else random.randrange(2**32)
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = Path(tempfile.mkdtemp(prefix="longcall-chaos-"))
        self.pg = EmbeddedPostgres(self.workdir / "pg", durable=True)
        self.kills: Counter = Counter()
        self.procs: list[Proc] = []
        self.settlers: list[Proc] = []
        self.web: Proc | None = None
        self.sim: Proc | None = None
        self.web_url = ""
        self.sim_url = ""
        self.pg_cpu_s = 0.0
        self.started = time.monotonic()
        self.load: LoadGenerator | None = None
        # Real-looking secrets, so the logs can be searched for them at the end.
        self.env_secrets = {"SECRET_KEY": secrets.token_urlsafe(32),
                        "REPLICATE_API_TOKEN": "r8_" + secrets.token_urlsafe(24),
                        "FAL_KEY": secrets.token_urlsafe(24), "KIE_API_KEY": secrets.token_urlsafe(24),
                        "AI_GATEWAY_API_KEY": secrets.token_urlsafe(24), "GEMINI_API_KEY": secrets.token_urlsafe(24),
                        "ELEVENLABS_API_KEY": secrets.token_urlsafe(24),
                        "ANTHROPIC_API_KEY": "sk-ant-" + secrets.token_urlsafe(24),
                        "OPENAI_API_KEY": "sk-" + secrets.token_urlsafe(24)}
        self.api_keys: dict[str, str] = {}
        self.sync_by_status: Counter = Counter()  # (provider model, status, error code) -> jobs
        self.models: ModelsFile = NO_MODELS  # the models file the service runs with
        self.caps: list[invariants.Cap] = []
        self.cap_tallies: list[invariants.CapTally] = []
        self.sim_stats: dict[str, Any] = {}
        self.priced: list[dict[str, Any]] = []  # the succeeded jobs' charges by model and price (the report)
        self.receivers: dict[str, Receiver] = make_receivers(config, seed) if config.notify else {}
        self.notify_tally: invariants.NotifyTally | None = None
        self.owner_ids: list[str] = []  # the owners' ids, as the keys setup returns are ordered
        self.platform_id: str | None = None
        self.platform: PlatformClient | None = None
        self.platform_endpoint: str | None = None  # the platform's own endpoint's id

    def say(self, line: str) -> None:
        self.out(f"[{time.monotonic() - self.started:6.1f}s] {line}")

    # -- setting up -------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("S3_ENDPOINT_URL", "ADMIN_TOKEN", "REPLICATE_WEBHOOK_SECRET", "PORT", "NOTIFY_ALLOWED_ORIGINS"):
            env.pop(name, None)
        for name in list(env):
            if name.startswith(("GIVE_UP_AFTER_S", "MAX_IN_FLIGHT_")):
                del env[name]
        env.update({
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
            "DATABASE_URL": self.pg.url,
            "STORAGE_URL": f"file://{self.workdir / 'objects'}",
            "SIM_URL": self.sim_url,
            "PUBLIC_URL": self.web_url,
            "REPLICATE_BASE_URL": f"{self.sim_url}/replicate",
            "FAL_BASE_URL": f"{self.sim_url}/fal",
            "FAL_JWKS_URL": f"{self.sim_url}/fal/.well-known/jwks.json",
            "KIE_BASE_URL": f"{self.sim_url}/kie",
            "AI_GATEWAY_BASE_URL": f"{self.sim_url}/gateway/v4/ai",
            "GEMINI_BASE_URL": f"{self.sim_url}/gemini",
            "ELEVENLABS_BASE_URL": f"{self.sim_url}/elevenlabs",
            "ANTHROPIC_BASE_URL": f"{self.sim_url}/anthropic",
            "OPENAI_BASE_URL": f"{self.sim_url}/openai/v1",
            "MODELS_FILE": str(self.workdir / "models.toml"),
            **self.env_secrets,
            "PROVIDER_TIMEOUT_S": str(self.config.provider_timeout_s),
            "READ_RECHECK_AFTER_S": str(self.config.read_recheck_after_s),
            "SWEEP_INTERVAL_S": str(self.config.sweep_interval_s),
            "GIVE_UP_AFTER_S": str(self.config.give_up_after_s),
            "SETTLER_LEASE_S": str(self.config.settler_lease_s),
            "STALE_AFTER_S": str(self.config.stale_after_s),
            "NOTIFY_RETRY_S": self.config.notify_retry_s,
        })
        if self.receivers:  # loopback and plain http: allowed for these origins only
            env["NOTIFY_ALLOWED_ORIGINS"] = ",".join(r.server.url for r in self.receivers.values())
        if self.config.give_up_after_s_fal:
            env["GIVE_UP_AFTER_S_FAL"] = str(self.config.give_up_after_s_fal)
        provider_caps, _ = run_caps(self.config)
        env.update({f"MAX_IN_FLIGHT_{p.upper()}": str(n) for p, n in provider_caps.items()})
        return env

    def _cli(self, env: dict[str, str], *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "app", *args], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"longcall {args[0]} failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    async def setup(self) -> list[str]:
        """PostgreSQL, migrations, owners, then the simulator, web and settlers.
        Returns the owners' API keys (the tight owner's, then the platform's,
        at `platform_key_index`)."""
        self.say(f"workdir {self.workdir}, seed {self.seed}")
        await asyncio.to_thread(self.pg.start)
        self.sim_url = f"http://127.0.0.1:{free_port()}"
        self.web_url = f"http://127.0.0.1:{free_port()}"
        for receiver in self.receivers.values():
            receiver.server.start()
        text = models_file(self.config)
        (self.workdir / "models.toml").write_text(text)
        self.models = parse_models(text)
        env = self._env()
        self.caps = invariants.caps_of(self.models, env)
        self.cap_tallies = [invariants.CapTally(cap) for cap in self.caps]
        (self.workdir / "objects").mkdir()
        await asyncio.to_thread(self._cli, env, "migrate")
        keys = []
        jobs = self.config.jobs
        for i in range(self.config.owners + 1):
            tight = i == self.config.owners
            credits, max_active = (60, 4) if tight else (jobs * 25, max(100, jobs))
            made = json.loads(await asyncio.to_thread(
                self._cli, env, "owners", "create", "chaos-tight" if tight else f"chaos-{i}",
                "--credits", str(credits), "--max-active", str(max_active), "--json"))
            keys.append(made["api_key"])
            self.owner_ids.append(made["owner_id"])
            self.api_keys[f"the API key of {made['owner_id']}"] = made["api_key"]
        if self.config.platform:  # its owners have the credits; it needs none, nor slots
            made = json.loads(await asyncio.to_thread(
                self._cli, env, "owners", "create", "chaos-platform", "--platform", "--credits", "0",
                "--max-active", "0", "--json"))
            keys.append(made["api_key"])
            self.owner_ids.append(made["owner_id"])
            self.platform_id = made["owner_id"]
            self.api_keys[f"the API key of platform {made['owner_id']}"] = made["api_key"]

        sim_port = self.sim_url.rsplit(":", 1)[1]
        self.sim = Proc("simulator", ["app.simulator", "--port", sim_port], env, self.workdir / "sim.log")
        self.web = Proc("web", ["app", "serve", "--host", "127.0.0.1", "--port", self.web_url.rsplit(":", 1)[1]],
                        env, self.workdir / "web.log")
        self.settlers = [Proc(f"settler-{i}", ["app", "settler", "--concurrency",
                                                str(self.config.settler_concurrency)],
                              env, self.workdir / f"settler-{i}.log") for i in range(self.config.settlers)]
        self.procs = [self.sim, self.web, *self.settlers]
        self.sim.start()
        await _wait_http(f"{self.sim_url}/_sim/faults", self.sim)
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            (await client.post(f"{self.sim_url}/_sim/faults", json=self.config.faults)).raise_for_status()
        self.web.start()
        for s in self.settlers:
            s.start()
        await _wait_http(f"{self.web_url}/healthz", self.web)
        endpoints = await self.register_endpoints(keys)
        if self.config.platform:
            self.platform = PlatformClient(self.config, self.web_url, keys[platform_key_index(self.config)],
                                           self.rng)
            await self.platform.make_owners(self.config.platform_owners, max(100, jobs), self.platform_funds())
            endpoints += await self.register_platform_endpoints(keys[platform_key_index(self.config)])
            self.say(f"platform {self.platform_id}: {len(self.platform.owner_ids)} owners made and funded "
                     f"({self.platform_funds()} credits each)")
        self.say(f"up: postgres {self.pg.port}, simulator {self.sim_url}, web {self.web_url}, "
                 f"{len(self.settlers)} settlers; faults {self.config.faults}; "
                 f"caps {', '.join(c.name for c in self.caps) or 'none'}; "
                 f"notification endpoints {', '.join(endpoints) or 'none'}")
        return keys

    async def register_endpoints(self, keys: list[str]) -> list[str]:
        """The run's notification endpoints (ENDPOINTS, for the owners the run
        has), through the API as a client registers them, each secret handed
        to its receiver (and searched for in the logs); DELETED_ENDPOINT is
        registered and deleted at once. Returns what was made, for the log."""
        made_list = []
        async with httpx.AsyncClient(base_url=self.web_url, trust_env=False, timeout=30) as client:
            for slot, (owner, name, events) in enumerate((*ENDPOINTS, DELETED_ENDPOINT)):
                if not self.receivers or owner >= self.config.owners:
                    continue
                auth = {"Authorization": f"Bearer {keys[owner]}"}
                made = await self._register_endpoint(client, auth, name, slot, events)
                asked = "all events" if events == ALL_EVENTS else " ".join(events) if events else "closes"
                what = f"owner {owner} {name} ({asked})"
                if slot == len(ENDPOINTS):  # DELETED_ENDPOINT
                    r = await client.delete(f"/v1/webhook-endpoints/{made['id']}", headers=auth)
                    if r.status_code != 204:
                        raise RuntimeError(f"deleting a notification endpoint answered {r.status_code}")
                    what += " deleted"
                made_list.append(what)
        return made_list

    async def _register_endpoint(self, client: httpx.AsyncClient, headers: dict[str, str], name: str, slot: int,
                                 events: Any) -> dict[str, Any]:
        """Register receiver `name`'s endpoint on `slot` through the API; its secret goes to the receiver."""
        receiver = self.receivers[name]
        body: dict[str, Any] = {"url": receiver.url(slot)}
        if events is not None:
            body["events"] = list(events)
        r = await client.post("/v1/webhook-endpoints", json=body, headers=headers)
        if r.status_code != 201:
            raise RuntimeError(f"registering a notification endpoint answered {r.status_code} {r.text[:200]}")
        made = r.json()
        receiver.register(slot, made["id"], made["secret"])
        self.api_keys[f"the secret of endpoint {made['id']}"] = made["secret"]
        return made

    def platform_funds(self) -> int:
        """Each platform owner's funding grant: room for its share of the
        jobs at the most each reserves, and for the claw-backs."""
        per_owner = self.config.jobs * self.config.platform_share / self.config.platform_owners
        return math.ceil(per_owner * 20) + 200

    async def register_platform_endpoints(self, platform_key: str) -> list[str]:
        """PLATFORM_ENDPOINT with the platform's key, ACTING_ENDPOINT with it
        acting for its owner; each on a slot past the owners' ENDPOINTS."""
        if not self.receivers:
            return []
        assert self.platform is not None
        owner, acting_name, acting_events = ACTING_ENDPOINT
        made_list = []
        async with httpx.AsyncClient(base_url=self.web_url, trust_env=False, timeout=30) as client:
            for slot, acting, (name, events) in (
                    (len(ENDPOINTS) + 1, None, PLATFORM_ENDPOINT),
                    (len(ENDPOINTS) + 2, self.platform.owner_ids[owner], (acting_name, acting_events))):
                headers = {"Authorization": f"Bearer {platform_key}"}
                if acting is not None:
                    headers["Longcall-Owner"] = acting
                made = await self._register_endpoint(client, headers, name, slot, events)
                asked = "all events" if events == ALL_EVENTS else " ".join(events) if events else "closes"
                if acting is None:
                    self.platform_endpoint = made["id"]
                    made_list.append(f"the platform {name} ({asked})")
                else:
                    made_list.append(f"platform owner {owner} {name} ({asked}, by the platform acting for it)")
        return made_list

    def receipts(self) -> list[invariants.Receipt]:
        return [receipt for r in self.receivers.values() for receipt in r.receipts()]

    # -- the killer ----------------------------------------------------------------------------
    async def _kill_and_restart(self, proc: Proc) -> None:
        proc.kill()
        self.kills[proc.name.split("-")[0]] += 1
        outage = self.rng.uniform(*self.config.outage_s)
        self.say(f"SIGKILL {proc.name}; back in {outage:.1f}s")
        await asyncio.sleep(outage)
        proc.start()
        if proc is self.web:
            await _wait_http(f"{self.web_url}/healthz", proc)

    async def killer(self, busy: Callable[[], bool]) -> None:
        """Kill at random intervals while `busy()`; the first kill hits a
        settler and the second the web server, so a short run has both."""
        order = ["settler"] * self.config.min_settler_kills + ["web"] * self.config.min_web_kills
        done = 0
        while done < self.config.max_kills and (busy() or done < len(order)):
            await asyncio.sleep(self.rng.uniform(*self.config.kill_interval_s))
            kind = order[done] if done < len(order) else self.rng.choice(["settler", "web"])
            victim = self.web if kind == "web" else self.rng.choice(self.settlers)
            await self._kill_and_restart(victim)
            done += 1

    async def postgres_restarter(self) -> None:
        at = self.config.restart_postgres_at
        if at is None:
            return
        assert self.load is not None, "the load starts before the restarter"
        await self.load.until_answered(at * self.config.jobs)
        self.say("restarting PostgreSQL")
        self.pg_cpu_s += _postgres_cpu_s(self.pg)
        took = time.monotonic()
        await asyncio.to_thread(self.pg.restart)
        self.kills["postgres restart"] += 1
        self.say(f"PostgreSQL back after {time.monotonic() - took:.1f}s")

    # -- watching ------------------------------------------------------------------------------
    async def _counts(self) -> tuple[Counter, int, int] | None:
        """Jobs by status, intents left on closed jobs, and notifications
        still to deliver (pending deliveries and notify intents)."""
        from app import db

        try:
            conn = await asyncio.wait_for(db.connect(self.pg.url, role="chaos"), 5)
        except Exception:
            return None
        try:
            rows = await conn.fetch("select status, count(*) as n from jobs group by status")
            left = await conn.fetchval("""select count(*) from outbox o join jobs j on j.id = o.job_id
                                          where j.status = any($1::text[])""", list(TERMINAL))
            notifying = await conn.fetchval("""select (select count(*) from deliveries where status = 'pending')
                                                      + (select count(*) from outbox where kind = 'notify')""")
            return Counter({r["status"]: r["n"] for r in rows}), left, notifying
        except Exception:
            return None
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    def _line(self, statuses: Counter, left: int, notifying: int) -> str:
        order = ["queued", "submitting", "running", "uncertain", *TERMINAL]
        parts = " ".join(f"{s}={statuses[s]}" for s in order if statuses[s])
        answered = self.load.answered if self.load else 0
        line = f"answered {answered}/{self.config.jobs} creates | {parts} | intents on closed jobs {left}"
        return line + (f" | notifications to deliver {notifying}" if self.receivers else "")

    async def progress(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.progress_every_s)
            if stop.is_set():
                return
            got = await self._counts()
            if got:
                self.say(self._line(*got))

    async def sample_caps(self, stop: asyncio.Event) -> None:
        """Every `cap_sample_every_s` until `stop`: the jobs each cap counts,
        submitted and waiting, into its tally (the database check of the
        caps). A sample the database cannot answer (it is restarting) is
        skipped."""
        from app import db

        if not self.caps:
            return
        providers = sorted({c.provider for c in self.caps})
        conn: Any = None
        try:
            while not stop.is_set():
                try:
                    if conn is None:
                        conn = await asyncio.wait_for(db.connect(self.pg.url, role="chaos-caps"), 5)
                    rows = await asyncio.wait_for(conn.fetch(invariants.CAP_SAMPLE, providers), 5)
                    at = time.monotonic() - self.started
                    for tally in self.cap_tallies:
                        tally.add(self.models, rows, at)
                except Exception:  # the database restarting, or away: reconnect
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.close()
                    conn = None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.cap_sample_every_s)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def drain(self) -> bool:
        """Wait (bounded) until no job is settling, no intent is left on a
        closed job and no notification is left to deliver. True when it got
        there."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        last_said = 0.0
        while time.monotonic() < deadline:
            got = await self._counts()
            if got:
                statuses, left, notifying = got
                if not any(statuses[s] for s in SETTLING) and left == 0 and notifying == 0:
                    self.say("drained: " + self._line(*got))
                    return True
                if time.monotonic() - last_said >= self.config.progress_every_s:
                    self.say("draining: " + self._line(*got))
                    last_said = time.monotonic()
            # A process that died on its own (not by our hand) is a finding;
            # restart it so the run can finish and the checks can speak.
            for proc in self.procs:
                if proc.popen is not None and not proc.alive:
                    self.say(f"{proc.name} exited on its own (code {proc.popen.returncode}); restarting")
                    self.kills[f"{proc.name.split('-')[0]} died"] += 1
                    proc.start()
            await asyncio.sleep(1.0)
        self.say(f"gave up waiting after {self.config.drain_timeout_s:g}s")
        return False

    # -- checking ------------------------------------------------------------------------------
    async def _dubs_by_name(self, client: httpx.AsyncClient) -> Counter:
        """ElevenLabs dubs registered no callback URL: each is named after its
        job (the adapter's look-up rests on it), so the list attributes them."""
        names: Counter = Counter()
        headers = {"xi-api-key": self.env_secrets["ELEVENLABS_API_KEY"]}
        params: dict[str, str] = {"page_size": "100"}
        while True:
            r = await client.get(f"{self.sim_url}/elevenlabs/v1/dubbing", params=params, headers=headers)
            r.raise_for_status()
            page = r.json()
            names.update(dub["name"] for dub in page["dubs"])
            if not page.get("has_more"):
                return names
            params["cursor"] = page["next_cursor"]

    async def check(self) -> tuple[list[Check], Counter, list[str]]:
        from app import db
        from app.storage import open_storage

        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            r = await client.get(f"{self.sim_url}/_sim/stats")
            r.raise_for_status()
            sim_stats = r.json()
            dubs_by_name = await self._dubs_by_name(client)
        storage = open_storage(f"file://{self.workdir / 'objects'}")
        conn = await db.connect(self.pg.url, role="chaos-check")
        try:
            checks = await invariants.system_checks(conn, sim_stats=sim_stats, storage=storage,
                                                    tasks_by_job=dubs_by_name, models=self.models,
                                                    caps=self.caps)
            record = self.load.record
            checks += [
                invariants.caps_in_database(self.cap_tallies),
                await invariants.accepted_creates_are_jobs(conn, record.accepted, record.refused),
                await invariants.client_cancels_held(conn, record.cancelled),
                await invariants.reads_agree(conn, record.seen_terminal),
                Check("every client request answered as the contract says",
                      sum(record.answers.values()), list(record.unexpected)),
                invariants.secrets_not_logged([str(p) for p in sorted(self.workdir.glob("*.log"))],
                                              {**self.env_secrets, **self.api_keys}),
            ]
            if self.receivers:
                notified, self.notify_tally = await invariants.notifications_kept(conn, self.receipts())
                checks.append(notified)
            if self.platform is not None and self.platform_id is not None:
                told = self.platform.record
                expected_owners = {p.key: self.platform.owner_ids[p.acting] if p.acting is not None
                                   else self.owner_ids[p.owner] for p in self.load.plans}
                checks += [
                    await invariants.grants_kept(conn, self.platform_id, told.made.values(), told.grants.values()),
                    await invariants.platform_owners_kept(conn, self.platform_id, told.made.values(),
                                                          expected_owners),
                    Check("every platform request answered as the contract says", sum(told.answers.values()),
                          list(told.unexpected)),
                ]
            by_status = Counter()
            # Uncertain jobs have no error code: which provider they are of says why.
            for r in await conn.fetch(f"select status, coalesce(error_code, case when status = "
                                      f"'{JobStatus.UNCERTAIN}' then provider end, '-') as code, count(*) as n "
                                      "from jobs group by 1, 2 order by 1, 2"):
                by_status[(r["status"], r["code"])] = r["n"]
            # The sync jobs on their own (uncertain/dubbing rows above mix them with the async ones).
            for r in await conn.fetch("select provider, model, status, coalesce(error_code, '-') as code, "
                                      "count(*) as n from jobs where provider = any($1::text[]) "
                                      "group by 1, 2, 3, 4 order by 1, 2, 3, 4", list(MODELS)):
                if provider_kind(r["provider"], r["model"]) is ProviderKind.SYNC:
                    self.sync_by_status[(f"{r['provider']} {r['model']}", r["status"], r["code"])] = r["n"]
            self.priced = [dict(r) for r in await conn.fetch(PRICED_BY_MODEL)]
            # The history of the first few jobs named in a violation, for diagnosis.
            bad_jobs: dict[str, None] = {}
            for c in checks:
                for v in c.violations:
                    bad_jobs.update(dict.fromkeys(invariants.JOB_ID_IN_URL.findall(v)[:1]))
            histories = [await invariants.job_history(conn, job_id) for job_id in list(bad_jobs)[:3]]
        finally:
            await conn.close()
            await storage.aclose()
        self.sim_stats = sim_stats
        return checks, by_status, histories

    # -- tearing down ---------------------------------------------------------------------------
    def teardown(self, keep: bool) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.stop(timeout=30)
        for receiver in self.receivers.values():
            with contextlib.suppress(Exception):  # never started, when the setup failed first
                receiver.server.stop()
        with contextlib.suppress(Exception):
            self.pg_cpu_s += _postgres_cpu_s(self.pg)
        with contextlib.suppress(Exception):
            self.pg.stop()
        if keep:
            self.say(f"kept {self.workdir} (logs, database, objects)")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


# The succeeded jobs' charges by model and the price they were charged by.
PRICED_BY_MODEL = """
select provider, model, coalesce(price_applied->'price'->>'per', '-') as per, count(*) as jobs,
       sum(credits_charged) as charged, sum(credits_reserved) as reserved,
       count(*) filter (where price_applied->>'note' like '%capped%') as capped,
       count(*) filter (where price_applied->'price' <> 'null'::jsonb and price_applied->'measure' = 'null'::jsonb)
           as unreadable
from jobs where status = 'succeeded' group by 1, 2, 3 order by 1, 2, 3
"""


def _cpu_s() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


async def run_chaos(config: ChaosConfig, out: Callable[[str], None] = print) -> ChaosResult:
    chaos = Chaos(config, out)
    cpu_before = _cpu_s()
    ok = False
    checks: list[Check] = []
    by_status: Counter = Counter()
    try:
        keys = await chaos.setup()
        plans = plan_jobs(config, chaos.rng)
        chaos.load = LoadGenerator(config, chaos.web_url, keys, plans, chaos.rng,
                                   acting=chaos.platform.owner_ids if chaos.platform else None)
        load = asyncio.create_task(chaos.load.run())
        # The platform's grants race the creates: spread over the time they take.
        grants = asyncio.create_task(chaos.platform.race(
            max(config.min_grants, round(config.jobs * config.grants_per_job)),
            config.jobs / config.create_rate if config.create_rate else 0.0)
            if chaos.platform else asyncio.sleep(0))
        statuses_seen: dict[str, int] = {}

        def busy() -> bool:
            # Keep killing while jobs go in, and while many are still settling.
            return not load.done() or statuses_seen.get("settling", 0) > config.jobs // 10

        async def watch_settling() -> None:
            while not load.done() or statuses_seen.get("settling", 0) > config.jobs // 10:
                got = await chaos._counts()
                if got:
                    statuses_seen["settling"] = sum(got[0][s] for s in SETTLING)
                await asyncio.sleep(2.0)

        stop_progress, stop_sampling = asyncio.Event(), asyncio.Event()
        sampler = asyncio.create_task(chaos.sample_caps(stop_sampling))
        killer = asyncio.create_task(chaos.killer(busy))
        restarter = asyncio.create_task(chaos.postgres_restarter())
        watchers = [asyncio.create_task(chaos.progress(stop_progress)), asyncio.create_task(watch_settling())]
        try:
            await load
            load_s = time.monotonic() - chaos.started
            chaos.say(f"all {config.jobs} creates answered, clients done")
            await grants
            if chaos.platform:
                chaos.say("platform grants: " + _platform_line(chaos.platform.record.tally()))
            await restarter  # due by now: it fires at a share of the creates
            await killer
        finally:
            stop_progress.set()
            for task in (load, grants, killer, restarter, *watchers):
                task.cancel()
            await asyncio.gather(load, grants, killer, restarter, *watchers, return_exceptions=True)
            await chaos.load.aclose()
        try:
            drained = await chaos.drain()
        finally:
            stop_sampling.set()
            await asyncio.gather(sampler, return_exceptions=True)
        drain_s = time.monotonic() - chaos.started - load_s
        for proc in (*chaos.settlers, chaos.web):  # a quiet system before we look
            proc.stop()
        checks, by_status, histories = await chaos.check()
        if not drained:
            checks.insert(0, Check("drained within the time limit", 1,
                                   [f"still settling after {config.drain_timeout_s:g}s"]))
        ok = all(c.ok for c in checks)
        elapsed = time.monotonic() - chaos.started
        _report(chaos, checks, by_status, histories, load_s, drain_s, elapsed)
    finally:
        if chaos.platform:  # made in setup, which may have failed after it
            await chaos.platform.aclose()
        chaos.teardown(keep=config.keep_dir or not ok)
    cpu = _cpu_s() - cpu_before + chaos.pg_cpu_s
    jobs_made = len(chaos.load.record.accepted) if chaos.load else 0
    out(f"CPU: {cpu:.0f} s in all processes (PostgreSQL included), "
        f"{1000 * cpu / max(1, jobs_made):.1f} ms per job; wall {time.monotonic() - chaos.started:.0f} s")
    out("RESULT: " + ("ok, no violations" if ok else "VIOLATIONS (see above)"))
    return ChaosResult(checks, chaos.kills, Counter({s: n for (s, _), n in by_status.items()}),
                       time.monotonic() - chaos.started, str(chaos.workdir), chaos.cap_tallies,
                       chaos.notify_tally, {name: r.answers()[0] for name, r in chaos.receivers.items()},
                       chaos.platform.record.tally() if chaos.platform else Counter())


def _platform_line(tally: Counter) -> str:
    return (f"{tally['grants moved']} grants and {tally['claw-backs moved']} claw-backs moved, "
            f"{tally['grants refused'] + tally['claw-backs refused']} refused 402 "
            f"({tally['sure overdraws']} sent past what the owner held), "
            f"{tally['grants unanswered'] + tally['claw-backs unanswered']} unanswered; replays answered "
            f"200 x{tally['replays answered 200']} and 402 x{tally['replays answered 402']}, "
            f"200 to a retry after a lost answer x{tally['200 to a retry after a lost answer']}; "
            f"{tally['retried through an outage']} requests retried through outages; "
            f"owner creates replayed x{tally['owner creates replayed']}")


def _report(chaos: Chaos, checks: list[Check], by_status: Counter, histories: list[str],
            load_s: float, drain_s: float, elapsed: float) -> None:
    out = chaos.out
    record = chaos.load.record
    out("")
    out(invariants.format_table(checks))
    out("")
    out("jobs by status and error code (uncertain: by provider):")
    for (status, code), n in sorted(by_status.items()):
        out(f"  {status:<11} {code:<18} {n:>6}")
    out("sync jobs by model, status and error code:")
    for (model, status, code), n in sorted(chaos.sync_by_status.items()):
        out(f"  {model:<46} {status:<11} {code:<18} {n:>6}")
    out("succeeded jobs charged, by model and price unit:")
    for r in chaos.priced:
        out(f"  {r['provider'] + ' ' + r['model']:<46} {r['per']:<13} {r['jobs']:>4} jobs, {r['charged']:>5} of "
            f"{r['reserved']:>5} reserved; {r['capped']} capped by the reservation, {r['unreadable']} unreadable")
    out("caps: " + (", ".join(c.name for c in chaos.caps) or "none") + "; simulator peak_concurrent: "
        + ", ".join(f"{k} {v}" for k, v in sorted((chaos.sim_stats.get("peak_concurrent") or {}).items())))
    out("client answers: " + ", ".join(f"{k} x{v}" for k, v in sorted(record.answers.items()))
        + f"; create retries {record.create_retries}")
    stats = chaos.sim_stats
    out(f"simulator: {stats.get('tasks_created')} tasks created, {stats.get('webhooks_sent')} webhooks sent "
        f"({stats.get('webhooks_delivered')} delivered, {stats.get('webhooks_failed')} given up), "
        f"{stats.get('status_calls')} status calls, "
        f"{sum((stats.get('sync_calls_by_body') or {}).values())} sync calls")
    if chaos.notify_tally is not None:
        answers = []
        for name, receiver in chaos.receivers.items():
            codes, slow = receiver.answers()
            answers.append(f"{name} " + " ".join(f"{code} x{n}" for code, n in sorted(codes.items()))
                           + (f" ({slow} slowly)" if slow else ""))
        out("notifications: " + chaos.notify_tally.line() + "; receivers answered " + ", ".join(answers))
    if chaos.platform:
        platform_jobs = sum(1 for p in chaos.load.plans if p.acting is not None)
        made = sum(1 for p in chaos.load.plans if p.acting is not None and p.key in record.accepted)
        got = [r for r in chaos.receipts() if r.endpoint_id == chaos.platform_endpoint]
        out(f"platform: {len(chaos.platform.owner_ids)} owners, {made} of its {platform_jobs} planned jobs "
            f"accepted; " + _platform_line(chaos.platform.record.tally()))
        out(f"platform endpoint {chaos.platform_endpoint}: {len(got)} requests, "
            f"{sum(1 for r in got if 200 <= r.answered < 300)} accepted, {len({r.webhook_id for r in got})} "
            f"notifications")
    out("faults done: " + (", ".join(f"{k} x{v}" for k, v in sorted(chaos.kills.items())) or "none"))
    creates_s = (chaos.load.creates_done_at or chaos.started) - chaos.started
    out(f"time: {elapsed:.0f} s (setup and creates {creates_s:.0f} s, clients done at {load_s:.0f} s, "
        f"then {drain_s:.0f} s draining), seed {chaos.seed}")
    for history in histories:
        out("")
        out(history)


def main(jobs: int = 5000, **overrides: Any) -> int:
    """`longcall chaos --jobs N`. 0 when every invariant holds, 1 otherwise."""
    if jobs < 1:
        print("longcall: --jobs must be at least 1", file=sys.stderr)
        return 2
    config = ChaosConfig(jobs=jobs, **overrides)
    if config.notify and importlib.util.find_spec("standardwebhooks") is None:
        print("longcall: chaos verifies notifications with the standardwebhooks library: "
              "pip install 'standardwebhooks>=1.1,<2'", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_chaos(config, out=lambda line: print(line, flush=True)))
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # a process would not start
        print(f"longcall: chaos could not run: {e}", file=sys.stderr)
        return 1
    return 0 if result.ok else 1
