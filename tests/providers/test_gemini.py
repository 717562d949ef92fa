"""The Gemini (Veo) adapter: its pure decisions as tables over the API's
documented shapes, then the adapter over real HTTP — against the
simulator's /gemini protocol, and against a scripted Gemini on loopback for
what the simulator does not produce (filtered samples, inline videos,
Google's RetryInfo, compressed answers, a key echoed back, redirects).

Sources of the shapes (each fixture names its own):
- PROTO: https://github.com/googleapis/googleapis/blob/master/google/ai/generativelanguage/v1beta/prediction_service.proto
  (PredictLongRunningResponse, GenerateVideoResponse, Media, Video)
- SDK: https://github.com/googleapis/python-genai/blob/main/google/genai/_operations_converters.py
  (`_GenerateVideosOperation_from_mldev`, `_Video_from_mldev`: `uri`, `encodedVideo`, `encoding`)
- ERRORS: https://ai.google.dev/gemini-api/docs/troubleshooting (status words),
  https://cloud.google.com/apis/design/errors (the JSON error answer, google.rpc.RetryInfo)
- VEO: https://ai.google.dev/gemini-api/docs/video (the Files API link, 2 days, 11 s to 6 min)
"""
from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import os
import time
from collections.abc import Iterator

import pytest
from starlette.responses import JSONResponse, RedirectResponse, Response

from app.download import DownloadPolicy, download_to_file
from app.download_errors import OutputTooLarge, Refused
from app.origins import origin_of
from app.providers.base import (
    Observation,
    Rejected,
    SubmitRequest,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
)
from app.providers.gemini import (
    OUTPUT_TTL_S,
    GeminiProvider,
    Videos,
    check_body,
    model_path,
    operation_path,
    read_operation,
    retry_delay,
    rpc_reason,
)
from app.providers.http import Secrets
from app.simulator import output_sha256
from tests.support.loopback import LoopbackServer
from tests.support.simulator import RunningSimulator, clear_faults, set_faults, stats

from .scripted import Script, Seen

KEY = "AIzaGeminiTestKey0123456789abcdefghi"
MODEL = "veo-3.1-generate-preview"
NAME = f"models/{MODEL}/operations/abc123"
FILE_URI = "https://generativelanguage.googleapis.com/v1beta/files/acwe2jipjo5j:download?alt=media"
SECRETS = Secrets(KEY)
TIMEOUT_S = 1.5


def body(prompt: str = "a cat", **parameters) -> dict:
    return {"instances": [{"prompt": prompt}], "parameters": parameters}


def request_for(input: dict, model: str = MODEL) -> SubmitRequest:
    return SubmitRequest(job_id="job_" + os.urandom(6).hex(), model=model, input=input, callback_url=None)


def done(**fields) -> dict:
    return {"name": NAME, "done": True, **fields}


def video_response(*samples: dict, **extra) -> dict:
    # PROTO: PredictLongRunningResponse.generate_video_response, as the API
    # writes an Any: its @type, then its fields.
    inner = {"generatedSamples": list(samples), **extra} if samples else dict(extra)
    return {"response": {"@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse",
                         "generateVideoResponse": inner}}


# ------------------------------------------------------------------ pure: names and bodies


@pytest.mark.parametrize(("model", "path"), [
    ("veo-3.1-generate-preview", "models/veo-3.1-generate-preview"),
    ("models/veo-2.0-generate-001", "models/veo-2.0-generate-001"),  # the SDK's t_model takes either
    ("veo-3.1-fast-generate-preview", "models/veo-3.1-fast-generate-preview"),
])
def test_model_path(model, path):
    assert model_path(model) == path


@pytest.mark.parametrize("model", ["", "models/", "veo/3", "../veo", "veo 3", "veo?x=1", "veo:predict", "x" * 200])
def test_a_model_that_is_no_model_id_is_rejected(model):
    with pytest.raises(Rejected):
        model_path(model)


@pytest.mark.parametrize(("name", "path"), [
    (NAME, NAME),
    ("operations/veo-3.1-generate-preview-xxxxx", "operations/veo-3.1-generate-preview-xxxxx"),  # a mirror's form
    ("models/veo~2/operations/a.b_c", "models/veo~2/operations/a.b_c"),
])
def test_operation_path(name, path):
    assert operation_path(name) == path


@pytest.mark.parametrize("name", ["", "/", "models//operations/x", "models/../files/x", "./x", "a/.", "a b",
                                  "a?alt=media", "a#b", "a%2Fb", "files/x:download", "x" * 401])
def test_a_name_that_is_no_operation_is_rejected(name):
    with pytest.raises(Rejected):
        operation_path(name)


@pytest.mark.parametrize(("sent", "ok"), [
    (body(), True),
    ({"instances": [{"prompt": "a"}]}, True),  # parameters are optional (PROTO)
    ({"instances": []}, False),
    ({"instances": "a cat"}, False),
    ({"instances": ["a cat"]}, False),
    ({"prompt": "a cat"}, False),  # the flat form is not the API's body
    ({"instances": [{"prompt": "a"}], "parameters": [1]}, False),
])
def test_check_body(sent, ok):
    if ok:
        check_body(sent)
    else:
        with pytest.raises(Rejected, match="predictLongRunning body|parameters"):
            check_body(sent)


# ------------------------------------------------------------------ pure: the operation


OPERATIONS = [
    # (what, operation, expected)
    ("the submit's answer, done left out (proto3 JSON)", {"name": NAME}, Observation(TaskState.RUNNING)),
    ("done false written out", {"name": NAME, "done": False}, Observation(TaskState.RUNNING)),
    ("an error: its message", done(error={"code": 3, "message": "Unsupported use case."}),
     Observation(TaskState.FAILED, error="Unsupported use case.")),
    ("an error without a message: its code", done(error={"code": 13}),
     Observation(TaskState.FAILED, error="error code 13")),
    ("two Files API links (SDK: video.uri)",
     done(**video_response({"video": {"uri": FILE_URI}}, {"video": {"uri": FILE_URI.replace("acwe", "bcwe")}})),
     Videos(urls=(FILE_URI, FILE_URI.replace("acwe", "bcwe")))),
    ("inline bytes (SDK: encodedVideo, encoding) after the links",
     done(**video_response({"video": {"encodedVideo": "AAEC", "encoding": "video/mp4"}},
                           {"video": {"uri": FILE_URI}})),
     "inline+uri"),
    ("one kept, one filtered: a success with the one",
     done(**video_response({"video": {"uri": FILE_URI}}, raiMediaFilteredCount=1,
                           raiMediaFilteredReasons=["The prompt could not be submitted."])),
     Videos(urls=(FILE_URI,), filtered_count=1, filtered_reasons=("The prompt could not be submitted.",))),
    ("all filtered: no video, no error (PROTO: rai_media_filtered_*)",
     done(**video_response(raiMediaFilteredCount=2, raiMediaFilteredReasons=["Celebrity likeness.", "Violence."])),
     Observation(TaskState.FAILED, error="every video (2 generated) was filtered by Google's safety checks: "
                                         "Celebrity likeness.; Violence.")),
    ("filtered, the count alone", done(**video_response(raiMediaFilteredCount=1)),
     Observation(TaskState.FAILED, error="every video (1 generated) was filtered by Google's safety checks")),
    ("done with an empty response", done(**video_response()),
     Observation(TaskState.FAILED, error="the operation finished without a video")),
    ("done with no response at all", done(),
     Observation(TaskState.FAILED, error="the operation finished without a video")),
    ("a gs:// link is no download (Vertex's form)", done(**video_response({"video": {"uri": "gs://b/v.mp4"}})),
     Observation(TaskState.FAILED, error="the operation finished without a video")),
]


@pytest.mark.parametrize(("what", "operation", "expected"), OPERATIONS, ids=[o[0] for o in OPERATIONS])
def test_read_operation(what, operation, expected):
    seen = read_operation(operation, SECRETS)
    if expected == "inline+uri":
        assert isinstance(seen, Videos) and seen.urls == (FILE_URI,)
        assert [(v.data, v.content_type) for v in seen.inline] == [("AAEC", "video/mp4")]
    else:
        assert seen == expected


def test_a_done_that_is_no_boolean_is_a_read_to_repeat():
    with pytest.raises(Transient):
        read_operation({"name": NAME, "done": "yes"}, SECRETS)


@pytest.mark.parametrize(("answer", "seconds"), [
    # ERRORS: a 429 with google.rpc.RetryInfo among its details.
    ({"error": {"code": 429, "message": "You exceeded your current quota.", "status": "RESOURCE_EXHAUSTED",
                "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
                            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]}}, 37.0),
    ({"error": {"code": 429, "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                          "retryDelay": "1.5s"}]}}, 1.5),
    ({"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}, None),
    ({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "soon"}]}}, None),
    ({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "99999s"}]}},
     3600.0),  # clamped as every Retry-After is
    ("not json", None),
])
def test_retry_delay(answer, seconds):
    assert retry_delay(answer) == seconds


def test_reasons_are_masked():
    assert rpc_reason({"code": 400, "message": f"API key not valid: {KEY}", "status": "INVALID_ARGUMENT"},
                      SECRETS) == "API key not valid: [redacted]"
    assert rpc_reason({"code": 403, "status": "PERMISSION_DENIED"}, SECRETS) == "PERMISSION_DENIED"


# ------------------------------------------------------------------ facts


def test_facts():
    adapter = GeminiProvider("https://generativelanguage.googleapis.com", KEY)
    facts = adapter.facts
    assert (facts.webhook_scheme, facts.idempotent_submit, facts.can_find, facts.can_cancel) == \
        ("none", False, False, False)
    assert facts.output_hosts == facts.credential_hosts == ("generativelanguage.googleapis.com",)
    assert not facts.outputs_from_any_host and facts.output_ttl_s == OUTPUT_TTL_S == 2 * 24 * 3600
    assert adapter.download_credentials() == {"x-goog-api-key": KEY}
    assert GeminiProvider("https://generativelanguage.googleapis.com", None).download_credentials() == {}
    # Veo: 11 s to 6 min (VEO): a first look at 10 s, then every 10 s.
    for model in (MODEL, "models/veo-2.0-generate-001"):
        veo = adapter.facts_for(model)
        assert veo.poll_delays_s == (10.0,) and veo.poll_delay(0) == veo.poll_delay(300) == 10.0
        assert veo.give_up_after_s is None and veo.output_ttl_s == OUTPUT_TTL_S
    assert adapter.facts_for("some-other-model") == facts
    assert KEY not in repr(adapter)


# ------------------------------------------------------------------ over HTTP: the simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    with RunningSimulator() as sim:
        yield sim.url


@pytest.fixture
async def gemini(simulator):
    clear_faults(simulator)
    adapter = GeminiProvider(f"{simulator}/gemini", KEY, timeout_s=TIMEOUT_S)
    yield adapter
    await adapter.aclose()
    clear_faults(simulator)


async def wait_final(adapter: GeminiProvider, task: Task, timeout_s: float = 10.0) -> Observation:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await adapter.status(task)
        if seen.state is not TaskState.RUNNING or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.05)


def policy_for(adapter: GeminiProvider, **overrides) -> DownloadPolicy:
    """The download policy the settler builds for this adapter
    (outbox/context.py: Context.download_policy; plain http only for the
    adapter's own loopback origin, as Settings.plain_http_origins gives it)."""
    fields = {"allowed_hosts": adapter.facts.output_hosts,
              "plain_http_origins": frozenset({origin_of(adapter.base_url)}), "max_bytes": 10**6,
              "credential_hosts": adapter.facts.credential_hosts, "credentials": adapter.download_credentials()}
    return DownloadPolicy(**{**fields, **overrides})


async def test_submit_runs_then_succeeds_with_two_files_fetched_with_the_key(gemini, simulator, tmp_path):
    request = request_for(body(duration_s=0.4, sampleCount=2, output_bytes=300))
    submitted = await gemini.submit(request, request.job_id)
    assert submitted.task_id.startswith(f"models/{MODEL}/operations/") and submitted.webhook_secret is None
    task = Task(submitted.task_id, model=MODEL)
    assert (await gemini.status(task)).state is TaskState.RUNNING
    final = await wait_final(gemini, task)
    assert final.state is TaskState.SUCCEEDED and final.error is None and not final.files
    assert len(final.output_urls) == 2
    op_id = submitted.task_id.rpartition("/")[2]
    for index, url in enumerate(final.output_urls):
        got = await download_to_file(url, policy_for(gemini), str(tmp_path))
        assert (got.bytes, got.sha256, got.content_type) == (300, output_sha256(op_id, index, 300), "video/mp4")
        os.unlink(got.path)


async def test_a_failed_operation_is_failed_with_its_reason(gemini):
    request = request_for(body(duration_s=0.1, outcome="failed"))
    submitted = await gemini.submit(request, request.job_id)
    final = await wait_final(gemini, Task(submitted.task_id))
    assert final.state is TaskState.FAILED and "failed" in final.error and not final.output_urls


async def test_no_video_and_no_error_is_a_failure(gemini):
    request = request_for(body(duration_s=0, outputs=0))
    submitted = await gemini.submit(request, request.job_id)
    final = await wait_final(gemini, Task(submitted.task_id))
    assert final == Observation(TaskState.FAILED, error="the operation finished without a video")


async def test_an_in_doubt_submit_is_uncertain_and_the_operation_exists(gemini, simulator):
    set_faults(simulator, submit_timeout_after_create=1)
    before = stats(simulator)["tasks_created"]
    request = request_for(body(duration_s=30))
    started = time.monotonic()
    with pytest.raises(Uncertain) as caught:
        await gemini.submit(request, request.job_id)
    assert time.monotonic() - started < TIMEOUT_S + 2
    assert stats(simulator)["tasks_created"] == before + 1  # made, and its name lost with the answer
    # Nothing can find it again: no idempotency key, no look-up.
    assert not gemini.facts.idempotent_submit and not gemini.facts.can_find
    assert await gemini.find(request) is None
    assert KEY not in str(caught.value)


async def test_throttled_submit_and_status_are_transient_with_the_wait(gemini, simulator):
    request = request_for(body(duration_s=30))
    submitted = await gemini.submit(request, request.job_id)
    set_faults(simulator, throttle=1)
    before = stats(simulator)["tasks_created"]
    with pytest.raises(Transient) as on_submit:
        await gemini.submit(request_for(body()), "job_x")
    with pytest.raises(Transient) as on_status:
        await gemini.status(Task(submitted.task_id))
    assert on_submit.value.retry_after == on_status.value.retry_after == 1.0
    assert "RESOURCE_EXHAUSTED" in str(on_submit.value) and "Resource has been exhausted" in str(on_status.value)
    assert stats(simulator)["tasks_created"] == before


async def test_submit_error_is_uncertain_and_status_error_transient(gemini, simulator):
    request = request_for(body(duration_s=30))
    submitted = await gemini.submit(request, request.job_id)
    set_faults(simulator, submit_error=1, status_error=1)
    before = stats(simulator)["tasks_created"]
    with pytest.raises(Uncertain):
        await gemini.submit(request_for(body()), "job_y")
    with pytest.raises(Transient):
        await gemini.status(Task(submitted.task_id))
    assert stats(simulator)["tasks_created"] == before
    clear_faults(simulator)
    assert (await gemini.status(Task(submitted.task_id))).state is TaskState.RUNNING


async def test_a_bad_body_is_rejected_with_googles_reason_and_creates_nothing(gemini, simulator):
    before = stats(simulator)["tasks_created"]
    with pytest.raises(Rejected, match="parameters.duration_s must be a number"):
        await gemini.submit(request_for(body(duration_s="soon")), "job_z")
    with pytest.raises(Rejected, match="INVALID_ARGUMENT"):
        await gemini.submit(request_for({"instances": [{"prompt": "a"}], "webhookConfig": {}}), "job_z")
    with pytest.raises(Rejected, match="predictLongRunning body"):
        await gemini.submit(request_for({"prompt": "a cat"}), "job_z")  # refused before any call
    assert stats(simulator)["tasks_created"] == before


async def test_without_a_key_the_submit_is_rejected(simulator):
    adapter = GeminiProvider(f"{simulator}/gemini", None, timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(Rejected, match="HTTP 403.*unregistered callers"):
            await adapter.submit(request_for(body()), "job_k")
    finally:
        await adapter.aclose()


async def test_unknown_operations_are_rejected_and_a_bad_name_is_never_sent(gemini, simulator):
    with pytest.raises(Rejected, match="no such operation"):
        await gemini.status(Task(f"models/{MODEL}/operations/{'0' * 20}"))
    calls = stats(simulator)["status_calls"]
    with pytest.raises(Rejected):
        await gemini.status(Task("models/../files/x"))
    assert stats(simulator)["status_calls"] == calls


async def test_cancel_asks_nothing_and_the_operation_runs_on(gemini, simulator):
    request = request_for(body(duration_s=30))
    task = Task((await gemini.submit(request, request.job_id)).task_id)
    calls = stats(simulator)["status_calls"]
    await gemini.cancel(task)
    await gemini.cancel(task)
    assert stats(simulator)["status_calls"] == calls
    assert (await gemini.status(task)).state is TaskState.RUNNING


async def test_no_webhook_is_ever_ours(gemini):
    hook = WebhookRequest(job_id="job_1", headers={"webhook-signature": "v1,abc"}, query={},
                          raw_body=b'{"name": "models/x/operations/y"}')
    assert not await gemini.verify(hook)
    assert gemini.webhook_task_id(hook) is None


async def test_the_video_is_fetched_with_the_key_on_the_api_host_only(gemini, tmp_path):
    request = request_for(body(duration_s=0, output_bytes=64))
    final = await wait_final(gemini, Task((await gemini.submit(request, request.job_id)).task_id))
    (url,) = final.output_urls
    # Without the key the Files API refuses (403), so the key is what fetched it.
    keyless = policy_for(gemini, credentials={})
    with pytest.raises(Exception, match="HTTP 403"):
        await download_to_file(url, keyless, str(tmp_path))
    got = await download_to_file(url, policy_for(gemini), str(tmp_path))
    assert got.bytes == 64
    os.unlink(got.path)


# ------------------------------------------------------------------ over HTTP: a scripted Gemini


@pytest.fixture
async def scripted(script: Script, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    adapter = GeminiProvider(script.url, KEY, timeout_s=TIMEOUT_S, spool_dir=str(spool), max_output_bytes=200_000)
    adapter.spool = spool  # type: ignore[attr-defined]
    yield adapter
    await adapter.aclose()


def leftovers(adapter: GeminiProvider, keep: tuple[str, ...] = ()) -> list[str]:
    return sorted(p for p in os.listdir(adapter.spool) if os.path.join(adapter.spool, p) not in keep)  # type: ignore[attr-defined]


async def test_the_wire_is_the_documented_one(scripted, script):
    script.answer(200, {"name": NAME})
    sent = body("a cat", sampleCount=2, durationSeconds=8, aspectRatio="16:9")
    assert (await scripted.submit(request_for(sent), "job_w")).task_id == NAME
    (seen,) = script.seen
    assert (seen.method, seen.path) == ("POST", f"/v1beta/models/{MODEL}:predictLongRunning")
    assert seen.headers["x-goog-api-key"] == KEY and "authorization" not in seen.headers
    assert json.loads(seen.body) == sent  # the job's input, as given: no key of ours added
    script.answer(200, {"name": NAME, "done": False})
    assert (await scripted.status(Task(NAME))).state is TaskState.RUNNING
    assert (script.seen[1].method, script.seen[1].path) == ("GET", f"/v1beta/{NAME}")
    assert script.seen[1].headers["x-goog-api-key"] == KEY


@pytest.mark.parametrize("answer", [{}, {"name": ""}, {"name": 7}, {"name": "a/../b"}, [NAME]])
async def test_an_accepted_submit_without_a_usable_name_is_uncertain(scripted, script, answer):
    script.answer(200, answer)
    with pytest.raises(Uncertain):
        await scripted.submit(request_for(body()), "job_n")


async def test_all_filtered_is_a_failure_with_the_reasons(scripted, script):
    script.answer(200, done(**video_response(raiMediaFilteredCount=1, raiMediaFilteredReasons=[
        "Your current safety settings for person generation prevented the video from being generated."])))
    seen = await scripted.status(Task(NAME))
    assert seen.state is TaskState.FAILED and not seen.output_urls and not seen.files
    assert seen.error.startswith("every video (1 generated) was filtered by Google's safety checks: Your current")


@pytest.mark.parametrize("size", [3_000, 150_000])  # kept in the skeleton; spilled to a file while read
async def test_inline_videos_are_written_as_files_with_their_type(scripted, script, size):
    first, second = os.urandom(size), os.urandom(size // 3)
    script.answer(200, done(**video_response(
        {"video": {"encodedVideo": base64.b64encode(first).decode(), "encoding": "video/mp4"}},
        {"video": {"encodedVideo": base64.b64encode(second).decode()}},
        {"video": {"uri": FILE_URI}})))
    seen = await scripted.status(Task(NAME))
    assert seen.state is TaskState.SUCCEEDED and seen.output_urls == (FILE_URI,)
    assert [(f.bytes, f.sha256, f.content_type) for f in seen.files] == [
        (size, hashlib.sha256(first).hexdigest(), "video/mp4"),
        (size // 3, hashlib.sha256(second).hexdigest(), None)]
    for file in seen.files:
        assert os.path.dirname(file.path) == str(scripted.spool)
        with open(file.path, "rb") as f:
            assert f.read() in (first, second)
    # Only the decoded files are left: the spilled base64 is gone.
    assert leftovers(scripted, keep=tuple(f.path for f in seen.files)) == []


async def test_an_inline_video_over_the_cap_fails_and_leaves_nothing(scripted, script):
    big = base64.b64encode(os.urandom(210_000)).decode()
    script.answer(200, done(**video_response({"video": {"encodedVideo": big, "encoding": "video/mp4"}})))
    # Over the cap: the settle step fails the job output_too_large.
    with pytest.raises(OutputTooLarge, match="200000 byte cap"):
        await scripted.status(Task(NAME))
    assert leftovers(scripted) == []


@pytest.mark.parametrize("text", ["not base64!", "QUJD" * 30_000 + "!"])
async def test_inline_bytes_that_are_not_base64_fail_and_leave_nothing(scripted, script, text):
    # Asking again would answer the same bytes: the job fails, refunded.
    script.answer(200, done(**video_response({"video": {"uri": FILE_URI}}, {"video": {"encodedVideo": text}})))
    seen = await scripted.status(Task(NAME))
    assert seen.state is TaskState.FAILED and "base64" in (seen.error or "")
    assert leftovers(scripted) == []


async def test_a_compressed_answer_is_read(scripted, script):
    # httpx asks for gzip; Google's front ends answer with it.
    answer = json.dumps(done(**video_response({"video": {"uri": FILE_URI}}))).encode()
    script.handler = lambda seen: Response(gzip.compress(answer), media_type="application/json",
                                           headers={"content-encoding": "gzip"})
    assert (await scripted.status(Task(NAME))).output_urls == (FILE_URI,)


@pytest.mark.parametrize(("status", "error"), [(404, Rejected), (400, Transient), (403, Transient),
                                               (500, Transient), (503, Transient)])
async def test_status_errors(scripted, script, status, error):
    script.answer(status, {"error": {"code": status, "message": "nope", "status": "X"}})
    with pytest.raises(error):
        await scripted.status(Task(NAME))


@pytest.mark.parametrize(("status", "error"), [(400, Rejected), (401, Rejected), (403, Rejected), (404, Rejected),
                                               (429, Transient), (500, Uncertain), (503, Uncertain)])
async def test_submit_errors(scripted, script, status, error):
    script.answer(status, {"error": {"code": status, "message": "nope", "status": "X"}})
    with pytest.raises(error):
        await scripted.submit(request_for(body()), "job_e")


async def test_a_429_without_retry_after_waits_its_retry_info_on_submit(scripted, script):
    """As on a status read: the wait Google says in the body is the hint
    (a paused provider, a wait counting no failed attempt)."""
    script.answer(429, {"error": {"code": 429, "message": "You exceeded your current quota.",
                                  "status": "RESOURCE_EXHAUSTED",
                                  "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                               "retryDelay": "41s"}]}})
    with pytest.raises(Transient) as caught:
        await scripted.submit(request_for(body()), "job_e")
    assert caught.value.retry_after == 41.0


async def test_a_429_without_retry_after_waits_its_retry_info_on_status(scripted, script):
    script.answer(429, {"error": {"code": 429, "message": "You exceeded your current quota.",
                                  "status": "RESOURCE_EXHAUSTED",
                                  "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                               "retryDelay": "41s"}]}})
    with pytest.raises(Transient) as caught:
        await scripted.status(Task(NAME))
    assert caught.value.retry_after == 41.0 and "exceeded your current quota" in str(caught.value)
    script.answer(429, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}, headers={"retry-after": "3"})
    with pytest.raises(Transient) as caught:
        await scripted.status(Task(NAME))
    assert caught.value.retry_after == 3.0


@pytest.mark.parametrize("raw", [b"<html>busy</html>", b"[1, 2]", b'{"name": "x", "done": "maybe"}'])
async def test_a_garbled_status_answer_is_a_read_to_repeat(scripted, script, raw):
    script.handler = lambda seen: Response(raw, media_type="application/json")
    with pytest.raises(Transient):
        await scripted.status(Task(NAME))
    assert leftovers(scripted) == []


async def test_the_key_never_appears_in_a_message(scripted, script):
    """A Gemini that echoes the key it got (header or query form) in every
    reason it gives: no message of ours may carry it."""
    def echo(seen: Seen, status: int) -> Response:
        key = seen.headers.get("x-goog-api-key", "")
        reason = f"API key {key} not valid; see https://x.example/why?key={key}"
        return JSONResponse({"error": {"code": status, "message": reason, "status": "INVALID_ARGUMENT",
                                       "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                                    "metadata": {"key": key}}]}}, status_code=status)

    messages: list[str] = []
    for status, on_submit in ((400, Rejected), (429, Transient), (500, Uncertain)):
        script.handler = lambda seen, status=status: echo(seen, status)
        with pytest.raises(on_submit) as caught:
            await scripted.submit(request_for(body()), "job_m")
        messages.append(str(caught.value))
    for status, on_status in ((404, Rejected), (429, Transient), (500, Transient)):
        script.handler = lambda seen, status=status: echo(seen, status)
        with pytest.raises(on_status) as caught:
            await scripted.status(Task(NAME))
        messages.append(str(caught.value))
    script.handler = lambda seen: JSONResponse(done(error={"code": 3,
                                                           "message": f"bad key {seen.headers['x-goog-api-key']}"}))
    messages.append((await scripted.status(Task(NAME))).error)
    script.handler = lambda seen: JSONResponse(done(**video_response(
        raiMediaFilteredCount=1, raiMediaFilteredReasons=[f"key={seen.headers['x-goog-api-key']}"])))
    messages.append((await scripted.status(Task(NAME))).error)
    assert len(messages) == 8 and all(m for m in messages)
    for message in messages:
        assert KEY not in message and KEY[8:24] not in message, message


# ------------------------------------------------------------------ the key and redirects


@pytest.fixture
def file_hosts():
    """Two loopback origins: `api`, the adapter's base URL, whose file route
    redirects where the test says; `elsewhere`, another origin."""
    api, elsewhere = Script(), Script()
    servers = [LoopbackServer(s.app()).start() for s in (api, elsewhere)]
    api.url, elsewhere.url = servers[0].url, servers[1].url
    elsewhere.answer(200, raw=b"video bytes")
    yield api, elsewhere
    for server in servers:
        server.stop()


def file_route(api: Script, redirect_to: str | None) -> None:
    def handler(seen: Seen) -> Response:
        if seen.path.startswith("/v1beta/files/") and redirect_to:
            return RedirectResponse(redirect_to, status_code=302)
        return Response(b"video bytes", media_type="video/mp4")
    api.handler = handler


async def test_a_redirect_to_another_origin_is_refused_and_the_key_goes_nowhere_else(file_hosts, tmp_path):
    api, elsewhere = file_hosts
    adapter = GeminiProvider(api.url, KEY)
    file_route(api, redirect_to=f"{elsewhere.url}/video.mp4")
    with pytest.raises(Refused):
        await download_to_file(f"{api.url}/v1beta/files/abc:download?alt=media", policy_for(adapter), str(tmp_path))
    assert [s.headers.get("x-goog-api-key") for s in api.seen] == [KEY]  # the first hop, the API's host
    assert elsewhere.seen == []
    await adapter.aclose()


async def test_a_redirect_on_the_api_origin_is_followed_without_the_key(file_hosts, tmp_path):
    api, _ = file_hosts
    adapter = GeminiProvider(api.url, KEY)
    file_route(api, redirect_to="/blob/video.mp4")
    got = await download_to_file(f"{api.url}/v1beta/files/abc:download?alt=media", policy_for(adapter),
                                 str(tmp_path))
    assert got.bytes == len(b"video bytes") and got.content_type == "video/mp4"
    assert [(s.path, s.headers.get("x-goog-api-key")) for s in api.seen] == [
        ("/v1beta/files/abc:download", KEY), ("/blob/video.mp4", None)]  # never after a redirect
    os.unlink(got.path)
    await adapter.aclose()
