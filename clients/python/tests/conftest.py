"""A real longcall for the client's tests: clients/testing/serve_longcall.py,
started once per session, with a platform owner (`longcall.platform_api_key`).
Tests that need an owner of their own (exact balances, an exact job list, one
slot) make one with `make_owner`; a platform of their own, `make_platform`."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_asyncio
from client_support import (
    POOL_CREDITS,
    POOL_MAX_ACTIVE,
    Api,
    Launched,
    Longcall,
    Loopback,
    Owner,
    OwnerPool,
    Reply,
    create_owners,
    launch,
)
from longcall_client import AsyncClient, Client


@pytest.fixture(scope="session")
def receiver() -> Iterator[Loopback]:
    """Where the session's longcall may deliver notifications (an allowed plain-http origin): answers 204."""
    server = Loopback(lambda seen: Reply(204))
    yield server
    server.close()


@pytest.fixture(scope="session")
def launched(receiver: Loopback) -> Iterator[Launched]:
    running = launch("--credits", "1000000", "--max-active", "50", "--platform",
                     "--env", f"NOTIFY_ALLOWED_ORIGINS={receiver.url}")
    yield running
    code = running.stop()
    try:
        assert code == 0, f"the launcher exited {code}: {running.stderr()}"
    finally:
        running.discard()


@pytest.fixture(scope="session")
def longcall(launched: Launched) -> Longcall:
    return Longcall(**launched.ready)


@pytest.fixture(scope="session")
def owner_pool(longcall: Longcall) -> OwnerPool:
    return OwnerPool(longcall.database_url)


@pytest.fixture
def make_owner(longcall: Longcall, owner_pool: OwnerPool):
    """make_owner(): an owner of this test's own, with POOL_CREDITS and POOL_MAX_ACTIVE;
    make_owner(credits=N, max_active=M): one made to measure."""
    def make(credits: int | None = None, max_active: int | None = None) -> Owner:
        if credits is None and max_active is None:
            return owner_pool.take()
        return create_owners(longcall.database_url, 1, credits=credits if credits is not None else POOL_CREDITS,
                             max_active=max_active if max_active is not None else POOL_MAX_ACTIVE)[0]
    return make


@pytest.fixture
def make_platform(longcall: Longcall):
    """make_platform(): a platform owner of this test's own (an exact list of owners under it)."""
    def make() -> Owner:
        return create_owners(longcall.database_url, 1, credits=0, platform=True)[0]
    return make


@pytest_asyncio.fixture(params=["sync", "async"])
async def make_api(request: pytest.FixtureRequest, longcall: Longcall):
    """make_api(api_key=None, base_url=None, **client_kwargs) -> Api, for the client kind of this parameter."""
    made: list[Api] = []

    def make(api_key: str | None = None, base_url: str | None = None, **kwargs: Any) -> Api:
        cls = AsyncClient if request.param == "async" else Client
        client = cls(base_url or longcall.base_url, api_key or longcall.api_key, **kwargs)
        made.append(Api(client, request.param == "async"))
        return made[-1]

    yield make
    for api in made:
        await api.aclose()


@pytest.fixture
def api(make_api) -> Api:
    return make_api()


@pytest.fixture
def proxy(longcall):
    """`proxy(decide)`: a loopback proxy in front of the session's longcall that `decide`s each answer's fate."""
    started: list[Loopback] = []

    def start(decide) -> Loopback:
        started.append(Loopback(decide, upstream=longcall.base_url))
        return started[-1]

    yield start
    for server in started:
        server.close()
