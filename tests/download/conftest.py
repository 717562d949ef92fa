"""Fixtures: servers started for one test and stopped after it."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.download.download_servers import PeakRss, RunningApp, start_app, stop_app
from tests.support.raw_server import serve_raw  # noqa: F401 (a fixture)


@pytest.fixture
async def serve_app():
    """serve_app(app, **uvicorn_config) -> RunningApp, stopped after the test."""
    running: list[RunningApp] = []

    async def start(app, **config) -> RunningApp:
        running.append(await start_app(app, **config))
        return running[-1]

    yield start
    await asyncio.gather(*(stop_app(app) for app in running))


@pytest.fixture
def peak_rss():
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc to sample memory")
    return PeakRss
