"""KIE's own families under /kie (Veo 3.1, Runway, Flux Kontext, Suno), each
answering only the fields its docs.kie.ai pages document: the generate page
(request fields, required ones, the create answer), the details page (the
record's fields and states), the callbacks page (the body of each callback),
and the optional signature of /common-api/webhook-verification."""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import time

import httpx
import pytest

from app.simulator import output_sha256

from .helpers import wait_until

AUTH = {"Authorization": "Bearer kie-test"}


def suno_body(**fields) -> dict:
    return {"model": "V4_5", "customMode": False, "instrumental": False, "prompt": "a calm piano tune",
            "callBackUrl": "http://127.0.0.1:9/discard", **fields}


# Each family: a valid generate body (controls beside its own fields), its
# routes, and its details page's `data` fields.
FAMILIES = {
    "veo": {
        "generate": "/kie/api/v1/veo/generate", "record": "/kie/api/v1/veo/record-info",
        "body": lambda **f: {"prompt": "a cat in a garden", "model": "veo3_fast", **f},
        # https://docs.kie.ai/veo3-api/get-veo-3-video-details
        "fields": {"taskId", "paramJson", "completeTime", "response", "successFlag", "errorCode", "errorMessage",
                   "createTime", "fallbackFlag"},
    },
    "runway": {
        "generate": "/kie/api/v1/runway/generate", "record": "/kie/api/v1/runway/record-detail",
        "body": lambda **f: {"prompt": "a fluffy orange cat dancing", "duration": 5, "quality": "720p",
                             "aspectRatio": "16:9", **f},
        # https://docs.kie.ai/runway-api/get-ai-video-details
        "fields": {"taskId", "parentTaskId", "generateParam", "state", "generateTime", "videoInfo", "failCode",
                   "failMsg", "expireFlag"},
    },
    "flux-kontext": {
        "generate": "/kie/api/v1/flux/kontext/generate", "record": "/kie/api/v1/flux/kontext/record-info",
        "body": lambda **f: {"prompt": "a mountain lake at sunset", "model": "flux-kontext-pro", **f},
        # https://docs.kie.ai/flux-kontext-api/get-image-details
        "fields": {"taskId", "paramJson", "completeTime", "response", "successFlag", "errorCode", "errorMessage",
                   "createTime"},
    },
    "suno": {
        "generate": "/kie/api/v1/generate", "record": "/kie/api/v1/generate/record-info",
        "body": suno_body,
        # https://docs.kie.ai/suno-api/get-music-details
        "fields": {"taskId", "parentMusicId", "param", "response", "status", "type", "errorCode", "errorMessage"},
    },
}
NAMES = sorted(FAMILIES)


def generate(client: httpx.Client, family: str, **fields) -> httpx.Response:
    spec = FAMILIES[family]
    return client.post(spec["generate"], json=spec["body"](**fields), headers=AUTH)


def task_of(client: httpx.Client, family: str, **fields) -> str:
    response = generate(client, family, **fields)
    assert response.status_code == 200, response.text
    answer = response.json()
    # Every generate page's answer: {"code": 200, "msg": "success", "data": {"taskId": "..."}}.
    assert answer == {"code": 200, "msg": "success", "data": {"taskId": answer["data"]["taskId"]}}
    return answer["data"]["taskId"]


def read(client: httpx.Client, family: str, task_id: str) -> dict:
    response = client.get(FAMILIES[family]["record"], params={"taskId": task_id}, headers=AUTH)
    assert response.status_code == 200
    return response.json()


def data_of(client: httpx.Client, family: str, task_id: str) -> dict:
    body = read(client, family, task_id)
    assert set(body) == {"code", "msg", "data"} and body["code"] == 200 and body["msg"] == "success"
    assert set(body["data"]) == FAMILIES[family]["fields"]
    return body["data"]


def wait_data(client, family: str, task_id: str, done, what: str, timeout: float = 5.0) -> dict:
    def ready() -> dict | None:
        data = data_of(client, family, task_id)
        return data if done(data) else None

    return wait_until(ready, timeout, what)


def created(client: httpx.Client) -> int:
    return client.get("/_sim/stats").json()["tasks_created"]


def fetch(url: str) -> httpx.Response:
    return httpx.get(url, trust_env=False)


def clock(value: str) -> float:
    return dt.datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()


# ------------------------------------------------------------------ every family


@pytest.mark.parametrize("family", NAMES)
def test_routes_want_a_bearer_token_and_answer_in_the_body(client, family):
    spec = FAMILIES[family]
    response = client.post(spec["generate"], json=spec["body"]())
    assert response.status_code == 200 and response.json()["code"] == 401
    assert client.get(spec["record"], params={"taskId": "x"}).json()["code"] == 401
    assert created(client) == 0


@pytest.mark.parametrize("family", NAMES)
def test_unknown_missing_or_other_familys_task_id(client, family):
    spec = FAMILIES[family]
    assert read(client, family, "nope") == {"code": 404, "msg": "task not found", "data": None}
    assert client.get(spec["record"], headers=AUTH).json()["code"] == 422
    # A task of another family (or of the Market) is not one this route knows.
    other = "veo" if family != "veo" else "suno"
    assert read(client, family, task_of(client, other, duration_s=5))["code"] == 404
    market = client.post("/kie/api/v1/jobs/createTask", json={"model": "m", "input": {}}, headers=AUTH).json()
    assert read(client, family, market["data"]["taskId"])["code"] == 404
    # ... nor does the Market's route know a family's.
    market_read = client.get("/kie/api/v1/jobs/recordInfo", params={"taskId": task_of(client, family)},
                             headers=AUTH).json()
    assert market_read["code"] == 404


@pytest.mark.parametrize("family", NAMES)
@pytest.mark.parametrize("change", ["not json", "an array", "a bad callback", "a bad control"])
def test_an_invalid_generate_is_code_422_and_creates_nothing(client, family, change):
    spec = FAMILIES[family]
    if change == "not json":
        response = client.post(spec["generate"], content=b"{oops", headers=AUTH)
    elif change == "an array":
        response = client.post(spec["generate"], json=[spec["body"]()], headers=AUTH)
    elif change == "a bad callback":
        response = generate(client, family, callBackUrl="javascript:alert(1)")
    else:
        response = generate(client, family, outputs=-2)
    assert response.status_code == 200
    assert response.json()["code"] == 422 and response.json()["msg"] and response.json()["data"] is None
    assert created(client) == 0


@pytest.mark.parametrize("family, fields, missing", [
    ("veo", {"prompt": None}, "prompt"),
    ("veo", {"model": "veo2"}, "model"),
    ("runway", {"duration": None}, "duration"),
    ("runway", {"quality": None}, "quality"),
    ("runway", {"duration": "five"}, "duration"),
    ("flux-kontext", {"prompt": ""}, "prompt"),
    ("flux-kontext", {"model": "flux-kontext-ultra"}, "model"),
    ("suno", {"model": None}, "model"),
    ("suno", {"model": "V2"}, "model"),
    ("suno", {"callBackUrl": None}, "callBackUrl"),
    ("suno", {"customMode": None}, "customMode"),
    ("suno", {"instrumental": "no"}, "instrumental"),
    ("suno", {"customMode": True, "instrumental": True, "prompt": None, "style": "Jazz"}, "title"),
    ("suno", {"prompt": None}, "prompt"),
])
def test_what_a_generate_page_requires(client, family, fields, missing):
    body = {k: v for k, v in FAMILIES[family]["body"](**fields).items() if v is not None}
    response = client.post(FAMILIES[family]["generate"], json=body, headers=AUTH)
    assert response.json()["code"] == 422 and missing in response.json()["msg"]
    assert created(client) == 0


def test_a_custom_instrumental_suno_task_needs_no_prompt(client):
    body = {k: v for k, v in suno_body(customMode=True, instrumental=True, style="Classical",
                                       title="Peaceful Piano").items() if k != "prompt"}
    assert client.post("/kie/api/v1/generate", json=body, headers=AUTH).json()["code"] == 200


# ------------------------------------------------------------------ Veo 3.1


def test_veo_generates_then_succeeds_with_result_urls(client):
    task_id = task_of(client, "veo", duration_s=0.6, outputs=2, output_bytes=500)
    assert task_id.startswith("veo_task_")
    first = data_of(client, "veo", task_id)
    assert first["successFlag"] == 0 and first["response"] is None and first["completeTime"] is None
    assert json.loads(first["paramJson"]) == {"prompt": "a cat in a garden", "model": "veo3_fast",
                                              "duration_s": 0.6, "outputs": 2, "output_bytes": 500}
    done = wait_data(client, "veo", task_id, lambda d: d["successFlag"] != 0, "veo success")
    assert done["successFlag"] == 1 and done["errorCode"] is None and done["errorMessage"] == ""
    assert done["fallbackFlag"] is False
    response = done["response"]
    assert set(response) == {"taskId", "resultUrls", "originUrls", "resolution"} and response["taskId"] == task_id
    assert len(response["resultUrls"]) == 2 and response["originUrls"] == []
    for index, url in enumerate(response["resultUrls"]):
        got = fetch(url)
        assert got.headers["content-type"] == "video/mp4"
        assert hashlib.sha256(got.content).hexdigest() == output_sha256(task_id, index, 500)
    # "2025-06-06 10:30:00"
    assert abs(clock(done["createTime"]) - time.time()) < 60 and clock(done["completeTime"]) >= clock(
        done["createTime"])


def test_a_failed_veo_task_is_success_flag_3(client):
    task_id = task_of(client, "veo", duration_s=0.1, outcome="failed")
    done = wait_data(client, "veo", task_id, lambda d: d["successFlag"] != 0, "veo failure")
    assert done["successFlag"] == 3 and done["errorCode"] == 501 and done["errorMessage"]
    assert done["response"] is None and done["completeTime"]


# ------------------------------------------------------------------ Runway


def test_runway_waits_generates_then_succeeds_with_one_video(client):
    task_id = task_of(client, "runway", duration_s=1.0, outputs=3, output_bytes=300)
    first = data_of(client, "runway", task_id)
    assert first["state"] in ("wait", "queueing") and first["videoInfo"] is None
    assert first["generateParam"] == {"prompt": "a fluffy orange cat dancing", "imageUrl": "",
                                      "expandPrompt": False}
    wait_data(client, "runway", task_id, lambda d: d["state"] == "generating", "generating")
    done = wait_data(client, "runway", task_id, lambda d: d["state"] == "success", "success")
    video = done["videoInfo"]
    assert set(video) == {"videoId", "taskId", "videoUrl", "imageUrl"} and video["taskId"] == task_id
    assert done["failCode"] is None and done["failMsg"] == "" and done["expireFlag"] == 0
    assert done["parentTaskId"] == "" and clock(done["generateTime"]) > 0
    got = fetch(video["videoUrl"])  # one video per task, whatever `outputs` says
    assert hashlib.sha256(got.content).hexdigest() == output_sha256(task_id, 0, 300)
    assert fetch(video["videoUrl"].removesuffix("/0") + "/1").status_code == 404


def test_a_runway_video_past_its_lifetime_is_expire_flag_1(client):
    task_id = task_of(client, "runway", duration_s=0.1, output_ttl_s=0.3)
    done = wait_data(client, "runway", task_id, lambda d: d["state"] == "success", "success")
    expired = wait_data(client, "runway", task_id, lambda d: d["expireFlag"] == 1, "expired")
    assert expired["state"] == "success" and fetch(expired["videoInfo"]["videoUrl"]).status_code == 404
    assert done["videoInfo"] == expired["videoInfo"]


def test_a_failed_runway_task_has_an_integer_fail_code(client):
    task_id = task_of(client, "runway", duration_s=0.1, outcome="failed")
    done = wait_data(client, "runway", task_id, lambda d: d["state"] == "fail", "fail")
    assert done["failCode"] == 400 and done["failMsg"] and done["videoInfo"] is None


# ------------------------------------------------------------------ Flux Kontext


def test_flux_kontext_succeeds_with_one_result_image(client):
    task_id = task_of(client, "flux-kontext", duration_s=0.2, outputFormat="png",
                      inputImage="https://example.com/input.jpg", output_bytes=200)
    first = data_of(client, "flux-kontext", task_id)
    assert first["successFlag"] == 0 and first["response"] is None
    done = wait_data(client, "flux-kontext", task_id, lambda d: d["successFlag"] != 0, "flux success")
    assert done["successFlag"] == 1 and done["errorCode"] is None
    # The origin is KIE's copy of the input image, never an output.
    assert done["response"]["originImageUrl"] == "https://example.com/input.jpg"
    got = fetch(done["response"]["resultImageUrl"])
    assert got.headers["content-type"] == "image/png"
    assert hashlib.sha256(got.content).hexdigest() == output_sha256(task_id, 0, 200)
    # "2024-03-20T10:30:00Z"
    assert dt.datetime.fromisoformat(done["completeTime"].replace("Z", "+00:00")) >= dt.datetime.fromisoformat(
        done["createTime"].replace("Z", "+00:00"))


def test_flux_kontext_answers_jpeg_by_default_and_fails_as_documented(client):
    done = wait_data(client, "flux-kontext", task_of(client, "flux-kontext", duration_s=0.1),
                     lambda d: d["successFlag"] != 0, "flux success")
    assert fetch(done["response"]["resultImageUrl"]).headers["content-type"] == "image/jpeg"
    assert done["response"]["originImageUrl"] == ""
    failed = wait_data(client, "flux-kontext", task_of(client, "flux-kontext", duration_s=0.1, outcome="failed"),
                       lambda d: d["successFlag"] != 0, "flux failure")
    assert failed["successFlag"] == 3 and failed["errorCode"] == 501 and failed["errorMessage"]


# ------------------------------------------------------------------ Suno


def test_suno_goes_through_its_stages_with_two_tracks(client):
    task_id = task_of(client, "suno", duration_s=1.5, output_bytes=400)
    seen = []

    def stage(status: str) -> dict:
        data = wait_data(client, "suno", task_id, lambda d: d["status"] == status, status)
        seen.append(data)
        return data

    pending = stage("PENDING")
    assert pending["response"] == {"taskId": task_id, "sunoData": []} and pending["type"] == "GENERATE"
    assert stage("TEXT_SUCCESS")["response"]["sunoData"] == []
    first = stage("FIRST_SUCCESS")["response"]["sunoData"]
    done = stage("SUCCESS")
    tracks = done["response"]["sunoData"]
    assert len(first) == 1 and first[0] == tracks[0] and len(tracks) == 2
    assert done["errorCode"] is None and done["errorMessage"] is None and done["parentMusicId"] == ""
    assert json.loads(done["param"])["model"] == "V4_5"
    for index, track in enumerate(tracks):
        assert set(track) == {"id", "audioUrl", "streamAudioUrl", "imageUrl", "prompt", "modelName", "title",
                              "tags", "createTime", "duration"}
        assert track["modelName"] == "chirp-v4-5" and track["duration"] == 30.0
        got = fetch(track["audioUrl"])
        assert got.headers["content-type"] == "audio/mpeg"
        assert hashlib.sha256(got.content).hexdigest() == output_sha256(task_id, index, 400)
    assert tracks[0]["id"] != tracks[1]["id"]


def test_suno_outputs_is_the_number_of_tracks_and_a_failure_is_generate_audio_failed(client):
    done = wait_data(client, "suno", task_of(client, "suno", duration_s=0.1, outputs=3),
                     lambda d: d["status"] == "SUCCESS", "success")
    assert len(done["response"]["sunoData"]) == 3
    failed = wait_data(client, "suno", task_of(client, "suno", duration_s=0.1, outcome="failed"),
                       lambda d: d["status"] != "PENDING", "failure")
    assert failed["status"] == "GENERATE_AUDIO_FAILED" and failed["errorCode"] == 501 and failed["errorMessage"]
    assert failed["response"]["sunoData"] == []


# ------------------------------------------------------------------ callbacks


def hook_body(hook) -> dict:
    assert hook.headers["content-type"] == "application/json"
    return json.loads(hook.body)


def test_veo_callbacks_as_the_callbacks_page_shows_them(client, receiver):
    ok = task_of(client, "veo", duration_s=0.1, callBackUrl=f"{receiver.url}/ok?token=t1")
    receiver.wait_for(1)
    task_of(client, "veo", duration_s=0.1, outcome="failed", callBackUrl=f"{receiver.url}/failed")
    first, second = receiver.wait_for(2)
    assert first.path == "/ok" and first.query == "token=t1"
    body = hook_body(first)
    urls = data_of(client, "veo", ok)["response"]["resultUrls"]
    assert body == {"code": 200, "msg": "Veo3.1 video generated successfully.",
                    "data": {"taskId": ok, "info": {"resultUrls": urls, "originUrls": [], "resolution": "720p"},
                             "fallbackFlag": False}}
    failure = hook_body(second)
    assert failure["code"] == 501 and failure["msg"] and set(failure["data"]) == {"taskId", "fallbackFlag"}


def test_runway_callbacks_are_snake_case(client, receiver):
    ok = task_of(client, "runway", duration_s=0.1, callBackUrl=f"{receiver.url}/ok")
    receiver.wait_for(1)
    task_of(client, "runway", duration_s=0.1, outcome="failed", callBackUrl=f"{receiver.url}/failed")
    first, second = receiver.wait_for(2)
    video = data_of(client, "runway", ok)["videoInfo"]
    assert hook_body(first) == {"code": 200, "msg": "All generated successfully.",
                                "data": {"task_id": ok, "video_id": video["videoId"], "video_url": video["videoUrl"],
                                         "image_url": video["imageUrl"]}}
    failure = hook_body(second)
    assert failure["code"] == 400 and failure["msg"]
    assert set(failure["data"]) == {"task_id", "video_id", "video_url", "image_url"}


def test_flux_kontext_callbacks(client, receiver):
    ok = task_of(client, "flux-kontext", duration_s=0.1, callBackUrl=f"{receiver.url}/ok")
    receiver.wait_for(1)
    failed = task_of(client, "flux-kontext", duration_s=0.1, outcome="failed", callBackUrl=f"{receiver.url}/x")
    first, second = receiver.wait_for(2)
    assert hook_body(first) == {"code": 200, "msg": "BFL image generated successfully.",
                                "data": {"taskId": ok, "info": data_of(client, "flux-kontext", ok)["response"]}}
    assert hook_body(second)["code"] == 501 and hook_body(second)["data"] == {"taskId": failed}


def test_suno_callbacks_come_in_stages(client, receiver):
    task_id = task_of(client, "suno", duration_s=0.9, callBackUrl=f"{receiver.url}/suno?token=t")
    hooks = receiver.wait_for(3)
    bodies = [hook_body(h) for h in hooks]
    assert [b["data"]["callbackType"] for b in bodies] == ["text", "first", "complete"]
    assert all(b["code"] == 200 and b["data"]["task_id"] == task_id for b in bodies)
    assert hooks[0].at < hooks[1].at < hooks[2].at
    assert bodies[0]["data"]["data"] == []
    tracks = data_of(client, "suno", task_id)["response"]["sunoData"]
    snake = [{"id": t["id"], "audio_url": t["audioUrl"], "stream_audio_url": t["streamAudioUrl"],
              "image_url": t["imageUrl"], "prompt": t["prompt"], "model_name": t["modelName"], "title": t["title"],
              "tags": t["tags"], "createTime": t["createTime"], "duration": t["duration"]} for t in tracks]
    assert bodies[1]["data"]["data"] == snake[:1]
    assert bodies[2]["data"]["data"] == snake and bodies[2]["msg"] == "All generated successfully."
    time.sleep(0.3)
    assert len(receiver.received) == 3  # nothing more


def test_a_failed_suno_task_sends_one_error_callback(client, receiver):
    task_id = task_of(client, "suno", duration_s=0.2, outcome="failed", callBackUrl=f"{receiver.url}/suno")
    (hook,) = receiver.wait_for(1)
    # The callbacks page's failure example.
    assert hook_body(hook) == {"code": 501, "msg": "Audio generation failed",
                               "data": {"callbackType": "error", "task_id": task_id, "data": None}}
    time.sleep(0.3)
    assert len(receiver.received) == 1


@pytest.mark.parametrize("family", NAMES)
def test_family_callbacks_carry_the_documented_signature_once_a_key_is_set(client, receiver, family):
    key = "kie-hmac-key-for-families"
    client.put("/_sim/kie/webhook-hmac-key", json={"key": key}).raise_for_status()
    task_id = task_of(client, family, duration_s=0.1, callBackUrl=f"{receiver.url}/hook")
    hook = receiver.wait_for(1)[0]
    timestamp = hook.headers["x-webhook-timestamp"]
    assert timestamp.isdigit() and abs(int(timestamp) - time.time()) < 60
    expected = hmac.new(key.encode(), f"{task_id}.{timestamp}".encode(), hashlib.sha256).digest()
    assert hook.headers["x-webhook-signature"] == base64.b64encode(expected).decode()
    data = hook_body(hook)["data"]
    assert data.get("taskId", data.get("task_id")) == task_id  # the id the signature covers


@pytest.mark.parametrize("family", NAMES)
def test_creates_are_counted_by_callback_url_without_its_query(client, receiver, family):
    task_of(client, family, duration_s=5, callBackUrl=f"{receiver.url}/webhooks/kie/job_1?token=secret")
    assert client.get("/_sim/stats").json()["creates_by_callback_url"] == {f"{receiver.url}/webhooks/kie/job_1": 1}


# ------------------------------------------------------------------ faults


def faults(client: httpx.Client, **rates) -> None:
    client.post("/_sim/faults", json=rates).raise_for_status()


@pytest.mark.parametrize("family", NAMES)
def test_submit_error_answers_500_without_creating(client, family):
    faults(client, submit_error=1)
    assert generate(client, family, duration_s=1).status_code == 500
    assert created(client) == 0


@pytest.mark.parametrize("family", NAMES)
def test_submit_timeout_after_create_creates_then_never_answers(sim_url, client, family):
    faults(client, submit_timeout_after_create=1)
    spec = FAMILIES[family]
    with httpx.Client(base_url=sim_url, timeout=0.3, trust_env=False) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post(spec["generate"], json=spec["body"](duration_s=5), headers=AUTH)
    assert created(client) == 1


@pytest.mark.parametrize("family", NAMES)
def test_status_error_and_throttle(client, family):
    task_id = task_of(client, family, duration_s=5)
    faults(client, status_error=1)
    assert client.get(FAMILIES[family]["record"], params={"taskId": task_id}, headers=AUTH).status_code == 500
    faults(client, throttle=1)
    for response in (generate(client, family, duration_s=1),
                     client.get(FAMILIES[family]["record"], params={"taskId": task_id}, headers=AUTH)):
        # KIE's code table: 429 "Rate Limited", here with `retry-after: 1`.
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert response.json() == {"code": 429, "msg": "Rate Limited", "data": None}
    assert created(client) == 1
    client.delete("/_sim/faults")
    assert read(client, family, task_id)["code"] == 200
    assert client.get("/_sim/stats").json()["status_calls"] == 3
