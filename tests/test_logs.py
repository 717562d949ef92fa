"""app/logs.py in a process of its own (it replaces the root handlers): one
JSON object per line, and no URL's query in any line at any LOG_LEVEL, the
HTTP client's own loggers included (httpx logs each request's URL at INFO)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECRET = "sv-2024&sig=Zm9vYmFyLXNhcy1zaWduYXR1cmUtZG8tbm90LWxvZw"  # an Azure SAS query, say

SCRIPT = """
import asyncio, logging, sys
from app.logs import configure_logging
from app.providers.http import make_client

configure_logging(sys.argv[1])


async def main():
    async def handle(reader, writer):
        await reader.readuntil(b"\\r\\n\\r\\n")
        writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with make_client(5.0) as client:
        response = await client.get(f"http://127.0.0.1:{port}/outputs/0.png?{sys.argv[2]}")
    logging.getLogger("longcall.settler").info("output fetched", extra={"status_code": response.status_code})
    server.close()


asyncio.run(main())
"""


@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_no_request_url_reaches_the_log_at_any_level(level):
    done = subprocess.run([sys.executable, "-c", SCRIPT, level, SECRET], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    entries = [json.loads(line) for line in lines]  # every line one JSON object
    assert {"logger": "longcall.settler", "msg": "output fetched", "status_code": 200}.items() \
        <= entries[-1].items()  # our own INFO line is there: the log is on
    assert not [line for line in lines if "sig=" in line or "/outputs/0.png" in line]
