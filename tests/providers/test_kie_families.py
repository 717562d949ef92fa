"""KIE's own families (Veo 3.1, Runway, Flux Kontext, Suno) in the KIE
adapter: the pure parts as tables over the documented example bodies of each
family's details and callbacks pages (their source in a comment above each),
then the adapter over real HTTP against the simulator's emulation of them."""
from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import json
import secrets
import time

import httpx
import pytest

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
from app.providers.http import Secrets
from app.providers.kie import (
    FLUX_KONTEXT,
    LIP_SYNC_TIMINGS,
    NO_OUTPUT,
    RUNWAY,
    SUNO,
    VEO,
    KieProvider,
    echo_matches,
    family_body,
    family_of,
    observation_from_flux,
    observation_from_runway,
    observation_from_suno,
    observation_from_veo,
    record_outcome,
    signature_ok,
    submit_outcome,
)
from app.signing.tokens import make_capability_token
from tests.support.simulator import RunningSimulator, clear_faults, set_faults, stats

API_KEY = "kie-families-api-key"
SECRETS = Secrets(API_KEY)
SERVER_KEY = b"families-server-key-0123456789ab"


# ------------------------------------------------------------------ documented bodies

# https://docs.kie.ai/veo3-api/get-veo-3-video-details (the page's 200 example)
VEO_RECORD = {
    "code": 200,
    "msg": "success",
    "data": {
        "taskId": "veo_task_abcdef123456",
        "paramJson": "{\"prompt\":\"A futuristic city with flying cars at sunset.\",\"waterMark\":\"KieAI\"}",
        "completeTime": "2025-06-06 10:30:00",
        "response": {
            "taskId": "veo_task_abcdef123456",
            "resultUrls": ["http://example.com/video1.mp4"],
            "originUrls": ["http://example.com/original_video1.mp4"],
            "resolution": "1080p",
        },
        "successFlag": 1,
        "errorCode": None,
        "errorMessage": "",
        "createTime": "2025-06-06 10:25:00",
        "fallbackFlag": False,
    },
}
# https://docs.kie.ai/veo3-api/generate-veo-3-video-callbacks (success callback)
VEO_CALLBACK = {
    "code": 200,
    "msg": "Veo3.1 video generated successfully.",
    "data": {
        "taskId": "veo_task_abcdef123456",
        "info": {"resultUrls": ["http://example.com/video1.mp4"],
                 "originUrls": ["http://example.com/original_video1.mp4"], "resolution": "1080p"},
        "fallbackFlag": False,
    },
}
# https://docs.kie.ai/runway-api/get-ai-video-details (the schema's examples,
# as the quickstart's "Task Status Response" shows them)
RUNWAY_RECORD = {
    "code": 200,
    "msg": "success",
    "data": {
        "taskId": "ee603959-debb-48d1-98c4-a6d1c717eba6",
        "parentTaskId": "",
        "generateParam": {"prompt": "A fluffy orange cat dancing energetically in a colorful room with disco lights",
                          "imageUrl": "https://example.com/image.jpg", "expandPrompt": True},
        "state": "success",
        "generateTime": "2023-08-15 14:30:45",
        "videoInfo": {"videoId": "485da89c-7fca-4340-8c04-101025b2ae71",
                      "taskId": "ee603959-debb-48d1-98c4-a6d1c717eba6",
                      "videoUrl": "https://file.com/k/xxxxxxx.mp4", "imageUrl": "https://file.com/m/xxxxxxxx.png"},
        "failCode": 400,
        "failMsg": "Generation failed, please try again later",
        "expireFlag": 0,
    },
}
# https://docs.kie.ai/runway-api/generate-ai-video-callbacks
RUNWAY_CALLBACK = {
    "code": 200,
    "msg": "All generated successfully.",
    "data": {"task_id": "ee603959-debb-48d1-98c4-a6d1c717eba6", "video_id": "485da89c-7fca-4340-8c04-101025b2ae71",
             "video_url": "https://file.com/k/xxxxxxx.mp4", "image_url": "https://file.com/m/xxxxxxxx.png"},
}
# https://docs.kie.ai/flux-kontext-api/get-image-details
FLUX_RECORD = {
    "code": 200,
    "msg": "success",
    "data": {
        "taskId": "task12345",
        "paramJson": "{\"prompt\":\"A serene mountain landscape\",\"aspectRatio\":\"16:9\"}",
        "completeTime": "2024-03-20T10:30:00Z",
        "response": {"originImageUrl": "https://example.com/original.jpg",
                     "resultImageUrl": "https://example.com/result.jpg"},
        "successFlag": 1,
        "errorCode": None,
        "errorMessage": "",
        "createTime": "2024-03-20T10:25:00Z",
    },
}
# https://docs.kie.ai/flux-kontext-api/generate-or-edit-image-callbacks
FLUX_CALLBACK = {
    "code": 200,
    "msg": "BFL image generated successfully.",
    "data": {"taskId": "task12345", "info": {"originImageUrl": "https://example.com/original.jpg",
                                             "resultImageUrl": "https://example.com/result.jpg"}},
}
# https://docs.kie.ai/suno-api/get-music-details
SUNO_RECORD = {
    "code": 200,
    "msg": "success",
    "data": {
        "taskId": "5c79****be8e",
        "parentMusicId": "",
        "param": "{\"prompt\":\"A calm piano track\",\"style\":\"Classical\",\"title\":\"Peaceful Piano\","
                 "\"customMode\":true,\"instrumental\":true,\"model\":\"V3_5\"}",
        "response": {
            "taskId": "5c79****be8e",
            "sunoData": [{
                "id": "8551****662c",
                "audioUrl": "https://example.cn/****.mp3",
                "streamAudioUrl": "https://example.cn/****",
                "imageUrl": "https://example.cn/****.jpeg",
                "prompt": "[Verse] 夜晚城市 灯火辉煌",
                "modelName": "chirp-v3-5",
                "title": "钢铁侠",
                "tags": "electrifying, rock",
                "createTime": "2025-01-01 00:00:00",
                "duration": 198.44,
            }],
        },
        "status": "SUCCESS",
        "type": "GENERATE",
        "errorCode": None,
        "errorMessage": None,
    },
}


def suno_callback_track(track_id: str, duration: float) -> dict:
    # https://docs.kie.ai/suno-api/generate-music-callbacks (a track of the success callback)
    return {"id": track_id, "audio_url": "https://example.cn/****.mp3", "stream_audio_url": "https://example.cn/****",
            "image_url": "https://example.cn/****.jpeg", "prompt": "[Verse] Night city lights shining bright",
            "model_name": "chirp-v3-5", "title": "Iron Man", "tags": "electrifying, rock",
            "createTime": "2025-01-01 00:00:00", "duration": duration}


# https://docs.kie.ai/suno-api/generate-music-callbacks: success and failure callbacks
SUNO_COMPLETE = {
    "code": 200,
    "msg": "All generated successfully.",
    "data": {"callbackType": "complete", "task_id": "2fac****9f72",
             "data": [suno_callback_track("e231****-****-****-****-****8cadc7dc", 198.44),
                      suno_callback_track("e231****-****-****-****-****8cadc7dc", 228.28)]},
}
SUNO_ERROR = {"code": 501, "msg": "Audio generation failed",
              "data": {"callbackType": "error", "task_id": "2fac****9f72", "data": None}}


def changed(body: dict, **data) -> dict:
    out = copy.deepcopy(body)
    out["data"].update(data)
    return out


def hook(body: dict | bytes, **headers: str) -> WebhookRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return WebhookRequest(job_id="job_" + "0" * 24, headers=headers, query={}, raw_body=raw)


ADAPTER = KieProvider("http://127.0.0.1:9/kie", API_KEY, secret_keys=(SERVER_KEY,))


# ------------------------------------------------------------------ records as Observations


def test_the_documented_veo_record_is_its_result_urls_not_its_origins():
    seen = record_outcome(VEO_RECORD, SECRETS, VEO.observe)
    assert seen == Observation(state=TaskState.SUCCEEDED, output_urls=("http://example.com/video1.mp4",))


@pytest.mark.parametrize("flag, state, error", [
    (0, TaskState.RUNNING, None),
    (2, TaskState.FAILED, "the task failed"),
    (3, TaskState.FAILED, "the generation failed"),
    ("1", TaskState.SUCCEEDED, None),
])
def test_every_veo_success_flag(flag, state, error):
    seen = observation_from_veo(changed(VEO_RECORD, successFlag=flag)["data"], SECRETS)
    assert seen.state is state and seen.error == error


def test_a_veo_failure_says_why_and_never_repeats_the_key():
    data = changed(VEO_RECORD, successFlag=3, errorCode=400, response=None,
                   errorMessage=f"Your prompt was flagged (key {API_KEY})")["data"]
    seen = observation_from_veo(data, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "Your prompt was flagged (key [redacted])"
    assert observation_from_veo({**data, "errorMessage": ""}, SECRETS).error == "400"


@pytest.mark.parametrize("observe, data", [
    (observation_from_veo, {"successFlag": 1, "response": {"resultUrls": []}}),
    (observation_from_veo, {"successFlag": 1, "response": None}),
    (observation_from_flux, {"successFlag": 1, "response": {"originImageUrl": "https://example.com/o.jpg",
                                                            "resultImageUrl": ""}}),
    (observation_from_runway, {"state": "success", "videoInfo": {"videoUrl": "", "imageUrl": "https://x/t.png"}}),
    (observation_from_suno, {"status": "SUCCESS", "response": {"sunoData": [{"id": "a", "audioUrl": ""}]}}),
])
def test_a_success_without_an_output_is_a_failure(observe, data):
    seen = observe(data, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == NO_OUTPUT and seen.output_urls == ()


@pytest.mark.parametrize("observe, data", [
    (observation_from_veo, {"successFlag": 7}),
    (observation_from_veo, {"successFlag": True}),
    (observation_from_flux, {}),
    (observation_from_runway, {"state": "waiting"}),  # the Market's spelling, not Runway's
    (observation_from_suno, {"status": "COMPLETE"}),
])
def test_a_state_kie_does_not_document_is_not_guessed(observe, data):
    with pytest.raises(Transient, match="unknown task"):
        observe(data, SECRETS)


def test_the_documented_flux_record_is_its_result_image_only():
    seen = record_outcome(FLUX_RECORD, SECRETS, FLUX_KONTEXT.observe)
    assert seen.state is TaskState.SUCCEEDED and seen.output_urls == ("https://example.com/result.jpg",)


@pytest.mark.parametrize("flag, state, error", [
    (0, TaskState.RUNNING, None),
    (2, TaskState.FAILED, "CREATE_TASK_FAILED"),
    (3, TaskState.FAILED, "GENERATE_FAILED"),
])
def test_every_flux_success_flag(flag, state, error):
    seen = observation_from_flux(changed(FLUX_RECORD, successFlag=flag, response=None)["data"], SECRETS)
    assert seen.state is state and seen.error == error


def test_the_documented_runway_record_is_its_video_not_its_thumbnail():
    seen = record_outcome(RUNWAY_RECORD, SECRETS, RUNWAY.observe)
    assert seen == Observation(state=TaskState.SUCCEEDED, output_urls=("https://file.com/k/xxxxxxx.mp4",))


@pytest.mark.parametrize("state", ["wait", "queueing", "generating"])
def test_a_runway_task_not_finished_is_running(state):
    assert observation_from_runway(changed(RUNWAY_RECORD, state=state)["data"], SECRETS).state is TaskState.RUNNING


def test_an_expired_runway_video_is_a_success_whose_output_is_gone():
    seen = observation_from_runway(changed(RUNWAY_RECORD, expireFlag=1)["data"], SECRETS)
    assert seen.state is TaskState.SUCCEEDED and seen.output_removed and seen.output_urls == ()


def test_a_failed_runway_task_gives_its_message_or_its_integer_code():
    data = changed(RUNWAY_RECORD, state="fail", videoInfo=None)["data"]
    assert observation_from_runway(data, SECRETS) == Observation(
        state=TaskState.FAILED, error="Generation failed, please try again later")
    assert observation_from_runway({**data, "failMsg": ""}, SECRETS).error == "400"


def test_the_documented_suno_record_is_its_track_labelled_with_its_id():
    seen = record_outcome(SUNO_RECORD, SECRETS, SUNO.observe)
    assert seen == Observation(state=TaskState.SUCCEEDED, output_urls=("https://example.cn/****.mp3",),
                               url_labels=("8551****662c",), usage=(Usage(UsageUnit.SECONDS, 198.44),))


def two_tracks(**second) -> list[dict]:
    first = SUNO_RECORD["data"]["response"]["sunoData"][0]
    return [first, {**first, "id": "9662****1558", "audioUrl": "https://example.cn/two.mp3", "duration": 228.28,
                    **second}]


def test_two_suno_tracks_are_two_outputs_in_order_and_their_durations_summed():
    seen = observation_from_suno({**SUNO_RECORD["data"], "response": {"sunoData": two_tracks()}}, SECRETS)
    assert seen.output_urls == ("https://example.cn/****.mp3", "https://example.cn/two.mp3")
    assert seen.url_labels == ("8551****662c", "9662****1558")
    assert seen.usage == (Usage(UsageUnit.SECONDS, pytest.approx(426.72)),)


def test_suno_usage_only_when_every_track_gives_its_duration():
    seen = observation_from_suno({**SUNO_RECORD["data"], "response": {"sunoData": two_tracks(duration=None)}},
                                 SECRETS)
    assert len(seen.output_urls) == 2 and seen.usage == ()


@pytest.mark.parametrize("status", ["PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"])
def test_suno_stages_are_still_running_even_with_a_first_track(status):
    seen = observation_from_suno({**SUNO_RECORD["data"], "status": status}, SECRETS)
    assert seen == Observation(state=TaskState.RUNNING)


@pytest.mark.parametrize("status", ["CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "SENSITIVE_WORD_ERROR"])
def test_suno_failures(status):
    data = {**SUNO_RECORD["data"], "status": status, "response": None, "errorCode": 413,
            "errorMessage": "Theme or prompt too long"}
    assert observation_from_suno(data, SECRETS) == Observation(state=TaskState.FAILED,
                                                               error="Theme or prompt too long")
    assert observation_from_suno({**data, "errorMessage": None, "errorCode": None}, SECRETS).error == status


def test_a_suno_callback_exception_is_read_from_its_tracks():
    # KIE could not deliver its callback: the music is there all the same.
    data = {**SUNO_RECORD["data"], "status": "CALLBACK_EXCEPTION", "errorMessage": "callback failed"}
    seen = observation_from_suno(data, SECRETS)
    assert seen.state is TaskState.SUCCEEDED and seen.url_labels == ("8551****662c",)
    empty = observation_from_suno({**data, "response": {"sunoData": []}}, SECRETS)
    assert empty == Observation(state=TaskState.FAILED, error="callback failed")


def test_a_suno_track_id_too_long_for_a_label_is_no_label():
    seen = observation_from_suno({**SUNO_RECORD["data"], "response": {"sunoData": two_tracks(id="x" * 201)}},
                                 SECRETS)
    assert seen.url_labels == ("8551****662c", None)


# ------------------------------------------------------------------ the code table


@pytest.mark.parametrize("code, error", [
    (409, Rejected), (413, Rejected), (451, Rejected),  # the families' refusals
    (430, Transient),  # Suno's "call frequency too high"
    (500, Uncertain), (531, Uncertain),
    (400, Uncertain),  # Veo's generate page gives it only its 1080P call's words
])
def test_the_families_create_codes(code, error):
    with pytest.raises(error, match=f"code {code}"):
        submit_outcome({"code": code, "msg": "no", "data": None}, SECRETS)


@pytest.mark.parametrize("observe", [VEO.observe, RUNWAY.observe, FLUX_KONTEXT.observe, SUNO.observe])
def test_every_familys_record_codes(observe):
    with pytest.raises(Rejected, match="no such task"):
        record_outcome({"code": 404, "msg": "task not found", "data": None}, SECRETS, observe)
    for code in (400, 401, 429, 451, 455, 500):
        with pytest.raises(Transient, match=f"code {code}"):
            record_outcome({"code": code, "msg": "not now", "data": None}, SECRETS, observe)
    for code in (422, 501):
        failed = record_outcome({"code": code, "msg": "Generation failed", "data": {"errorMessage": "nsfw"}},
                                SECRETS, observe)
        assert failed == Observation(state=TaskState.FAILED, error="nsfw")


# ------------------------------------------------------------------ models and bodies


@pytest.mark.parametrize("model, family, own", [
    ("veo/veo3_fast", VEO, "veo3_fast"),
    ("runway/generate", RUNWAY, "generate"),
    ("flux-kontext/flux-kontext-max", FLUX_KONTEXT, "flux-kontext-max"),
    ("suno/V4_5", SUNO, "V4_5"),
    ("suno/", SUNO, ""),
    ("kling/v2", None, "kling/v2"),
    ("veo", None, "veo"),
    ("google/veo3", None, "google/veo3"),
    ("flux-2/pro-text-to-image", None, "flux-2/pro-text-to-image"),
])
def test_the_prefix_chooses_the_family(model, family, own):
    assert family_of(model) == (family, own)


CALLBACK = "https://longcall.example/webhooks/kie/job_1?token=secret"


def test_a_family_body_is_the_input_with_our_model_and_callback():
    assert family_body(VEO, "veo3", {"prompt": "p", "aspect_ratio": "16:9"}, CALLBACK) == {
        "prompt": "p", "aspect_ratio": "16:9", "model": "veo3", "callBackUrl": CALLBACK}
    assert family_body(VEO, "veo3", {"prompt": "p", "model": "veo3"}, None) == {"prompt": "p", "model": "veo3"}
    # Runway's body has no model field.
    assert family_body(RUNWAY, "generate", {"prompt": "p", "duration": 5}, None) == {"prompt": "p", "duration": 5}


@pytest.mark.parametrize("family, model, input, callback, words", [
    (RUNWAY, "gen4", {"prompt": "p"}, CALLBACK, "runway/generate"),
    (VEO, "", {"prompt": "p"}, CALLBACK, "needs its model"),
    (VEO, "veo3", {"prompt": "p", "model": "veo3_fast"}, CALLBACK, "input.model"),
    (FLUX_KONTEXT, "flux-kontext-pro", {"callBackUrl": "https://elsewhere.example/hook"}, CALLBACK, "callBackUrl"),
    (SUNO, "V5", {"prompt": "p", "customMode": False, "instrumental": False}, None, "PUBLIC_URL"),
])
def test_a_body_longcall_cannot_send_is_refused_before_any_call(family, model, input, callback, words):
    with pytest.raises(Rejected, match=words) as caught:
        family_body(family, model, input, callback)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("echo, sent, callback, matches", [
    ({"callBackUrl": "https://l.example/webhooks/kie/job_1?token=other"}, {}, CALLBACK.replace(
        "longcall.example", "l.example"), True),  # the token is not compared
    ({"callBackUrl": "https://l.example/webhooks/kie/job_2"}, {}, "https://l.example/webhooks/kie/job_1?t=1",
     False),
    ({"model": "V4"}, {"model": "V5"}, None, False),
    ({"model": "V5", "prompt": "translated"}, {"model": "V5", "prompt": "p"}, None, True),
    ({}, {"model": "V5"}, CALLBACK, True),  # Runway echoes neither
    ({"callBackUrl": "https://l.example/webhooks/kie/job_1"}, {"model": "x"}, None, True),
])
def test_which_echoed_request_is_this_jobs(echo, sent, callback, matches):
    assert echo_matches(echo, sent, callback) is matches


# ------------------------------------------------------------------ facts per model


@pytest.mark.parametrize("model, stale, first_poll, give_up", [
    ("veo/veo3", 25 * 60, 10.0, None),
    ("suno/V5", 30 * 60, 10.0, None),
    ("runway/generate", 25 * 60, 5.0, None),
    ("flux-kontext/flux-kontext-pro", 10 * 60, 2.0, None),
    ("infinitalk/from-audio", 75 * 60, 15.0, 3 * 3600),
    ("kling/ai-avatar-pro", 75 * 60, 15.0, 3 * 3600),
    ("volcengine/video-to-video-lip-sync", 75 * 60, 15.0, 3 * 3600),
    ("wan/2-2-a14b-speech-to-video-turbo", 75 * 60, 15.0, 3 * 3600),
    ("kling/v2", 60.0, 2.0, None),  # the Market's own defaults
])
def test_facts_per_model(model, stale, first_poll, give_up):
    facts = ADAPTER.facts_for(model)
    assert (facts.stale_after_s, facts.poll_delays_s[0], facts.give_up_after_s) == (stale, first_poll, give_up)
    assert not facts.can_cancel and not facts.can_find and not facts.idempotent_submit
    assert facts.give_up_after_s is None or facts.give_up_after_s > facts.stale_after_s


def test_stale_after_s_given_overrides_every_models_own():
    adapter = KieProvider("http://127.0.0.1:9/kie", API_KEY, secret_keys=(SERVER_KEY,), stale_after_s=42)
    assert adapter.facts_for("veo/veo3").stale_after_s == 42 and adapter.facts_for("kling/v2").stale_after_s == 42
    assert adapter.facts_for("infinitalk/from-audio").give_up_after_s == LIP_SYNC_TIMINGS["give_up_after_s"]


def test_results_kept_14_days_where_the_pages_say_so():
    assert ADAPTER.facts_for("runway/generate").output_ttl_s == 14 * 86400
    assert ADAPTER.facts_for("flux-kontext/flux-kontext-pro").output_ttl_s == 14 * 86400


# ------------------------------------------------------------------ callbacks (pure)


@pytest.mark.parametrize("body, task_id, final", [
    (VEO_CALLBACK, "veo_task_abcdef123456", True),
    (RUNWAY_CALLBACK, "ee603959-debb-48d1-98c4-a6d1c717eba6", True),
    (FLUX_CALLBACK, "task12345", True),
    (SUNO_COMPLETE, "2fac****9f72", True),
    (SUNO_ERROR, "2fac****9f72", True),
    (changed(SUNO_COMPLETE, callbackType="text", data=[]), "2fac****9f72", False),
    (changed(SUNO_COMPLETE, callbackType="first"), "2fac****9f72", False),
    ({"code": 200, "data": {"taskId": 7, "task_id": "t_2"}}, "t_2", True),
    (b"not json", None, True),  # the settle step asks the status endpoint anyway
])
def test_the_task_each_callback_names_and_whether_it_ends(body, task_id, final):
    assert ADAPTER.webhook_task_id(hook(body)) == task_id
    assert ADAPTER.is_final_webhook(hook(body)) is final


HMAC_KEY = "account-webhook-hmac-key"


def signed(body: dict, t: int, key: str = HMAC_KEY) -> dict[str, str]:
    """KIE's recipe, written out from /common-api/webhook-verification:
    base64(HMAC-SHA256(taskId + "." + timestamp, webhookHmacKey))."""
    data = body["data"]
    task_id = data.get("taskId") or data.get("task_id")
    digest = hmac.new(key.encode(), f"{task_id}.{t}".encode(), hashlib.sha256).digest()
    return {"x-webhook-timestamp": str(t), "x-webhook-signature": base64.b64encode(digest).decode()}


@pytest.mark.parametrize("body", [VEO_CALLBACK, RUNWAY_CALLBACK, FLUX_CALLBACK, SUNO_COMPLETE])
def test_kies_signature_over_the_task_id_each_family_names(body):
    now = 1_760_000_000
    raw = json.dumps(body).encode()
    assert signature_ok(HMAC_KEY, signed(body, now), raw, now)
    assert signature_ok(HMAC_KEY, signed(body, now - 290), raw, now)
    assert signature_ok(HMAC_KEY, signed(body, now + 290), raw, now)  # a clock a little ahead
    assert not signature_ok(HMAC_KEY, signed(body, now - 301), raw, now)
    assert not signature_ok(HMAC_KEY, signed(body, now, key="another-key"), raw, now)
    other_task = json.dumps(changed(body, taskId="x", task_id="x")).encode()
    assert not signature_ok(HMAC_KEY, signed(body, now), other_task, now)
    assert not signature_ok(HMAC_KEY, {}, raw, now)
    assert not signature_ok(HMAC_KEY, {**signed(body, now), "x-webhook-timestamp": "+1760000000"}, raw, now)


async def test_with_the_accounts_key_a_callback_needs_our_token_and_kies_signature():
    adapter = KieProvider("http://127.0.0.1:9/kie", API_KEY, secret_keys=(SERVER_KEY,), webhook_hmac_key=HMAC_KEY)
    job_id = "job_" + "1" * 24
    token = {"token": make_capability_token("kie", job_id, SERVER_KEY)}
    raw = json.dumps(VEO_CALLBACK).encode()
    now = int(time.time())

    def delivery(headers: dict, query: dict) -> WebhookRequest:
        return WebhookRequest(job_id=job_id, headers=headers, query=query, raw_body=raw)

    assert await adapter.verify(delivery(signed(VEO_CALLBACK, now), token))
    assert not await adapter.verify(delivery({}, token))
    assert not await adapter.verify(delivery(signed(VEO_CALLBACK, now), {}))
    assert not await adapter.verify(delivery(signed(VEO_CALLBACK, now - 3600), token))
    # Without the account's key, our token is the whole check.
    assert await ADAPTER.verify(delivery({}, token))


# ------------------------------------------------------------------ over real HTTP, against the simulator

SUBMIT_TIMEOUT_S = 1.0
CASES = {
    "veo": ("veo/veo3_fast", {}),
    "runway": ("runway/generate", {"duration": 5, "quality": "720p"}),
    "flux-kontext": ("flux-kontext/flux-kontext-pro", {}),
    "suno": ("suno/V4_5", {"customMode": False, "instrumental": False}),
}
NAMES = sorted(CASES)
DISCARD = "http://127.0.0.1:9"  # nothing listens: the simulator's callbacks go nowhere


@pytest.fixture(scope="module")
def simulator():
    with RunningSimulator() as sim:
        yield sim.url


@pytest.fixture
async def adapter(simulator):
    clear_faults(simulator)
    made = KieProvider(simulator + "/kie", API_KEY, secret_keys=(SERVER_KEY,), timeout_s=SUBMIT_TIMEOUT_S)
    yield made
    await made.aclose()
    clear_faults(simulator)


def request_for(family: str, callback_base: str | None = DISCARD, **controls) -> SubmitRequest:
    model, fields = CASES[family]
    job_id = "job_" + secrets.token_hex(12)
    callback = None
    if callback_base:
        callback = f"{callback_base}/webhooks/kie/{job_id}?token={make_capability_token('kie', job_id, SERVER_KEY)}"
    return SubmitRequest(job_id=job_id, model=model, input={"prompt": f"a cat for {job_id}", **fields, **controls},
                         callback_url=callback)


def task_of(request: SubmitRequest, task_id: str) -> Task:
    return Task(task_id=task_id, model=request.model)


async def until_final(adapter: KieProvider, task: Task, timeout_s: float = 10.0) -> Observation:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = await adapter.status(task)
        if seen.state is not TaskState.RUNNING or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("family", NAMES)
async def test_submit_runs_then_succeeds_with_its_outputs(adapter, family):
    request = request_for(family, duration_s=0.5, output_bytes=100)
    submitted = await adapter.submit(request, request.job_id)
    task = task_of(request, submitted.task_id)
    assert (await adapter.status(task)).state is TaskState.RUNNING
    final = await until_final(adapter, task)
    assert final.state is TaskState.SUCCEEDED, final
    assert len(final.output_urls) == (2 if family == "suno" else 1)
    if family == "suno":
        assert all(final.url_labels) and final.usage == (Usage(UsageUnit.SECONDS, 60.0),)
    async with httpx.AsyncClient(trust_env=False) as client:
        for url in final.output_urls:
            response = await client.get(url)
            assert response.status_code == 200 and len(response.content) == 100


@pytest.mark.parametrize("family", NAMES)
async def test_a_failed_task_is_failed_with_a_reason(adapter, family):
    request = request_for(family, duration_s=0.2, outcome="failed")
    submitted = await adapter.submit(request, request.job_id)
    final = await until_final(adapter, task_of(request, submitted.task_id))
    assert final.state is TaskState.FAILED and final.error and final.output_urls == ()


async def test_a_runway_video_past_its_lifetime_is_output_removed(adapter):
    request = request_for("runway", duration_s=0.1, output_ttl_s=0.2)
    task = task_of(request, (await adapter.submit(request, request.job_id)).task_id)
    assert (await until_final(adapter, task)).state is TaskState.SUCCEEDED
    await asyncio.sleep(0.4)
    seen = await adapter.status(task)
    assert seen.state is TaskState.SUCCEEDED and seen.output_removed


@pytest.mark.parametrize("family, model", [("veo", "veo/veo2"), ("suno", "suno/V1"),
                                           ("flux-kontext", "flux-kontext/flux-kontext-ultra")])
async def test_a_model_kie_does_not_offer_is_rejected_and_creates_nothing(adapter, simulator, family, model):
    request = request_for(family)
    request = SubmitRequest(request.job_id, model, request.input, request.callback_url)
    before = stats(simulator)["tasks_created"]
    with pytest.raises(Rejected, match="code 422"):
        await adapter.submit(request, request.job_id)
    assert stats(simulator)["tasks_created"] == before


async def test_a_suno_job_without_a_callback_url_is_refused_before_any_call(adapter, simulator):
    before = stats(simulator)["tasks_created"]
    with pytest.raises(Rejected, match="PUBLIC_URL"):
        await adapter.submit(request_for("suno", callback_base=None), "job_x")
    assert stats(simulator)["tasks_created"] == before


@pytest.mark.parametrize("family", NAMES)
async def test_an_unknown_task_is_rejected(adapter, family):
    with pytest.raises(Rejected, match="no such task"):
        await adapter.status(Task(task_id="nosuchtask0123456789", model=CASES[family][0]))


@pytest.mark.parametrize("family", NAMES)
async def test_throttle_and_status_errors_are_transient(adapter, simulator, family):
    request = request_for(family, duration_s=30)
    task = task_of(request, (await adapter.submit(request, request.job_id)).task_id)
    set_faults(simulator, throttle=1)
    for call in (adapter.submit(request_for(family), "job_y"), adapter.status(task)):
        with pytest.raises(Transient) as caught:
            await call
        assert caught.value.retry_after == 1.0
    set_faults(simulator, status_error=1)
    with pytest.raises(Transient):
        await adapter.status(task)
    set_faults(simulator, submit_error=1)
    with pytest.raises(Uncertain):  # a 500 does not say whether a task was made
        await adapter.submit(request_for(family), "job_z")


@pytest.mark.parametrize("family", NAMES)
async def test_an_in_doubt_submit_is_uncertain_and_its_callback_names_a_task_we_confirm(adapter, simulator,
                                                                                       receiver, family):
    set_faults(simulator, submit_timeout_after_create=1)
    request = request_for(family, callback_base=receiver.url, duration_s=0.3)
    started = time.monotonic()
    with pytest.raises(Uncertain):
        await adapter.submit(request, request.job_id)
    assert time.monotonic() - started < SUBMIT_TIMEOUT_S + 2
    clear_faults(simulator)
    path = f"/webhooks/kie/{request.job_id}"
    assert stats(simulator)["creates_by_callback_url"][receiver.url + path] == 1
    arrival = await receiver.wait_for(path)
    delivery = WebhookRequest(job_id=request.job_id, headers=arrival.headers, query=arrival.query,
                              raw_body=arrival.body)
    assert await adapter.verify(delivery)
    named = adapter.webhook_task_id(delivery)
    assert named and await adapter.confirm_task(named, request) is not None
    assert await adapter.confirm_task("nosuchtask0123456789", request) is None
    if family != "runway":  # Runway's record echoes no callback URL or model to compare
        other_job = request_for(family, callback_base=receiver.url)
        assert await adapter.confirm_task(named, other_job) is None


async def arrivals_at(receiver, path: str, count: int, timeout_s: float = 10.0) -> list:
    for _ in range(int(timeout_s / 0.05)):
        arrivals = [a for a in receiver.arrivals if a.path == path]
        if len(arrivals) >= count:
            return arrivals
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} callbacks did not arrive at {path}")


async def test_suno_stage_callbacks_are_accepted_without_a_settle(adapter, receiver):
    request = request_for("suno", callback_base=receiver.url, duration_s=0.6)
    submitted = await adapter.submit(request, request.job_id)
    path = f"/webhooks/kie/{request.job_id}"
    arrivals = await arrivals_at(receiver, path, 3)
    finals = []
    for arrival in arrivals:
        delivery = WebhookRequest(job_id=request.job_id, headers=arrival.headers, query=arrival.query,
                                  raw_body=arrival.body)
        assert await adapter.verify(delivery) and adapter.webhook_task_id(delivery) == submitted.task_id
        finals.append(adapter.is_final_webhook(delivery))
    assert finals == [False, False, True]


async def test_nothing_we_say_repeats_the_key_or_the_callback_token(adapter, simulator, closed_port_url):
    request = request_for("veo", duration_s=5)
    token = request.callback_url.partition("token=")[2]
    messages = []
    for faults in ({"throttle": 1}, {"submit_error": 1}):
        set_faults(simulator, **faults)
        with pytest.raises((Transient, Uncertain)) as caught:
            await adapter.submit(request, request.job_id)
        messages.append(str(caught.value))
    clear_faults(simulator)
    with pytest.raises(Rejected) as caught:
        await adapter.submit(SubmitRequest(request.job_id, "veo/nope", request.input, request.callback_url), "j")
    messages.append(str(caught.value))
    offline = KieProvider(closed_port_url + "/kie", API_KEY, secret_keys=(SERVER_KEY,))
    try:
        for call in (offline.submit(request, request.job_id), offline.status(Task("t1", model="suno/V5"))):
            with pytest.raises(Transient) as caught:
                await call
            messages.append(str(caught.value))
    finally:
        await offline.aclose()
    assert len(messages) == 5
    assert all(API_KEY not in m and token not in m for m in messages), messages
