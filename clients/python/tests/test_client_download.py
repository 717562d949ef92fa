"""Downloads that go through a redirect to storage (a presigned URL): the
API key goes to longcall only, never to where the redirect points, and a
broken or short download leaves no file behind."""
from __future__ import annotations

import hashlib

import httpx
import pytest
from client_support import Loopback, Reply, launch
from longcall_client import LongcallError, UnexpectedResponse

JOB = "job_" + "c" * 24
KEY = "lc_the-api-key-for-longcall-only"
PAYLOAD = bytes(range(256)) * 1000


@pytest.fixture
def servers():
    started: list[Loopback] = []

    def start(decide) -> Loopback:
        started.append(Loopback(decide))
        return started[-1]

    yield start
    for server in started:
        server.close()


def storage_answer(seen):
    if seen.path.startswith("/bucket/out?X-Signature=abc"):
        return Reply(200, PAYLOAD, {"content-type": "image/png"})
    return Reply(403, b"<Error>signature</Error>", {"content-type": "application/xml"})


async def test_a_redirect_to_another_origin_gets_no_key(servers, make_api, tmp_path):
    storage = servers(storage_answer)
    api_server = servers(lambda seen: Reply(302, b"", {"location": f"{storage.url}/bucket/out?X-Signature=abc"}))
    api = make_api(KEY, base_url=api_server.url)
    saved = await api.jobs.download(JOB, 0, tmp_path / "out.png")
    assert (tmp_path / "out.png").read_bytes() == PAYLOAD
    assert saved.bytes == len(PAYLOAD) and saved.sha256 == hashlib.sha256(PAYLOAD).hexdigest()
    assert saved.content_type == "image/png"
    [to_api] = api_server.seen
    assert to_api.path == f"/v1/jobs/{JOB}/outputs/0" and to_api.headers["authorization"] == f"Bearer {KEY}"
    [to_storage] = storage.seen
    assert "authorization" not in to_storage.headers and "longcall-owner" not in to_storage.headers
    assert all(KEY not in value for value in to_storage.headers.values())


async def test_a_redirect_to_the_same_origin_gets_no_key_either(servers, make_api, tmp_path):
    def both(seen):
        if seen.path.startswith("/v1/"):
            return Reply(302, b"", {"location": "/bucket/out?X-Signature=abc"})  # relative: the same origin
        return storage_answer(seen)
    server = servers(both)
    api = make_api(KEY, base_url=server.url, owner="own_x")
    await api.jobs.download(JOB, 0, tmp_path / "out.png")
    assert (tmp_path / "out.png").read_bytes() == PAYLOAD
    to_api, to_storage = server.seen
    assert to_api.headers["authorization"] == f"Bearer {KEY}" and to_api.headers["longcall-owner"] == "own_x"
    assert "authorization" not in to_storage.headers and "longcall-owner" not in to_storage.headers


async def test_storage_refusing_is_an_error_and_no_file(servers, make_api, tmp_path):
    storage = servers(storage_answer)
    api_server = servers(lambda seen: Reply(302, b"", {"location": f"{storage.url}/bucket/expired"}))
    api = make_api(KEY, base_url=api_server.url)
    with pytest.raises(UnexpectedResponse) as caught:
        await api.jobs.download(JOB, 0, tmp_path / "out.png")
    assert caught.value.status == 403
    assert list(tmp_path.iterdir()) == []


async def test_bytes_that_do_not_match_the_sha256_are_refused(servers, make_api, tmp_path):
    wrong = '"' + "0" * 64 + '"'  # longcall's ETag is the output's sha256
    server = servers(lambda seen: Reply(200, PAYLOAD, {"content-type": "image/png", "etag": wrong}))
    api = make_api(KEY, base_url=server.url)
    (tmp_path / "out.png").write_bytes(b"the old file")
    with pytest.raises(LongcallError, match="sha256"):
        await api.jobs.download(JOB, 0, tmp_path / "out.png")
    assert (tmp_path / "out.png").read_bytes() == b"the old file"  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]

    right = '"' + hashlib.sha256(PAYLOAD).hexdigest() + '"'
    server.decide = lambda seen: Reply(200, PAYLOAD, {"content-type": "image/png", "etag": right})
    await api.jobs.download(JOB, 0, tmp_path / "out.png")
    assert (tmp_path / "out.png").read_bytes() == PAYLOAD


@pytest.fixture(scope="module")
def s3_longcall():
    """A second longcall whose outputs are in S3 (moto's server on loopback)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        httpx.put(f"{endpoint}/client-outputs", timeout=30).raise_for_status()
        env = {"STORAGE_URL": "s3://client-outputs/outputs", "S3_ENDPOINT_URL": endpoint,
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
        running = launch(*(arg for name, value in env.items() for arg in ("--env", f"{name}={value}")))
        try:
            yield running.ready
        finally:
            code = running.stop()
            stderr = running.stderr()
            running.discard()
            assert code == 0, stderr
    finally:
        moto.stop()


async def test_a_download_from_real_s3_storage(make_api, tmp_path, s3_longcall):
    """The real thing: longcall on S3 storage (moto) answers a 302 to a presigned URL."""
    api = make_api(s3_longcall["api_key"], base_url=s3_longcall["base_url"])
    job = await api.jobs.create("sim", "image-fast", {"prompt": "s3", "duration_s": 0.3, "output_bytes": 50_000},
                                max_credits=2)
    job = await api.jobs.wait(job.id, 120)
    assert job.status == "succeeded", job.raw
    # It is a redirect indeed (to the S3 endpoint, presigned), not bytes served by longcall.
    async with httpx.AsyncClient(timeout=30) as plain:
        direct = await plain.get(s3_longcall["base_url"] + job.outputs[0].url,
                                 headers={"Authorization": f"Bearer {s3_longcall['api_key']}"})
    assert direct.status_code == 302 and "X-Amz-Signature=" in direct.headers["location"]
    saved = await api.jobs.download(job.id, 0, tmp_path / "s3.png")
    assert saved.bytes == job.outputs[0].bytes == 50_000
    assert saved.sha256 == job.outputs[0].sha256 == hashlib.sha256((tmp_path / "s3.png").read_bytes()).hexdigest()
