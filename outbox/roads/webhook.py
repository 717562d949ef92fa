"""Road 1 to a settle: a provider's signed webhook.

Every callback URL we register carries our capability token for (provider,
job) (Settings.callback_url), so a delivery must pass our check — first, on
the query alone, before any database read — and then the provider's own
scheme on the raw bytes. Then the only effect is a settle request (coalesced
into the job's open intent). The body is never parsed for state: the settle
step re-asks the provider. One thing only is taken from a verified delivery,
for a job whose submit is in doubt (no task id yet): the task id it names, as
a claim the settle step confirms with the provider before adopting it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import asyncpg

from app.config import CALLBACK_TOKEN
from app.domain import jobs
from app.providers.base import OFFLINE_WEBHOOK_SCHEMES, Provider, WebhookRequest
from app.signing.secretbox import SecretBox
from app.signing.tokens import check_capability_token
from app.vocabulary import TERMINAL, EventType, IntentKind, JobStatus
from outbox import intents

LOAD = "select status, provider_task_id, webhook_secret from jobs where id = $1 and provider = $2"

# A job in these states without a task id may be recovered by the task its
# own webhook names (the webhook can beat the submit's lost answer).
IN_DOUBT = (JobStatus.SUBMITTING, JobStatus.UNCERTAIN)


async def accept(pool: asyncpg.Pool, provider: Provider, secretbox: SecretBox, keys: Sequence[bytes],
                 job_id: str, headers: Mapping[str, str], query: Mapping[str, str], raw_body: bytes) -> bool:
    """True when the webhook is genuine and a settle was requested (or it
    is a stage report that asks for none: Suno's `text` and `first`). Every
    failure (no or another job's token, unknown job, closed job, bad
    signature) is the same False."""
    # Ours first: a pure HMAC check, so a delivery without our token costs no database read.
    if not check_capability_token(query.get(CALLBACK_TOKEN), provider.name, job_id, keys):
        return False
    if provider.facts.webhook_scheme in OFFLINE_WEBHOOK_SCHEMES:
        # Its verify is CPU alone: one checkout for the load, the verify and
        # the write (a pool call each is two checkouts: 9% of the
        # web tier's CPU per webhook: README, the ingest row).
        async with pool.acquire() as conn:
            return await _verify_and_request(conn, provider, secretbox, job_id, headers, query, raw_body)
    # No database connection is held while it verifies: such a scheme may
    # fetch its keys over the network (fal's JWKS, Replicate's secret), and
    # a flood of forged webhooks waiting on that must not drain the pool.
    return await _verify_and_request(pool, provider, secretbox, job_id, headers, query, raw_body)


async def _verify_and_request(db: asyncpg.Pool | asyncpg.Connection, provider: Provider, secretbox: SecretBox,
                              job_id: str, headers: Mapping[str, str], query: Mapping[str, str],
                              raw_body: bytes) -> bool:
    """The load, the provider's verify and the settle request, on `db`: the
    pool (a checkout per statement) or one connection held throughout."""
    row = await db.fetchrow(LOAD, job_id, provider.name)
    if row is None or row["status"] in TERMINAL:
        return False
    secret = secretbox.decrypt(row["webhook_secret"], job_id)
    webhook = WebhookRequest(job_id=job_id, headers=headers, query=query, raw_body=raw_body, job_secret=secret)
    if not await provider.verify(webhook):
        return False
    claimed = provider.webhook_task_id(webhook) if row["provider_task_id"] is None \
        and row["status"] in IN_DOUBT else None
    if claimed is None:
        if not provider.is_final_webhook(webhook):
            return True  # accepted; the end will come (its own webhook, or a timer)
        # One statement: requested only if the job is still open (closed
        # while we verified: nothing to do). Its commit does not wait for the
        # disk: lost in a database crash, it is a lost webhook, which the
        # job's own timer recovers (outbox/intents.REQUEST_UNFLUSHED).
        return await intents.request(db, job_id, IntentKind.SETTLE, line=EventType.WEBHOOK_ACCEPTED,
                                     wait_for_flush=False)
    async with _connection(db) as conn, conn.transaction():
        # The claim and its settle request together (the claim's statement
        # re-checks the job under its row lock).
        await jobs.claim_task(conn, job_id, claimed)
        return await intents.request(conn, job_id, IntentKind.SETTLE, line=EventType.WEBHOOK_ACCEPTED)


def _connection(db: asyncpg.Pool | asyncpg.Connection):
    """A connection from the pool, or the one already held."""
    return db.acquire() if isinstance(db, asyncpg.Pool) else contextlib.nullcontext(db)
