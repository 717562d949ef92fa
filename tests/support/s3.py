"""A real S3-protocol server for tests: moto in server mode on 127.0.0.1.

    with RunningS3() as s3:
        bucket = s3.bucket("outputs")           # creates it, returns the name
        storage = S3Storage(bucket, endpoint_url=s3.endpoint_url)

While running it points S3_ENDPOINT_URL at itself and sets dummy AWS
credentials and region (and hides any real AWS profile), so code that reads
the environment talks to it; stop() puts the environment back.
"""
from __future__ import annotations

import logging
import os

import httpx
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    # Never fall back to a developer's real profile or credentials files.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_UNSET = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SECURITY_TOKEN")


class RunningS3:
    def __init__(self) -> None:
        self._server: ThreadedMotoServer | None = None
        self._saved_env: dict[str, str | None] = {}
        self.endpoint_url = ""

    def start(self) -> RunningS3:
        # Port 0: the OS picks a free port, read back once it is bound (no race).
        # werkzeug logs every request at INFO on stderr; only problems are worth reading.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        changes: dict[str, str | None] = {**_ENV, "S3_ENDPOINT_URL": self.endpoint_url}
        changes.update({name: None for name in _UNSET})
        for name, value in changes.items():
            self._saved_env[name] = os.environ.get(name)
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        return self

    def stop(self) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def bucket(self, name: str) -> str:
        """Create a bucket (moto accepts the unsigned request) and return its name."""
        response = httpx.put(f"{self.endpoint_url}/{name}", timeout=10)
        if response.status_code != 200:
            raise RuntimeError(f"creating bucket {name!r} failed: HTTP {response.status_code} {response.text[:200]}")
        return name

    def reset(self) -> None:
        """Forget every bucket and object (moto's own reset endpoint)."""
        httpx.post(f"{self.endpoint_url}/moto-api/reset", timeout=10).raise_for_status()

    def __enter__(self) -> RunningS3:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
