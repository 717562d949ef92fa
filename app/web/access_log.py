"""Our access log and request counter, replacing uvicorn's (which prints
query strings, where read tokens and capability tokens travel). Logs the
path only, with job ids kept (they are not secrets) and never a query."""
from __future__ import annotations

import logging
import re
import time

from app.metrics import HTTP_REQUESTS

log = logging.getLogger("longcall.access")
_JOB = re.compile(r"job_[0-9a-f]{24}")
_INDEX = re.compile(r"/outputs/\d+")


def route_of(path: str) -> str:
    """A low-cardinality label for a path."""
    route = _INDEX.sub("/outputs/{n}", _JOB.sub("{job_id}", path))
    return route if route.startswith(("/v1/", "/webhooks/", "/healthz", "/readyz", "/metrics", "/openapi")) \
        else "other"


class AccessLog:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            path = scope.get("path", "")
            HTTP_REQUESTS.labels(scope["method"], route_of(path), str(status)).inc()
            if log.isEnabledFor(logging.INFO):
                log.info("request", extra={"method": scope["method"], "path": path, "status": status,
                                           "ms": round((time.perf_counter() - started) * 1000, 2)})
