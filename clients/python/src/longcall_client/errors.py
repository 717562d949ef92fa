"""One exception class per API error code (CONTRACT.md, "HTTP API").

Every error the server answers is a `LongcallError` with `code`, `message`
and `status`; the subclass says which code, so callers catch what they can
handle (`except InsufficientCredits:`) and let the rest through. A code this
library does not know yet is a plain `LongcallError`. Messages are the
server's (which never echoes credentials) or our own: no exception here ever
holds the API key.
"""
from __future__ import annotations


class LongcallError(Exception):
    """An error answer of the longcall API (or, for `APIConnectionError`, no answer at all)."""

    code: str = ""

    def __init__(self, code: str, message: str, status: int | None, *, retry_after: float | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        # Seconds the server asked us to wait (Retry-After), where it sent one.
        self.retry_after = retry_after
        # The Idempotency-Key the failed call sent (a create, a grant), the
        # one it generated included: the client's retries ran out, and the
        # server may have acted. Pass it as `idempotency_key` to send the
        # same request again without making a second job or grant.
        self.idempotency_key: str | None = None

    def __str__(self) -> str:
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}{status}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, status={self.status!r})"


class Unauthenticated(LongcallError):
    """401: no API key, or one that is not valid."""


class NotFound(LongcallError):
    """404: no such job/output/route, or another owner's; an owner not under this platform key
    (or any key that is not a platform's, on the owners API or with `owner=`)."""


class InvalidRequest(LongcallError):
    """400: the request is malformed (bad JSON, a missing field, a value out of range)."""


class PayloadTooLarge(LongcallError):
    """413: the request body is over 1 MiB."""


class UnknownProvider(LongcallError):
    """422: the provider is not one this server runs."""


class InsufficientCredits(LongcallError):
    """402: the balance does not cover `max_credits`, or a claw-back (a negative grant) exceeds it."""


class CapacityExhausted(LongcallError):
    """429: the owner's active jobs are at `max_active`; `retry_after` says when to try again."""


class IdempotencyConflict(LongcallError):
    """409: this Idempotency-Key was used with a different request."""


class InvalidState(LongcallError):
    """409: the job cannot do that now (e.g. cancel a terminal job)."""


class MethodNotAllowed(LongcallError):
    """405: the route does not take this method."""


class Unavailable(LongcallError):
    """503: the server cannot reach its database right now; `retry_after` says when to try again."""


class InternalError(LongcallError):
    """500: a bug on the server."""


class APIConnectionError(LongcallError):
    """No answer: the connection failed, was dropped or timed out (after the client's own retries).
    `code` is "connection_error", `status` None; the httpx exception is the `__cause__`."""


class UnexpectedResponse(LongcallError):
    """An answer that is not the API's (a proxy's error page, a body that is not JSON); `code` "unexpected_response"."""


ERROR_CLASSES: dict[str, type[LongcallError]] = {
    "unauthenticated": Unauthenticated,
    "not_found": NotFound,
    "invalid_request": InvalidRequest,
    "payload_too_large": PayloadTooLarge,
    "unknown_provider": UnknownProvider,
    "insufficient_credits": InsufficientCredits,
    "capacity_exhausted": CapacityExhausted,
    "idempotency_conflict": IdempotencyConflict,
    "invalid_state": InvalidState,
    "method_not_allowed": MethodNotAllowed,
    "unavailable": Unavailable,
    "internal": InternalError,
}


def error_for(code: str, message: str, status: int | None, *, retry_after: float | None = None) -> LongcallError:
    """The exception for an error code; unknown codes get the base class."""
    cls = ERROR_CLASSES.get(code, LongcallError)
    return cls(code, message, status, retry_after=retry_after)
