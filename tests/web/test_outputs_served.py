"""Outputs served from our origin cannot act in it: active types (HTML,
SVG, ...) are attachments, passive media inline, and every answer carries
nosniff and a sandboxing CSP; on S3 the presigned URL makes S3 answer with
the same type and disposition. Over real HTTP, with file storage and with a
local S3 server."""
from __future__ import annotations

import hashlib
import uuid
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from app.storage import object_key, open_storage
from tests.support.s3 import RunningS3

JOB = {"provider": "sim", "model": "image-fast", "input": {}, "max_credits": 10}
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.domain)</script></svg>'
HTML = b"<html><script>fetch('/v1/account')</script></html>"
PNG = b"\x89PNG\r\n\x1a\n not really"
# (stored type, bytes, served Content-Type, disposition)
OUTPUTS = [
    ("text/html", HTML, "text/html; charset=utf-8", "attachment"),
    ("image/svg+xml", SVG, "image/svg+xml", "attachment"),
    ("image/png", PNG, "image/png", "inline"),
    ("text/plain; charset=utf-8", b"hello", "text/plain; charset=utf-8", "attachment"),
    (None, b"?", "application/octet-stream", "attachment"),
    ("text/html\r\nSet-Cookie: x=1", HTML, "application/octet-stream", "attachment"),
]


async def job_with_outputs(server, owner, db, storage_url: str, tmp_path, s3_endpoint_url=None) -> str:
    async with server.client(owner.api_key) as c:
        job_id = (await c.post("/v1/jobs", json=JOB)).json()["id"]
    storage = open_storage(storage_url, s3_endpoint_url=s3_endpoint_url)
    try:
        for index, (content_type, data, _, _) in enumerate(OUTPUTS):
            key = object_key(owner.owner_id, job_id, index)
            source = tmp_path / f"out-{index}"
            source.write_bytes(data)
            sha = hashlib.sha256(data).hexdigest()
            # Stored untyped: what is served comes from the assets row (and on
            # S3 from the presigned URL), whatever the object itself says.
            await storage.put_file(key, str(source), None, sha, len(data))
            await db.execute("insert into assets (job_id, index, storage_key, bytes, sha256, content_type)"
                             " values ($1, $2, $3, $4, $5, $6)", job_id, index, key, len(data), sha, content_type)
    finally:
        await storage.aclose()
    return job_id


async def test_file_outputs_are_inert(web, make_owner, db, tmp_objects, tmp_path):
    server = await web()
    owner = await make_owner()
    job_id = await job_with_outputs(server, owner, db, f"file://{tmp_objects}", tmp_path)
    async with server.client(owner.api_key) as c:
        token_url = (await c.get(f"/v1/jobs/{job_id}")).json()["status_url"]
        for index, (_, data, served, kind) in enumerate(OUTPUTS):
            r = await c.get(f"/v1/jobs/{job_id}/outputs/{index}")
            assert r.status_code == 200 and r.content == data
            assert r.headers["content-type"] == served, index
            assert r.headers["content-disposition"].split(";")[0] == kind, index
            assert f'filename="{job_id}-{index}' in r.headers["content-disposition"]
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["content-security-policy"] == "sandbox"
            assert "set-cookie" not in r.headers
    async with server.client() as anon:  # the read token's CORS answer carries the same protections
        token = token_url.split("token=")[1]
        r = await anon.get(f"/v1/jobs/{job_id}/outputs/1", params={"token": token})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
        assert r.headers["content-disposition"].startswith("attachment")
        assert r.headers["content-security-policy"] == "sandbox"
        assert r.headers["x-content-type-options"] == "nosniff"


@pytest.fixture(scope="module")
def running_s3():
    with RunningS3() as s3:
        yield s3


async def test_s3_presigned_urls_carry_type_and_disposition(web, make_owner, db, running_s3, tmp_path):
    bucket = running_s3.bucket(f"web-{uuid.uuid4().hex[:12]}")
    storage_url = f"s3://{bucket}/pre"
    server = await web(STORAGE_URL=storage_url, S3_ENDPOINT_URL=running_s3.endpoint_url)
    owner = await make_owner()
    job_id = await job_with_outputs(server, owner, db, storage_url, tmp_path, running_s3.endpoint_url)
    async with server.client(owner.api_key) as c:
        for index, (_, data, served, kind) in enumerate(OUTPUTS):
            r = await c.get(f"/v1/jobs/{job_id}/outputs/{index}")
            assert r.status_code == 302
            assert r.headers["x-content-type-options"] == "nosniff"
            location = r.headers["location"]
            query = parse_qs(urlsplit(location).query)
            # the S3 type is what we send ourselves (no charset added: S3 sends it verbatim)
            assert query["response-content-type"] == [served.replace("; charset=utf-8", "")
                                                      if served.startswith("text/html") else served]
            disposition = query["response-content-disposition"][0]
            assert disposition.split(";")[0] == kind and f'filename="{job_id}-{index}' in disposition
            direct = httpx.get(location)
            assert direct.status_code == 200 and direct.content == data
            assert direct.headers["content-disposition"] == disposition
            assert direct.headers["content-type"] == query["response-content-type"][0]
