"""Sending a notification to an owner's endpoint (CONTRACT.md: Notifications
to the client): the URL rule, the Standard Webhooks signature, the retry
schedule, and the one guarded POST.

Endpoint URLs come from owners and are untrusted like output URLs: an owner
could aim our server at its own metadata service or a database on the
private network. So an endpoint is https, and every address it resolves to
must be public — checked when it is registered (as far as that can be told
without DNS, plus DNS when it answers) and again, after DNS, at every
delivery, which then connects to that very address (app/download.py's
pinning) so the answer cannot change between the check and the connect.
Redirects are never followed: a 3xx is a failed attempt. The only way past
these rules is an exact origin in NOTIFY_ALLOWED_ORIGINS (development,
tests), which may also be plain http.

Messages never quote an endpoint's path or query (they may carry tokens).
"""
from __future__ import annotations

import asyncio
import base64
import ipaddress
import random
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from app.download import (
    DownloadError,
    DownloadPolicy,
    Refused,
    Resolver,
    describe,
    is_public_address,
    pinned_request,
    resolve_allowed,
    system_resolver,
)
from app.download import check_url as check_download_url
from app.download import origin as origin_of_url
from app.http_transport import AiohttpTransport, outbound_client
from app.signing.webhooks import sign_standard_webhooks

SEND_TIMEOUT_S = 15.0  # no answer within this: a failed attempt
RETRY_FOR_S = 24 * 3600.0  # from the notification's creation (or its redelivery)
# The last attempt is due at the 24 h mark itself, so it runs a little after
# it (the settler's poll, a busy queue); an attempt later than this was held
# up (settlers down for a day) and is recorded failed without a request.
LAST_ATTEMPT_LATE_S = 300.0
MAX_URL_CHARS = 2048
SECRET_BYTES = 24


class EndpointRefused(Exception):
    """The URL breaks the endpoint rule: nothing is (or was) sent."""


class SendFailed(Exception):
    """No answer: the connection failed, timed out, or DNS did not answer."""


def new_secret() -> str:
    """`whsec_` and the base64 of 24 random bytes (Standard Webhooks' form)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _policy(allowed_origins: frozenset[str]) -> DownloadPolicy:
    # Any https host; plain http only for an allowed origin (download's parse rules).
    return DownloadPolicy(allowed_hosts=(), plain_http_origins=allowed_origins, max_bytes=0, any_host=True)


def check_endpoint_url(url: str, allowed_origins: frozenset[str]) -> httpx.URL:
    """The URL, parsed, when an endpoint may use it; EndpointRefused with a
    clear reason otherwise. Pure: the names it cannot judge without DNS are
    judged when delivering (and by `check_resolved` at registration)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise EndpointRefused(f"url must be an https URL of at most {MAX_URL_CHARS} characters")
    try:
        check_download_url(url, _policy(allowed_origins))
        parsed = httpx.URL(url)
    except Refused as e:
        raise EndpointRefused(f"url {e}") from None
    except Exception:
        raise EndpointRefused("url is not a valid URL") from None
    if parsed.fragment:
        raise EndpointRefused("url must not have a #fragment")
    if origin_of_url(parsed) in allowed_origins:
        return parsed
    host = parsed.host.lower()
    if host == "localhost" or host.endswith(".localhost"):
        raise EndpointRefused("url names a loopback host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # No domain's last label is a number: `2130706433`, `0x7f.0.0.1` or
        # `127.1` are addresses some resolvers read as 127.0.0.1.
        last = host.rstrip(".").rsplit(".", 1)[-1]
        if last.isdigit() or last.startswith("0x"):
            raise EndpointRefused("url names a host in a numeric form that is not a plain address") from None
        return parsed
    if not is_public_address(ip):
        raise EndpointRefused(f"url is at a non-public address ({ip})")
    return parsed


async def resolve_checked(url: httpx.URL, allowed_origins: frozenset[str], resolve: Resolver) -> list[str]:
    """The addresses to connect to: every answer must be public, unless the
    origin is allowed. EndpointRefused if any is not; SendFailed when DNS
    does not answer."""
    allowed = origin_of_url(url) in allowed_origins
    try:
        return await resolve_allowed(url, resolve, SEND_TIMEOUT_S, lambda ip: allowed or is_public_address(ip))
    except Refused as e:
        raise EndpointRefused(str(e).removeprefix("refused: ")) from None
    except DownloadError as e:
        raise SendFailed(str(e)) from None


async def check_resolved(url: httpx.URL, allowed_origins: frozenset[str], resolve: Resolver) -> None:
    """At registration: refuse a name that resolves to a non-public address
    now. A name that does not resolve yet is not refused (it is checked
    again at every delivery)."""
    try:
        await resolve_checked(url, allowed_origins, resolve)
    except SendFailed:
        pass


def signed_headers(secret: str, notification_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Standard Webhooks' three headers (the id is the same on every retry)."""
    return {"webhook-id": notification_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign_standard_webhooks(secret, notification_id, timestamp, body),
            "content-type": "application/json"}


def next_attempt_in(attempts: int, schedule: tuple[float, ...], elapsed_s: float,
                    rng: random.Random | None = None) -> float | None:
    """Seconds until the next attempt after `attempts` failed ones, the
    delivery's retries having run for `elapsed_s`; None: give up (its 24 h
    are over). The schedule's last gap repeats; each gap is drawn from
    [80%, 100%] of itself so deliveries that failed together (an endpoint
    down) do not all come back at once. A gap that would end past
    RETRY_FOR_S is cut to end at it: the last attempt is made at the 24 h
    mark, and failed is recorded only after it. Pure."""
    if attempts < 1:
        return 0.0
    if elapsed_s >= RETRY_FOR_S:
        return None
    gap = schedule[min(attempts, len(schedule)) - 1]
    delay = gap * (0.8 + 0.2 * (rng or random).random())
    return min(delay, RETRY_FOR_S - elapsed_s)


def is_held_past_retries(elapsed_s: float) -> bool:
    """An attempt this late after the notification (or its redelivery) is
    not made: its retries are over. Pure."""
    return elapsed_s > RETRY_FOR_S + LAST_ATTEMPT_LATE_S


def is_delivered(status_code: int) -> bool:
    return 200 <= status_code < 300


@dataclass
class Sender:
    """Sends deliveries; one per settler process. `resolve` and `transport`
    exist for tests (a fake DNS answer, a connect guard)."""

    allowed_origins: frozenset[str]
    resolve: Resolver = system_resolver
    transport: httpx.AsyncBaseTransport | None = None
    verify: ssl.SSLContext | bool = True

    def __post_init__(self) -> None:
        timeout = httpx.Timeout(SEND_TIMEOUT_S)
        self._client = outbound_client(self.transport or AiohttpTransport(verify=self.verify), timeout)

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        """POST once; the answer's status code. EndpointRefused when the URL
        (or what it resolves to now) breaks the rule, SendFailed when there
        was no answer within SEND_TIMEOUT_S."""
        parsed = check_endpoint_url(url, self.allowed_origins)
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                addresses = await resolve_checked(parsed, self.allowed_origins, self.resolve)
                return await self._post(parsed, addresses, body, headers)
        except TimeoutError:
            raise SendFailed(f"no answer from {describe(parsed)} within {SEND_TIMEOUT_S:g} s") from None

    async def _post(self, url: httpx.URL, addresses: list[str], body: bytes, headers: Mapping[str, str]) -> int:
        for ip in addresses:
            request = pinned_request(self._client, url, ip, method="POST", content=body, headers=headers)
            try:
                response = await self._client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                continue  # the next address of the same checked answer
            except httpx.HTTPError as exc:
                raise SendFailed(f"request to {describe(url)} failed ({type(exc).__name__})") from None
            await response.aclose()  # the body is not ours to read
            return response.status_code
        raise SendFailed(f"could not connect to {describe(url)}")

    async def aclose(self) -> None:
        await self._client.aclose()
