"""Outputs copied into a real S3-protocol server (moto in server mode), and
served to owners as short-lived presigned redirects."""
from __future__ import annotations

import hashlib
from urllib.parse import parse_qs, urlsplit

import httpx

from app.simulator.outputs import output_sha256
from tests.outbox.conftest import assert_money_balances, wait_for_status
from tests.support.s3 import RunningS3


async def test_outputs_land_in_s3_and_redirect(web, make_owner, db, sim, make_settings, start_settler):
    with RunningS3() as s3:
        bucket = s3.bucket("longcall-test")
        storage = {"STORAGE_URL": f"s3://{bucket}/prefix", "S3_ENDPOINT_URL": s3.endpoint_url}
        server = await web(SIM_URL=sim.url, **storage)
        await start_settler(make_settings(SIM_URL=sim.url, **storage))
        owner = await make_owner(credits=100)
        async with server.client(owner.api_key) as c:
            created = (await c.post("/v1/jobs", json={
                "provider": "sim", "model": "m", "max_credits": 10,
                "input": {"duration_s": 0.2, "outputs": 2, "output_bytes": 20 * 1024 * 1024}})).json()
            row = await wait_for_status(db, created["id"], "succeeded", timeout=60)
            job = (await c.get(f"/v1/jobs/{created['id']}")).json()
            for out in job["outputs"]:
                r = await c.get(out["url"])
                assert r.status_code == 302
                location = r.headers["location"]
                assert f"/prefix/outputs/{owner.owner_id}/{created['id']}/{out['index']}" in location
                assert int(parse_qs(urlsplit(location).query)["X-Amz-Expires"][0]) <= 60
                body = httpx.get(location, timeout=30).content
                assert hashlib.sha256(body).hexdigest() == out["sha256"] == \
                    output_sha256(row["provider_task_id"], out["index"], 20 * 1024 * 1024)
        await assert_money_balances(db)
