"""The pure layer both clients share (longcall_client._core): the requests
it builds and its retry decisions. No network here."""
from __future__ import annotations

import httpx
import pytest
from longcall_client import (
    APIConnectionError,
    AsyncClient,
    Client,
    InternalError,
    LongcallError,
    NotFound,
    Unavailable,
    UnexpectedResponse,
)
from longcall_client import _core as core
from longcall_client.models import Job

KEY = "lc_pure-layer-key"


def config(**kw) -> core.Config:
    return core.Config(base_url=kw.pop("base_url", "http://h:1"), api_key=KEY, **kw)


def test_a_base_url_with_a_path_keeps_it():
    call = core.list_jobs(None, None, None, None)
    assert core.url_of(config(base_url="https://h/longcall/"), call) == "https://h/longcall/v1/jobs"
    assert core.url_of(config(base_url="https://h"), call) == "https://h/v1/jobs"


def test_ids_are_one_escaped_path_segment():
    assert core.get_job("../account", None, None).path == "/v1/jobs/%2E%2E%2Faccount"
    assert core.cancel_job("a b?c", None).path == "/v1/jobs/a%20b%3Fc/cancel"
    # As sent: no dot segment for httpx to resolve away.
    request = httpx.Request("POST", core.url_of(config(), core.cancel_job("..", None)))
    assert request.url.raw_path == b"/v1/jobs/%2E%2E/cancel"


def test_a_create_carries_one_key_for_all_its_sends():
    call = core.create_job("sim", "m", {"a": 1}, 5, None, None, None)
    key = call.headers["Idempotency-Key"]
    assert len(key) == 36 and call.resend == "safe" and "metadata" not in call.body
    assert core.create_job("sim", "m", {"a": 1}, 5, None, None, None).headers["Idempotency-Key"] != key
    assert core.create_job("sim", "m", {}, 5, {"k": 1}, "mine", "own_x").headers == {
        "Idempotency-Key": "mine", "Longcall-Owner": "own_x"}


def test_headers_owner_per_call_wins():
    headers = core.headers_of(config(owner="own_client"), core.get_account("own_call"))
    assert headers["Longcall-Owner"] == "own_call" and headers["Authorization"] == f"Bearer {KEY}"
    assert core.headers_of(config(owner="own_client"), core.get_account(None))["Longcall-Owner"] == "own_client"
    assert "Longcall-Owner" not in core.headers_of(config(), core.list_models(None))


def test_a_long_poll_gets_more_read_time():
    timeout = core.timeout_of(config(timeout=10), core.get_job("job_x", 30, None))
    assert timeout.read == 40 and timeout.connect == 10
    assert core.get_job("job_x", 2.5, None).params == {"wait": "2.5"}
    assert core.get_job("job_x", 0, None).params == {}


def test_what_is_sent_again():
    create = core.create_job("sim", "m", {}, 1, None, None, None)
    cancel = core.cancel_job("job_x", None)
    request = httpx.Request("POST", "http://h")
    lost = httpx.RemoteProtocolError("Server disconnected", request=request)
    refused = httpx.ConnectError("refused", request=request)
    assert core.delay_after_error(create, 0, 3, lost) is not None
    assert core.delay_after_error(cancel, 0, 3, lost) is None  # it may have happened
    assert core.delay_after_error(cancel, 0, 3, refused) is not None  # it surely did not
    assert core.delay_after_error(create, 3, 3, refused) is None  # bounded
    assert core.delay_after_status(create, 0, 3, 503, {"retry-after": "2"}) == 2
    assert core.delay_after_status(create, 0, 3, 503, {"retry-after": "3600"}) is None  # too long: raise it
    assert core.delay_after_status(create, 0, 3, 429, {}) is None
    assert core.delay_after_status(create, 0, 3, 400, {"retry-after": "1"}) is None
    assert core.delay_after_status(cancel, 0, 3, 503, {"retry-after": "0"}) is None
    assert 0 < core.delay_after_status(create, 2, 3, 502, {}) <= core.BACKOFF_CAP_S


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_the_key_is_checked_and_never_shown(cls):
    for bad in ("", "lc_with space", "lc_new\nline", "lc_é"):
        with pytest.raises(ValueError) as caught:
            cls("http://h", bad)
        assert not bad or bad not in str(caught.value)
    client = cls("http://h", KEY)
    assert KEY not in repr(client) and KEY not in repr(client._config)
    with pytest.raises(ValueError):
        cls("ftp://h", KEY)


RUNNING = Job.from_json({"id": "job_" + "a" * 24, "status": "running"})
NO_ANSWER = APIConnectionError("connection_error", "ConnectError: refused", None)
DOWN = Unavailable("unavailable", "the database is unavailable", 503, retry_after=3.0)
PROXY_PAGE = UnexpectedResponse("unexpected_response", "HTTP 502 without an API error body", 502)
BUG = InternalError("internal", "internal error", 500)
BUSY = LongcallError("rate_limited", "slow down", 429)
GONE = NotFound("not_found", "no such job", 404)
RAISE = "raise"


@pytest.mark.parametrize("error,remaining,seen,expected", [
    # no answer, or a server in trouble: poll again after a pause
    (NO_ANSWER, 10.0, None, core.WAIT_PAUSE_S),
    (NO_ANSWER, 10.0, RUNNING, core.WAIT_PAUSE_S),
    (DOWN, 10.0, None, 3.0),            # as the server asked
    (DOWN, 2.0, RUNNING, 2.0),          # never past the wait's end
    (PROXY_PAGE, 10.0, None, core.WAIT_PAUSE_S),
    (BUG, 10.0, None, core.WAIT_PAUSE_S),
    (BUSY, 0.5, None, 0.5),
    # at the end: the last job seen, or the error when no poll answered
    (NO_ANSWER, 0.0, RUNNING, RUNNING),
    (DOWN, -1.0, RUNNING, RUNNING),
    (NO_ANSWER, 0.0, None, RAISE),
    # about the job itself: at once
    (GONE, 10.0, RUNNING, RAISE),
    (GONE, 10.0, None, RAISE),
])
def test_what_a_wait_does_after_a_failed_poll(error, remaining, seen, expected):
    if expected == RAISE:
        with pytest.raises(type(error)):
            core.after_failed_poll(error, remaining, seen)
    else:
        assert core.after_failed_poll(error, remaining, seen) == expected
