"""A job as the API shows it (CONTRACT.md). Nothing secret is ever read into
the rows rendered here."""
from __future__ import annotations

import datetime as dt
from urllib.parse import quote


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def render_job(row, read_token: str, *, token_in_urls: bool = False) -> dict:
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
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "finished_at": _iso(row["finished_at"]),
        "credits": {"reserved": row["credits_reserved"], "charged": row["credits_charged"],
                    "refunded": row["credits_refunded"]},
        "outputs": outputs,
        "error": error,
        "status_url": f"/v1/jobs/{job_id}?token={quote(read_token)}",
    }
