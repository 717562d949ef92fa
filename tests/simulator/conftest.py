"""One in-process simulator and one webhook receiver for the whole
directory; every test starts from a reset simulator and an empty receiver."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.simulator import create_app

from .helpers import Receiver, ServedApp

# Short retry delays and hold keep the retry and timeout tests fast; the
# behaviour is the same as with the defaults (1, 2, 4 s and 60 s).
RETRY_DELAYS = (0.2, 0.4, 0.8)
HOLD_S = 1.0


@pytest.fixture(scope="session")
def sim_server() -> Iterator[ServedApp]:
    # With its lifespan: the simulator's shutdown closes its webhook client.
    served = ServedApp(create_app(webhook_retry_delays=RETRY_DELAYS, hold_s=HOLD_S), lifespan="on").start()
    yield served
    served.stop()


@pytest.fixture(scope="session")
def sim_url(sim_server: ServedApp) -> str:
    return sim_server.url


@pytest.fixture(scope="session")
def _receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver.server.start()
    yield receiver
    receiver.server.stop()


@pytest.fixture
def receiver(_receiver: Receiver) -> Receiver:
    return _receiver


@pytest.fixture(scope="session")
def _client(sim_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_url, timeout=10.0, trust_env=False) as client:
        yield client


@pytest.fixture
def client(_client: httpx.Client) -> httpx.Client:
    return _client


@pytest.fixture(autouse=True)
def _fresh(_client: httpx.Client, _receiver: Receiver) -> None:
    _client.post("/_sim/reset").raise_for_status()
    _receiver.clear()
