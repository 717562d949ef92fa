"""The provider HTTP client's own cost: `python -m proof.bench_http
TRANSPORT URL REQUESTS CONCURRENCY` GETs URL with one httpx client, as the
settler does, and prints one JSON line: requests/s and the client process's
CPU per request. TRANSPORT is `ours` (app/http_transport.py's
outbound_client, as the settler makes it: httpx over aiohttp) or `httpx`
(httpx's default client and transport: httpcore through anyio). Run in a
fresh process per measurement, so neither variant inherits the other's
warm state."""
from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

import httpx

from app.http_transport import AiohttpTransport, outbound_client


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def measure(transport: str, url: str, requests: int, concurrency: int) -> dict:
    client = outbound_client(AiohttpTransport(), httpx.Timeout(30)) if transport == "ours" \
        else httpx.AsyncClient(trust_env=False, timeout=30)
    async with client:
        async def worker(n: int) -> None:
            for _ in range(n):
                r = await client.get(url)
                if r.status_code != 200:
                    raise RuntimeError(f"GET {url} answered {r.status_code}")

        per_worker = max(1, requests // concurrency)
        await asyncio.gather(*[worker(max(1, per_worker // 10)) for _ in range(concurrency)])  # warm-up
        cpu0, t0 = _cpu_s(), time.perf_counter()
        await asyncio.gather(*[worker(per_worker) for _ in range(concurrency)])
        elapsed, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    n = per_worker * concurrency
    return {"transport": transport, "n": n, "per_s": n / elapsed, "cpu_us_per_req": cpu / n * 1e6}


def main(argv: list[str]) -> int:
    transport, url, requests, concurrency = argv[0], argv[1], int(argv[2]), int(argv[3])
    if transport not in ("ours", "httpx"):
        print("transport must be 'ours' or 'httpx'", file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(measure(transport, url, requests, concurrency))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
