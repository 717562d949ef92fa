"""The Python client of longcall: durable, paid calls to AI providers.

    from longcall_client import Client

    client = Client("http://127.0.0.1:8000", "lc_...")
    job = client.jobs.create("sim", "image-fast", {"prompt": "a lighthouse"}, max_credits=10)
    job = client.jobs.wait(job.id, timeout=120)
    client.jobs.download(job.id, 0, "lighthouse.png")

`AsyncClient` has the same calls for asyncio. Errors are `LongcallError`
subclasses, one per API error code; `verify_webhook` checks a notification.
A platform owner's key manages owners under it (`client.owners`) and acts
for one with `owner=` (the Longcall-Owner header) on any other call.
"""
from longcall_client._async import AsyncClient
from longcall_client._core import VERSION as __version__
from longcall_client._sync import Client
from longcall_client.errors import (
    APIConnectionError,
    CapacityExhausted,
    IdempotencyConflict,
    InsufficientCredits,
    InternalError,
    InvalidRequest,
    InvalidState,
    LongcallError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
    UnexpectedResponse,
    UnknownProvider,
)
from longcall_client.models import (
    TERMINAL_STATUSES,
    Account,
    AccountCredits,
    Credits,
    Delivery,
    DownloadedOutput,
    Event,
    Job,
    JobError,
    JobPage,
    JobStatus,
    Model,
    Notification,
    NotificationPage,
    Output,
    Owner,
    OwnerCredits,
    OwnerPage,
    WebhookEndpoint,
)
from longcall_client.webhooks import WebhookVerificationError, sign_webhook, verify_webhook

__all__ = [
    "TERMINAL_STATUSES", "APIConnectionError", "Account", "AccountCredits", "AsyncClient", "CapacityExhausted",
    "Client", "Credits", "Delivery", "DownloadedOutput", "Event", "IdempotencyConflict", "InsufficientCredits",
    "InternalError", "InvalidRequest", "InvalidState", "Job", "JobError", "JobPage", "JobStatus", "LongcallError",
    "MethodNotAllowed", "Model", "NotFound", "Notification", "NotificationPage", "Output", "Owner", "OwnerCredits",
    "OwnerPage", "PayloadTooLarge", "Unauthenticated", "Unavailable", "UnexpectedResponse", "UnknownProvider",
    "WebhookEndpoint",
    "WebhookVerificationError", "__version__", "sign_webhook", "verify_webhook",
]
