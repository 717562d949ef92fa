"""HTTP plumbing shared by the adapters: httpx clients with explicit
timeouts, and the mapping of every way an HTTP call can fail onto
Rejected / Transient / Uncertain.

Two kinds of call fail differently:
- a *submit* may create a paid task, so anything that happened after the
  request could have reached the provider is Uncertain;
- a *read* (status, cancel, list, fetch a key) is safe to repeat, so any
  failure is Transient, except an explicit "no such task".

Messages never carry a secret: httpx's own exception text is not used (it
can name URLs), and provider text reaches a message only through the
adapter's `Secrets` (URLs lose their query strings, known secrets are
masked).
"""
from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import httpx

from app.http_transport import AiohttpTransport, outbound_client
from app.origins import host_of as host_of  # re-exported: the adapters import both from here
from app.origins import same_origin as same_origin
from app.providers.base import (
    MAX_TASK_ID_CHARS,
    Observation,
    ProviderError,
    Rejected,
    TaskState,
    Transient,
    Uncertain,
    claimed_id,
)

_MAX_DETAIL = 200
_MIN_SECRET_LEN = 4
_URL_QUERY_RE = re.compile(r"(https?://[^\s?#\"'<>]+)[?#][^\s\"'<>]*")
# Longest Retry-After we honour; a provider asking for more is clamped.
_MAX_RETRY_AFTER_S = 3600.0


def make_client(timeout_s: float, *, keepalive: bool = True) -> httpx.AsyncClient:
    """An httpx client with every timeout explicit: `timeout_s` bounds each
    phase (read, write, pool), connecting gets at most 10 s of it."""
    limits = httpx.Limits() if keepalive else httpx.Limits(max_keepalive_connections=0)
    return outbound_client(
        AiohttpTransport(limits=limits),
        httpx.Timeout(connect=min(timeout_s, 10.0), read=timeout_s, write=timeout_s, pool=timeout_s))


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


class Secrets:
    """What one adapter must never repeat: its API token, a webhook secret, a
    capability token it put in a callback URL.

    Words from a provider's answer become our text (an exception message,
    an Observation's error: the job's error column, the API response, logs)
    only through `mask`, `reason` or `detail` of the adapter's Secrets, and
    an Observation with an error only through `ended`. A provider that
    echoes our `Authorization` header thus cannot put the token anywhere:
    masking the token masks its `Bearer …` and `Key …` forms, and its
    URL-encoded and JSON-escaped forms are masked too. Values shorter than
    four characters are not masked (they would garble every message).
    """

    __slots__ = ("_values", "_forms")

    def __init__(self, *values: str | None):
        self._values = tuple(v for v in values if v and len(v) >= _MIN_SECRET_LEN)
        forms = {form for v in self._values for form in (v, quote(v, safe=""), json.dumps(v)[1:-1])}
        # Longest first: a secret that contains another is masked whole.
        self._forms = tuple(sorted(forms, key=len, reverse=True))

    def __repr__(self) -> str:
        return f"<Secrets {len(self._values)}>"

    def plus(self, *values: str | None) -> Secrets:
        return Secrets(*self._values, *values)

    def plus_callback(self, callback_url: str | None) -> Secrets:
        """These and the query values of a callback URL we hand the
        provider (our capability token): a provider may echo the URL in a
        form (URL-encoded inside its own query, say) that no longer looks
        like a URL, so the token itself is masked."""
        if not callback_url:
            return self
        return self.plus(*(value for _, value in parse_qsl(urlsplit(callback_url).query)))

    def _scrubbed(self, value: Any) -> Any:
        """A JSON value with the secrets masked in each of its strings, so
        that writing it as JSON text (which escapes each string once more)
        cannot carry a form of one that is no longer masked."""
        if isinstance(value, str):
            for form in self._forms:
                value = value.replace(form, "[redacted]")
            return value
        if isinstance(value, Mapping):
            return {self._scrubbed(k) if isinstance(k, str) else k: self._scrubbed(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._scrubbed(v) for v in value]
        return value

    def _json_text(self, value: Any) -> str:
        return json.dumps(self._scrubbed(value), default=str)

    def mask(self, text: str, limit: int = _MAX_DETAIL) -> str:
        """Provider text made safe to show: query strings of URLs removed,
        secrets masked, whitespace folded, at most `limit` characters (cut
        after masking, so no part of a secret survives the cut)."""
        text = _URL_QUERY_RE.sub(r"\1?…", text)
        for form in self._forms:
            text = text.replace(form, "[redacted]")
        text = " ".join(text.split())
        if len(text) > limit:
            text = text[: limit - 1] + "…"
        return text

    def clean_id(self, value: object) -> str | None:
        """A provider's id for something (a sync call's request id) as we
        keep it: `value` when it can be an id (base.claimed_id) and holds
        none of these secrets in any form; else None."""
        kept = claimed_id(value)
        return kept if kept is not None and self.mask(kept, limit=MAX_TASK_ID_CHARS) == kept else None

    def reason(self, value: Any) -> str | None:
        """A provider's failure reason (a string, or an object/list) as one
        short masked line; None when there is none."""
        if value is None or value == "" or value == [] or value == {}:
            return None
        if isinstance(value, Mapping):
            for key in ("message", "msg", "detail", "error"):
                inner = value.get(key)
                if isinstance(inner, str) and inner:
                    return self.mask(inner)
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            # FastAPI/pydantic style: [{"loc": [...], "msg": "..."}]
            msgs = [str(v.get("msg")) for v in value if v.get("msg")]
            if msgs:
                return self.mask("; ".join(msgs))
        text = value if isinstance(value, str) else self._json_text(value)
        return self.mask(text) or None

    def detail(self, response: httpx.Response) -> str:
        """The provider's own short reason from an error response, masked."""
        text = ""
        try:
            body = response.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        if isinstance(body, Mapping):
            for key in ("detail", "msg", "message", "error", "title"):
                value = body.get(key)
                if value:
                    text = value if isinstance(value, str) else self._json_text(value)
                    break
        elif isinstance(body, (str, list)) and body:
            text = body if isinstance(body, str) else self._json_text(body)
        if not text and not isinstance(body, (Mapping, list)):
            try:
                raw = response.text
            except Exception:
                raw = ""
            # An HTML error page says nothing useful.
            if raw and not raw.lstrip().startswith("<"):
                text = raw
        return self.mask(text)


NO_SECRETS = Secrets()  # for an adapter that holds none (the simulator's native protocol)


def ended(state: TaskState, secrets: Secrets, *reasons: Any, fallback: str | None = None) -> Observation:
    """A task that ended without output (FAILED, CANCELLED), its error the
    first of `reasons` that says something, masked; else `fallback`. The
    one way adapters build an Observation that carries an error."""
    for reason in reasons:
        text = secrets.reason(reason)
        if text:
            return Observation(state=state, error=text)
    return Observation(state=state, error=fallback)


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


def _with_detail(prefix: str, detail: str) -> str:
    return f"{prefix}: {detail}" if detail else prefix


async def submit_call(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    secrets: Secrets,
    ask_again: Callable[[httpx.Response], bool] | None = None,
    retry_hint: Callable[[httpx.Response], float | None] | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """Send a request that may create a task. Returns a 2xx response;
    otherwise raises the error class that says whether a task may exist.
    `ask_again`: error answers the provider's own client sends the request
    again on, this one having made nothing (Transient). `retry_hint`: a 429's
    wait read from its body when it has no Retry-After."""
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
    detail = secrets.detail(response)
    if status == 429:
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        if retry_after is None and retry_hint is not None:
            retry_after = retry_hint(response)
        raise Transient(_with_detail(f"{provider}: rate limited (HTTP 429)", detail), retry_after=retry_after)
    if status == 408:
        # The server gave up waiting for our request before it was whole.
        raise Transient(_with_detail(f"{provider}: request timeout (HTTP 408)", detail))
    if ask_again is not None and ask_again(response):
        raise Transient(_with_detail(f"{provider}: not now (HTTP {status})", detail))
    if 400 <= status < 500:
        raise Rejected(_with_detail(f"{provider}: submit rejected (HTTP {status})", detail))
    raise Uncertain(_with_detail(f"{provider}: submit answered HTTP {status}", detail))


async def read_call(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    secrets: Secrets,
    not_found: str | None = "no such task",
    pass_statuses: Iterable[int] = (),
    **kwargs: Any,
) -> httpx.Response:
    """Send a request that is safe to repeat. Returns a 2xx response (or one
    whose status is in `pass_statuses`, for the caller to read); a 404 is
    Rejected(`not_found`) when `not_found` is set; anything else Transient."""
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise Transient(f"{provider}: request failed ({type(exc).__name__})") from None
    status = response.status_code
    if 200 <= status < 300 or status in pass_statuses:
        return response
    raise read_failure(response, provider, secrets=secrets, not_found=not_found)


def read_failure(response: httpx.Response, provider: str, *, secrets: Secrets,
                 not_found: str | None = "no such task",
                 retry_hint: Callable[[httpx.Response], float | None] | None = None) -> ProviderError:
    """What a read answered with an error means (pure, on a read body): a
    404 is Rejected(`not_found`) when `not_found` is set; anything else is a
    read that did not work (Transient, with the provider's Retry-After on a
    429 or 503 — or, without one, what `retry_hint` reads in the body)."""
    status = response.status_code
    detail = secrets.detail(response)
    if status == 404 and not_found:
        return Rejected(_with_detail(f"{provider}: {not_found} (HTTP 404)", detail))
    retry_after = None
    if status in (429, 503):
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        if retry_after is None and retry_hint is not None:
            retry_after = retry_hint(response)
    return Transient(_with_detail(f"{provider}: HTTP {status}", detail), retry_after=retry_after)


# An error answer read for its message: this much of it at most.
MAX_ERROR_BODY = 64 * 1024


async def read_error_body(response: httpx.Response) -> httpx.Response:
    """At most MAX_ERROR_BODY bytes of an open error answer, as a small
    response to read its reason from (with only the headers that reading
    needs: the body is already decoded). httpx.HTTPError while reading is
    the caller's to map."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= MAX_ERROR_BODY:
            break
    headers = {k: response.headers[k] for k in ("content-type", "retry-after") if k in response.headers}
    return httpx.Response(response.status_code, headers=headers, content=bytes(body[:MAX_ERROR_BODY]))


@contextlib.asynccontextmanager
async def streamed_read(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    secrets: Secrets,
    not_found: str | None = "no such task",
    retry_hint: Callable[[httpx.Response], float | None] | None = None,
    **kwargs: Any,
) -> AsyncIterator[httpx.Response]:
    """A read whose 2xx answer is left open for the caller to stream (a
    status answer that can carry whole files: app/providers/inline.py),
    closed on leaving. An error answer is read (at most MAX_ERROR_BODY
    bytes) and classified as read_call classifies it; a connection that
    fails is Transient."""
    try:
        response = await client.send(client.build_request(method, url, **kwargs), stream=True)
    except httpx.HTTPError as exc:
        raise Transient(f"{provider}: request failed ({type(exc).__name__})") from None
    try:
        if not 200 <= response.status_code < 300:
            try:
                read = await read_error_body(response)
            except httpx.HTTPError as exc:
                raise Transient(f"{provider}: request failed ({type(exc).__name__})") from None
            raise read_failure(read, provider, secrets=secrets, not_found=not_found, retry_hint=retry_hint)
        yield response
    finally:
        await response.aclose()


# Answered before any byte of the body, these say "not now" (rate limit,
# Anthropic's 529 overloaded, unavailable): a sync call asks again after
# their retry-after (CONTRACT.md: Sync calls).
SYNC_RETRY_STATUSES = (429, 503, 529)


def call_timeout(timeout_s: float) -> httpx.Timeout:
    """A sync call's httpx timeout: the answer may take the whole call's
    timeout to start (an LLM thinking), connecting at most 10 s of it."""
    return httpx.Timeout(connect=min(timeout_s, 10.0), read=timeout_s, write=timeout_s, pool=timeout_s)


@contextlib.asynccontextmanager
async def sync_call(
    client: httpx.AsyncClient,
    provider: str,
    method: str,
    url: str,
    *,
    secrets: Secrets,
    timeout_s: float,
    **kwargs: Any,
) -> AsyncIterator[httpx.Response]:
    """Send a sync call (paid, and no provider has an idempotency key for
    it) and yield its 2xx answer, open for the caller to stream; closed on
    leaving. What a failure means:
    - the connection never opened: Transient (nothing was sent);
    - 429, 503 or 529 (before any body byte, by definition): Transient with
      the provider's retry-after; 408 likewise (our request never arrived whole);
    - any other 4xx: Rejected (the provider did nothing it bills);
    - any other status, a timeout, a reset: Uncertain (the call is lost).
    Reading the body is the caller's: `answer_error` maps its failures."""
    request = client.build_request(method, url, timeout=call_timeout(timeout_s), **kwargs)
    try:
        response = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol) as exc:
        raise Transient(f"{provider}: could not connect ({type(exc).__name__})") from None
    except httpx.TimeoutException as exc:
        raise Uncertain(f"{provider}: no answer to the call in time ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        raise Uncertain(f"{provider}: connection lost during the call ({type(exc).__name__})") from None
    try:
        status = response.status_code
        if not 200 <= status < 300:
            try:
                read = await read_error_body(response)
            except httpx.HTTPError:  # the status says what happened; the message is a courtesy
                read = httpx.Response(status, headers={k: response.headers[k] for k in ("retry-after",)
                                                       if k in response.headers})
            raise call_failure(read, provider, secrets=secrets)
        yield response
    finally:
        await response.aclose()


def sync_retry_after(headers: Mapping[str, str]) -> float | None:
    """A sync call's wait: `retry-after-ms` first, then `Retry-After`, as the
    official anthropic and openai clients read them (`_parse_retry_after_header`)."""
    try:
        ms = float(headers.get("retry-after-ms") or "nan")
    except ValueError:
        ms = math.nan
    if math.isfinite(ms):
        return max(0.0, min(ms / 1000, _MAX_RETRY_AFTER_S))
    return retry_after_seconds(headers.get("retry-after"))


def call_failure(response: httpx.Response, provider: str, *, secrets: Secrets) -> ProviderError:
    """What a sync call answered with an error status means (pure, on a read body)."""
    status = response.status_code
    detail = secrets.detail(response)
    if status in SYNC_RETRY_STATUSES:
        return Transient(_with_detail(f"{provider}: not now (HTTP {status})", detail),
                         retry_after=sync_retry_after(response.headers))
    if status == 408:
        return Transient(_with_detail(f"{provider}: request timeout (HTTP 408)", detail))
    if 400 <= status < 500:
        return Rejected(_with_detail(f"{provider}: call rejected (HTTP {status})", detail))
    return Uncertain(_with_detail(f"{provider}: call answered HTTP {status}", detail))


def answer_error(provider: str, exc: BaseException) -> Uncertain:
    """A sync answer that broke while it was read (a reset, a timeout
    between bytes): the call is lost."""
    return Uncertain(f"{provider}: the answer broke off ({type(exc).__name__})")


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


def collect_urls(value: Any, *, only_url_keys: bool = False, limit: int = 100) -> tuple[str, ...]:
    """Every http(s) URL string in a JSON value, depth first, in order,
    without duplicates. With `only_url_keys`, only strings under a key named
    "url" count (fal's `images[].url`, `video.url`)."""
    found: list[str] = []

    def is_url(s: Any) -> bool:
        # No URL holds a space or a control character: a model's text that
        # starts with one ("https://example.com is ...") is text.
        return isinstance(s, str) and s.startswith(("https://", "http://")) and len(s) <= 8192 \
            and not any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in s)

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
