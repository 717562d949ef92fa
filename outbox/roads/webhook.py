"""Road 1 to a settle: a provider's signed webhook.

Verified at arrival with the provider's own scheme on the raw bytes; then the
only effect is a settle request (coalesced into the job's open intent). The
body is never parsed for state: the settle step re-asks the provider.
"""
from __future__ import annotations

from collections.abc import Mapping

from app.providers.base import Provider, WebhookRequest
from app.signing.secretbox import SecretBox
from app.vocabulary import TERMINAL, IntentKind
from outbox import intents

LOAD = "select status, webhook_secret from jobs where id = $1 and provider = $2"


async def accept(pool, provider: Provider, secretbox: SecretBox, job_id: str,
                 headers: Mapping[str, str], query: Mapping[str, str], raw_body: bytes) -> bool:
    """True when the webhook is genuine and a settle was requested. Every
    failure (unknown job, closed job, bad signature) is the same False."""
    row = await pool.fetchrow(LOAD, job_id, provider.name)
    if row is None or row["status"] in TERMINAL:
        return False
    secret = secretbox.decrypt(row["webhook_secret"], job_id)
    webhook = WebhookRequest(job_id=job_id, headers=headers, query=query, raw_body=raw_body,
                             job_secret=secret)
    # No database connection is held here: a scheme may fetch its keys over
    # the network (fal's JWKS, Replicate's secret), and a flood of forged
    # webhooks waiting on that must not drain the pool.
    if not await provider.verify(webhook):
        return False
    # One statement: requested only if the job is still open (closed while
    # we verified: nothing to do).
    return await intents.request(pool, job_id, IntentKind.SETTLE)
