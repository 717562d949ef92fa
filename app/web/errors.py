"""API errors: one JSON shape, one status per code (CONTRACT.md). The codes
and their statuses are app/vocabulary.py's, so this module, the OpenAPI
document and the contract cannot drift apart."""
from __future__ import annotations

from starlette.responses import JSONResponse

from app.vocabulary import API_ERROR_STATUS, ApiErrorCode


class ApiError(Exception):
    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = ApiErrorCode(code)  # an unknown code is a bug here, not a 500 later
        self.message = message
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return API_ERROR_STATUS[self.code]


def error_response(code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    code = ApiErrorCode(code)
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=API_ERROR_STATUS[code],
                        headers=headers)


def not_found(what: str = "job") -> ApiError:
    # The same answer for "missing" and "someone else's": owners learn nothing
    # about other owners' jobs.
    return ApiError(ApiErrorCode.NOT_FOUND, f"no such {what}")
