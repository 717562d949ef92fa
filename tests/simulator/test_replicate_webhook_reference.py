"""The simulator's Replicate webhooks, verified by the reference libraries.

`python -m app.simulator` (as tests/support/simulator.py runs it, with its
default settings) sends a prediction's webhooks to a receiver on loopback;
`standardwebhooks.Webhook(secret)` and svix's `Webhook(secret)` must accept
every delivery as it arrived, with the secret exactly as
`GET /replicate/v1/webhooks/default/secret` hands it out. A Replicate user
verifies with these libraries, so the simulator may not sign any other way.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
import standardwebhooks
import svix.webhooks

from tests.support.simulator import RunningSimulator

from .helpers import Receiver

AUTH = {"Authorization": "Bearer r8_test"}


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with RunningSimulator() as running:
        yield running


def _secret(sim: RunningSimulator) -> str:
    response = httpx.get(f"{sim.url}/replicate/v1/webhooks/default/secret", headers=AUTH, timeout=10.0,
                         trust_env=False)
    assert response.status_code == 200
    return response.json()["key"]


def test_the_secret_is_one_the_reference_reads(sim: RunningSimulator) -> None:
    secret = _secret(sim)
    # Replicate's form, "whsec_" + standard base64 of the key (the simulator's
    # 32-byte key needs one "="; the reference pads for itself either way)
    assert secret.startswith("whsec_")
    key = base64.b64decode(secret[len("whsec_"):], validate=True)
    assert len(key) == 32
    # the reference derives that same key: its signature is HMAC-SHA256 under it
    mac = hmac.new(key, b"msg_1.1700000000.{}", hashlib.sha256).digest()
    at = datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert standardwebhooks.Webhook(secret).sign("msg_1", at, "{}") == "v1," + base64.b64encode(mac).decode()


def test_a_real_delivery_verifies_with_the_references(sim: RunningSimulator, receiver: Receiver) -> None:
    secret = _secret(sim)
    response = httpx.post(
        f"{sim.url}/replicate/v1/predictions", headers=AUTH, timeout=10.0, trust_env=False,
        json={"version": "owner/model:abc123", "input": {"duration_s": 0.2},
              "webhook": f"{receiver.url}/webhooks/replicate/job_1", "webhook_events_filter": ["start", "completed"]},
    )
    assert response.status_code == 201
    prediction = response.json()
    hooks = receiver.wait_for(2, timeout=10.0)
    assert [json.loads(h.body)["status"] for h in hooks] == ["starting", "succeeded"]
    for hook in hooks:
        # as it arrived on the wire: raw body bytes, the headers as sent
        assert standardwebhooks.Webhook(secret).verify(hook.body, hook.headers)["id"] == prediction["id"]
        svix.webhooks.Webhook(secret).verify(hook.body, hook.headers)
        # and the references refuse it once it is not what was signed
        with pytest.raises(standardwebhooks.WebhookVerificationError):
            standardwebhooks.Webhook(secret).verify(hook.body + b" ", hook.headers)
        with pytest.raises(standardwebhooks.WebhookVerificationError):
            standardwebhooks.Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(hook.body, hook.headers)
        with pytest.raises(svix.webhooks.WebhookVerificationError):
            svix.webhooks.Webhook(secret).verify(hook.body, {**hook.headers, "webhook-id": "msg_other"})
