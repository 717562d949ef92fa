"""download_to_file against real servers on 127.0.0.1."""
from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import socket
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from app.download import (
    DownloadClients,
    DownloadError,
    DownloadPolicy,
    OutputTooLarge,
    Refused,
    download_to_file,
)
from tests.download.download_servers import start_app, stop_app

MiB = 1024 * 1024
BLOCK = bytes(range(256)) * (MiB // 256)


def pattern(size: int):
    """`size` deterministic bytes, one block at a time (never whole in memory)."""
    while size > 0:
        piece = BLOCK[: min(size, len(BLOCK))]
        size -= len(piece)
        yield piece


def sha256_of_pattern(size: int) -> str:
    digest = hashlib.sha256()
    for piece in pattern(size):
        digest.update(piece)
    return digest.hexdigest()


async def _bytes(request: Request) -> Response:
    size = int(request.path_params["size"])
    headers = {} if request.query_params.get("nolength") else {"Content-Length": str(size)}

    async def body():
        for piece in pattern(size):
            yield piece

    return StreamingResponse(body(), headers=headers,
                             media_type=request.query_params.get("type", "application/octet-stream"))


async def _redirect(request: Request) -> Response:
    hops = int(request.path_params["hops"])
    if hops == 0:
        return Response(b"arrived", media_type="text/plain")
    return RedirectResponse(f"/redirect/{hops - 1}", status_code=302)  # relative Location


async def _to(request: Request) -> Response:
    return RedirectResponse(request.query_params["location"], status_code=307)


async def _status(request: Request) -> Response:
    return Response(b"nope", status_code=int(request.path_params["code"]))


async def _host(request: Request) -> Response:
    return PlainTextResponse(request.headers.get("host", ""))


async def _authorization(request: Request) -> Response:
    return PlainTextResponse(request.headers.get("authorization", "(none)"))


async def _gzip(request: Request) -> Response:
    return Response(gzip.compress(b"a" * 10_000), headers={"Content-Encoding": "gzip"},
                    media_type="text/plain")


async def _no_location(request: Request) -> Response:
    return Response(status_code=302)


async def _peer(request: Request) -> Response:
    """The client's port: which TCP connection the request came on."""
    assert request.client is not None
    return PlainTextResponse(str(request.client.port))


OUTPUTS = Starlette(routes=[
    Route("/bytes/{size:int}", _bytes),
    Route("/redirect/{hops:int}", _redirect),
    Route("/to", _to),
    Route("/status/{code:int}", _status),
    Route("/host", _host),
    Route("/authorization", _authorization),
    Route("/gzip", _gzip),
    Route("/no-location", _no_location),
    Route("/peer", _peer),
])


def plain_policy(*origins: str, max_bytes: int = 10 * MiB, **overrides) -> DownloadPolicy:
    """Policy for the local test server: its origin allowed over plain http."""
    return DownloadPolicy(allowed_hosts=(), plain_http_origins=frozenset(origins), max_bytes=max_bytes, **overrides)


@pytest.fixture(scope="module")
async def outputs_server():
    server = await start_app(OUTPUTS)
    yield server
    await stop_app(server)


@pytest.fixture
async def outputs(outputs_server):
    """The shared output server, its request count reset for this test."""
    outputs_server.requests = 0
    return outputs_server


def leftovers(directory) -> list[str]:
    return sorted(os.listdir(directory))


# ----------------------------------------------------------------- happy path

async def test_download_measures_size_sha256_and_type(outputs, tmp_path):
    got = await download_to_file(f"{outputs.url}/bytes/300000?type=image/png", plain_policy(outputs.url), str(tmp_path))
    assert got.bytes == 300000
    assert got.sha256 == sha256_of_pattern(300000)
    assert got.content_type == "image/png"
    assert os.path.dirname(got.path) == str(tmp_path)
    with open(got.path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == got.sha256
    assert leftovers(tmp_path) == [os.path.basename(got.path)]


async def test_empty_body_and_exactly_the_cap(outputs, tmp_path):
    empty = await download_to_file(f"{outputs.url}/bytes/0", plain_policy(outputs.url), str(tmp_path))
    assert (empty.bytes, empty.sha256) == (0, hashlib.sha256(b"").hexdigest())
    exact = await download_to_file(f"{outputs.url}/bytes/5000?nolength=1", plain_policy(outputs.url, max_bytes=5000),
                                   str(tmp_path))
    assert exact.bytes == 5000


async def test_the_file_is_made_off_the_event_loop(outputs, tmp_path, monkeypatch):
    # Making a file can wait on the filesystem's journal while other
    # threads fsync; on the event loop that wait stalls every job.
    import tempfile
    import threading

    made_in: list[threading.Thread] = []
    mkstemp = tempfile.mkstemp

    def recording(*args, **kwargs):
        made_in.append(threading.current_thread())
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", recording)
    for size in (0, 5000, 3 * MiB):  # nothing, one write, several
        got = await download_to_file(f"{outputs.url}/bytes/{size}", plain_policy(outputs.url), str(tmp_path))
        assert (got.bytes, got.sha256) == (size, sha256_of_pattern(size))
    assert len(made_in) == 3 and threading.main_thread() not in made_in


async def test_a_download_cancelled_while_its_file_is_made_leaves_no_file(outputs, tmp_path, monkeypatch):
    # The thread making the file runs on after the cancel (asyncio cannot
    # stop it): the file it makes is removed, not left behind.
    import tempfile
    import threading

    entered, release = threading.Event(), threading.Event()
    done: list[str] = []
    mkstemp = tempfile.mkstemp

    def gated(*args, **kwargs):
        entered.set()
        release.wait(10)
        made = mkstemp(*args, **kwargs)
        done.append(made[1])
        return made

    monkeypatch.setattr(tempfile, "mkstemp", gated)
    task = asyncio.ensure_future(download_to_file(f"{outputs.url}/bytes/5000", plain_policy(outputs.url),
                                                  str(tmp_path)))
    assert await asyncio.to_thread(entered.wait, 10)
    # The cancel's clean-up waits for the thread's write to end: let it
    # end a moment after the cancel.
    threading.Timer(0.2, release.set).start()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done and leftovers(tmp_path) == []


# ----------------------------------------------------------------- byte cap

async def test_declared_length_over_the_cap_fails_early(outputs, tmp_path):
    with pytest.raises(OutputTooLarge):
        await download_to_file(f"{outputs.url}/bytes/{20 * MiB}", plain_policy(outputs.url, max_bytes=MiB),
                               str(tmp_path))
    assert leftovers(tmp_path) == []


async def test_chunked_body_without_length_over_the_cap(outputs, tmp_path):
    with pytest.raises(OutputTooLarge):
        await download_to_file(f"{outputs.url}/bytes/{3 * MiB}?nolength=1",
                               plain_policy(outputs.url, max_bytes=MiB + 1), str(tmp_path))
    assert leftovers(tmp_path) == []


async def test_close_delimited_body_without_length_over_the_cap(serve_raw, tmp_path):
    async def endless(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nConnection: close\r\n\r\n")
        for _ in range(64):  # 4 MiB, four times the cap
            writer.write(b"x" * 65536)
            await writer.drain()

    raw = await serve_raw(endless)
    with pytest.raises(OutputTooLarge):
        await download_to_file(f"{raw.url}/o", plain_policy(raw.url, max_bytes=MiB), str(tmp_path))
    assert leftovers(tmp_path) == []


async def test_lying_content_length_is_not_trusted(serve_raw, tmp_path):
    # Claims 10 bytes but frames the body as chunked: an answer that names
    # two lengths is not valid HTTP (RFC 9112 §6.3: the way requests are
    # smuggled), so nothing of it is read, let alone kept.
    async def liar(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(40):
            writer.write(b"10000\r\n" + b"y" * 65536 + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    raw = await serve_raw(liar)
    with pytest.raises(DownloadError, match="failed \\(RemoteProtocolError\\)"):
        await download_to_file(f"{raw.url}/o", plain_policy(raw.url, max_bytes=MiB), str(tmp_path))
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------- redirects

async def test_three_redirects_are_followed(outputs, tmp_path):
    got = await download_to_file(f"{outputs.url}/redirect/3", plain_policy(outputs.url), str(tmp_path))
    with open(got.path, "rb") as f:
        assert f.read() == b"arrived"
    assert outputs.requests == 4


async def test_fourth_redirect_is_refused(outputs, tmp_path):
    with pytest.raises(Refused, match="redirects"):
        await download_to_file(f"{outputs.url}/redirect/4", plain_policy(outputs.url), str(tmp_path))
    assert outputs.requests == 4  # the fifth URL was never fetched
    assert leftovers(tmp_path) == []


async def test_max_redirects_is_configurable(outputs, tmp_path):
    with pytest.raises(Refused):
        await download_to_file(f"{outputs.url}/redirect/1", plain_policy(outputs.url, max_redirects=0), str(tmp_path))


async def test_redirect_to_another_loopback_port_is_refused_unfetched(serve_app, outputs, tmp_path):
    other = await serve_app(OUTPUTS)
    with pytest.raises(Refused):
        await download_to_file(f"{outputs.url}/to?location={other.url}/bytes/10", plain_policy(outputs.url),
                               str(tmp_path))
    assert other.requests == 0
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("location", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "https://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "https://evil.example/x",
    "file:///etc/passwd",
    "http://user:pw@127.0.0.1/",
])
async def test_redirect_off_policy_is_refused(outputs, tmp_path, location):
    from urllib.parse import quote

    with pytest.raises(Refused):
        await download_to_file(f"{outputs.url}/to?location={quote(location, safe='')}", plain_policy(outputs.url),
                               str(tmp_path))


async def test_redirect_to_an_allowed_host_on_a_private_address_is_refused(outputs, tmp_path):
    # Even an allowlisted name is refused when it points inside.
    policy = DownloadPolicy(allowed_hosts=("169.254.169.254",), plain_http_origins=frozenset({outputs.url}),
                            max_bytes=MiB)
    with pytest.raises(Refused, match="non-public"):
        await download_to_file(f"{outputs.url}/to?location=https://169.254.169.254/latest", policy, str(tmp_path))


async def test_redirect_without_location(outputs, tmp_path):
    with pytest.raises(DownloadError, match="Location"):
        await download_to_file(f"{outputs.url}/no-location", plain_policy(outputs.url), str(tmp_path))


# ----------------------------------------------------------------- the provider's credentials

TOKEN_HEADER = {"Authorization": "Bearer r8_download_secret"}


def read(got) -> bytes:
    with open(got.path, "rb") as f:
        return f.read()


async def test_credentials_go_to_the_providers_own_host(outputs, tmp_path):
    policy = plain_policy(outputs.url, credential_hosts=("127.0.0.1",), credentials=TOKEN_HEADER)
    got = await download_to_file(f"{outputs.url}/authorization", policy, str(tmp_path))
    assert read(got) == b"Bearer r8_download_secret"


async def test_credentials_never_follow_a_redirect_even_to_the_same_host(outputs, tmp_path):
    policy = plain_policy(outputs.url, credential_hosts=("127.0.0.1",), credentials=TOKEN_HEADER)
    got = await download_to_file(f"{outputs.url}/to?location=/authorization", policy, str(tmp_path))
    assert read(got) == b"(none)"


async def test_credentials_never_go_to_another_allowed_host(outputs, tmp_path):
    dns = FakeDns({"cdn.test": ["127.0.0.1"]})
    origin = f"http://cdn.test:{outputs.port}"
    policy = plain_policy(origin, credential_hosts=("replicate.delivery", ".replicate.delivery"),
                          credentials=TOKEN_HEADER)
    got = await download_to_file(f"{origin}/authorization", policy, str(tmp_path), resolve=dns)
    assert read(got) == b"(none)"


def test_a_policy_never_shows_its_credentials():
    policy = plain_policy(credential_hosts=("h",), credentials=TOKEN_HEADER)
    assert "r8_download_secret" not in repr(policy) and "r8_download_secret" not in str(policy)


@pytest.mark.parametrize("url, hop, sent", [
    ("https://replicate.delivery/pbxt/a.png", 0, True),
    ("https://tjzk.replicate.delivery/a.png", 0, True),
    ("https://tjzk.replicate.delivery/a.png", 1, False),
    ("https://replicate.delivery.evil.example/a.png", 0, False),
    ("https://evilreplicate.delivery/a.png", 0, False),
    ("https://cdn.example/a.png", 0, False),
])
def test_which_requests_carry_the_credentials(url, hop, sent):
    import httpx

    policy = plain_policy(credential_hosts=("replicate.delivery", ".replicate.delivery"), credentials=TOKEN_HEADER)
    assert policy.credentials_for(httpx.URL(url), hop) == (TOKEN_HEADER if sent else {})


# ----------------------------------------------------------------- names and addresses

class FakeDns:
    """An injected resolver: this sandbox has no DNS, and tests need names
    that resolve to chosen addresses."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


async def test_connects_to_the_resolved_address_with_the_real_host_header(outputs, tmp_path):
    # sim.test exists nowhere but in FakeDns: success proves the connection used its answer.
    dns = FakeDns({"sim.test": ["127.0.0.1"]})
    origin = f"http://sim.test:{outputs.port}"
    got = await download_to_file(f"{origin}/host", plain_policy(origin), str(tmp_path), resolve=dns)
    with open(got.path, "rb") as f:
        assert f.read() == f"sim.test:{outputs.port}".encode()
    assert dns.calls == ["sim.test"]


async def test_each_hop_is_resolved_exactly_once(outputs, tmp_path):
    dns = FakeDns({"sim.test": ["127.0.0.1"]})
    origin = f"http://sim.test:{outputs.port}"
    await download_to_file(f"{origin}/redirect/2", plain_policy(origin), str(tmp_path), resolve=dns)
    assert dns.calls == ["sim.test"] * 3


async def test_later_addresses_are_tried_when_the_first_refuses(outputs, tmp_path):
    dns = FakeDns({"sim.test": ["::1", "127.0.0.1"]})
    origin = f"http://sim.test:{outputs.port}"
    # ::1 has no server on this port (uvicorn listens on 127.0.0.1 only).
    got = await download_to_file(f"{origin}/bytes/10", plain_policy(origin), str(tmp_path), resolve=dns)
    assert got.bytes == 10


@pytest.mark.parametrize("answers", [
    ["10.0.0.7"],
    ["93.184.216.34", "127.0.0.1"],  # every address must be public, not just the first
    ["169.254.169.254"],
    ["::ffff:192.168.1.1"],
    ["fd12:3456::1"],
])
async def test_allowed_name_resolving_inside_is_refused(tmp_path, answers):
    dns = FakeDns({"cdn.test": answers})
    policy = DownloadPolicy(allowed_hosts=(".test",), plain_http_origins=frozenset(), max_bytes=MiB)
    with pytest.raises(Refused, match="non-public"):
        await download_to_file("https://cdn.test/out.png?sig=SECRET", policy, str(tmp_path), resolve=dns)
    assert leftovers(tmp_path) == []


async def test_any_host_still_refuses_a_name_resolving_inside(tmp_path):
    dns = FakeDns({"upstream.example": ["10.1.2.3"]})
    policy = DownloadPolicy(allowed_hosts=(), plain_http_origins=frozenset(), max_bytes=MiB, any_host=True)
    with pytest.raises(Refused, match="non-public"):
        await download_to_file("https://upstream.example/v.mp4", policy, str(tmp_path), resolve=dns)
    assert leftovers(tmp_path) == []


async def test_plain_origin_may_be_loopback_but_not_private(outputs, tmp_path):
    dns = FakeDns({"sim.test": ["10.1.1.1"]})
    origin = f"http://sim.test:{outputs.port}"
    with pytest.raises(Refused, match="non-public"):
        await download_to_file(f"{origin}/bytes/10", plain_policy(origin), str(tmp_path), resolve=dns)


async def test_unresolvable_name_is_a_download_error(tmp_path):
    policy = DownloadPolicy(allowed_hosts=("nowhere.test",), plain_http_origins=frozenset(), max_bytes=MiB)
    with pytest.raises(DownloadError, match="resolve") as info:
        await download_to_file("https://nowhere.test/x", policy, str(tmp_path), resolve=FakeDns({}))
    assert not isinstance(info.value, Refused)


async def test_localhost_over_https_is_refused_unfetched(outputs, tmp_path):
    # Real DNS: localhost is loopback, and only the configured plain origins may be.
    policy = DownloadPolicy(allowed_hosts=("localhost",), plain_http_origins=frozenset(), max_bytes=MiB)
    with pytest.raises(Refused):
        await download_to_file(f"https://localhost:{outputs.port}/bytes/10", policy, str(tmp_path))
    with pytest.raises(Refused):
        await download_to_file(f"http://localhost:{outputs.port}/bytes/10", policy, str(tmp_path))
    assert outputs.requests == 0


async def test_plain_http_to_a_non_loopback_host_is_refused(tmp_path):
    policy = DownloadPolicy(allowed_hosts=("replicate.delivery",), plain_http_origins=frozenset(), max_bytes=MiB)
    with pytest.raises(Refused, match="plain http"):
        await download_to_file("http://replicate.delivery/x.png", policy, str(tmp_path))


async def test_https_host_not_in_allowlist_is_refused(tmp_path):
    policy = DownloadPolicy(allowed_hosts=("replicate.delivery",), plain_http_origins=frozenset(), max_bytes=MiB)
    dns = FakeDns({"evil.example": ["93.184.216.34"]})
    with pytest.raises(Refused, match="allowlist"):
        await download_to_file("https://evil.example/x.png", policy, str(tmp_path), resolve=dns)
    assert dns.calls == []  # refused before any lookup


# ----------------------------------------------------------------- answers and failures

async def test_not_found_is_a_download_error_without_the_query_string(outputs, tmp_path):
    with pytest.raises(DownloadError) as info:
        await download_to_file(f"{outputs.url}/status/404?token=SECRET123", plain_policy(outputs.url), str(tmp_path))
    assert not isinstance(info.value, Refused)
    assert "404" in str(info.value)
    assert "SECRET123" not in str(info.value) and "token" not in str(info.value)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("code", [500, 403, 410, 304])
async def test_non_2xx_is_a_download_error(outputs, tmp_path, code):
    with pytest.raises(DownloadError, match=str(code)):
        await download_to_file(f"{outputs.url}/status/{code}", plain_policy(outputs.url), str(tmp_path))


async def test_encoded_body_is_refused_not_inflated(outputs, tmp_path):
    with pytest.raises(DownloadError, match="encoded"):
        await download_to_file(f"{outputs.url}/gzip", plain_policy(outputs.url), str(tmp_path))
    assert leftovers(tmp_path) == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connection_refused(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(DownloadError, match="connect"):
        await download_to_file(f"{url}/x", plain_policy(url), str(tmp_path))
    assert leftovers(tmp_path) == []


async def test_missing_directory_is_a_download_error(outputs, tmp_path):
    with pytest.raises(DownloadError):
        await download_to_file(f"{outputs.url}/bytes/10", plain_policy(outputs.url), str(tmp_path / "missing"))


async def test_missing_content_type_is_none(serve_raw, tmp_path):
    async def bare(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
        await writer.drain()

    raw = await serve_raw(bare)
    got = await download_to_file(f"{raw.url}/o", plain_policy(raw.url), str(tmp_path))
    assert (got.bytes, got.content_type) == (3, None)


# ----------------------------------------------------------------- timeouts

async def test_server_that_never_answers_times_out(serve_raw, tmp_path):
    async def silent(reader, writer):
        await reader.read()  # until the client gives up

    raw = await serve_raw(silent)
    started = time.monotonic()
    with pytest.raises(DownloadError, match="timed out"):
        await download_to_file(f"{raw.url}/o", plain_policy(raw.url, stall_timeout_s=0.3), str(tmp_path))
    assert time.monotonic() - started < 10  # the short timeout fired (the server never gives up)
    assert leftovers(tmp_path) == []


async def test_body_that_stalls_times_out(serve_raw, tmp_path):
    async def stall(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"z" * 10)
        await writer.drain()
        await reader.read()

    raw = await serve_raw(stall)
    started = time.monotonic()
    with pytest.raises(DownloadError, match="timed out"):
        await download_to_file(f"{raw.url}/o", plain_policy(raw.url, stall_timeout_s=0.3), str(tmp_path))
    assert time.monotonic() - started < 10  # the short timeout fired (the server never gives up)
    assert leftovers(tmp_path) == []


async def test_trickle_hits_the_total_timeout(serve_raw, tmp_path):
    async def trickle(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while not writer.is_closing():
            writer.write(b"t")
            await writer.drain()
            await asyncio.sleep(0.02)  # each byte well within the read timeout

    raw = await serve_raw(trickle)
    started = time.monotonic()
    with pytest.raises(DownloadError, match="longer than"):
        await download_to_file(f"{raw.url}/o", plain_policy(raw.url, stall_timeout_s=5, total_timeout_s=0.4),
                               str(tmp_path))
    assert time.monotonic() - started < 10  # the short timeout fired (the server never gives up)
    assert leftovers(tmp_path) == []


# ----------------------------------------------------------------- memory

async def _download_with_flat_memory(outputs, tmp_path, peak_rss, size: int, limit: int) -> None:
    with peak_rss() as rss:
        got = await download_to_file(f"{outputs.url}/bytes/{size}?nolength=1",
                                     plain_policy(outputs.url, max_bytes=size), str(tmp_path))
    try:
        assert got.bytes == size
        assert got.sha256 == sha256_of_pattern(size)
        assert rss.growth < limit, f"resident memory grew by {rss.growth / MiB:.1f} MiB"
    finally:
        os.unlink(got.path)


async def test_64_mib_download_keeps_memory_flat(outputs, tmp_path, peak_rss):
    await _download_with_flat_memory(outputs, tmp_path, peak_rss, 64 * MiB, limit=24 * MiB)


@pytest.mark.slow
async def test_1_gib_download_keeps_memory_flat(outputs, tmp_path, peak_rss):
    await _download_with_flat_memory(outputs, tmp_path, peak_rss, 1024 * MiB, limit=48 * MiB)


# ----------------------------------------------------------------- keep-alive

async def _peer_port(url: str, policy: DownloadPolicy, tmp_path, **kw) -> str:
    got = await download_to_file(url, policy, str(tmp_path), **kw)
    with open(got.path) as f:
        return f.read()


async def test_shared_clients_keep_a_connection_per_origin(outputs, tmp_path):
    origin = outputs.url
    alone = plain_policy(origin)
    assert await _peer_port(f"{origin}/peer", alone, tmp_path) != await _peer_port(f"{origin}/peer", alone, tmp_path)
    clients = DownloadClients()
    try:
        kept = plain_policy(origin, clients=clients)
        first = await _peer_port(f"{origin}/peer", kept, tmp_path)
        assert await _peer_port(f"{origin}/peer", kept, tmp_path) == first
    finally:
        await clients.aclose()


async def test_a_kept_connection_serves_only_the_host_name_it_was_made_for(outputs, tmp_path):
    """Two names at one address never share a connection: over TLS it was
    verified for one of them only."""
    dns = FakeDns({"a.test": ["127.0.0.1"], "b.test": ["127.0.0.1"]})
    a, b = f"http://a.test:{outputs.port}", f"http://b.test:{outputs.port}"
    clients = DownloadClients()
    try:
        policy = plain_policy(a, b, clients=clients)
        via_a = await _peer_port(f"{a}/peer", policy, tmp_path, resolve=dns)
        via_b = await _peer_port(f"{b}/peer", policy, tmp_path, resolve=dns)
        assert via_a != via_b
        assert await _peer_port(f"{a}/peer", policy, tmp_path, resolve=dns) == via_a
        assert await _peer_port(f"{b}/peer", policy, tmp_path, resolve=dns) == via_b
    finally:
        await clients.aclose()


async def test_a_download_cut_short_does_not_leave_its_connection_for_the_next(outputs, tmp_path):
    origin = outputs.url
    clients = DownloadClients()
    try:
        policy = plain_policy(origin, max_bytes=MiB, clients=clients)
        first = await _peer_port(f"{origin}/peer", policy, tmp_path)
        with pytest.raises(OutputTooLarge):
            await download_to_file(f"{origin}/bytes/{3 * MiB}?nolength=1", policy, str(tmp_path))
        assert await _peer_port(f"{origin}/peer", policy, tmp_path) != first
    finally:
        await clients.aclose()


async def test_shared_clients_keep_at_most_max_origins(outputs, tmp_path):
    names = ["a.test", "b.test", "c.test"]
    dns = FakeDns({name: ["127.0.0.1"] for name in names})
    origins = [f"http://{name}:{outputs.port}" for name in names]
    clients = DownloadClients(max_origins=2)
    try:
        policy = plain_policy(*origins, clients=clients)
        ports = [await _peer_port(f"{o}/peer", policy, tmp_path, resolve=dns) for o in origins]
        assert clients.kept == 2 and len(set(ports)) == 3
        # a.test, the least recently used, made room: its next download connects anew.
        assert await _peer_port(f"{origins[0]}/peer", policy, tmp_path, resolve=dns) != ports[0]
        assert await _peer_port(f"{origins[2]}/peer", policy, tmp_path, resolve=dns) == ports[2]
    finally:
        await clients.aclose()
