"""A few raw bytes to a server, for requests an HTTP client refuses to
send (a header value with trailing whitespace) or never sends (half a
request line)."""
from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


async def raw_request(url: str, head: bytes, body: bytes = b"", timeout: float = 30) -> tuple[int, dict, bytes]:
    """Send `head` (request line and headers, without the blank line) and
    `body` on a fresh connection; (status, lower-cased headers, body)."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    try:
        writer.write(head + b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    header_block, _, content = answer.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
    return int(lines[0].split()[1]), headers, content


def error_of(content: bytes) -> dict:
    return json.loads(content)["error"]
