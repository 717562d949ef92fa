"""The ElevenLabs dubbing adapter: its pure decisions held to the API's
documented bodies, then the adapter over real HTTP against the simulator's
/elevenlabs protocol and, for answers the simulator does not give, a scripted
ElevenLabs on loopback.

Sources of the bodies below:
- create: https://elevenlabs.io/docs/api-reference/dubbing/create (the
  answer example `{"dubbing_id": "21m00Tcm4TlvDq8ikWAM",
  "expected_duration_sec": 127.5}`);
- get and list: https://elevenlabs.io/docs/api-reference/dubbing/get and
  .../dubbing/list (the list's example dub, status `preparing`), and
  elevenlabs-python's types/dubbing_metadata_response.py,
  types/dubbing_media_metadata.py, dubbing/types/*_statuses_item.py (the
  five status values);
- errors: https://elevenlabs.io/docs/eleven-api/resources/errors (the
  current shape and its example), and the research brief's live answers
  (shared/research/providers.md 4.3: the legacy `quota_exceeded` 401, the
  FastAPI 422 list).
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.download import DownloadPolicy, Refused, download_to_file
from app.providers.base import (
    Observation,
    Rejected,
    SubmitRequest,
    Task,
    TaskState,
    Transient,
    Uncertain,
    Usage,
    UsageUnit,
    WebhookRequest,
)
from app.providers.elevenlabs import (
    ElevenLabsProvider,
    check_model,
    form_fields,
    form_value,
    observation_from_dub,
    page_matches,
    reaches_back_to,
    submitted_from,
)
from app.providers.http import Secrets
from app.simulator import output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults, stats

from .scripted import Script

KEY = "sk_elevenlabs_adapter_test_key_0123"
SECRETS = Secrets(KEY)
BASE = "https://api.elevenlabs.io"
SOURCE = "https://media.example.com/talks/keynote.mp4"
TIMEOUT_S = 1.0

# The create answer's documented example.
CREATE_EXAMPLE = {"dubbing_id": "21m00Tcm4TlvDq8ikWAM", "expected_duration_sec": 127.5}
# The list page's documented example dub (.../dubbing/list), as a get answers it.
LISTED_EXAMPLE = {"dubbing_id": "string", "name": "string", "status": "preparing", "source_language": "string",
                  "target_languages": ["string"], "created_at": "2024-01-15T09:30:00Z", "editable": False,
                  "media_metadata": {"content_type": "string", "duration": 1.1}, "error": "string"}
# A dubbed dub built from DubbingMetadataResponse's field list.
DUBBED = {"dubbing_id": "21m00Tcm4TlvDq8ikWAM", "name": "job_1", "status": "dubbed", "source_language": "en",
          "target_languages": ["es"], "editable": False, "created_at": "2024-01-15T09:30:00Z",
          "media_metadata": {"content_type": "video/mp4", "duration": 127.5}, "error": None}


def task(task_id: str = "21m00Tcm4TlvDq8ikWAM", languages: list[str] | None = None) -> Task:
    return Task(task_id=task_id, operation={"target_languages": languages} if languages else None, model="dubbing")


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def dub_request(job_id: str | None = None, model: str = "dubbing", **input) -> SubmitRequest:
    job_input = {"source_url": SOURCE, "target_lang": "es", **input}
    return SubmitRequest(job_id=job_id or new_job_id(), model=model, input=job_input, callback_url=None)


# ================================================================== pure


@pytest.mark.parametrize("model", ["text-to-speech/JBFqnCBsd6RMkjVDRZzb", "sound-generation", "", "Dubbing"])
def test_only_the_dubbing_model_is_taken(model):
    check_model("dubbing")
    with pytest.raises(Rejected) as caught:
        check_model(model)
    assert str(caught.value).startswith("elevenlabs: model must be dubbing; ")


@pytest.mark.parametrize(("value", "text"), [
    ("es", "es"), ("", ""), (True, "true"), (False, "false"), (0, "0"), (2, "2"), (0.5, "0.5"), (29.97, "29.97"),
    (1e20, "1e+20"), ({"a": 1}, None), ([1], None), (float("nan"), None), (float("inf"), None),
])
def test_a_json_value_as_a_form_field(value, text):
    assert form_value(value) == text


def test_the_form_is_the_input_named_after_the_job():
    fields = form_fields({"source_url": SOURCE, "target_lang": "es", "num_speakers": 2, "watermark": True,
                          "target_accent": None, "duration_s": 0.4}, "job_abc")
    assert fields == [("name", "job_abc"), ("source_url", SOURCE), ("target_lang", "es"), ("num_speakers", "2"),
                      ("watermark", "true"), ("duration_s", "0.4")]


@pytest.mark.parametrize(("job_input", "says"), [
    ({"target_lang": "es"}, "input.source_url is required"),
    ({"source_url": "", "target_lang": "es"}, "input.source_url is required"),
    ({"source_url": 3, "target_lang": "es"}, "input.source_url is required"),
    ({"source_url": SOURCE, "file": "clip.mp4"}, "input.file: file uploads are not supported"),
    ({"source_url": SOURCE, "csv_file": "t.csv"}, "input.csv_file: file uploads are not supported"),
    ({"source_url": SOURCE, "background_audio_file": "b.wav"}, "input.background_audio_file: file uploads"),
    ({"source_url": SOURCE, "name": "my dub"}, "input.name is set by longcall"),
    ({"source_url": SOURCE, "target_lang": ["es", "fr"]}, "input.target_lang must be a string, a number or"),
])
def test_what_cannot_be_a_dub_of_a_url_is_refused_before_sending(job_input, says):
    with pytest.raises(Rejected) as caught:
        form_fields(job_input, "job_abc")
    assert says in str(caught.value)


def test_the_create_answer_names_the_task():
    submitted = submitted_from(CREATE_EXAMPLE, {"target_languages": ["es"]})
    assert submitted.task_id == "21m00Tcm4TlvDq8ikWAM" and submitted.operation == {"target_languages": ["es"]}
    for body in ({}, {"dubbing_id": ""}, {"dubbing_id": 7}, {"dubbing_id": "has space"}):
        with pytest.raises(Uncertain):
            submitted_from(body, None)


@pytest.mark.parametrize("status", ["queued", "preparing", "dubbing"])
def test_a_dub_in_progress_is_running(status):
    assert observation_from_dub({**LISTED_EXAMPLE, "status": status}, task(), BASE, SECRETS) == Observation(
        state=TaskState.RUNNING)


def test_a_dubbed_dub_is_one_labelled_output_per_language_with_its_media_length():
    seen = observation_from_dub(DUBBED, task(), BASE, SECRETS)
    assert seen == Observation(
        state=TaskState.SUCCEEDED,
        output_urls=("https://api.elevenlabs.io/v1/dubbing/21m00Tcm4TlvDq8ikWAM/audio/es",),
        url_labels=("es",),
        usage=(Usage(UsageUnit.SECONDS, 127.5),),
    )
    # One dub can hold several languages (added in Dubbing Studio): each is an output.
    two = observation_from_dub({**DUBBED, "target_languages": ["es", "fr", "es"], "media_metadata": None},
                               task(), BASE, SECRETS)
    assert two.url_labels == ("es", "fr") and two.usage == ()
    assert two.output_urls[1] == "https://api.elevenlabs.io/v1/dubbing/21m00Tcm4TlvDq8ikWAM/audio/fr"
    # Ids and codes are path segments, escaped.
    odd = observation_from_dub({**DUBBED, "target_languages": ["pt/BR"]}, task("a b"), BASE, SECRETS)
    assert odd.output_urls == ("https://api.elevenlabs.io/v1/dubbing/a%20b/audio/pt%2FBR",)


def test_a_dubbed_dub_listing_no_language_uses_the_requested_one_or_fails():
    seen = observation_from_dub({**DUBBED, "target_languages": []}, task(languages=["de"]), BASE, SECRETS)
    assert seen.url_labels == ("de",) and seen.state is TaskState.SUCCEEDED
    none = observation_from_dub({**DUBBED, "target_languages": [""]}, task(), BASE, SECRETS)
    assert none.state is TaskState.FAILED and none.output_urls == () and none.error


@pytest.mark.parametrize(("media", "usage"), [
    ({"content_type": "audio/mpeg", "duration": 0}, (Usage(UsageUnit.SECONDS, 0.0),)),
    ({"content_type": "audio/mpeg", "duration": -1}, ()),
    ({"content_type": "audio/mpeg", "duration": True}, ()),
    ({"content_type": "audio/mpeg"}, ()),
    ("3 s", ()),
])
def test_usage_is_the_media_length_when_it_is_one(media, usage):
    assert observation_from_dub({**DUBBED, "media_metadata": media}, task(), BASE, SECRETS).usage == usage


def test_a_failed_dub_says_why_masked():
    seen = observation_from_dub({**LISTED_EXAMPLE, "status": "failed", "error": f"bad key {KEY} for source"},
                                task(), BASE, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "bad key [redacted] for source"
    quiet = observation_from_dub({**LISTED_EXAMPLE, "status": "failed", "error": None}, task(), BASE, SECRETS)
    assert quiet.error == "the dub failed"


def test_an_unknown_status_is_a_read_to_repeat():
    with pytest.raises(Transient, match="unknown dub status"):
        observation_from_dub({**DUBBED, "status": "rendering"}, task(), BASE, SECRETS)


def test_list_pages_are_matched_by_name_and_read_back_to_the_window():
    page = [{**DUBBED, "dubbing_id": "a", "name": "job_1", "created_at": "2024-01-15T09:30:00Z"},
            {**DUBBED, "dubbing_id": "b", "name": "job_2", "created_at": "2024-01-15T09:29:00Z"},
            {**DUBBED, "dubbing_id": "bad id", "name": "job_1"}, "not a dub"]
    assert page_matches(page, "job_1") == ["a"]
    assert page_matches(page, "job_3") == []
    since = datetime(2024, 1, 15, 9, 29, 30, tzinfo=UTC)
    assert reaches_back_to(page, since)
    assert not reaches_back_to(page[:1], since)
    assert not reaches_back_to([{"created_at": "yesterday"}], since)


def test_facts_polled_no_cancel_findable_key_for_its_own_host_only():
    provider = ElevenLabsProvider(BASE, KEY)
    facts = provider.facts
    assert (facts.webhook_scheme, facts.can_cancel, facts.can_find, facts.idempotent_submit) == (
        "none", False, True, False)
    assert facts.output_hosts == facts.credential_hosts == ("api.elevenlabs.io",)
    assert facts.poll_delays_s[0] >= 10 and max(facts.poll_delays_s) <= 30
    assert provider.download_credentials() == {"xi-api-key": KEY}
    assert ElevenLabsProvider(BASE, None).download_credentials() == {}
    assert KEY not in repr(provider)


async def test_no_webhook_is_ever_ours():
    provider = ElevenLabsProvider(BASE, KEY)
    hook = WebhookRequest(job_id="job_1", headers={}, query={}, raw_body=b'{"dubbing_id": "x"}')
    assert await provider.verify(hook) is False
    assert provider.webhook_task_id(hook) is None


# ================================================================== against the simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    from app.simulator import create_app

    # A short hold: a lost create answer is dropped soon after the adapter gave up.
    served = ServedApp(create_app(hold_s=2.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
async def adapter(simulator):
    clear_faults(simulator)
    provider = ElevenLabsProvider(f"{simulator}/elevenlabs", KEY, timeout_s=TIMEOUT_S)
    yield provider
    await provider.aclose()
    clear_faults(simulator)


async def wait_until_final(adapter: ElevenLabsProvider, dub: Task, timeout_s: float = 10.0) -> Observation:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await adapter.status(dub)
        if seen.state is not TaskState.RUNNING or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.05)


def task_of(request: SubmitRequest, submitted) -> Task:
    return Task(task_id=submitted.task_id, operation=submitted.operation, model=request.model)


def dubs_named(simulator: str, name: str) -> list[dict]:
    page = httpx.get(f"{simulator}/elevenlabs/v1/dubbing", params={"page_size": 200},
                     headers={"xi-api-key": KEY}, trust_env=False).json()
    return [d for d in page["dubs"] if d["name"] == name]


async def test_submit_runs_then_succeeds_with_its_language_audio(adapter, simulator):
    request = dub_request(duration_s=0.4, output_bytes=5000, num_speakers=1, watermark=False)
    submitted = await adapter.submit(request, request.job_id)
    assert submitted.operation == {"target_languages": ["es"]}
    (made,) = dubs_named(simulator, request.job_id)  # named after the job
    assert made["dubbing_id"] == submitted.task_id
    dub = task_of(request, submitted)
    assert (await adapter.status(dub)).state is TaskState.RUNNING
    final = await wait_until_final(adapter, dub)
    assert final.state is TaskState.SUCCEEDED and final.url_labels == ("es",) and final.error is None
    (url,) = final.output_urls
    assert url == f"{simulator}/elevenlabs/v1/dubbing/{submitted.task_id}/audio/es"
    async with httpx.AsyncClient(trust_env=False) as client:
        assert (await client.get(url)).status_code == 401  # the audio needs the key
        response = await client.get(url, headers=adapter.download_credentials())
    assert hashlib.sha256(response.content).hexdigest() == output_sha256(submitted.task_id, 0, 5000)


async def test_a_failed_dub_is_failed_with_a_reason(adapter):
    request = dub_request(duration_s=0.1, outcome="failed")
    submitted = await adapter.submit(request, request.job_id)
    final = await wait_until_final(adapter, task_of(request, submitted))
    assert final.state is TaskState.FAILED and final.error and final.output_urls == ()


async def test_refusals_before_sending_create_nothing(adapter, simulator):
    before = stats(simulator)["tasks_created"]
    for request, says in ((dub_request(model="text-to-speech/JBFqnCBsd6RMkjVDRZzb"), "model must be dubbing"),
                          (dub_request(model="sound-generation"), "model must be dubbing"),
                          (dataclasses.replace(dub_request(), input={"target_lang": "es"}), "source_url"),
                          (dub_request(file="clip.mp4"), "file uploads")):
        with pytest.raises(Rejected, match=says):
            await adapter.submit(request, request.job_id)
    assert stats(simulator)["tasks_created"] == before


async def test_what_the_api_refuses_is_rejected_and_creates_nothing(adapter, simulator):
    before = stats(simulator)["tasks_created"]
    missing = dataclasses.replace(dub_request(), input={"source_url": SOURCE})
    with pytest.raises(Rejected, match="HTTP 422.*target_lang"):
        await adapter.submit(missing, missing.job_id)
    bad_control = dub_request(duration_s="soon")
    with pytest.raises(Rejected, match="duration_s"):
        await adapter.submit(bad_control, bad_control.job_id)
    assert stats(simulator)["tasks_created"] == before


async def test_an_unknown_dub_is_rejected(adapter):
    with pytest.raises(Rejected, match="no such dub"):
        await adapter.status(task("nosuchdub0123456789"))


async def test_cancel_is_a_no_op_the_dub_runs_on(adapter):
    request = dub_request(duration_s=30)
    submitted = await adapter.submit(request, request.job_id)
    await adapter.cancel(task_of(request, submitted))
    assert (await adapter.status(task_of(request, submitted))).state is TaskState.RUNNING


async def test_an_in_doubt_submit_is_found_by_its_name(adapter, simulator):
    set_faults(simulator, submit_timeout_after_create=1)
    request = dub_request(duration_s=30)
    started = time.monotonic()
    with pytest.raises(Uncertain):
        await adapter.submit(request, request.job_id)
    assert time.monotonic() - started < TIMEOUT_S + 2
    clear_faults(simulator)
    first_attempt = dataclasses.replace(request, first_attempt_at=datetime.now(UTC) - timedelta(seconds=5))
    found = await adapter.find(first_attempt)
    (made,) = dubs_named(simulator, request.job_id)
    assert found is not None and found.task_id == made["dubbing_id"]
    assert found.operation == {"target_languages": ["es"]}
    assert (await adapter.status(task_of(request, found))).state is TaskState.RUNNING
    # Another job's name finds nothing; the found dub is confirmed as this job's, not another's.
    assert await adapter.find(dub_request()) is None
    assert await adapter.confirm_task(found.task_id, request) == found
    assert await adapter.confirm_task(found.task_id, dub_request()) is None
    assert await adapter.confirm_task("nosuchdub0123456789", request) is None


async def test_throttle_is_transient_with_retry_after(adapter, simulator):
    request = dub_request(duration_s=30)
    submitted = await adapter.submit(request, request.job_id)
    before = stats(simulator)["tasks_created"]
    set_faults(simulator, throttle=1)
    with pytest.raises(Transient) as on_submit:
        await adapter.submit(dub_request(), "job_x")
    with pytest.raises(Transient) as on_status:
        await adapter.status(task_of(request, submitted))
    for caught in (on_submit, on_status):
        assert caught.value.retry_after == 1 and "rate_limit_exceeded" in str(caught.value)
    assert stats(simulator)["tasks_created"] == before


async def test_a_5xx_is_uncertain_on_submit_and_transient_on_status(adapter, simulator):
    request = dub_request(duration_s=30)
    submitted = await adapter.submit(request, request.job_id)
    set_faults(simulator, submit_error=1, status_error=1)
    with pytest.raises(Uncertain):
        await adapter.submit(dub_request(), "job_y")
    with pytest.raises(Transient):
        await adapter.status(task_of(request, submitted))


async def test_connection_refused_is_transient(closed_port_url):
    provider = ElevenLabsProvider(closed_port_url, KEY, timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(Transient):
            await provider.submit(dub_request(), "job_z")
        with pytest.raises(Transient):
            await provider.status(task())
        with pytest.raises(Transient):
            await provider.find(dub_request())
    finally:
        await provider.aclose()


# ================================================================== against a scripted ElevenLabs


@pytest.fixture
async def scripted(script: Script):
    provider = ElevenLabsProvider(script.url, KEY, timeout_s=TIMEOUT_S, find_max_pages=3)
    yield provider, script
    await provider.aclose()


async def test_the_submit_is_a_multipart_form_with_the_key(scripted):
    provider, script = scripted
    script.answer(200, CREATE_EXAMPLE)
    request = dub_request(job_id="job_form", num_speakers=2, watermark=True)
    assert (await provider.submit(request, request.job_id)).task_id == "21m00Tcm4TlvDq8ikWAM"
    (seen,) = script.seen
    assert (seen.method, seen.path) == ("POST", "/v1/dubbing")
    assert seen.headers["xi-api-key"] == KEY and "authorization" not in seen.headers
    assert seen.headers["content-type"].startswith("multipart/form-data; boundary=")
    for name, value in (("name", "job_form"), ("source_url", SOURCE), ("target_lang", "es"), ("num_speakers", "2"),
                        ("watermark", "true")):
        assert f'Content-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode() in seen.body
    assert b"filename=" not in seen.body


@pytest.mark.parametrize(("status", "body", "headers", "error", "says"), [
    # The errors page's current shape (its example is a validation error).
    (400, {"detail": {"type": "validation_error", "code": "invalid_parameters", "message": "bad source_url",
                      "status": "invalid_parameters", "request_id": "3c807fc4c3a1705f9638ecc764a91c01",
                      "param": "source_url"}}, None, Rejected, "bad source_url"),
    # Legacy shape: quota errors arrive as 401.
    (401, {"detail": {"status": "quota_exceeded", "message": "This request exceeds your quota of 10000."}}, None,
     Rejected, "quota_exceeded"),
    (422, {"detail": [{"type": "missing", "loc": ["body", "target_lang"], "msg": "Field required", "input": None}]},
     None, Rejected, "target_lang"),
    (429, {"detail": {"type": "rate_limit_error", "code": "concurrent_limit_exceeded", "message": "Too many",
                      "status": "too_many_concurrent_requests", "request_id": "r"}}, {"retry-after": "7"},
     Transient, "concurrent_limit_exceeded"),
    (429, {"detail": {"status": "system_busy", "message": "busy"}}, None, Transient, "system_busy"),
    (500, {"detail": {"type": "internal_error", "code": "internal_error", "message": "oops",
                      "status": "internal_error", "request_id": "r"}}, None, Uncertain, "HTTP 500"),
    (503, {"detail": {"type": "service_unavailable", "code": "maintenance", "message": "later"}}, None,
     Uncertain, "HTTP 503"),
])
async def test_submit_errors_by_shape(scripted, status, body, headers, error, says):
    provider, script = scripted
    script.answer(status, body, headers)
    request = dub_request()
    with pytest.raises(error) as caught:
        await provider.submit(request, request.job_id)
    assert says in str(caught.value)
    if headers:
        assert caught.value.retry_after == 7


@pytest.mark.parametrize(("status", "body", "error"), [
    (404, {"detail": {"type": "not_found", "code": "dubbing_not_found", "message": "no"}}, Rejected),
    (429, {"detail": {"status": "system_busy", "message": "busy"}}, Transient),
    (500, {"detail": {"type": "internal_error", "code": "internal_error", "message": "oops"}}, Transient),
    (401, {"detail": {"status": "invalid_api_key", "message": "Invalid API key"}}, Transient),
    (200, ["not", "a", "dub"], Transient),
])
async def test_status_errors_by_shape(scripted, status, body, error):
    provider, script = scripted
    script.answer(status, body)
    with pytest.raises(error):
        await provider.status(task())


async def test_the_key_is_masked_in_every_message(scripted):
    provider, script = scripted
    echo = {"detail": {"type": "validation_error", "code": "invalid_parameters",
                       "message": f"key {KEY} is not allowed", "status": "invalid_parameters", "request_id": "r"}}
    errors = []
    for status in (400, 429, 500):
        script.answer(status, echo)
        for call in (provider.submit(dub_request(), "job_m"), provider.status(task()), provider.find(dub_request())):
            try:
                await call
            except (Rejected, Transient, Uncertain) as e:
                errors.append(e)
    script.answer(200, {**DUBBED, "status": "failed", "error": f"upstream said {KEY}"})
    failed = await provider.status(task())
    script.answer(200, {**DUBBED, "status": f"odd-{KEY}"})
    with pytest.raises(Transient) as odd:
        await provider.status(task())
    assert len(errors) >= 8
    for text in [*(str(e) + repr(e) for e in errors), failed.error or "", str(odd.value)]:
        assert KEY not in text


def page(dubs: list[dict], cursor: str | None) -> dict:
    return {"dubs": dubs, "next_cursor": cursor, "has_more": cursor is not None}


def listed_dub(dubbing_id: str, name: str, created: datetime) -> dict:
    return {**DUBBED, "dubbing_id": dubbing_id, "name": name, "status": "dubbing",
            "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ")}


async def test_find_walks_newest_first_pages_back_to_the_first_attempt(scripted):
    provider, script = scripted
    now = datetime.now(UTC)
    request = dataclasses.replace(dub_request(job_id="job_lost"), first_attempt_at=now - timedelta(minutes=5))
    pages = {None: page([listed_dub("n1", "job_other", now)], "c2"),
             "c2": page([listed_dub("ours", "job_lost", now - timedelta(minutes=4))], "c3"),
             "c3": page([listed_dub("old", "job_older", now - timedelta(hours=2))], "c4")}
    script.handler = lambda seen: JSONResponse(pages[seen.query.get("cursor")])
    found = await provider.find(request)
    assert found is not None and found.task_id == "ours" and found.operation == {"target_languages": ["es"]}
    # Read newest first, and no further than the page reaching back past the first attempt.
    assert [s.query.get("cursor") for s in script.seen] == [None, "c2", "c3"]
    for seen in script.seen:
        assert (seen.query["order_by"], seen.query["order_direction"], seen.query["page_size"]) == (
            "created_at", "DESCENDING", "100")
        assert seen.headers["xi-api-key"] == KEY


async def test_find_sees_none_when_the_window_is_longer_than_its_pages(scripted):
    provider, script = scripted
    now = datetime.now(UTC)
    request = dataclasses.replace(dub_request(job_id="job_lost"), first_attempt_at=now - timedelta(hours=1))
    script.handler = lambda seen: JSONResponse(page([listed_dub("ours", "job_lost", now)], "more"))
    assert await provider.find_candidates(request) == ()
    assert len(script.seen) == 3  # find_max_pages


async def test_two_dubs_of_one_job_are_two_candidates_and_no_find(scripted):
    provider, script = scripted
    now = datetime.now(UTC)
    request = dataclasses.replace(dub_request(job_id="job_twice"), first_attempt_at=now - timedelta(minutes=1))
    script.answer(200, page([listed_dub("second", "job_twice", now), listed_dub("first", "job_twice", now)], None))
    assert [c.task_id for c in await provider.find_candidates(request)] == ["second", "first"]
    assert await provider.find(request) is None


async def test_a_list_without_dubs_is_transient(scripted):
    provider, script = scripted
    script.answer(200, {"items": []})
    with pytest.raises(Transient, match="no dubs"):
        await provider.find(dub_request())


# ================================================================== the key and redirects


@pytest.fixture
def elsewhere(serve):
    """Another loopback origin that records what reaches it."""
    arrivals: list[dict[str, str]] = []

    async def record(request: Request) -> Response:
        arrivals.append({k.lower(): v for k, v in request.headers.items()})
        return Response(b"elsewhere bytes", media_type="audio/mpeg")

    server = serve(Starlette(routes=[Route("/{path:path}", record)]))
    server.arrivals = arrivals  # type: ignore[attr-defined]
    return server


def policy_for(provider: ElevenLabsProvider, *origins: str) -> DownloadPolicy:
    # As the settler builds it (outbox/context.py): the adapter's own hosts and key.
    return DownloadPolicy(allowed_hosts=provider.facts.output_hosts, plain_http_origins=frozenset(origins),
                          max_bytes=1024 * 1024, credential_hosts=provider.facts.credential_hosts,
                          credentials=provider.download_credentials())


async def test_the_key_goes_to_the_api_and_never_through_a_redirect(scripted, elsewhere, tmp_path):
    provider, script = scripted
    target = f"{elsewhere.url}/cdn/es.mp3"

    def audio(seen):
        if seen.headers.get("xi-api-key") != KEY:
            return JSONResponse({"detail": {"status": "needs_authorization", "message": "no key"}}, status_code=401)
        if seen.path.endswith("/es"):
            return Response(b"dubbed in spanish", media_type="audio/mpeg")
        return RedirectResponse(target, status_code=302)

    script.handler = audio
    url_es, url_fr = observation_from_dub({**DUBBED, "target_languages": ["es", "fr"]}, task(), script.url,
                                          SECRETS).output_urls
    got = await download_to_file(url_es, policy_for(provider, script.url), str(tmp_path))
    assert got.bytes == len(b"dubbed in spanish")
    # A redirect to another origin than the API's: refused, and nothing reaches it.
    with pytest.raises(Refused):
        await download_to_file(url_fr, policy_for(provider, script.url), str(tmp_path))
    assert elsewhere.arrivals == []
    # Even where that origin may be fetched from, the key does not follow the redirect.
    followed = await download_to_file(url_fr, policy_for(provider, script.url, elsewhere.url), str(tmp_path))
    assert followed.bytes == len(b"elsewhere bytes")
    (arrival,) = elsewhere.arrivals
    assert "xi-api-key" not in arrival and KEY not in str(arrival)
