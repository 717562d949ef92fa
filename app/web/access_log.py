"""Our access log and request counter, replacing uvicorn's (which prints
query strings, where read tokens and capability tokens travel). Logs the
path only, with job ids kept (they are not secrets) and never a query.

The counter's labels are bounded whatever the client sends: the route is
the template of the route that matched (`/v1/jobs/{job_id}`), `other` when
none did, and the method one of a fixed few — never the raw path, which
anyone can make unique per request."""
from __future__ import annotations

import logging
import time

from app.metrics import HTTP_REQUESTS

log = logging.getLogger("longcall.access")

UNMATCHED = "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_label(scope) -> str:
    """The matched route's template (Starlette leaves the route in the scope,
    also for a 405 on a known path), or `other`."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


def method_label(method: str) -> str:
    return method if method in METHODS else UNMATCHED


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
            HTTP_REQUESTS.labels(method_label(scope["method"]), route_label(scope), str(status)).inc()
            if log.isEnabledFor(logging.INFO):
                log.info("request", extra={"method": scope["method"], "path": path, "status": status,
                                           "ms": round((time.perf_counter() - started) * 1000, 2)})
