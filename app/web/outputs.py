"""How a stored output is served: its content type, and whether a browser
may show it inline. An output's type comes from a provider, so it is not
ours to trust: anything that could run in our origin (HTML, SVG, XML, PDF,
JavaScript, ...) is an attachment, and only passive media the browser
renders itself is inline. The response also carries `nosniff` and a
sandboxing CSP (app/web/jobs.py), so even a mislabelled file stays inert."""
from __future__ import annotations

import re

OCTET_STREAM = "application/octet-stream"

# Passive media only: decoded by the browser's own image/audio/video
# pipelines, never a document, so nothing in them can script our origin.
# Never image/svg+xml (a document with scripts) nor text/html.
INLINE_TYPES: dict[str, str] = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "image/avif": ".avif",
    "video/mp4": ".mp4",
    "video/webm": ".webm",
    "video/ogg": ".ogv",
    "audio/mpeg": ".mp3",
    "audio/mp4": ".m4a",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/wave": ".wav",
    "audio/ogg": ".ogg",
    "audio/webm": ".weba",
    "audio/flac": ".flac",
}
# Downloads worth a familiar extension; everything else gets none.
ATTACHMENT_EXTENSIONS: dict[str, str] = {
    "application/json": ".json",
    "text/plain": ".txt",
    "application/zip": ".zip",
    "model/gltf-binary": ".glb",
}

# `type/subtype` with optional `; name=value` parameters, RFC 9110 tokens
# only: anything else (a CR/LF, quotes, spaces inside) is not sent as a header.
_TOKEN = r"[A-Za-z0-9!#$%&'*+.^_`|~-]+"
_CONTENT_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:\s*;\s*{_TOKEN}={_TOKEN})*")


def served_type(content_type: str | None) -> str:
    """The Content-Type to send: the stored one when it is a well-formed
    media type, else application/octet-stream."""
    if content_type and len(content_type) <= 200 and _CONTENT_TYPE.fullmatch(content_type.strip()):
        return content_type.strip()
    return OCTET_STREAM


def essence(content_type: str | None) -> str:
    """`image/png` of `Image/PNG; q=1`: the type without parameters, lower case."""
    return served_type(content_type).split(";", 1)[0].strip().lower()


def disposition(content_type: str | None, stem: str) -> str:
    """Content-Disposition for an output of this type; `stem` is a safe file
    name without extension (`job_…-0`: hex, digits and `_-` only)."""
    kind = essence(content_type)
    if kind in INLINE_TYPES:
        return f'inline; filename="{stem}{INLINE_TYPES[kind]}"'
    return f'attachment; filename="{stem}{ATTACHMENT_EXTENSIONS.get(kind, "")}"'
