"""A job as the API shows it (CONTRACT.md: A job as JSON), from a row of
app/domain/jobs.py's reads or from the snapshot a notification keeps.
Nothing secret is ever read into the rows rendered here.

Shared by the web tier and the settler (a notification's `data` is this
JSON, rendered when it is sent, from the job as it was at its transition).
"""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from app.signing.tokens import make_read_token

READ_TOKEN_TTL_S = 24 * 3600
_TIMESTAMPS = ("created_at", "updated_at", "finished_at")


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def read_token(job_id: str, secret_key: bytes, now: float | None = None) -> str:
    """A read token for one job, valid for a day."""
    return make_read_token(job_id, secret_key, int(now if now is not None else time.time()) + READ_TOKEN_TTL_S)


def render_job(row: Any, read_token: str, *, token_in_urls: bool = False) -> dict:
    job_id = row["id"]
    suffix = f"?token={quote(read_token)}" if token_in_urls else ""
    outputs = [
        {"index": a["index"], "url": f"/v1/jobs/{job_id}/outputs/{a['index']}{suffix}",
         "content_type": a["content_type"], "bytes": a["bytes"], "sha256": a["sha256"],
         "label": a.get("label")}
        for a in row["outputs"]
    ]
    error = None
    if row["error_code"]:
        error = {"code": row["error_code"], "message": row["error_message"] or row["error_code"]}
    return {
        "id": job_id,
        "owner_id": row["owner_id"],
        "status": row["status"],
        "provider": row["provider"],
        "model": row["model"],
        "input": row["input"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "finished_at": iso(row["finished_at"]),
        "credits": {"reserved": row["credits_reserved"], "charged": row["credits_charged"],
                    "refunded": row["credits_refunded"]},
        "outputs": outputs,
        "error": error,
        "metadata": row["metadata"],
        "status_url": f"/v1/jobs/{job_id}?token={quote(read_token)}",
    }


def row_of_snapshot(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """A notification's job snapshot (JSON, written in SQL by
    app/domain/notifications.SNAPSHOT) as the row render_job reads."""
    row = dict(snapshot)
    for name in _TIMESTAMPS:
        value = row.get(name)
        row[name] = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    return row
