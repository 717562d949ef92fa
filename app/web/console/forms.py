"""What the console's forms and query strings may carry: pure functions,
table-tested (tests/web/console/test_forms.py). Each returns a value or a
FormError whose message is shown to the operator as it is."""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from app import ids
from app.vocabulary import JobStatus
from app.web.body import MAX_CREDITS, MAX_PROVIDER_TASK_ID

MAX_FORM_BYTES = 16 * 1024
MAX_FORM_FIELDS = 16
MAX_SEARCH = 500  # a provider task id, at most (app/web/body.py)
MAX_GRANT_REASON = 500  # the ledger's limit (migration 007)
MAX_ADMIN_TOKEN = 4096
FORM_TYPE = "application/x-www-form-urlencoded"
# Where a sign-in may return to: a console page, nothing else (no scheme, no
# host, no `//`, no backslash a browser would read as a slash).
_NEXT = re.compile(r"/console(/[A-Za-z0-9_\-]+)*/?(\?[A-Za-z0-9_\-=&%.]*)?")
_GRANT_KEY = re.compile(r"console-[0-9a-f]{32}")
_DIGITS = re.compile(r"[1-9][0-9]{0,12}")


class FormError(ValueError):
    """A form refused, nothing changed: `status_code` 400, or 413 for one over MAX_FORM_BYTES."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


def parse_form(content_type: str | None, raw: bytes) -> dict[str, str]:
    """An urlencoded body as {name: value}. A name given twice, a body not
    UTF-8, too many fields or another content type: FormError. No body at
    all is an empty form (its missing CSRF token is then what refuses it)."""
    if not raw and not content_type:
        return {}
    if (content_type or "").split(";")[0].strip().lower() != FORM_TYPE:
        raise FormError("forms are sent as " + FORM_TYPE)
    if len(raw) > MAX_FORM_BYTES:
        raise FormError("the form is too large")
    try:
        text = raw.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text),
                          max_num_fields=MAX_FORM_FIELDS, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise FormError("the form could not be read") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise FormError(f"the field {name!r} is given twice")
        if "\x00" in value:
            raise FormError(f"the field {name!r} holds a NUL character")
        fields[name] = value
    return fields


def safe_next(raw: str | None) -> str:
    """The console page to go to after signing in; anything else is the fleet."""
    return raw if raw and len(raw) <= 500 and _NEXT.fullmatch(raw) else "/console"


@dataclass(frozen=True)
class Resolution:
    """What an operator resolves an uncertain job with: a task id, or failed."""
    task_id: str | None

    @property
    def as_failed(self) -> bool:
        return self.task_id is None


def parse_resolution(fields: dict[str, str]) -> Resolution:
    outcome = fields.get("outcome", "")
    task_id = fields.get("task_id", "").strip()
    if outcome == JobStatus.FAILED and not task_id:
        return Resolution(None)
    if outcome == "task" or (not outcome and task_id):
        if not task_id:
            raise FormError("give the provider's task id")
        if len(task_id) > MAX_PROVIDER_TASK_ID:
            raise FormError(f"a task id has at most {MAX_PROVIDER_TASK_ID} characters")
        if not task_id.isprintable():
            raise FormError("a task id is printable text")
        return Resolution(task_id)
    raise FormError("choose a task id or failed")


@dataclass(frozen=True)
class Grant:
    credits: int
    reason: str


def parse_grant(fields: dict[str, str]) -> Grant:
    raw = fields.get("credits", "").strip()
    if not _DIGITS.fullmatch(raw) or int(raw) > MAX_CREDITS:
        raise FormError(f"credits: a whole number from 1 to {MAX_CREDITS}")
    reason = " ".join(fields.get("reason", "").split())
    if len(reason) > MAX_GRANT_REASON:
        raise FormError(f"a reason has at most {MAX_GRANT_REASON} characters")
    return Grant(int(raw), reason or "granted in the console")


def parse_grant_key(raw: str | None) -> str:
    """The grant's one-time key, made with its confirmation page."""
    if raw is None or not _GRANT_KEY.fullmatch(raw):
        raise FormError("this grant's confirmation is missing its key; start again")
    return raw


@dataclass(frozen=True)
class Search:
    """Where a search leads: a job, an owner, a notification's job, or the
    jobs with this provider task id."""
    kind: str  # "job" | "owner" | "notification" | "task"
    value: str


def parse_search(raw: str | None) -> Search | None:
    q = (raw or "").strip()
    if not q:
        return None
    if len(q) > MAX_SEARCH:
        raise FormError(f"a search has at most {MAX_SEARCH} characters")
    if not q.isprintable():
        # No id holds one, and PostgreSQL refuses a NUL in text outright.
        raise FormError("a search holds printable characters only")
    if ids.is_job_id(q):
        return Search("job", q)
    if ids.is_owner_id(q):
        return Search("owner", q)
    if ids.is_notification_id(q):
        return Search("notification", q)
    return Search("task", q)
