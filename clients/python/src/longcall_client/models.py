"""Typed views of the API's JSON (CONTRACT.md, "HTTP API").

Each object keeps the JSON it was built from in `raw`, so fields a newer
server adds are readable before this library knows them. Parsing is lenient
about additions and strict about nothing else: a field the server omits
becomes None (or an empty collection), never an exception.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

JobStatus = Literal["queued", "submitting", "running", "uncertain", "succeeded", "failed", "cancelled", "expired"]
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "expired"})


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 timestamp (the server writes `...Z`) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class Credits:
    reserved: int
    charged: int
    refunded: int

    @classmethod
    def from_json(cls, data: Any) -> Credits:
        data = _dict(data)
        return cls(reserved=data.get("reserved", 0), charged=data.get("charged", 0),
                   refunded=data.get("refunded", 0))


@dataclass(frozen=True)
class Output:
    index: int
    url: str
    content_type: str
    bytes: int
    sha256: str
    label: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Output:
        data = _dict(data)
        return cls(index=data.get("index", 0), url=data.get("url", ""), content_type=data.get("content_type", ""),
                   bytes=data.get("bytes", 0), sha256=data.get("sha256", ""), label=data.get("label"), raw=data)


@dataclass(frozen=True)
class JobError:
    """Why a job failed (`error` in the job JSON), e.g. `provider_failed`."""

    code: str
    message: str

    @classmethod
    def from_json(cls, data: Any) -> JobError | None:
        if not isinstance(data, dict):
            return None
        return cls(code=str(data.get("code", "")), message=str(data.get("message", "")))


@dataclass(frozen=True)
class Job:
    id: str
    owner_id: str
    status: str
    provider: str
    model: str
    input: dict[str, Any]
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    finished_at: dt.datetime | None
    credits: Credits
    outputs: list[Output]
    error: JobError | None
    metadata: dict[str, Any]
    status_url: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        """True once the job can change no more (succeeded, failed, cancelled, expired)."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_json(cls, data: Any) -> Job:
        data = _dict(data)
        return cls(
            id=data.get("id", ""), owner_id=data.get("owner_id", ""), status=data.get("status", ""),
            provider=data.get("provider", ""), model=data.get("model", ""), input=_dict(data.get("input")),
            created_at=parse_time(data.get("created_at")), updated_at=parse_time(data.get("updated_at")),
            finished_at=parse_time(data.get("finished_at")), credits=Credits.from_json(data.get("credits")),
            outputs=[Output.from_json(o) for o in _list(data.get("outputs"))],
            error=JobError.from_json(data.get("error")), metadata=_dict(data.get("metadata")),
            status_url=data.get("status_url", ""), raw=data,
        )


@dataclass(frozen=True)
class JobPage:
    """One page of `GET /v1/jobs`, newest first; pass `next_cursor` for the next (None: the last page)."""

    jobs: list[Job]
    next_cursor: str | None

    @classmethod
    def from_json(cls, data: Any) -> JobPage:
        data = _dict(data)
        return cls(jobs=[Job.from_json(j) for j in _list(data.get("jobs"))], next_cursor=data.get("next_cursor"))


@dataclass(frozen=True)
class AccountCredits:
    balance: int
    reserved: int
    charged: int


@dataclass(frozen=True)
class Account:
    owner_id: str
    credits: AccountCredits
    active: int
    max_active: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Account:
        data = _dict(data)
        credits = _dict(data.get("credits"))
        return cls(owner_id=data.get("owner_id", ""),
                   credits=AccountCredits(balance=credits.get("balance", 0), reserved=credits.get("reserved", 0),
                                          charged=credits.get("charged", 0)),
                   active=data.get("active", 0), max_active=data.get("max_active", 0), raw=data)


@dataclass(frozen=True)
class OwnerCredits:
    """An owner's money: `granted` is every grant summed (claw-backs
    subtracted); `balance` is what it may still spend."""

    granted: int
    balance: int
    reserved: int
    charged: int


@dataclass(frozen=True)
class Owner:
    """An owner under a platform, as the owners API shows it (`/v1/owners`)."""

    owner_id: str
    name: str
    credits: OwnerCredits
    active: int
    max_active: int
    created_at: dt.datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Owner:
        data = _dict(data)
        credits = _dict(data.get("credits"))
        return cls(owner_id=data.get("owner_id", ""), name=data.get("name", ""),
                   credits=OwnerCredits(granted=credits.get("granted", 0), balance=credits.get("balance", 0),
                                        reserved=credits.get("reserved", 0), charged=credits.get("charged", 0)),
                   active=data.get("active", 0), max_active=data.get("max_active", 0),
                   created_at=parse_time(data.get("created_at")), raw=data)


@dataclass(frozen=True)
class OwnerPage:
    """One page of `GET /v1/owners`, newest first; `next_cursor` None on the last page."""

    owners: list[Owner]
    next_cursor: str | None

    @classmethod
    def from_json(cls, data: Any) -> OwnerPage:
        data = _dict(data)
        return cls(owners=[Owner.from_json(o) for o in _list(data.get("owners"))],
                   next_cursor=data.get("next_cursor"))


@dataclass(frozen=True)
class Model:
    """One entry of the models file as owners see it (`GET /v1/models`)."""

    provider: str
    model: str
    price: Any
    give_up_after_s: float | None
    kind: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Model:
        data = _dict(data)
        return cls(provider=data.get("provider", ""), model=data.get("model", ""), price=data.get("price"),
                   give_up_after_s=data.get("give_up_after_s"), kind=data.get("kind", ""), raw=data)


@dataclass(frozen=True)
class Event:
    """One entry of a job's timeline (`GET /v1/jobs/{id}/events`)."""

    at: dt.datetime | None
    type: str
    detail: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Event:
        data = _dict(data)
        return cls(at=parse_time(data.get("at")), type=data.get("type", ""), detail=_dict(data.get("detail")),
                   raw=data)


@dataclass(frozen=True)
class WebhookEndpoint:
    """A notification endpoint. `secret` (`whsec_...`) is only in the answer to its creation."""

    id: str
    url: str
    events: list[str]
    secret: str | None
    created_at: dt.datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    def __repr__(self) -> str:  # the secret stays out of logs
        return f"WebhookEndpoint(id={self.id!r}, url={self.url!r}, events={self.events!r})"

    @classmethod
    def from_json(cls, data: Any) -> WebhookEndpoint:
        data = _dict(data)
        return cls(id=data.get("id", ""), url=data.get("url", ""), events=_list(data.get("events")),
                   secret=data.get("secret"), created_at=parse_time(data.get("created_at")), raw=data)


@dataclass(frozen=True)
class Delivery:
    endpoint_id: str
    status: str  # pending | delivered | failed
    attempts: int
    last_status_code: int | None
    last_attempt_at: dt.datetime | None

    @classmethod
    def from_json(cls, data: Any) -> Delivery:
        data = _dict(data)
        return cls(endpoint_id=data.get("endpoint_id", ""), status=data.get("status", ""),
                   attempts=data.get("attempts", 0), last_status_code=data.get("last_status_code"),
                   last_attempt_at=parse_time(data.get("last_attempt_at")))


@dataclass(frozen=True)
class Notification:
    id: str
    type: str
    job_id: str
    created_at: dt.datetime | None
    deliveries: list[Delivery]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Notification:
        data = _dict(data)
        return cls(id=data.get("id", ""), type=data.get("type", ""), job_id=data.get("job_id", ""),
                   created_at=parse_time(data.get("created_at")),
                   deliveries=[Delivery.from_json(d) for d in _list(data.get("deliveries"))], raw=data)


@dataclass(frozen=True)
class DownloadedOutput:
    """What `jobs.download` wrote: the file, its size and SHA-256 as received."""

    path: str
    bytes: int
    sha256: str
    content_type: str | None


@dataclass(frozen=True)
class NotificationPage:
    """One page of `GET /v1/notifications`, newest first; `next_cursor` None on the last page."""

    notifications: list[Notification]
    next_cursor: str | None

    @classmethod
    def from_json(cls, data: Any) -> NotificationPage:
        data = _dict(data)
        return cls(notifications=[Notification.from_json(n) for n in _list(data.get("notifications"))],
                   next_cursor=data.get("next_cursor"))


# The list answers, unwrapped (each is an object holding one array).

def events_from_json(data: Any) -> list[Event]:
    return [Event.from_json(e) for e in _list(_dict(data).get("events"))]


def models_from_json(data: Any) -> list[Model]:
    return [Model.from_json(m) for m in _list(_dict(data).get("models"))]


def endpoints_from_json(data: Any) -> list[WebhookEndpoint]:
    return [WebhookEndpoint.from_json(e) for e in _list(_dict(data).get("webhook_endpoints"))]
