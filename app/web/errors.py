"""API errors: one JSON shape, one status per code (CONTRACT.md)."""
from __future__ import annotations

from starlette.responses import JSONResponse

STATUS = {
    "unauthenticated": 401,
    "not_found": 404,
    "invalid_request": 400,
    "payload_too_large": 413,
    "unknown_provider": 422,
    "insufficient_credits": 402,
    "capacity_exhausted": 429,
    "idempotency_conflict": 409,
    "invalid_state": 409,
    "method_not_allowed": 405,
    "unavailable": 503,
    "internal": 500,
}


class ApiError(Exception):
    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS[self.code]


def error_response(code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=STATUS[code],
                        headers=headers)


def not_found(what: str = "job") -> ApiError:
    # The same answer for "missing" and "someone else's": owners learn nothing
    # about other owners' jobs.
    return ApiError("not_found", f"no such {what}")
