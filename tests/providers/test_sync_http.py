"""The HTTP plumbing every sync adapter shares (app/providers/http.py
`sync_call`, `call_failure`; app/providers/inline.py `write_answer`): what
each way a call can fail means, and an answer streamed to its file with the
cap and sha256, never leaving a file behind. Over real loopback servers:
a raw TCP one for answers that break off."""
from __future__ import annotations

import asyncio
import hashlib
import os

import httpx
import pytest

from app.download_errors import OutputTooLarge
from app.providers.base import Rejected, Transient, Uncertain
from app.providers.http import NO_SECRETS, Secrets, call_failure, make_client, sync_call
from app.providers.inline import write_answer
from tests.support.raw_server import serve_raw  # noqa: F401 (a fixture)


def response(status: int, body: bytes = b"", **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, content=body)


@pytest.mark.parametrize(("status", "headers", "kind", "retry_after"), [
    (429, {"retry-after": "3"}, Transient, 3.0),
    (529, {"retry-after": "1"}, Transient, 1.0),  # Anthropic's overloaded
    (503, {}, Transient, None),
    (408, {}, Transient, None),
    (400, {}, Rejected, None),
    (401, {}, Rejected, None),
    (404, {}, Rejected, None),
    (413, {}, Rejected, None),
    (422, {}, Rejected, None),
    (500, {}, Uncertain, None),  # the call reached the provider: it may have done (and billed) the work
    (502, {}, Uncertain, None),
    (504, {}, Uncertain, None),
    (302, {"location": "https://elsewhere.example/"}, Uncertain, None),
])
def test_what_an_error_status_means(status, headers, kind, retry_after):
    error = call_failure(response(status, **headers), "llm", secrets=NO_SECRETS)
    assert type(error) is kind
    if kind is Transient:
        assert error.retry_after == retry_after


def test_an_error_message_never_repeats_the_key():
    key = "sk-live-Echo7d1f9a2b"
    body = f'{{"error": {{"message": "bad key {key}"}}}}'.encode()
    error = call_failure(response(401, body, **{"content-type": "application/json"}), "llm", secrets=Secrets(key))
    assert key not in str(error) and "[redacted]" in str(error)


async def test_a_refused_connection_sent_nothing(unused_tcp_port):
    async with make_client(5.0) as client:
        with pytest.raises(Transient):
            async with sync_call(client, "llm", "POST", f"http://127.0.0.1:{unused_tcp_port}/v1/x",
                                 secrets=NO_SECRETS, timeout_s=5.0):
                pass


def _answer(head: bytes, body: bytes, *, close_after: int | None = None):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head + body[:close_after])
        await writer.drain()
        writer.close()
    return handler


async def test_an_answer_is_written_with_its_size_and_sha256(serve_raw, tmp_path):
    body = os.urandom(300_000)
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: audio/mpeg\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode())
    server = await serve_raw(_answer(head, body))
    async with make_client(5.0) as client:
        async with sync_call(client, "llm", "POST", f"{server.url}/x", secrets=NO_SECRETS, timeout_s=5.0) as r:
            got = await write_answer(r, "llm", directory=str(tmp_path), max_bytes=1_000_000,
                                     content_type=r.headers["content-type"])
    assert (got.bytes, got.sha256, got.content_type) == (len(body), hashlib.sha256(body).hexdigest(), "audio/mpeg")
    with open(got.path, "rb") as f:
        assert f.read() == body


async def test_an_answer_that_breaks_off_is_a_lost_call_and_leaves_no_file(serve_raw, tmp_path):
    body = os.urandom(300_000)
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode()
    server = await serve_raw(_answer(head, body, close_after=100_000))
    async with make_client(5.0) as client:
        with pytest.raises(Uncertain):
            async with sync_call(client, "llm", "POST", f"{server.url}/x", secrets=NO_SECRETS, timeout_s=5.0) as r:
                await write_answer(r, "llm", directory=str(tmp_path), max_bytes=1_000_000, content_type=None)
    assert os.listdir(tmp_path) == []


async def test_an_answer_over_the_cap_stops_there_and_leaves_no_file(serve_raw, tmp_path):
    body = os.urandom(300_000)
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode()
    server = await serve_raw(_answer(head, body))
    async with make_client(5.0) as client:
        with pytest.raises(OutputTooLarge):
            async with sync_call(client, "llm", "POST", f"{server.url}/x", secrets=NO_SECRETS, timeout_s=5.0) as r:
                await write_answer(r, "llm", directory=str(tmp_path), max_bytes=200_000, content_type=None)
    assert os.listdir(tmp_path) == []


async def test_a_silent_provider_is_a_lost_call_after_the_calls_timeout(serve_raw):
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    server = await serve_raw(silent)
    async with make_client(30.0) as client:
        with pytest.raises(Uncertain, match="no answer"):
            async with sync_call(client, "llm", "POST", f"{server.url}/x", secrets=NO_SECRETS, timeout_s=0.5):
                pass
