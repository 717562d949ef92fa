"""How a console page is made: Jinja2 templates (autoescaped, every name
defined), the console's own two static files, and the headers every console
response carries. No asset comes from anywhere but longcall itself."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from app.web.console.session import Session

HERE = Path(__file__).parent
# The console's own files, read once: name -> (bytes, media type, version).
STATIC: dict[str, tuple[bytes, str, str]] = {
    path.name: (body := path.read_bytes(),
                "text/css; charset=utf-8" if path.suffix == ".css" else "text/javascript; charset=utf-8",
                hashlib.sha256(body).hexdigest()[:16])
    for path in sorted((HERE / "static").iterdir()) if path.suffix in (".css", ".js")
}
# No inline script or style at all, nothing from another origin, no framing,
# and forms post only to us.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
FRAGMENT_HEADER = "x-console-fragment"  # console.js asks for a page's live part only


def when(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def ago(value: dt.datetime | None, now: dt.datetime) -> str:
    if value is None:
        return "—"
    seconds = max(0, int((now - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    value = max(0.0, float(value))
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.0f} min" if value < 7200 else f"{value / 3600:.1f} h"


def pretty(value: Any) -> str:
    """JSON for reading (autoescaped where it is shown)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "), default=str)


def asset(name: str) -> str:
    return f"/console/static/{name}?v={STATIC[name][2]}"


ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
ENV.filters.update(when=when, ago=ago, seconds=seconds, pretty=pretty, compact=compact)
ENV.globals.update(asset=asset)


def page(request: Request, template: str, context: dict[str, Any], *, session: Session | None,
         status_code: int = 200) -> HTMLResponse:
    settings = request.app.state.settings
    body = ENV.get_template(template).render(
        **context,
        csrf=session.form_token(settings.secret_key) if session else None,
        path=request.url.path,
    )
    return HTMLResponse(body, status_code=status_code, headers=HEADERS)


def wants_fragment(request: Request) -> bool:
    return request.headers.get(FRAGMENT_HEADER) == "1"


def static_file(name: str, version: str | None) -> Response | None:
    found = STATIC.get(name)
    if found is None:
        return None
    body, media_type, current = found
    # A versioned URL never changes meaning: the browser may keep it.
    cache = "public, max-age=31536000, immutable" if version == current else "no-cache"
    return Response(body, media_type=media_type,
                    headers={**HEADERS, "Cache-Control": cache, "ETag": f'"{current}"'})
