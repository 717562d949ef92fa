"""The words longcall speaks, defined once.

Job statuses, the sets they fall in, outbox intent kinds, ledger entry kinds,
the job error codes, the API error codes with their HTTP statuses, and the
provider names. Everything else (SQL fragments, metrics labels, the OpenAPI
document, the status screen, the chaos checks) is written from these. The
migration's CHECK constraints and the status-set index predicates are
compared against them by tests/test_vocabulary.py, and `make check` refuses
a status, kind or provider literal written out anywhere else in app/ and
outbox/ (tools/check_vocabulary.py).

StrEnum members are str: they go into SQL parameters, JSON and labels as
their plain value.
"""
from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    SUBMITTING = "submitting"
    RUNNING = "running"
    UNCERTAIN = "uncertain"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


# In flight: holding a reservation and an active slot (`uncertain` included).
IN_FLIGHT: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.SUBMITTING, JobStatus.RUNNING,
                                    JobStatus.UNCERTAIN)
# Submitted and not yet closed: what a provider's capacity counts (MAX_IN_FLIGHT_<PROVIDER>).
SUBMITTED: tuple[JobStatus, ...] = (JobStatus.SUBMITTING, JobStatus.RUNNING, JobStatus.UNCERTAIN)
TERMINAL: tuple[JobStatus, ...] = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED,
                                   JobStatus.EXPIRED)
# Terminal with everything refunded: never charged.
REFUNDED: tuple[JobStatus, ...] = (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)
ALL_STATUSES: tuple[JobStatus, ...] = IN_FLIGHT + TERMINAL


class TaskState(StrEnum):
    """A provider task's state as an adapter reports it (each adapter maps its
    provider's own words onto these)."""

    RUNNING = "running"  # queued or running at the provider: ask again later
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # cancelled or aborted at the provider


class IntentKind(StrEnum):
    """Outbox intents: what a settler is asked to do for a job."""

    SUBMIT = "submit"
    SETTLE = "settle"
    CANCEL = "cancel"
    NOTIFY = "notify"  # one delivery of a notification to one endpoint (outbox.delivery_id)


# The intents that closing a job makes pointless (a provider cancel may outlive it).
CLOSED_BY_CLOSE: tuple[IntentKind, ...] = (IntentKind.SUBMIT, IntentKind.SETTLE)


class EventType(StrEnum):
    """A line of a job's timeline (`GET /v1/jobs/{id}/events`, table job_events)."""

    CREATED = "created"
    SUBMIT_SENT = "submit_sent"
    TASK_SAVED = "task_saved"
    CALL_STARTED = "call_started"
    WEBHOOK_ACCEPTED = "webhook_accepted"
    STATUS_CHECKED = "status_checked"
    OUTPUT_STORED = "output_stored"
    CLOSED = "closed"
    NOTIFICATION_DELIVERED = "notification_delivered"
    NOTIFICATION_FAILED = "notification_failed"


class NotificationType(StrEnum):
    """What a notification tells (CONTRACT.md: Notifications to the client):
    `job.` and the status the job moved to."""

    RUNNING = "job.running"
    UNCERTAIN = "job.uncertain"
    SUCCEEDED = "job.succeeded"
    FAILED = "job.failed"
    CANCELLED = "job.cancelled"
    EXPIRED = "job.expired"


# The statuses whose arrival is notified; an endpoint that names no events gets the terminal ones.
NOTIFIED: tuple[JobStatus, ...] = (JobStatus.RUNNING, JobStatus.UNCERTAIN) + TERMINAL
DEFAULT_EVENTS: tuple[NotificationType, ...] = tuple(NotificationType(f"job.{s}") for s in TERMINAL)


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # not yet answered with a 2xx, still within its 24 h
    DELIVERED = "delivered"
    FAILED = "failed"  # given up (24 h of retries, or its endpoint deleted)


class LedgerKind(StrEnum):
    GRANT = "grant"
    RESERVE = "reserve"
    CHARGE = "charge"
    REFUND = "refund"


class JobError(StrEnum):
    """`error.code` of a job (CONTRACT.md: A job as JSON)."""

    PROVIDER_FAILED = "provider_failed"
    SUBMIT_REJECTED = "submit_rejected"
    SETTLE_EXHAUSTED = "settle_exhausted"
    GIVE_UP = "give_up"
    OUTPUT_TOO_LARGE = "output_too_large"
    OUTPUT_REFUSED = "output_refused"  # the URL broke the download policy (host, address)
    OUTPUT_EXPIRED = "output_expired"  # the provider removed the output before we copied it
    CALL_LOST = "call_lost"
    RESOLVED_FAILED = "resolved_failed"


# Closed jobs an operator should look at (the console's "Needs a human";
# the `jobs_needs_human` index predicate is this set).
NEEDS_A_HUMAN: tuple[JobError, ...] = (JobError.SETTLE_EXHAUSTED, JobError.CALL_LOST, JobError.OUTPUT_EXPIRED)


class ApiErrorCode(StrEnum):
    """`error.code` of an API error answer (CONTRACT.md: HTTP API)."""

    UNAUTHENTICATED = "unauthenticated"
    NOT_FOUND = "not_found"
    INVALID_REQUEST = "invalid_request"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNKNOWN_PROVIDER = "unknown_provider"
    INSUFFICIENT_CREDITS = "insufficient_credits"
    CAPACITY_EXHAUSTED = "capacity_exhausted"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    INVALID_STATE = "invalid_state"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


# The HTTP status of each API error code; the OpenAPI document is written from it.
API_ERROR_STATUS: dict[ApiErrorCode, int] = {
    ApiErrorCode.UNAUTHENTICATED: 401,
    ApiErrorCode.NOT_FOUND: 404,
    ApiErrorCode.INVALID_REQUEST: 400,
    ApiErrorCode.PAYLOAD_TOO_LARGE: 413,
    ApiErrorCode.UNKNOWN_PROVIDER: 422,
    ApiErrorCode.INSUFFICIENT_CREDITS: 402,
    ApiErrorCode.CAPACITY_EXHAUSTED: 429,
    ApiErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ApiErrorCode.INVALID_STATE: 409,
    ApiErrorCode.METHOD_NOT_ALLOWED: 405,
    ApiErrorCode.UNAVAILABLE: 503,
    ApiErrorCode.INTERNAL: 500,
}


class ProviderCall(StrEnum):
    """What the settler asks a provider (the `operation` label of provider call metrics)."""

    SUBMIT = "submit"
    STATUS = "status"
    CANCEL = "cancel"
    CALL = "call"  # a sync call: the answer is the result


class CallOutcome(StrEnum):
    """How a provider call ended (the `outcome` label): a success, or which
    of the adapter's error classes it raised."""

    OK = "ok"
    REJECTED = "rejected"
    TRANSIENT = "transient"
    UNCERTAIN = "uncertain"
    ERROR = "error"  # any provider error, where the class changes nothing (status, cancel)


class ProviderName(StrEnum):
    """The providers longcall has adapters for."""

    SIM = "sim"
    REPLICATE = "replicate"
    FAL = "fal"
    KIE = "kie"
    GATEWAY = "gateway"
    GEMINI = "gemini"
    ELEVENLABS = "elevenlabs"
    ANTHROPIC = "anthropic"
    OPENAI = "openai"


class ProviderKind(StrEnum):
    """How a provider works for one model (CONTRACT.md: Providers)."""

    ASYNC = "async"  # submit, then a task closed by a webhook, a read or a timer
    SYNC = "sync"  # one call whose answer is the result; never a task


class UsageUnit(StrEnum):
    """What a task's usage is measured in (jobs.usage)."""

    SECONDS = "seconds"  # of audio or video produced
    CHARACTERS = "characters"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    CREDITS = "credits"  # the provider's own cost, in our credits (the native protocol)
    USD = "usd"  # the provider's own cost in dollars (the Gateway's)


def sql_list(values: tuple[str, ...] | list[str]) -> str:
    """A set as a SQL literal list, `('a', 'b')`, for statements written from
    this module. Only ever called with the members above (no user input)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"
