"""app/delivery.py: the endpoint URL rule, the retry schedule, the signature
and the secret's form (pure), then the guarded Sender against servers on
loopback.

Every Sender here is built on GuardedTransport, whose connect step refuses
(and fails the test) for any address but 127.0.0.1: whatever a regression
lets through, no packet leaves this machine. The names resolved are fake
answers of the test's own resolver, never a DNS query."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import random
import time

import httpx
import pytest
import standardwebhooks
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.delivery import (
    LAST_ATTEMPT_LATE_S,
    MAX_URL_CHARS,
    RETRY_FOR_S,
    SEND_TIMEOUT_S,
    EndpointRefused,
    Sender,
    SendFailed,
    check_endpoint_url,
    check_resolved,
    is_held_past_retries,
    new_secret,
    next_attempt_in,
    signed_headers,
)
from app.download import system_resolver
from app.http_transport import AiohttpTransport
from tests.support.loopback import LoopbackServer
from tests.support.receiver import Receiver, RunningReceiver

ALLOWED = frozenset({"http://127.0.0.1:9000"})
SCHEDULE = (5.0, 30.0, 120.0)


# --- check_endpoint_url ------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "https://hooks.example.com/longcall",
    "https://hooks.example.com:8443/in?team=7",
    "https://8.8.8.8/hook",
    "https://[2001:4860:4860::8888]/hook",
    "http://127.0.0.1:9000/hook",  # the allowed origin: loopback and plain http are fine
])
def test_accepted_urls(url):
    assert str(check_endpoint_url(url, ALLOWED)) == url


@pytest.mark.parametrize("url", [
    "http://hooks.example.com/hook",  # plain http to a host whose origin is not allowed
    "https://127.0.0.1/hook",
    "https://[::1]/hook",
    "https://localhost/hook",
    "https://LocalHost/hook",
    "https://x.localhost/hook",
    "https://10.0.0.1/hook",
    "https://172.16.0.1/hook",
    "https://172.31.255.254/hook",
    "https://192.168.1.10/hook",
    "https://169.254.169.254/latest/meta-data",
    "https://[::ffff:127.0.0.1]/hook",
    "https://[::ffff:169.254.169.254]/hook",
    "https://[fe80::1]/hook",
    "https://[fc00::1]/hook",
    "https://[::ffff:7f00:1]/hook",  # IPv4-mapped, written in hex
    "https://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
    "https://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "https://[fe80::1%25eth0]/hook",
    "https://127.0.0.1./hook",
    "https://0.0.0.0/hook",
    "https://100.64.0.1/hook",  # carrier-grade NAT: not public
    "https://user:password@hooks.example.com/hook",
    "https://user@hooks.example.com/hook",
    "ftp://hooks.example.com/hook",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "hooks.example.com/hook",
    "https:///hook",
    "",
    "https://hooks.example.com/" + "a" * MAX_URL_CHARS,
    "https://hooks.example.com/hook#part",
    "http://127.0.0.1:9001/hook",  # the allowed origin's host on another port
    "https://127.0.0.1:9000/hook",  # ... or under another scheme
    "http://localhost:9000/hook",  # ... or by another name
])
def test_refused_urls(url):
    with pytest.raises(EndpointRefused):
        check_endpoint_url(url, ALLOWED)


def test_a_url_of_exactly_the_limit_is_accepted_one_more_is_not():
    base = "https://hooks.example.com/"
    exact = base + "a" * (MAX_URL_CHARS - len(base))
    assert str(check_endpoint_url(exact, ALLOWED)) == exact
    with pytest.raises(EndpointRefused):
        check_endpoint_url(exact + "a", ALLOWED)


def test_not_a_string_is_refused():
    for value in (None, 17, b"https://hooks.example.com/"):
        with pytest.raises(EndpointRefused):
            check_endpoint_url(value, ALLOWED)  # type: ignore[arg-type]


def test_loopback_is_refused_without_an_allowed_origin():
    with pytest.raises(EndpointRefused):
        check_endpoint_url("http://127.0.0.1:9000/hook", frozenset())


def test_a_refusal_never_quotes_the_path_or_query():
    with pytest.raises(EndpointRefused) as refused:
        check_endpoint_url("http://hooks.example.com/secret-path?token=s3cr3t", ALLOWED)
    assert "secret-path" not in str(refused.value) and "s3cr3t" not in str(refused.value)


# --- next_attempt_in -----------------------------------------------------------------

def test_the_schedule_steps_then_its_last_gap_repeats():
    rng = random.Random(7)
    for attempts, gap in [(1, 5.0), (2, 30.0), (3, 120.0), (4, 120.0), (10, 120.0), (500, 120.0)]:
        delay = next_attempt_in(attempts, SCHEDULE, 0.0, rng)
        assert delay is not None and 0.8 * gap <= delay <= gap, (attempts, delay)


def test_no_failed_attempt_yet_is_now():
    assert next_attempt_in(0, SCHEDULE, 0.0, random.Random(1)) == 0.0


def test_jitter_stays_within_80_to_100_percent_and_spreads():
    rng = random.Random(12345)
    delays = [next_attempt_in(2, SCHEDULE, 0.0, rng) for _ in range(2000)]
    assert all(d is not None and 24.0 <= d <= 30.0 for d in delays)
    # spread over the whole band, not stuck at one end
    assert min(delays) < 24.5 and max(delays) > 29.5
    # the same seed draws the same delays
    again = random.Random(12345)
    assert [next_attempt_in(2, SCHEDULE, 0.0, again) for _ in range(2000)] == delays


def test_a_gap_past_24_hours_is_cut_to_end_at_24_hours_then_none():
    rng = random.Random(3)
    delay = next_attempt_in(3, SCHEDULE, RETRY_FOR_S - 200.0, rng)
    assert delay is not None and 96.0 <= delay <= 120.0  # the whole gap fits
    assert next_attempt_in(3, SCHEDULE, RETRY_FOR_S - 10.0, rng) == 10.0  # cut to the mark
    assert next_attempt_in(3, SCHEDULE, RETRY_FOR_S - 0.5, rng) == 0.5
    assert next_attempt_in(3, SCHEDULE, RETRY_FOR_S, rng) is None
    assert next_attempt_in(1, (5.0,), RETRY_FOR_S + 1, rng) is None


def test_the_default_schedule_retries_until_the_24_hour_mark_and_then_stops():
    schedule = (5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)
    rng = random.Random(99)
    elapsed, attempts = 0.0, 0
    while (delay := next_attempt_in(attempts + 1, schedule, elapsed, rng)) is not None:
        elapsed += delay
        attempts += 1
    assert elapsed == RETRY_FOR_S  # the last attempt at the mark, failed recorded after it
    # ~ 2555 s of the first five gaps, then one hour (less jitter) at a time
    assert 25 <= attempts <= 36


@pytest.mark.parametrize(("elapsed_s", "held"), [
    (0.0, False),
    (RETRY_FOR_S, False),  # the last attempt, on time
    (RETRY_FOR_S + LAST_ATTEMPT_LATE_S, False),  # ... or a little late
    (RETRY_FOR_S + LAST_ATTEMPT_LATE_S + 1, True),  # held up past its retries
    (3 * RETRY_FOR_S, True),
])
def test_an_attempt_held_up_past_the_retries_is_not_made(elapsed_s, held):
    assert is_held_past_retries(elapsed_s) is held


# --- signed_headers and new_secret ------------------------------------------------------

def test_signed_headers_verify_with_the_standardwebhooks_library():
    secret = new_secret()
    body = b'{"id":"evt_0123","type":"job.succeeded","data":{"caf\xc3\xa9":1}}'
    headers = signed_headers(secret, "evt_" + "0" * 32, int(time.time()), body)
    assert headers["webhook-id"] == "evt_" + "0" * 32 and headers["content-type"] == "application/json"
    assert headers["webhook-signature"].startswith("v1,")
    verified = standardwebhooks.Webhook(secret).verify(body, headers)
    assert verified["type"] == "job.succeeded"
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(body.replace(b"succeeded", b"failed"), headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(body, {**headers, "webhook-id": "evt_" + "1" * 32})


def test_new_secret_is_whsec_and_base64_of_24_random_bytes():
    secrets_ = {new_secret() for _ in range(50)}
    assert len(secrets_) == 50
    for secret in secrets_:
        assert secret.startswith("whsec_")
        raw = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        assert len(raw) == 24


# --- the guarded Sender ----------------------------------------------------------------

class ConnectGuard(httpx.AsyncBaseTransport):
    """The only way out of a test Sender: app.http_transport's transport,
    sending only requests addressed to 127.0.0.1 (aiohttp connects to an
    address in the URL as it stands) and refusing, by failing the test,
    any other — a host name it would resolve itself included."""

    def __init__(self):
        self.inner = AiohttpTransport()
        self.connected: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        where = (request.url.host, request.url.port or {"https": 443, "http": 80}[request.url.scheme])
        if where[0] != "127.0.0.1":
            self.refused.append(where)
            raise AssertionError(f"the sender tried to connect to {where[0]}:{where[1]}")
        self.connected.append(where)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FakeDns:
    """Answers the names it was given (and an address as itself, as
    getaddrinfo does); records every question."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        with contextlib.suppress(ValueError):
            return [str(ipaddress.ip_address(host))]
        if host not in self.answers:
            raise OSError("no such name")
        return list(self.answers[host])


@pytest.fixture
async def guarded():
    made: list[tuple[Sender, ConnectGuard]] = []

    def make(allowed=frozenset(), answers=None, resolve=None) -> tuple[Sender, ConnectGuard, FakeDns]:
        guard = ConnectGuard()
        dns = FakeDns(answers or {})
        sender = Sender(frozenset(allowed), resolve=resolve or dns, transport=guard)
        made.append((sender, guard))
        return sender, guard, dns

    yield make
    for sender, guard in made:
        await sender.aclose()
        assert not guard.refused, f"a sender tried to leave loopback: {guard.refused}"


BODY = b'{"id":"evt_x","type":"job.succeeded"}'


def headers_for(secret: str) -> dict[str, str]:
    return signed_headers(secret, "evt_" + "a" * 32, int(time.time()), BODY)


@pytest.mark.parametrize("answers", [
    ["127.0.0.1"],
    ["10.0.0.1"],
    ["169.254.169.254"],
    ["::ffff:169.254.169.254"],
    ["93.184.216.34", "10.0.0.1"],  # one private answer among public ones refuses the name
    ["10.0.0.1", "93.184.216.34"],
    ["not-an-address"],
])
async def test_a_name_resolving_to_a_private_address_is_refused_and_nothing_connects(guarded, answers):
    sender, guard, dns = guarded(answers={"hooks.example.com": answers})
    with pytest.raises(EndpointRefused):
        await sender.send("https://hooks.example.com/hook", BODY, headers_for(new_secret()))
    assert dns.asked == [("hooks.example.com", 443)]
    assert guard.connected == [] and guard.refused == []


async def test_an_ip_literal_that_is_private_is_refused_before_any_lookup(guarded):
    sender, guard, dns = guarded()
    for url in ("https://127.0.0.1/hook", "https://169.254.169.254/", "https://[::1]/hook",
                "http://hooks.example.com/hook"):
        with pytest.raises(EndpointRefused):
            await sender.send(url, BODY, headers_for(new_secret()))
    assert dns.asked == [] and guard.connected == []


@pytest.mark.parametrize("url", ["https://2130706433/hook", "https://0x7f.0.0.1/hook", "https://127.1/hook",
                                 "https://0177.0.0.1/hook", "https://0/hook"])
async def test_loopback_in_a_numeric_form_the_rule_cannot_read_is_refused_after_the_lookup(guarded, url):
    """The pure rule passes these as names; the system resolver reads them
    as 127.0.0.1 (inet_aton's forms, no DNS query), and the address check
    after it refuses them."""
    sender, guard, _ = guarded(resolve=system_resolver)
    with pytest.raises(EndpointRefused):
        await sender.send(url, BODY, headers_for(new_secret()))
    assert guard.connected == []


async def test_a_name_that_does_not_resolve_is_a_failed_attempt(guarded):
    sender, guard, _ = guarded(answers={"empty.example.com": []})
    for url in ("https://nowhere.example.com/hook", "https://empty.example.com/hook"):
        with pytest.raises(SendFailed):
            await sender.send(url, BODY, headers_for(new_secret()))
    assert guard.connected == []


async def test_the_guard_itself_stops_a_public_address(guarded):
    """The guard works: a public answer passes the rule and the connect
    goes to that very address (pinned), where the guard stops it."""
    sender, guard, _ = guarded(answers={"hooks.example.com": ["93.184.216.34"]})
    with pytest.raises(AssertionError):
        await sender.send("https://hooks.example.com/hook", BODY, headers_for(new_secret()))
    assert guard.refused == [("93.184.216.34", 443)]
    guard.refused.clear()  # expected here: the fixture's check is for the other tests


async def test_an_allowed_loopback_origin_is_delivered_signed(guarded):
    with RunningReceiver(Receiver()) as rx:
        sender, guard, _ = guarded(allowed={rx.origin})
        secret = new_secret()
        assert await sender.send(rx.url, BODY, headers_for(secret)) == 204
        port = int(rx.origin.rsplit(":", 1)[1])
        assert guard.connected == [("127.0.0.1", port)]
        [got] = rx.receiver.received
        assert got.body == BODY
        assert standardwebhooks.Webhook(secret).verify(got.body, got.headers)["type"] == "job.succeeded"


async def test_an_allowed_origin_by_name_connects_to_its_checked_answer_with_its_host_header(guarded):
    with RunningReceiver(Receiver(answers=[200])) as rx:
        port = int(rx.origin.rsplit(":", 1)[1])
        origin = f"http://hooks.test:{port}"
        sender, guard, dns = guarded(allowed={origin}, answers={"hooks.test": ["127.0.0.1"]})
        assert await sender.send(f"{origin}/hook", BODY, headers_for(new_secret())) == 200
        assert dns.asked == [("hooks.test", port)] and guard.connected == [("127.0.0.1", port)]
        [got] = rx.receiver.received
        assert got.headers["host"] == f"hooks.test:{port}"


async def test_a_non_2xx_answer_is_returned_as_is(guarded):
    with RunningReceiver(Receiver(answers=[500, 410])) as rx:
        sender, _, _ = guarded(allowed={rx.origin})
        assert await sender.send(rx.url, BODY, headers_for(new_secret())) == 500
        assert await sender.send(rx.url, BODY, headers_for(new_secret())) == 410


def redirecting_app(hits: list[str]) -> Starlette:
    async def hook(request: Request) -> Response:
        hits.append(request.url.path)
        return Response(status_code=302, headers={"location": "http://169.254.169.254/latest/meta-data/"})
    return Starlette(routes=[Route("/hook", hook, methods=["POST"])])


async def test_a_redirect_is_a_failed_attempt_and_never_followed(guarded):
    hits: list[str] = []
    server = LoopbackServer(redirecting_app(hits)).start()
    try:
        sender, guard, dns = guarded(allowed={server.url})
        assert await sender.send(f"{server.url}/hook", BODY, headers_for(new_secret())) == 302
        assert hits == ["/hook"]
        assert guard.connected == [("127.0.0.1", server.port)] and guard.refused == []
        assert dns.asked == [("127.0.0.1", server.port)]  # the Location's host was never looked up
    finally:
        server.stop()


async def test_a_receiver_that_never_answers_is_send_failed_within_the_timeout(guarded):
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        accepted.set()
        await asyncio.sleep(60)  # reads nothing, answers nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    origin = f"http://127.0.0.1:{port}"
    try:
        sender, guard, _ = guarded(allowed={origin})
        started = time.monotonic()
        with pytest.raises(SendFailed):
            await sender.send(f"{origin}/hook", BODY, headers_for(new_secret()))
        elapsed = time.monotonic() - started
        assert accepted.is_set() and guard.connected == [("127.0.0.1", port)]
        # A timer never fires early; the upper margin is for a loaded machine.
        assert SEND_TIMEOUT_S - 0.5 <= elapsed < SEND_TIMEOUT_S + 4.0, elapsed
    finally:
        for writer in held:
            writer.close()
        server.close()


# --- check_resolved (registration) -------------------------------------------------------

async def test_registration_refuses_a_name_resolving_to_loopback_and_lets_an_unknown_name_pass():
    dns = FakeDns({"inside.example.com": ["127.0.0.1"], "outside.example.com": ["93.184.216.34"]})
    with pytest.raises(EndpointRefused):
        await check_resolved(httpx.URL("https://inside.example.com/hook"), frozenset(), dns)
    await check_resolved(httpx.URL("https://outside.example.com/hook"), frozenset(), dns)
    await check_resolved(httpx.URL("https://not-yet.example.com/hook"), frozenset(), dns)  # checked when sending
    assert [host for host, _ in dns.asked] == ["inside.example.com", "outside.example.com", "not-yet.example.com"]
