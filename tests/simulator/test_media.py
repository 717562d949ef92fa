"""`output_duration_s`: under every protocol an output made with it is a real
media file of that many seconds, read here by mutagen (the oracle, which
nobody here wrote): a WAV for audio, an MP4 where the output is a video.
Its bytes follow from the task id, the output's index, the kind and the
duration alone (`media_sha256`)."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import struct
from pathlib import Path
from typing import Any

import httpx
import mutagen
import pytest
from mutagen.mp4 import MP4, Atoms
from mutagen.wave import WAVE

from app.simulator import media_bytes_iter, media_sha256, output_bytes_iter
from app.simulator.controls import (
    MAX_OUTPUT_DURATION_S,
    ControlError,
    Controls,
    media_of,
    parse_controls,
    with_default_type,
)
from app.simulator.media import (
    MP4_TIMESCALE,
    WAV_HEADER_BYTES,
    WAV_RATE,
    media_parts,
    media_size,
    mp4_header,
)
from app.simulator.outputs import file_chunks, file_size

from .helpers import wait_until

BEARER = {"Authorization": "Bearer t"}
FAL_KEY = {"Authorization": "Key k"}
GOOG = {"x-goog-api-key": "k"}
XI = {"xi-api-key": "xi"}
ANTHROPIC = {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
QUICK = {"duration_s": 0.2}
TOLERANCE_S = 0.001


def read_length(tmp_path: Path, data: bytes, kind: str) -> float:
    """The file's duration as mutagen reads it from disk, and that it took it for `kind`."""
    path = tmp_path / hashlib.sha256(data).hexdigest()
    path.write_bytes(data)
    found = mutagen.File(path)
    assert isinstance(found, {"wav": WAVE, "mp4": MP4}[kind]), type(found)
    return found.info.length


def assert_media(tmp_path: Path, data: bytes, kind: str, duration_s: float, task_id: str, index: int) -> None:
    assert abs(read_length(tmp_path, data, kind) - duration_s) <= TOLERANCE_S
    assert hashlib.sha256(data).hexdigest() == media_sha256(task_id, index, kind, duration_s)


# ------------------------------------------------------------------ the files themselves


@pytest.mark.parametrize("kind", ["wav", "mp4"])
@pytest.mark.parametrize("duration_s", [0.001, 0.25, 1.0, 2.5, 7.333, 61.0004])
def test_mutagen_reads_the_duration(tmp_path, kind, duration_s):
    data = b"".join(media_bytes_iter("task_x", 0, kind, duration_s))
    assert len(data) == media_size(kind, duration_s)
    assert abs(read_length(tmp_path, data, kind) - duration_s) <= TOLERANCE_S


def test_a_wav_is_mono_16_bit_pcm_of_the_deterministic_bytes(tmp_path):
    data = b"".join(media_bytes_iter("task_w", 3, "wav", 0.5))
    found = mutagen.File(io.BytesIO(data))
    assert (found.info.channels, found.info.bits_per_sample, found.info.sample_rate) == (1, 16, WAV_RATE)
    assert data[WAV_HEADER_BYTES:] == b"".join(output_bytes_iter("task_w", 3, WAV_RATE))  # 0.5 s of 2 bytes


def _box(data: bytes, *path: bytes) -> bytes:
    fileobj = io.BytesIO(data)
    ok, payload = Atoms(fileobj).path(*path)[-1].read(fileobj)
    assert ok
    return payload


def test_an_mp4_states_its_duration_in_mvhd_tkhd_and_mdhd():
    data = b"".join(media_bytes_iter("task_v", 0, "mp4", 2.5))
    assert data[4:8] == b"ftyp"
    units = 2.5 * MP4_TIMESCALE
    assert struct.unpack(">II", _box(data, b"moov", b"mvhd")[12:20]) == (MP4_TIMESCALE, units)
    assert struct.unpack(">I", _box(data, b"moov", b"trak", b"tkhd")[20:24]) == (units,)
    assert struct.unpack(">II", _box(data, b"moov", b"trak", b"mdia", b"mdhd")[12:20]) == (MP4_TIMESCALE, units)
    assert _box(data, b"moov", b"trak", b"mdia", b"hdlr")[8:12] == b"vide"
    header, payload = media_parts("mp4", 2.5)
    assert header == mp4_header(2.5) and data[len(header):] == b"".join(output_bytes_iter("task_v", 0, payload))


def test_the_bytes_follow_from_task_index_kind_and_duration():
    def made(task_id: str, index: int, kind: str, duration_s: float) -> bytes:
        return b"".join(media_bytes_iter(task_id, index, kind, duration_s))

    first = made("t1", 0, "mp4", 1.0)
    assert first == made("t1", 0, "mp4", 1.0)
    others = [made("t2", 0, "mp4", 1.0), made("t1", 1, "mp4", 1.0), made("t1", 0, "wav", 1.0),
              made("t1", 0, "mp4", 1.5)]
    assert len({first, *others}) == 5
    assert media_sha256("t1", 0, "mp4", 1.0) == hashlib.sha256(first).hexdigest()


@pytest.mark.parametrize(("controls", "kind"), [
    (Controls(output_bytes=7), None),
    (Controls(output_duration_s=1.5, content_type="audio/wav"), "wav"),
    (Controls(output_duration_s=1.5, content_type="audio/mpeg"), "wav"),  # the bytes are a WAV whatever the label
    (Controls(output_duration_s=1.5, content_type="image/png"), "wav"),
    (Controls(output_duration_s=1.5, content_type="video/mp4"), "mp4"),
    (Controls(output_duration_s=1.5, content_type="video/quicktime"), "mp4"),
])
def test_what_each_output_is(controls, kind):
    assert media_of(controls) == (None if kind is None else (kind, 1.5))
    data = b"".join(file_chunks("t", 2, controls))
    assert len(data) == file_size(controls)
    expected = output_bytes_iter("t", 2, 7) if kind is None else media_bytes_iter("t", 2, kind, 1.5)
    assert data == b"".join(expected)


# ------------------------------------------------------------------ the control


@pytest.mark.parametrize(("given", "duration_s", "content_type"), [
    ({}, None, "image/png"),
    ({"output_duration_s": 2}, 2.0, "audio/wav"),  # an image default gives way to the WAV's type
    ({"output_duration_s": 0.01}, 0.01, "audio/wav"),
    ({"output_duration_s": MAX_OUTPUT_DURATION_S}, MAX_OUTPUT_DURATION_S, "audio/wav"),
    ({"output_duration_s": 1.5, "content_type": "video/MP4"}, 1.5, "video/mp4"),
    ({"output_duration_s": 1.5, "content_type": "audio/x-wav"}, 1.5, "audio/x-wav"),
    ({"output_duration_s": 1.5, "output_bytes": 5}, 1.5, "audio/wav"),  # output_bytes stays, unused
])
def test_output_duration_s_is_read(given, duration_s, content_type):
    controls = parse_controls(given)
    assert (controls.output_duration_s, controls.content_type) == (duration_s, content_type)


@pytest.mark.parametrize("value", [0, -1, MAX_OUTPUT_DURATION_S + 0.5, "2", True, None, [1]])
def test_output_duration_s_refuses_what_is_not_a_duration(value):
    with pytest.raises(ControlError) as raised:
        parse_controls({"output_duration_s": value})
    assert raised.value.field == "output_duration_s"


@pytest.mark.parametrize(("given", "default", "content_type"), [
    ({}, "video/mp4", "video/mp4"),
    ({}, "audio/mpeg", "audio/mpeg"),
    ({"content_type": "image/gif"}, "video/mp4", "image/gif"),
    ({"output_duration_s": 1}, "video/mp4", "video/mp4"),  # a video protocol keeps its MP4
    ({"output_duration_s": 1}, "audio/mpeg", "audio/wav"),  # an audio one says what the bytes are
    ({"output_duration_s": 1}, "image/jpeg", "audio/wav"),
    ({"output_duration_s": 1, "content_type": "audio/mpeg"}, "video/mp4", "audio/mpeg"),
])
def test_a_protocols_default_type(given, default, content_type):
    assert with_default_type(parse_controls(given), given, default).content_type == content_type


# ------------------------------------------------------------------ under every protocol


def download(client: httpx.Client, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    response = client.get(url, headers=headers)
    assert response.status_code == 200, response.text
    return response


def test_native_outputs_are_wavs_or_mp4s(client, tmp_path):
    made = client.post("/v1/tasks", json={"model": "m", "input": {
        **QUICK, "output_duration_s": 1.25, "outputs": 2, "output_bytes": 5}}).json()
    done = wait_until(lambda: (t := client.get(f"/v1/tasks/{made['id']}").json())["status"] == "succeeded" and t)
    bodies = []
    for index, url in enumerate(done["outputs"]):
        got = download(client, url)
        assert got.headers["content-type"] == "audio/wav"
        assert int(client.head(url).headers["content-length"]) == len(got.content) == media_size("wav", 1.25)
        assert got.content == download(client, url).content  # the same bytes every time
        assert_media(tmp_path, got.content, "wav", 1.25, made["id"], index)
        bodies.append(got.content)
    assert bodies[0] != bodies[1]

    video = client.post("/v1/tasks", json={"model": "m", "input": {
        **QUICK, "output_duration_s": 2.5, "content_type": "video/mp4"}}).json()
    done = wait_until(lambda: (t := client.get(f"/v1/tasks/{video['id']}").json())["status"] == "succeeded" and t)
    got = download(client, done["outputs"][0])
    assert got.headers["content-type"] == "video/mp4"
    assert_media(tmp_path, got.content, "mp4", 2.5, video["id"], 0)


def test_replicate_outputs(client, tmp_path):
    made = client.post("/replicate/v1/predictions", headers=BEARER,
                       json={"version": "a/b:1", "input": {**QUICK, "output_duration_s": 0.75}}).json()
    done = wait_until(lambda: (p := client.get(made["urls"]["get"], headers=BEARER).json())["status"] == "succeeded"
                      and p)
    got = download(client, done["output"][0])
    assert got.headers["content-type"] == "audio/wav"
    assert_media(tmp_path, got.content, "wav", 0.75, made["id"], 0)


def test_fal_outputs_and_their_file_size(client, tmp_path):
    made = client.post("/fal/fal-ai/flux/dev", json={**QUICK, "output_duration_s": 3,
                                                     "content_type": "video/mp4"}, headers=FAL_KEY).json()
    wait_until(lambda: client.get(made["status_url"], headers=FAL_KEY).json()["status"] == "COMPLETED")
    (image,) = client.get(made["response_url"], headers=FAL_KEY).json()["images"]
    got = download(client, image["url"])
    assert (image["content_type"], got.headers["content-type"]) == ("video/mp4", "video/mp4")
    assert image["file_size"] == len(got.content)
    assert_media(tmp_path, got.content, "mp4", 3.0, made["request_id"], 0)


def _kie_done(client: httpx.Client, path: str, task_id: str, done: Any) -> dict[str, Any]:
    def read() -> dict[str, Any] | None:
        data = client.get(f"/kie{path}", params={"taskId": task_id}, headers=BEARER).json()["data"]
        return data if done(data) else None
    return wait_until(read)


def test_kie_market_outputs(client, tmp_path):
    made = client.post("/kie/api/v1/jobs/createTask", headers=BEARER,
                       json={"model": "k", "input": {**QUICK, "output_duration_s": 1.5}}).json()
    task_id = made["data"]["taskId"]
    data = _kie_done(client, "/api/v1/jobs/recordInfo", task_id, lambda d: d["state"] == "success")
    (url,) = json.loads(data["resultJson"])["resultUrls"]
    got = download(client, url)
    assert got.headers["content-type"] == "audio/wav"
    assert_media(tmp_path, got.content, "wav", 1.5, task_id, 0)


@pytest.mark.parametrize(("family", "kind", "content_type"), [
    ("veo", "mp4", "video/mp4"), ("runway", "mp4", "video/mp4"), ("flux", "wav", "audio/wav"),
    ("suno", "wav", "audio/wav"),
])
def test_kie_family_outputs(client, tmp_path, family, kind, content_type):
    routes = {
        "veo": ("/api/v1/veo/generate", "/api/v1/veo/record-info", {"prompt": "p"},
                lambda d: d["response"]["resultUrls"][0]),
        "runway": ("/api/v1/runway/generate", "/api/v1/runway/record-detail",
                   {"prompt": "p", "duration": 5, "quality": "720p"}, lambda d: d["videoInfo"]["videoUrl"]),
        "flux": ("/api/v1/flux/kontext/generate", "/api/v1/flux/kontext/record-info", {"prompt": "p"},
                 lambda d: d["response"]["resultImageUrl"]),
        "suno": ("/api/v1/generate", "/api/v1/generate/record-info",
                 {"model": "V4_5", "customMode": False, "instrumental": False, "prompt": "p", "outputs": 1,
                  "callBackUrl": "http://127.0.0.1:9/discard"},
                 lambda d: d["response"]["sunoData"][0]["audioUrl"]),
    }
    generate, record, body, url_of = routes[family]
    made = client.post(f"/kie{generate}", json={**body, **QUICK, "output_duration_s": 2.0}, headers=BEARER).json()
    task_id = made["data"]["taskId"]

    def finished(data: dict[str, Any]) -> bool:
        return data.get("successFlag") == 1 or data.get("state") == "success" or data.get("status") == "SUCCESS"

    data = _kie_done(client, record, task_id, finished)
    got = download(client, url_of(data))
    assert got.headers["content-type"] == content_type
    assert_media(tmp_path, got.content, kind, 2.0, task_id, 0)
    if family == "suno":  # the track's documented `duration` is the file's
        assert data["response"]["sunoData"][0]["duration"] == 2.0


GATEWAY = {"Authorization": "Bearer t", "ai-gateway-protocol-version": "0.0.1", "ai-gateway-auth-method": "api-key",
           "ai-video-model-specification-version": "4"}


@pytest.mark.parametrize("model", ["klingai/kling-v3.0-t2v", "google/veo-3.1-generate-001"])
def test_gateway_videos_by_url_and_inline(client, tmp_path, model):
    headers = {**GATEWAY, "ai-model-id": model}
    made = client.post("/gateway/v4/ai/video-model/start", headers=headers,
                       json={"prompt": "p", **QUICK, "output_duration_s": 4, "n": 2}).json()

    def completed() -> dict[str, Any] | None:
        answer = client.post("/gateway/v4/ai/video-model/status", json={"operation": made["operation"]},
                             headers=headers).json()
        return answer if answer["status"] == "completed" else None

    videos = wait_until(completed)["videos"]
    job_id = made["operation"]["gatewayJobId"]
    for index, video in enumerate(videos):
        assert video["mediaType"] == "video/mp4"
        data = base64.b64decode(video["data"]) if video["type"] == "base64" else download(client, video["url"]).content
        assert_media(tmp_path, data, "mp4", 4.0, job_id, index)


def test_gemini_videos(client, tmp_path):
    made = client.post("/gemini/v1beta/models/veo-3.1-generate-preview:predictLongRunning", headers=GOOG,
                       json={"instances": [{"prompt": "p"}],
                             "parameters": {**QUICK, "output_duration_s": 8, "sampleCount": 1}}).json()
    done = wait_until(lambda: (o := client.get(f"/gemini/v1beta/{made['name']}", headers=GOOG).json()).get("done")
                      and o)
    (sample,) = done["response"]["generateVideoResponse"]["generatedSamples"]
    got = download(client, sample["video"]["uri"], GOOG)
    assert got.headers["content-type"] == "video/mp4"
    assert int(got.headers["content-length"]) == len(got.content)
    assert_media(tmp_path, got.content, "mp4", 8.0, made["name"].rpartition("/")[2], 0)


@pytest.mark.parametrize(("extra", "kind", "content_type"), [
    ({}, "wav", "audio/wav"), ({"content_type": "video/mp4"}, "mp4", "video/mp4"),
])
def test_elevenlabs_dub_audio(client, tmp_path, extra, kind, content_type):
    fields = {"source_url": "https://media.example.com/a.mp4", "target_lang": "es", **QUICK,
              "output_duration_s": 1.75, **extra}
    made = client.post("/elevenlabs/v1/dubbing", files=[(k, (None, str(v))) for k, v in fields.items()],
                       headers=XI).json()
    dub_id = made["dubbing_id"]
    wait_until(lambda: client.get(f"/elevenlabs/v1/dubbing/{dub_id}", headers=XI).json()["status"] == "dubbed")
    got = download(client, f"/elevenlabs/v1/dubbing/{dub_id}/audio/es", XI)
    assert got.headers["content-type"] == content_type
    assert_media(tmp_path, got.content, kind, 1.75, dub_id, 0)


def test_elevenlabs_speech_is_a_wav_mutagen_reads_at_the_formats_rate(client, tmp_path):
    got = client.post("/elevenlabs/v1/text-to-speech/v1", params={"output_format": "pcm_24000"},
                      json={"text": "hello", "duration_s": 0, "output_duration_s": 1.1}, headers=XI)
    assert got.status_code == 200 and got.headers["content-type"] == "audio/wav"
    assert abs(read_length(tmp_path, got.content, "wav") - 1.1) <= TOLERANCE_S
    assert mutagen.File(io.BytesIO(got.content)).info.sample_rate == 24000
    assert got.content == b"".join(media_bytes_iter(got.headers["request-id"], 0, "wav", 1.1, rate=24000))


def test_the_llm_protocols_check_output_duration_s_and_answer_text(client):
    anthropic = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    openai = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    for path, body, headers in (("/anthropic/v1/messages", anthropic, ANTHROPIC),
                                ("/openai/v1/chat/completions", openai, BEARER)):
        bad = client.post(path, json={**body, "metadata": {"duration_s": 0, "output_duration_s": 0}}, headers=headers)
        assert bad.status_code == 400 and "output_duration_s" in bad.text
        good = client.post(path, json={**body, "metadata": {"duration_s": 0, "output_duration_s": 2}},
                           headers=headers)
        assert good.status_code == 200 and good.headers["content-type"].startswith("application/json")
