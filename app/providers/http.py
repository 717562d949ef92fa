"""HTTP plumbing shared by the adapters: httpx clients with explicit
timeouts, and the mapping of every way an HTTP call can fail onto
Rejected / Transient / Uncertain.

Two kinds of call fail differently:
- a *submit* may create a paid task, so anything that happened after the
  request could have reached the provider is Uncertain;
- a *read* (status, cancel, list, fetch a key) is safe to repeat, so any
  failure is Transient, except an explicit "no such task".

Messages never carry a secret: httpx's own exception text is not used (it
can name URLs), URLs in provider text lose their query strings, and the
adapter's known secrets are masked.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.http_transport import AsyncioTransport
from app.providers.base import ProviderError, Rejected, Transient, Uncertain

_MAX_DETAIL = 200
_URL_QUERY_RE = re.compile(r"(https?://[^\s?#\"'<>]+)[?#][^\s\"'<>]*")
# Longest Retry-After we honour; a provider asking for more is clamped.
_MAX_RETRY_AFTER_S = 3600.0


def make_client(timeout_s: float, *, keepalive: bool = True) -> httpx.AsyncClient:
    """An httpx client with every timeout explicit: `timeout_s` bounds each
    phase (read, write, pool), connecting gets at most 10 s of it."""
    limits = httpx.Limits() if keepalive else httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=min(timeout_s, 10.0), read=timeout_s, write=timeout_s, pool=timeout_s),
        transport=AsyncioTransport(limits=limits),
        follow_redirects=False,
        # Providers are reached directly; never through an ambient proxy.
        trust_env=False,
    )


class Clients:
    """An adapter's two HTTP clients. Submits use a fresh connection each
    time: a pooled connection the server closed while idle fails only once
    the request is written, which would look like an Uncertain submit; a
    fresh one fails at connect, before anything is sent (Transient).
    A client passed in is used for both and left open."""

    def __init__(self, timeout_s: float, client: httpx.AsyncClient | None = None, *,
                 idempotent_submit: bool = False):
        self._owned = client is None
        self.reads = client or make_client(timeout_s)
        # An idempotent submit may safely be sent again, so a spurious
        # Uncertain costs nothing: it shares the pooled connections.
        self.submits = client or (self.reads if idempotent_submit else make_client(timeout_s, keepalive=False))

    async def aclose(self) -> None:
        if self._owned:
            await self.reads.aclose()
            if self.submits is not self.reads:
                await self.submits.aclose()


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Provider text made safe for logs: query strings of URLs removed,
    known secrets masked, whitespace folded, length bounded."""
    text = _URL_QUERY_RE.sub(r"\1?…", text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = " ".join(text.split())
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 1] + "…"
    return text


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """The Retry-After header in seconds (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(seconds, _MAX_RETRY_AFTER_S))


def error_detail(response: httpx.Response, secrets: Iterable[str | None] = ()) -> str:
    """The provider's own short reason from an error response, scrubbed."""
    text = ""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    if isinstance(body, Mapping):
        for key in ("detail", "msg", "message", "error", "title"):
            value = body.get(key)
            if value:
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                break
    elif isinstance(body, (str, list)) and body:
        text = body if isinstance(body, str) else json.dumps(body, default=str)
    if not text and not isinstance(body, (Mapping, list)):
        try:
            raw = response.text
        except Exception:
            raw = ""
        # An HTML error page says nothing useful.
        if raw and not raw.lstrip().startswith("<"):
            text = raw
    return scrub(text, secrets)


def _with_detail(prefix: str, detail: str) -> str:
    return f"{prefix}: {detail}" if detail else prefix


async def submit_call(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    secrets: Iterable[str | None] = (),
    **kwargs: Any,
) -> httpx.Response:
    """Send a request that may create a task. Returns a 2xx response;
    otherwise raises the error class that says whether a task may exist."""
    secrets = tuple(secrets)
    try:
        response = await client.request(method, url, **kwargs)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol) as exc:
        # The connection never opened (or no pooled connection was free):
        # the request was not sent, so nothing was created.
        raise Transient(f"{provider}: could not connect ({type(exc).__name__})") from None
    except httpx.TimeoutException as exc:
        raise Uncertain(f"{provider}: no answer to submit in time ({type(exc).__name__})") from None
    except httpx.TransportError as exc:
        # Dropped after (part of) the request went out: it may have landed.
        raise Uncertain(f"{provider}: connection lost during submit ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        raise Uncertain(f"{provider}: submit failed ({type(exc).__name__})") from None
    status = response.status_code
    if 200 <= status < 300:
        return response
    detail = error_detail(response, secrets)
    if status == 429:
        raise Transient(
            _with_detail(f"{provider}: rate limited (HTTP 429)", detail),
            retry_after=retry_after_seconds(response.headers.get("retry-after")),
        )
    if status == 408:
        # The server gave up waiting for our request before it was whole.
        raise Transient(_with_detail(f"{provider}: request timeout (HTTP 408)", detail))
    if 400 <= status < 500:
        raise Rejected(_with_detail(f"{provider}: submit rejected (HTTP {status})", detail))
    raise Uncertain(_with_detail(f"{provider}: submit answered HTTP {status}", detail))


async def read_call(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    secrets: Iterable[str | None] = (),
    not_found: str | None = "no such task",
    pass_statuses: Iterable[int] = (),
    **kwargs: Any,
) -> httpx.Response:
    """Send a request that is safe to repeat. Returns a 2xx response (or one
    whose status is in `pass_statuses`, for the caller to read); a 404 is
    Rejected(`not_found`) when `not_found` is set; anything else Transient."""
    secrets = tuple(secrets)
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise Transient(f"{provider}: request failed ({type(exc).__name__})") from None
    status = response.status_code
    if 200 <= status < 300 or status in pass_statuses:
        return response
    detail = error_detail(response, secrets)
    if status == 404 and not_found:
        raise Rejected(_with_detail(f"{provider}: {not_found} (HTTP 404)", detail))
    retry_after = None
    if status in (429, 503):
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
    raise Transient(_with_detail(f"{provider}: HTTP {status}", detail), retry_after=retry_after)


def json_body(response: httpx.Response, provider: str, error: type[ProviderError]) -> Any:
    """The parsed JSON of a response, or `error` (Uncertain after a submit,
    Transient after a read) when it is not JSON."""
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        raise error(f"{provider}: answer was not JSON (HTTP {response.status_code})") from None


def json_object(response: httpx.Response, provider: str, error: type[ProviderError]) -> dict:
    body = json_body(response, provider, error)
    if not isinstance(body, dict):
        raise error(f"{provider}: answer was not a JSON object (HTTP {response.status_code})")
    return body


def host_of(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def same_origin(url: Any, base_url: str) -> bool:
    """True when `url` is an absolute URL on exactly the origin of `base_url`
    (scheme, host and port)."""
    if not isinstance(url, str):
        return False
    try:
        a, b = urlsplit(url), urlsplit(base_url)
        a_port = a.port or (443 if a.scheme == "https" else 80)
        b_port = b.port or (443 if b.scheme == "https" else 80)
    except ValueError:
        return False
    return (
        a.scheme in ("http", "https")
        and a.scheme == b.scheme
        and (a.hostname or "").lower() == (b.hostname or "").lower()
        and a_port == b_port
        and not a.username
        and not a.password
    )


def collect_urls(value: Any, *, only_url_keys: bool = False, limit: int = 100) -> tuple[str, ...]:
    """Every http(s) URL string in a JSON value, depth first, in order,
    without duplicates. With `only_url_keys`, only strings under a key named
    "url" count (fal's `images[].url`, `video.url`)."""
    found: list[str] = []

    def is_url(s: Any) -> bool:
        return isinstance(s, str) and s.startswith(("https://", "http://")) and len(s) <= 8192

    def walk(node: Any, key: str | None, depth: int) -> None:
        if len(found) >= limit or depth > 32:
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, k if isinstance(k, str) else None, depth + 1)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item, key, depth + 1)
        elif is_url(node) and (not only_url_keys or key == "url") and node not in found:
            found.append(node)

    walk(value, None, 0)
    return tuple(found)


def reason_text(value: Any, secrets: Iterable[str | None] = ()) -> str | None:
    """A provider's failure reason (a string, or an object/list) as one
    short scrubbed line; None when there is none."""
    if value is None or value == "" or value == [] or value == {}:
        return None
    if isinstance(value, Mapping):
        for key in ("message", "msg", "detail", "error"):
            inner = value.get(key)
            if isinstance(inner, str) and inner:
                return scrub(inner, secrets)
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        # FastAPI/pydantic style: [{"loc": [...], "msg": "..."}]
        msgs = [str(v.get("msg")) for v in value if v.get("msg")]
        if msgs:
            return scrub("; ".join(msgs), secrets)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return scrub(text, secrets) or None
