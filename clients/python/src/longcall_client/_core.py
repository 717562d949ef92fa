"""What the sync and async clients share, written once: the requests each
call makes (`Call`), when a failed attempt is tried again, how an answer
becomes a value or an exception, and the file a download writes. No I/O on
the network here: `_sync.py` and `_async.py` are the two thin transports.
"""
from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import math
import os
import random
import re
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urljoin

import httpx

from longcall_client.errors import (
    APIConnectionError,
    InternalError,
    InvalidRequest,
    LongcallError,
    Unavailable,
    UnexpectedResponse,
    error_for,
)
from longcall_client.models import DownloadedOutput, Job

VERSION = "0.1.0"
USER_AGENT = f"longcall-client-python/{VERSION}"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_RETRIES = 3
MAX_WAIT_S = 30.0            # the server's cap on `?wait=`
MAX_RETRY_AFTER_S = 60.0     # a server asking for a longer pause gets its error raised instead
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 4.0
REDIRECTS = frozenset({301, 302, 303, 307, 308})
CHUNK = 64 * 1024
_SHA256_ETAG = re.compile(r'^"([0-9a-f]{64})"$')
_TOKEN = re.compile(r"[\x21-\x7e]+")

# "safe": the request may be sent again after any failure, even one where the
# server may have acted (reads; a job or owner create and a grant, whose
# Idempotency-Key makes a resend return the first answer's object, with
# nothing done twice). "unsent": sent again only when it surely never reached
# the server (the connection could not be made): a resent cancel or endpoint
# creation could act twice or answer differently.
Resend = Literal["safe", "unsent"]


@dataclass(frozen=True)
class Config:
    base_url: str
    api_key: str = field(repr=False)
    timeout: float = DEFAULT_TIMEOUT_S
    owner: str | None = None
    max_retries: int = DEFAULT_MAX_RETRIES

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        # Checked here, and said without the value: a key httpx refused later
        # would be quoted whole in its error message.
        if not isinstance(self.api_key, str) or not _TOKEN.fullmatch(self.api_key):
            raise ValueError("api_key must be a non-empty string of printable ASCII without spaces")
        if self.max_retries < 0:
            raise ValueError("max_retries must be 0 or more")


@dataclass(frozen=True)
class Call:
    """One API request, complete: resending it sends exactly the same bytes
    (the same Idempotency-Key included)."""

    method: str
    path: str
    resend: Resend
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    wait_s: float = 0.0  # a long poll: the answer may take this much longer than the usual timeout
    # False for the owners API: it is the platform's own, and the server
    # refuses a Longcall-Owner there, so the client's `owner` is not sent.
    acts_for_owner: bool = True


def _segment(value: str) -> str:
    """A path segment: escaped, so an id can never reach another route (dots
    too: a bare `..` would be resolved away as a dot segment)."""
    return quote(str(value), safe="").replace(".", "%2E")


def _owner_header(owner: str | None) -> dict[str, str]:
    return {"Longcall-Owner": owner} if owner is not None else {}


# ------------------------------------------------------------------ calls

_IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,255}")


def idempotency_key_of(given: str | None) -> str:
    """The key a create or grant sends: `given`, checked here as the API
    checks it (1 to 255 printable ASCII characters once stripped), since
    another key could not even be sent as a header; or a new UUID."""
    if given is None:
        return str(uuid.uuid4())
    key = given.strip()  # as the API strips it; a header cannot carry the spaces anyway
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidRequest("invalid_request", "idempotency_key must be 1 to 255 printable ASCII characters", None)
    return key


def create_job(provider: str, model: str, input: dict[str, Any], max_credits: int, metadata: dict[str, Any] | None,
               idempotency_key: str | None, owner: str | None) -> Call:
    body: dict[str, Any] = {"provider": provider, "model": model, "input": input, "max_credits": max_credits}
    if metadata is not None:
        body["metadata"] = metadata
    # Made once per create, so every resend of this Call carries the same key.
    key = idempotency_key_of(idempotency_key)
    return Call("POST", "/v1/jobs", "safe", body=body, headers={"Idempotency-Key": key, **_owner_header(owner)})


def get_job(job_id: str, wait_s: float | None, owner: str | None) -> Call:
    params = {"wait": _format_seconds(wait_s)} if wait_s else {}
    return Call("GET", f"/v1/jobs/{_segment(job_id)}", "safe", params=params, headers=_owner_header(owner),
                wait_s=wait_s or 0.0)


def list_jobs(status: str | None, limit: int | None, cursor: str | None, owner: str | None) -> Call:
    params = {name: str(value) for name, value in (("status", status), ("limit", limit), ("cursor", cursor))
              if value is not None}
    return Call("GET", "/v1/jobs", "safe", params=params, headers=_owner_header(owner))


def cancel_job(job_id: str, owner: str | None) -> Call:
    return Call("POST", f"/v1/jobs/{_segment(job_id)}/cancel", "unsent", headers=_owner_header(owner))


def job_events(job_id: str, owner: str | None) -> Call:
    return Call("GET", f"/v1/jobs/{_segment(job_id)}/events", "safe", headers=_owner_header(owner))


def job_output(job_id: str, index: int, owner: str | None) -> Call:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError("index must be a whole number, 0 or more")
    return Call("GET", f"/v1/jobs/{_segment(job_id)}/outputs/{index}", "safe", headers=_owner_header(owner))


def get_account(owner: str | None) -> Call:
    return Call("GET", "/v1/account", "safe", headers=_owner_header(owner))


def list_models(owner: str | None) -> Call:
    return Call("GET", "/v1/models", "safe", headers=_owner_header(owner))


def create_endpoint(url: str, events: list[str] | None, owner: str | None) -> Call:
    body: dict[str, Any] = {"url": url}
    if events is not None:
        body["events"] = list(events)
    return Call("POST", "/v1/webhook-endpoints", "unsent", body=body, headers=_owner_header(owner))


def list_endpoints(owner: str | None) -> Call:
    return Call("GET", "/v1/webhook-endpoints", "safe", headers=_owner_header(owner))


def delete_endpoint(endpoint_id: str, owner: str | None) -> Call:
    return Call("DELETE", f"/v1/webhook-endpoints/{_segment(endpoint_id)}", "unsent", headers=_owner_header(owner))


def list_notifications(job_id: str | None, limit: int | None, cursor: str | None, owner: str | None) -> Call:
    params = {name: str(value) for name, value in (("job_id", job_id), ("limit", limit), ("cursor", cursor))
              if value is not None}
    return Call("GET", "/v1/notifications", "safe", params=params, headers=_owner_header(owner))


def redeliver_notification(notification_id: str, owner: str | None) -> Call:
    return Call("POST", f"/v1/notifications/{_segment(notification_id)}/redeliver", "unsent",
                headers=_owner_header(owner))


# A platform's owners (a platform owner's key only). Creates and grants carry
# an Idempotency-Key, generated once per call when not given, so the client's
# own resends make one owner and move the money once.

def create_owner(name: str, credits: int | None, max_active: int | None, idempotency_key: str | None) -> Call:
    body: dict[str, Any] = {"name": name}
    if credits is not None:
        body["credits"] = credits
    if max_active is not None:
        body["max_active"] = max_active
    key = idempotency_key_of(idempotency_key)
    return Call("POST", "/v1/owners", "safe", body=body, headers={"Idempotency-Key": key}, acts_for_owner=False)


def list_owners(limit: int | None, cursor: str | None) -> Call:
    params = {name: str(value) for name, value in (("limit", limit), ("cursor", cursor)) if value is not None}
    return Call("GET", "/v1/owners", "safe", params=params, acts_for_owner=False)


def get_owner(owner_id: str) -> Call:
    return Call("GET", f"/v1/owners/{_segment(owner_id)}", "safe", acts_for_owner=False)


def grant_credits(owner_id: str, credits: int, reason: str | None, idempotency_key: str | None) -> Call:
    body: dict[str, Any] = {"credits": credits}
    if reason is not None:
        body["reason"] = reason
    key = idempotency_key_of(idempotency_key)
    return Call("POST", f"/v1/owners/{_segment(owner_id)}/grants", "safe", body=body,
                headers={"Idempotency-Key": key}, acts_for_owner=False)


# ------------------------------------------------------------ the request

def url_of(config: Config, call: Call) -> str:
    # Appended, not urljoin'ed: a base URL with a path (behind a proxy) keeps it.
    return config.base_url.rstrip("/") + call.path


def headers_of(config: Config, call: Call) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {config.api_key}", "Accept": "application/json", "User-Agent": USER_AGENT}
    if call.body is not None:
        headers["Content-Type"] = "application/json"
    if config.owner is not None and call.acts_for_owner:
        headers["Longcall-Owner"] = config.owner
    headers.update(call.headers)  # a per-call owner overrides the client's
    return headers


def timeout_of(config: Config, call: Call) -> httpx.Timeout:
    return httpx.Timeout(config.timeout, read=config.timeout + call.wait_s)


def build_request(http: httpx.Client | httpx.AsyncClient, config: Config, call: Call) -> httpx.Request:
    return http.build_request(call.method, url_of(config, call), params=call.params or None,
                              headers=headers_of(config, call), timeout=timeout_of(config, call),
                              content=None if call.body is None else encode_json(call.body))


def encode_json(value: Any) -> bytes:
    # allow_nan=False: NaN/Infinity are not JSON; refuse them here, before any request.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def storage_request(http: httpx.Client | httpx.AsyncClient, config: Config, url: str) -> httpx.Request:
    """The GET of a presigned URL: none of our headers, the API key above all."""
    return http.build_request("GET", url, headers={"User-Agent": USER_AGENT}, timeout=httpx.Timeout(config.timeout))


def redirect_target(response: httpx.Response) -> str:
    location = response.headers.get("location")
    if not location:
        raise UnexpectedResponse("unexpected_response", f"HTTP {response.status_code} without a Location",
                                 response.status_code)
    target = str(urljoin(str(response.request.url), location))
    if not target.startswith(("http://", "https://")):
        raise UnexpectedResponse("unexpected_response", "a redirect to a URL that is not http(s)",
                                 response.status_code)
    return target


# ----------------------------------------------------------------- retries

def parse_retry_after(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delay-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or dt.datetime.now(dt.UTC))).total_seconds())


def _backoff(attempt: int) -> float:
    exponential: float = BACKOFF_BASE_S * 2.0**attempt
    return min(BACKOFF_CAP_S, exponential) * random.uniform(0.5, 1.0)


def delay_after_error(call: Call, attempt: int, max_retries: int, error: httpx.TransportError) -> float | None:
    """Seconds to wait before sending `call` again after `error`, or None: give up."""
    if attempt >= max_retries:
        return None
    never_sent = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    if call.resend == "safe" or never_sent:
        return _backoff(attempt)
    return None


def delay_after_status(call: Call, attempt: int, max_retries: int, status: int,
                       headers: Mapping[str, str]) -> float | None:
    """Seconds to wait before sending `call` again after an error answer, or None: raise it.
    A 503 (the database is away; a proxy's overload) and a 429 that says when
    (Retry-After: the owner's slots are full) are worth waiting for; a
    gateway's 502/504 too. Only for calls that are safe to send twice."""
    if attempt >= max_retries or call.resend != "safe":
        return None
    retry_after = parse_retry_after(headers.get("retry-after"))
    if status == 429 and retry_after is None:
        return None
    if status not in (429, 502, 503, 504):
        return None
    if retry_after is None:
        return _backoff(attempt)
    return retry_after if retry_after <= MAX_RETRY_AFTER_S else None


# ----------------------------------------------------------------- answers

def raise_for_answer(status: int, headers: Mapping[str, str], content: bytes) -> None:
    """Nothing for a 2xx; else raises the LongcallError of the answer."""
    if not 200 <= status < 300:
        raise answer_error(status, headers, content)


def answer_error(status: int, headers: Mapping[str, str], content: bytes) -> LongcallError:
    """The LongcallError subclass of an error answer's code."""
    code = message = None
    try:
        error = json.loads(content)["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        pass
    if not isinstance(code, str) or not isinstance(message, str):
        return UnexpectedResponse("unexpected_response", f"HTTP {status} without an API error body", status)
    return error_for(code, message, status, retry_after=parse_retry_after(headers.get("retry-after")))


def decode_answer(status: int, headers: Mapping[str, str], content: bytes) -> Any:
    """The JSON of a successful answer, or the error it is."""
    raise_for_answer(status, headers, content)
    if status == 204 or not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        raise UnexpectedResponse("unexpected_response", f"HTTP {status} with a body that is not JSON",
                                 status) from None


def connection_error(error: httpx.TransportError) -> APIConnectionError:
    # httpx's messages name the failure ("Connection refused", "Server
    # disconnected"). The one that can quote a header value (an illegal one)
    # cannot happen with the key: Config refused such a key at the start.
    detail = str(error).splitlines()[0][:200] if str(error) else ""
    message = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    return APIConnectionError("connection_error", message, None)


def with_key(error: LongcallError, call: Call) -> LongcallError:
    """`error`, holding the Idempotency-Key its call sent (None: it sent none)."""
    error.idempotency_key = call.headers.get("Idempotency-Key")
    return error


def storage_failure(status: int) -> LongcallError:
    return UnexpectedResponse("unexpected_response", f"the output's storage answered HTTP {status}", status)


# --------------------------------------------------------------------- wait

WAIT_PAUSE_S = 1.0  # between the polls of a wait the server or the network failed


def after_failed_poll(error: LongcallError, remaining: float, seen: Job | None) -> float | Job:
    """What a wait does after a poll that raised `error`, with `remaining`
    seconds left and `seen` the last job a poll returned: pause that many
    seconds and poll again, return that job, or raise `error`. A wait polls
    on through no answer or a server (or a proxy) in trouble — a 5xx, a 429,
    an answer that is not the API's — pausing as the server asked
    (Retry-After), else WAIT_PAUSE_S, never past its end; at its end it
    returns the last job seen (raising only when no poll answered). An
    answer about the job or the request (a 401, a 404) ends it at once."""
    outage = isinstance(error, APIConnectionError | Unavailable | InternalError | UnexpectedResponse) \
        or error.status == 429
    if not outage or (remaining <= 0 and seen is None):
        raise error
    if remaining <= 0 and seen is not None:
        return seen
    asked = error.retry_after if error.retry_after is not None and error.retry_after > 0 else WAIT_PAUSE_S
    return min(asked, remaining)


def poll_seconds(remaining: float) -> float:
    """The `?wait=` of the next long poll with `remaining` seconds left (0: read at once)."""
    if remaining <= 0:
        return 0.0
    if remaining >= MAX_WAIT_S:  # math.inf included (floor would raise)
        return MAX_WAIT_S
    return math.floor(remaining * 1000) / 1000


def _format_seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


# ------------------------------------------------------------------- files

class PartFile:
    """A download in progress: written beside `path` under a temporary name,
    hashed as it goes, moved into place only once complete and checked; a
    failed download leaves nothing behind."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, self.part = tempfile.mkstemp(prefix=".longcall-", suffix=".part", dir=directory)
        self.file = os.fdopen(fd, "wb")
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.hash.update(chunk)
        self.size += len(chunk)

    def finish(self, headers: Mapping[str, str]) -> DownloadedOutput:
        """Check what arrived against what the answer announced, then move it into place."""
        self.file.close()
        sha256 = self.hash.hexdigest()
        length = headers.get("content-length")
        encoded = headers.get("content-encoding", "identity").lower() != "identity"  # then the length is another's
        if length is not None and length.isdigit() and not encoded and int(length) != self.size:
            raise UnexpectedResponse("unexpected_response",
                                     f"the output ended after {self.size} of {length} bytes", None)
        etag = _SHA256_ETAG.match(headers.get("etag", ""))  # longcall's own ETag is the sha256
        if etag and etag.group(1) != sha256:
            raise UnexpectedResponse("unexpected_response", "the output's bytes do not match its sha256", None)
        os.replace(self.part, self.path)
        return DownloadedOutput(path=self.path, bytes=self.size, sha256=sha256,
                                content_type=headers.get("content-type"))

    def abort(self) -> None:
        self.file.close()
        try:
            os.unlink(self.part)
        except FileNotFoundError:
            pass
