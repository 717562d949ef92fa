"""Every error the server answers arrives as its own LongcallError subclass,
with code, message and status, and never with the API key in it."""
from __future__ import annotations

import uuid

import pytest
from client_support import FAST, SLOW
from longcall_client import (
    CapacityExhausted,
    IdempotencyConflict,
    InsufficientCredits,
    InternalError,
    InvalidRequest,
    InvalidState,
    LongcallError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
    UnexpectedResponse,
    UnknownProvider,
)
from longcall_client import _core as core
from longcall_client.errors import ERROR_CLASSES

MISSING_JOB = "job_" + "0" * 24


def assert_error(caught: pytest.ExceptionInfo[LongcallError], cls: type, code: str, status: int,
                 api_key: str) -> None:
    error = caught.value
    assert type(error) is cls, repr(error)
    assert error.code == code and error.status == status and error.message
    for text in (str(error), repr(error), *map(str, error.args)):
        assert api_key not in text


async def test_a_bad_key_is_unauthenticated(make_api):
    bad_key = "lc_not-a-real-key-0123456789abcdef"
    api = make_api(bad_key)
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-fast", FAST, max_credits=1)
    assert_error(caught, Unauthenticated, "unauthenticated", 401, bad_key)
    with pytest.raises(Unauthenticated):
        await api.account.get()


async def test_a_bad_body_is_invalid_request(api, longcall):
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-fast", FAST, max_credits=0)
    assert_error(caught, InvalidRequest, "invalid_request", 400, longcall.api_key)
    assert "max_credits" in caught.value.message
    with pytest.raises(InvalidRequest):
        await api.jobs.list(limit=1000)


@pytest.mark.parametrize("key", ["clé", "", "   ", "a\nb", "k" * 256])
async def test_a_key_that_is_not_printable_ascii_is_refused_before_anything_is_sent(api, longcall, key):
    before = await api.account.get()
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-fast", FAST, max_credits=1, idempotency_key=key)
    assert_error(caught, InvalidRequest, "invalid_request", None, longcall.api_key)
    assert await api.account.get() == before


async def test_an_unknown_provider(api, longcall):
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("no-such-provider", "m", {}, max_credits=1)
    assert_error(caught, UnknownProvider, "unknown_provider", 422, longcall.api_key)


async def test_too_many_credits_is_insufficient_credits(make_owner, make_api):
    owner = make_owner(credits=10)
    api = make_api(owner.api_key)
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-fast", FAST, max_credits=11)
    assert_error(caught, InsufficientCredits, "insufficient_credits", 402, owner.api_key)
    assert (await api.account.get()).credits.balance == 10  # nothing was held


async def test_the_same_key_with_another_body_is_a_conflict(api, longcall):
    key = f"conflict-{uuid.uuid4()}"
    job = await api.jobs.create("sim", "image-fast", FAST, max_credits=2, idempotency_key=key)
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-fast", {**FAST, "prompt": "another"}, max_credits=2,
                              idempotency_key=key)
    assert_error(caught, IdempotencyConflict, "idempotency_conflict", 409, longcall.api_key)
    await api.jobs.cancel(job.id)


async def test_cancel_twice_is_invalid_state(api, longcall):
    job = await api.jobs.create("sim", "image-slow", SLOW, max_credits=2)
    await api.jobs.cancel(job.id)
    with pytest.raises(LongcallError) as caught:
        await api.jobs.cancel(job.id)
    assert_error(caught, InvalidState, "invalid_state", 409, longcall.api_key)


async def test_not_found(api, longcall, make_owner, make_api, tmp_path):
    for call in (lambda: api.jobs.get(MISSING_JOB), lambda: api.jobs.cancel(MISSING_JOB),
                 lambda: api.jobs.download(MISSING_JOB, 0, tmp_path / "x")):
        with pytest.raises(LongcallError) as caught:
            await call()
        assert_error(caught, NotFound, "not_found", 404, longcall.api_key)
    # An id that is not even an id, with a slash: escaped into one path segment, still a 404 job.
    with pytest.raises(NotFound):
        await api.jobs.get("../../v1/account")
    # Another owner's job is "not found" too; an output index it does not have as well.
    job = await api.jobs.create("sim", "image-slow", SLOW, max_credits=2)
    other = make_api(make_owner().api_key)
    with pytest.raises(NotFound):
        await other.jobs.get(job.id)
    with pytest.raises(NotFound):
        await api.jobs.download(job.id, 5, tmp_path / "y")
    assert list(tmp_path.iterdir()) == []  # a failed download writes nothing
    await api.jobs.cancel(job.id)


async def test_a_body_over_1_mib_is_payload_too_large(api, longcall):
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-fast", {"prompt": "x" * (1024 * 1024 + 1)}, max_credits=1)
    assert_error(caught, PayloadTooLarge, "payload_too_large", 413, longcall.api_key)


async def test_a_full_owner_is_capacity_exhausted_with_retry_after(make_owner, make_api):
    owner = make_owner(credits=100, max_active=1)
    api = make_api(owner.api_key, max_retries=0)  # else the client waits for the slot itself
    running = await api.jobs.create("sim", "image-slow", SLOW, max_credits=2)
    with pytest.raises(LongcallError) as caught:
        await api.jobs.create("sim", "image-slow", SLOW, max_credits=2)
    assert_error(caught, CapacityExhausted, "capacity_exhausted", 429, owner.api_key)
    assert caught.value.retry_after == 5
    await api.jobs.cancel(running.id)


# ------------------------------------------------ the mapping itself (pure)

@pytest.mark.parametrize("code, cls, status", [
    ("unauthenticated", Unauthenticated, 401), ("not_found", NotFound, 404), ("invalid_request", InvalidRequest, 400),
    ("payload_too_large", PayloadTooLarge, 413), ("unknown_provider", UnknownProvider, 422),
    ("insufficient_credits", InsufficientCredits, 402), ("capacity_exhausted", CapacityExhausted, 429),
    ("idempotency_conflict", IdempotencyConflict, 409), ("invalid_state", InvalidState, 409),
    ("method_not_allowed", MethodNotAllowed, 405), ("unavailable", Unavailable, 503), ("internal", InternalError, 500),
])
def test_each_code_has_its_class(code, cls, status):
    body = f'{{"error": {{"code": "{code}", "message": "m"}}}}'.encode()
    error = core.answer_error(status, {"retry-after": "7"}, body)
    assert type(error) is cls and isinstance(error, LongcallError)
    assert (error.code, error.message, error.status, error.retry_after) == (code, "m", status, 7)


def test_every_contract_code_is_mapped():
    assert set(ERROR_CLASSES) == {"unauthenticated", "not_found", "invalid_request", "payload_too_large",
                                  "unknown_provider", "insufficient_credits", "capacity_exhausted",
                                  "idempotency_conflict", "invalid_state", "method_not_allowed", "unavailable",
                                  "internal"}


def test_an_unknown_code_is_the_base_class():
    error = core.answer_error(418, {}, b'{"error": {"code": "teapot", "message": "short and stout"}}')
    assert type(error) is LongcallError and error.code == "teapot" and error.status == 418


@pytest.mark.parametrize("body", [b"<html>bad gateway</html>", b"", b'{"error": "x"}', b"[1]", b'{"error": {}}'])
def test_an_answer_that_is_not_ours_is_unexpected_response(body):
    error = core.answer_error(502, {}, body)
    assert type(error) is UnexpectedResponse and error.status == 502 and b"html" not in str(error).encode()


@pytest.mark.parametrize("value, seconds", [("0", 0), ("5", 5), (" 12 ", 12), ("soon", None), ("-1", None),
                                            ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)])
def test_retry_after(value, seconds):
    assert core.parse_retry_after(value) == seconds
