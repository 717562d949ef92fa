"""The one interface every provider adapter implements.

The settler and the webhook receiver talk to providers only through this
module's types. An adapter turns its provider's wire protocol into these
values and its failures into exactly one of the three error classes, so the
settler can decide without knowing which provider it is talking to.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.vocabulary import ProviderKind as ProviderKind
from app.vocabulary import ProviderName
from app.vocabulary import TaskState as TaskState  # adapters name it from here
from app.vocabulary import UsageUnit as UsageUnit


class ProviderError(Exception):
    """Base of the three outcomes of a failed provider call.

    Messages must never contain a secret (API token, webhook secret, a URL
    carrying a token): they end up in the job's `last_error` and in logs.
    """


class Rejected(ProviderError):
    """The provider definitely did not create anything and will not if asked
    again the same way (a 4xx validation error). No charge; the job fails."""


class Transient(ProviderError):
    """The provider definitely did not create anything, but may if asked again
    later (connection refused before the request was sent, 429, 503 on a read).
    `retry_after` is the provider's own hint in seconds, when it gave one."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class Uncertain(ProviderError):
    """The request may have reached the provider and created a task (a timeout
    or a 5xx after the request was sent). Never retried blindly unless the
    provider's submit is idempotent."""



@dataclass(frozen=True)
class Submitted:
    """What a submit (or a successful `find`) returns."""

    task_id: str
    # Provider-specific facts needed to address the task later (fal's model
    # path, say). Stored as JSON in jobs.provider_operation. Never a secret.
    operation: Mapping[str, Any] | None = None
    # The per-task webhook signing secret, when the provider hands one out.
    # Encrypted at rest by the caller, erased when the job closes; never in a repr.
    webhook_secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Task:
    """A provider task as we stored it: enough to ask about it or cancel it."""

    task_id: str
    operation: Mapping[str, Any] | None = None
    model: str | None = None


# The media types of outputs that are values in the provider's answer.
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class OutputValue:
    """An output carried in the provider's answer itself (a model that
    answers a string, a JSON value, inline bytes): stored as it is, with no
    download."""

    data: bytes
    content_type: str
    label: str | None = None  # names the output when a task has several kinds


def text_value(text: str, label: str | None = None) -> OutputValue:
    """A text answer as an output: its UTF-8 bytes."""
    return OutputValue(_utf8(text), TEXT_CONTENT_TYPE, label)


def json_value(value: Any, label: str | None = None) -> OutputValue:
    """A JSON answer as an output: compact, and the text as the model wrote
    it (no \\u escapes for non-ASCII)."""
    return OutputValue(_utf8(json.dumps(value, separators=(",", ":"), ensure_ascii=False)), JSON_CONTENT_TYPE, label)


def _utf8(text: str) -> bytes:
    # A lone surrogate (JSON can carry "\ud800") has no UTF-8 form: it becomes "?".
    return text.encode("utf-8", "replace")


@dataclass(frozen=True)
class OutputFile:
    """An output the adapter already wrote to a file of its own while it
    read the provider's answer (bytes inline in it: the Gateway's `base64`
    videos), with the cap, size and sha256 of what it wrote. The settle step
    moves it into storage, and removes it whatever happens."""

    path: str
    bytes: int
    sha256: str
    content_type: str | None
    label: str | None = None


@dataclass(frozen=True)
class Usage:
    """One measure of what a task used, as the provider reported it (or as
    we measured it): seconds of video, characters, tokens, the provider's
    own cost. Recorded on the job; priced by the models file."""

    unit: UsageUnit
    amount: float


@dataclass(frozen=True)
class Observation:
    """What the provider says about a task right now. A success's outputs are
    `output_urls` (downloaded, each named by the label at its place in
    `url_labels`, if any), then `files` (written by the adapter), then
    `values` (stored as they are), indexed in that order."""

    state: TaskState
    output_urls: tuple[str, ...] = ()
    cost: int | None = None  # credits, when the provider reports a cost
    error: str | None = None  # the provider's reason for a failure
    values: tuple[OutputValue, ...] = ()
    url_labels: tuple[str | None, ...] = ()
    files: tuple[OutputFile, ...] = ()
    usage: tuple[Usage, ...] = ()
    # The provider says the outputs no longer exist (Replicate's `data_removed`).
    output_removed: bool = False
    # A cancelled task that the provider stopped at the deadline it was
    # given at submit (Replicate's `Cancel-After`): the job's give-up.
    stopped_at_deadline: bool = False
    # A sync call's own id at the provider (Anthropic's `request-id`), kept
    # on the job for support: never a secret.
    request_id: str | None = None


@dataclass(frozen=True)
class SubmitRequest:
    job_id: str
    model: str
    input: Mapping[str, Any]
    # Where the provider should send its webhook; None when PUBLIC_URL is
    # unset (jobs then close through reads and timers).
    callback_url: str | None
    # When the job's first submit call began (jobs.provider_call_started_at):
    # a task any of its calls created was created after it. `find` looks no
    # further back.
    first_attempt_at: dt.datetime | None = None
    # The job's give-up deadline: a provider that can stop a task at a
    # deadline of its own is given it, so nothing runs (and bills) past it.
    deadline_at: dt.datetime | None = None
    # A sync call's own timeout (the model's `timeout_s`): the answer may
    # take this long to start, and the whole call no longer.
    call_timeout_s: float = 600.0


@dataclass(frozen=True)
class WebhookRequest:
    """An incoming webhook, exactly as it arrived. Nothing here is parsed
    before `verify` says yes."""

    job_id: str
    headers: Mapping[str, str]  # lower-cased names
    query: Mapping[str, str]
    raw_body: bytes
    # The job's decrypted per-task webhook secret (sim), or None.
    job_secret: str | None = None


# Webhook schemes whose verify never waits on the network: keyed with the
# job's own secret (t/v1) or our capability token (capability-url). The
# receiver may hold one database connection across such a verify; the
# others may fetch keys (fal's JWKS, Replicate's secret) and must not. A
# scheme not listed here is treated as one that may. ("none" never reaches
# a verify: such a provider has no webhook route, ProviderFacts.takes_webhooks.)
OFFLINE_WEBHOOK_SCHEMES = frozenset({"t/v1", "capability-url"})


@dataclass(frozen=True)
class ProviderFacts:
    """The pure facts the settler and the receiver need about a provider."""

    name: str
    webhook_scheme: str  # "t/v1", "standard-webhooks", "ed25519-jwks", "capability-url", "none"
    idempotent_submit: bool  # the same idempotency key returns the same task
    can_find: bool  # find() can look a task up by our job id
    # Lost-webhook check: with a webhook registered, ask the provider anyway
    # this long after submit.
    stale_after_s: float
    # Poll schedule without webhooks: the wait before each check, in order
    # (the first check after submit, then the next...); the last one repeats.
    poll_delays_s: tuple[float, ...] = (2.0, 3.0, 5.0, 10.0, 20.0, 30.0)
    # Hosts outputs may be downloaded from (exact names, or ".suffix").
    output_hosts: tuple[str, ...] = field(default_factory=tuple)
    output_ttl_s: float = 3600.0
    # Output hosts that are the provider's own and get its credentials on a
    # download (`Provider.download_credentials`); no other host ever does.
    credential_hosts: tuple[str, ...] = ()
    # Outputs may come from any public https host (the Gateway's are on
    # whichever upstream served the job): every other guard still holds.
    outputs_from_any_host: bool = False
    # The provider can be asked to stop a task. Without, a cancelled job is
    # closed and refunded here while the provider may run (and bill) it.
    can_cancel: bool = True
    # The job's give-up deadline, seconds after it is created; None: the
    # settings' (GIVE_UP_AFTER_S, GIVE_UP_AFTER_S_<PROVIDER>).
    give_up_after_s: float | None = None
    # Sync models (`kind` SYNC) make one `call`; for them `stale_after_s`
    # is the lost-call threshold, counted from the call's start, and
    # `call_timeout_s` the call's own timeout (it is never shorter).
    kind: ProviderKind = ProviderKind.ASYNC
    call_timeout_s: float = 600.0
    # A lost call can be looked up at the provider (`recover`: ElevenLabs'
    # speech history); without, it is failed `call_lost` after the threshold.
    can_recover: bool = False

    @property
    def takes_webhooks(self) -> bool:
        """False for a provider that never calls back (polled, or a sync
        call): no callback is registered, and its webhook route is a 404."""
        return self.webhook_scheme != "none"

    def poll_delay(self, age_s: float) -> float:
        """The wait before the next check of a task submitted `age_s` ago.
        Read off the schedule by the task's age, not by counting checks, so
        checks that other roads asked for (webhooks, reads) do not push the
        next timer out."""
        elapsed = 0.0
        for delay in self.poll_delays_s:
            elapsed += delay
            if age_s < elapsed:
                return delay
        return self.poll_delays_s[-1]


# A sync call's default timeout, and what the lost-call threshold adds to
# it (CONTRACT.md: Sync calls; the models file may set either).
SYNC_CALL_TIMEOUT_S = 600.0
LOST_CALL_MARGIN_S = 300.0


class Provider:
    """Base class of adapters. Each I/O method maps its failures to
    Rejected / Transient / Uncertain and nothing else."""

    facts: ProviderFacts

    @property
    def name(self) -> str:
        return self.facts.name

    def facts_for(self, model: str) -> ProviderFacts:
        """The facts of jobs of `model`: timings (stale threshold, poll
        schedule, output lifetime, give-up) may differ by model — a lip-sync
        runs for an hour, an image for seconds. Pure; the provider's own
        facts by default."""
        return self.facts

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        raise NotImplementedError

    async def call(self, request: SubmitRequest) -> Observation:
        """Sync models: make the one paid call, bounded by the model's
        `call_timeout_s` (`request.deadline_at` is not used), and return its
        answer as a SUCCEEDED Observation: the answer written by the adapter
        to `files` (capped at the adapter's max_output_bytes, with its size
        and sha256; output 0) and its `usage` and `request_id`. Raises
        Rejected (a 4xx: the provider did nothing it bills), Transient
        (nothing was sent, or a 429/529/503 before any byte of the answer:
        ask again after `retry_after`), Uncertain (anything else once the
        request was sent: the call is lost), or OutputTooLarge (over the cap).
        No retries of its own, ever."""
        raise NotImplementedError

    async def recover(self, request: SubmitRequest) -> Observation | None:
        """Sync models with `can_recover`: the answer of this job's lost call
        (made since `request.first_attempt_at`, the call's start) looked up
        at the provider, as `call` would have returned it; None when no such
        answer is there (yet). Raises Rejected when it cannot be told apart
        (several match: never adopted), Transient when the look-up did not
        work."""
        return None

    async def status(self, task: Task) -> Observation:
        raise NotImplementedError

    async def cancel(self, task: Task) -> None:
        """Best effort; a task that is already finished is not an error."""
        raise NotImplementedError

    async def find(self, request: SubmitRequest) -> Submitted | None:
        """Look a task up by a stable reference (our job id in the callback URL
        or metadata). None when no such task exists. Only called when
        `facts.can_find`."""
        return None

    async def find_candidates(self, request: SubmitRequest) -> tuple[Submitted, ...]:
        """Every task that may be the one this job's submit created, for the
        submit step to narrow down with what only the database knows (tasks
        already saved on another job). A provider that can name the task
        exactly answers `find`'s one task."""
        found = await self.find(request)
        return () if found is None else (found,)

    async def verify(self, webhook: WebhookRequest) -> bool:
        """True only for a webhook signed by this provider for this job.
        Never raises: every malformed input is simply False."""
        raise NotImplementedError

    def webhook_task_id(self, webhook: WebhookRequest) -> str | None:
        """The task a delivery names, read only after `verify` said yes, and
        only to recover a job whose submit is in doubt: `confirm_task` must
        confirm it before it is used. Pure; None when the delivery names none."""
        return None

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """Ask the provider, with our own credentials, whether `task_id` is a
        task of ours made by `request` (the in-doubt submit of that job): its
        Submitted when it is, None when the provider does not know it (or,
        where the provider echoes what a task was made with, it was made for
        something else). A read that did not work raises Transient."""
        try:
            await self.status(Task(task_id=task_id, model=request.model))
        except Rejected:
            return None
        return Submitted(task_id=task_id)

    def is_final_webhook(self, webhook: WebhookRequest) -> bool:
        """Whether a verified delivery announces an end (or may: the settle
        step asks the provider). False for stage reports (Suno's `text` and
        `first` callbacks): accepted, and nothing is settled. Pure."""
        return True

    def download_credentials(self) -> Mapping[str, str]:
        """Headers an output download sends to `facts.credential_hosts` (and
        only there, on the first hop). None by default."""
        return {}

    async def aclose(self) -> None:
        return None


# What a claimed task id may look like: an id, not a blob (jobs.claimed_task_id).
MAX_TASK_ID_CHARS = 200


def claimed_id(value: object) -> str | None:
    """`value` when it can be a task id (a short string of printable
    characters without spaces), else None. Pure."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TASK_ID_CHARS:
        return None
    return value if value.isprintable() and not any(c.isspace() for c in value) else None


def webhook_field(raw_body: bytes, *path: str) -> object:
    """The value at `path` in a JSON object body (`"data", "taskId"`), or
    None when the body is not JSON or has nothing there. Pure."""
    try:
        node: object = json.loads(raw_body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


SYNC_PROVIDERS: tuple[str, ...] = (ProviderName.ANTHROPIC, ProviderName.OPENAI)
ELEVENLABS_ASYNC_MODELS = ("dubbing",)
# ElevenLabs' sync models: `text-to-speech/<voice_id>` and `sound-generation`.
ELEVENLABS_SPEECH_PREFIX = "text-to-speech/"
ELEVENLABS_SOUND_MODEL = "sound-generation"


def provider_kind(provider: str, model: str) -> ProviderKind:
    """Whether jobs of `model` are one sync call or an async task (pure;
    CONTRACT.md: Providers). Each adapter's `facts_for(model).kind` says the
    same (tests/providers/test_adapter_suite.py holds them to it)."""
    if provider in SYNC_PROVIDERS:
        return ProviderKind.SYNC
    if provider == ProviderName.ELEVENLABS and model not in ELEVENLABS_ASYNC_MODELS:
        return ProviderKind.SYNC
    return ProviderKind.ASYNC
