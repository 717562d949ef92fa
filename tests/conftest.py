"""Shared fixtures: a real PostgreSQL (TEST_DATABASE_URL, else a throwaway
embedded cluster), the schema migrated once, and the web app served over
real HTTP on loopback. Tests never read DATABASE_URL."""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import asyncpg
import httpx
import pytest
import uvicorn

from app import db as app_db
from app.config import load_settings
from app.domain import owners
from app.embedded import EmbeddedPostgres
from app.migrate import migrate
from outbox.context import Context
from outbox.settler import Settler
from tests.support.loopback import serve_in_loop

TABLES = ("outbox, delivery_attempts, deliveries, notifications, webhook_endpoints, job_events, assets, ledger, "
          "jobs, api_keys, owners, provider_pauses")


@pytest.fixture(scope="session")
def database_url():
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    root = tempfile.mkdtemp(prefix="longcall-test-")
    # TEST_PG_BIN: run the suite on another server's binaries (make test-pg15).
    pg = EmbeddedPostgres(os.path.join(root, "pg"), durable=False,
                          bin_dir=os.environ.get("TEST_PG_BIN") or None).start()
    try:
        yield pg.url
    finally:
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
async def migrated(database_url):
    conn = await asyncpg.connect(database_url)
    try:
        # A test database is ours to reset: start from an empty schema.
        await conn.execute("drop schema public cascade; create schema public")
    finally:
        await conn.close()
    await migrate(database_url)
    return database_url


@pytest.fixture(scope="session")
async def pool(migrated):
    p = await app_db.create_pool(migrated, role="test", min_size=2, max_size=20)
    yield p
    await p.close()


@pytest.fixture
async def db(pool):
    """An empty database for this test."""
    await pool.execute(f"truncate {TABLES} restart identity cascade")
    return pool


@pytest.fixture
def tmp_objects(tmp_path):
    path = tmp_path / "objects"
    path.mkdir()
    return path


@pytest.fixture
async def empty_db(database_url):
    """A fresh database on the test server, never migrated, dropped afterwards."""
    admin = await asyncpg.connect(database_url)
    name = "migrate_test"
    await admin.execute(f"drop database if exists {name}")
    await admin.execute(f"create database {name}")
    yield database_url.rsplit("/", 1)[0] + f"/{name}"
    await admin.execute(f"drop database if exists {name} with (force)")
    await admin.close()


@pytest.fixture
def make_settings(migrated, tmp_objects):
    def make(**overrides):
        env = {
            "DATABASE_URL": migrated,
            "SECRET_KEY": "test-secret-key-0123456789",
            "STORAGE_URL": f"file://{tmp_objects}",
            "ADMIN_TOKEN": "test-admin-token",
            # Provider `sim` exists only with SIM_URL set; tests that run jobs
            # pass their simulator's URL. Port 9 (discard) has no server, so a
            # test that forgets fails at once rather than reaching a simulator
            # someone runs on 8787. SIM_URL="" unsets it.
            "SIM_URL": "http://127.0.0.1:9",
        }
        env.update({k: str(v) for k, v in overrides.items() if v is not None})
        return load_settings(env)
    return make


class Served:
    def __init__(self, url: str, app):
        self.url = url
        self.app = app

    def client(self, api_key: str | None = None, **kw) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **kw)


async def serve_app(app) -> tuple[uvicorn.Server, asyncio.Task, str]:
    running = await serve_in_loop(app, lifespan="on")
    return running.server, running.task, running.url


@pytest.fixture
async def web(db, make_settings):
    """The web app over real HTTP. Use `web_with(**settings)` for other settings."""
    from app.web import create_app

    started = []

    async def start(**overrides):
        app = create_app(make_settings(**overrides))
        server, task, url = await serve_app(app)
        started.append((server, task))
        return Served(url, app)

    yield start
    for server, task in started:
        server.should_exit = True
        await task


@pytest.fixture
def make_owner(db):
    async def make(credits: int = 1000, max_active: int = 10, name: str = "test", platform: bool = False):
        async with db.acquire() as conn:
            return await owners.create_owner(conn, name, credits, max_active, platform=platform)
    return make


@pytest.fixture
async def start_settler():
    """`await start_settler(settings)`: a settler on the test's event loop, stopped after it."""
    started = []

    async def start(settings, *, concurrency: int = 8, sweep_interval_s: float = 0,
                    provider_timeout_s: float = 2.0) -> Settler:
        ctx = await Context.open(settings, provider_timeout_s=provider_timeout_s)
        settler = Settler(ctx, concurrency, sweep_interval_s=sweep_interval_s)
        task = asyncio.create_task(settler.run())
        started.append((settler, task, ctx))
        return settler

    yield start
    for settler, task, ctx in started:
        settler.stop()
        await asyncio.wait_for(task, 30)
        await ctx.close()
