"""The benchmark's floor: the least any Python webhook receiver does.

A minimal Starlette endpoint on the same uvicorn settings as `longcall serve`
that checks one t/v1 HMAC over the raw body and does one asyncpg upsert,
then answers 204. `python -m proof.bench_baseline --port P` with
DATABASE_URL and BENCH_WEBHOOK_SECRET in the environment. It takes the very
same request bytes as our webhook route, so the two are compared on equal
input.

Its pool is asyncpg's default, as a minimal endpoint is written: each
connection is reset when it goes back to the pool (`SELECT
pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`), a second round
trip per request. `--no-pool-reset` skips it, as longcall's own pools do
(app/db.py): one round trip, the strict floor.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import os

import asyncpg
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app import db as app_db

TABLE = "bench_hook"
CREATE_TABLE = f"create table if not exists {TABLE} (id text primary key, n integer not null default 0)"
UPSERT = f"insert into {TABLE} (id, n) values ($1, 1) on conflict (id) do update set n = {TABLE}.n + 1"


def create_app(database_url: str, secret: str, *, pool_reset: bool = True) -> Starlette:
    key = secret.encode()

    async def receive(request: Request) -> Response:
        raw = await request.body()
        t, _, sig = request.headers.get("x-signature", "").partition(",v1=")
        expected = hmac.new(key, t.removeprefix("t=").encode() + b"." + raw, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, sig):
            return Response(status_code=401)
        await request.app.state.pool.execute(UPSERT, request.path_params["job_id"])
        return Response(status_code=204)

    async def notification(request: Request) -> Response:
        # The e2e row's notification receiver (not part of the floor): takes anything.
        await request.body()
        return Response(status_code=204)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        # The same pool size as the web tier's (app/web/__init__.py).
        app.state.pool = await asyncpg.create_pool(database_url, min_size=2, max_size=20,
                                                   reset=None if pool_reset else app_db.keep_session)
        try:
            yield
        finally:
            await app.state.pool.close()

    return Starlette(routes=[Route("/webhooks/{provider}/{job_id}", receive, methods=["POST"]),
                             Route("/notifications", notification, methods=["POST"])],
                     lifespan=lifespan)


def main() -> int:
    from app.logs import uvicorn_log_config

    parser = argparse.ArgumentParser(prog="bench_baseline")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-pool-reset", action="store_true",
                        help="release pooled connections without asyncpg's server-side reset")
    args = parser.parse_args()
    app = create_app(os.environ["DATABASE_URL"], os.environ["BENCH_WEBHOOK_SECRET"],
                     pool_reset=not args.no_pool_reset)
    # The same uvicorn settings as `longcall serve` (app/cli.py).
    uvicorn.run(app, host=args.host, port=args.port, log_config=uvicorn_log_config(),
                access_log=False, proxy_headers=True, lifespan="on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
