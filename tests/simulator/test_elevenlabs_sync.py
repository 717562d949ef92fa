"""ElevenLabs' sync calls under /elevenlabs — text to speech (and its
/stream), sound generation, and the speech history that finds a TTS call
whose answer was lost — answering only what the API documents
(https://elevenlabs.io/docs/api-reference/text-to-speech/convert, .../stream,
.../text-to-sound-effects/convert, .../history/list, .../history/get,
.../history/get-audio; elevenlabs-python's text_to_speech/raw_client.py,
text_to_sound_effects/raw_client.py, history/raw_client.py and the types
SpeechHistoryItemResponse and GetSpeechHistoryResponse)."""
from __future__ import annotations

import hashlib
import io
import json
import math
import time
import wave

import httpx
import pytest

from app.simulator import output_bytes_iter, output_sha256
from app.simulator.controls import Controls
from app.simulator.elevenlabs import (
    SFX_FIELDS,
    TTS_FIELDS,
    Audio,
    HistoryItem,
    call_audio,
    check_body,
    history_page,
    parse_call_query,
    parse_history_query,
    sample_rate,
    sound_cost,
    wav_header,
)

from .helpers import wait_until

KEY = {"xi-api-key": "xi-test-key"}
TTS = "/elevenlabs/v1/text-to-speech"
SFX = "/elevenlabs/v1/sound-generation"
HISTORY = "/elevenlabs/v1/history"
VOICE = "21m00Tcm4TlvDq8ikWAM"
# SpeechHistoryItemResponse's and GetSpeechHistoryResponse's fields, exactly.
ITEM_FIELDS = {"history_item_id", "request_id", "voice_id", "model_id", "voice_name", "voice_category", "text",
               "date_unix", "character_count_change_from", "character_count_change_to", "content_type", "state",
               "settings", "share_link_id", "source", "alignments", "dialogue", "output_format"}
PAGE_FIELDS = {"history", "last_history_item_id", "has_more", "scanned_until"}
ERROR_FIELDS = {"type", "code", "message", "status", "request_id"}


def speak(client: httpx.Client, text: str = "Hello there.", *, voice: str = VOICE, path: str = "",
          params: dict | None = None, **body) -> httpx.Response:
    """A speech call that succeeds; at once unless `duration_s` says (the control's default is 1 s)."""
    body = {"text": text, "duration_s": 0, **body}
    response = client.post(f"{TTS}/{voice}{path}", params=params, json=body, headers=KEY)
    assert response.status_code == 200, response.text
    return response


def history(client: httpx.Client, **params) -> dict:
    response = client.get(HISTORY, params=params, headers=KEY)
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == PAGE_FIELDS
    for item in page["history"]:
        assert set(item) == ITEM_FIELDS
    return page


def sync_calls(client: httpx.Client) -> dict[str, int]:
    return client.get("/_sim/stats").json()["sync_calls_by_body"]


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert "request-id" not in response.headers  # errors carry detail.request_id instead
    detail = response.json()["detail"]
    assert ERROR_FIELDS <= set(detail) <= ERROR_FIELDS | {"param"} and detail["code"] == code
    return detail


# ------------------------------------------------------------------ auth


def test_every_sync_and_history_route_wants_the_xi_api_key(client):
    made = speak(client)
    (item,) = history(client)["history"]
    routes = (("POST", f"{TTS}/{VOICE}"), ("POST", f"{TTS}/{VOICE}/stream"), ("POST", SFX), ("GET", HISTORY),
              ("GET", f"{HISTORY}/{item['history_item_id']}"), ("GET", f"{HISTORY}/{item['history_item_id']}/audio"))
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer xi-test-key"}, {"xi-api-key": ""}):
            response = client.request(method, path, headers=headers,
                                      json={"text": "again"} if method == "POST" else None)
            detail = assert_error(response, 401, "unauthorized")
            assert detail["type"] == "authentication_error" and detail["status"] == "needs_authorization"
    assert sync_calls(client) == {hashlib.sha256(made.request.content).hexdigest(): 1}


# ------------------------------------------------------------------ text to speech


def test_speech_is_the_deterministic_audio_with_its_documented_headers(client):
    started = time.monotonic()
    response = speak(client, "Twelve chars", duration_s=0.4, output_bytes=70_000)
    assert time.monotonic() - started >= 0.4  # duration_s: the generation takes that long
    request_id = response.headers["request-id"]
    assert len(request_id) == 20 and request_id.isalnum()
    assert response.headers["content-type"] == "audio/mpeg"
    assert response.headers["content-length"] == "70000"
    assert response.headers["character-cost"] == "12"  # one credit per character of the text
    assert hashlib.sha256(response.content).hexdigest() == output_sha256(request_id, 0, 70_000)
    assert client.get("/_sim/stats").json()["tasks_created"] == 0  # a sync call is no task


def test_the_stream_route_sends_its_headers_at_once_and_the_audio_when_done(client, sim_url):
    body = {"text": "Streamed.", "duration_s": 2.0, "output_bytes": 3000}
    started = time.monotonic()
    with httpx.stream("POST", f"{sim_url}{TTS}/{VOICE}/stream", json=body, headers=KEY, timeout=10,
                      trust_env=False) as response:
        headers_after = time.monotonic() - started
        audio = response.read()
    assert headers_after < 1.0 and time.monotonic() - started >= 2.0
    assert response.status_code == 200 and "content-length" not in response.headers
    assert response.headers["content-type"] == "audio/mpeg" and response.headers["character-cost"] == "9"
    assert hashlib.sha256(audio).hexdigest() == output_sha256(response.headers["request-id"], 0, 3000)


def test_output_format_is_the_routes_enum(client):
    assert speak(client, params={"output_format": "wav_16000"}).headers["content-type"] == "audio/mpeg"
    for path, fmt in (("/stream", "wav_16000"), ("", "mp3_44100_1"), ("", "flac")):
        response = client.post(f"{TTS}/{VOICE}{path}", params={"output_format": fmt}, json={"text": "x"}, headers=KEY)
        assert response.status_code == 422, (path, fmt)
        (entry,) = response.json()["detail"]
        assert entry["type"] == "enum" and entry["loc"] == ["query", "output_format"] and entry["input"] == fmt


def test_output_duration_s_makes_a_real_wav_at_the_formats_rate(client):
    response = speak(client, params={"output_format": "pcm_22050"}, output_duration_s=1.5, output_bytes=5)
    assert response.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 22050)
        assert wav.getnframes() == 33075 and wav.getnframes() / wav.getframerate() == 1.5
        samples = wav.readframes(wav.getnframes())
    assert samples == b"".join(output_bytes_iter(response.headers["request-id"], 0, 33075 * 2))
    # The content_type control names the type whatever the bytes are.
    typed = speak(client, output_duration_s=0.1, content_type="audio/x-wav")
    assert typed.headers["content-type"] == "audio/x-wav" and typed.content[:4] == b"RIFF"


def test_the_query_and_body_parse_as_documented(client):
    answer = speak(client, params={"enable_logging": "true", "optimize_streaming_latency": "3"},
                   model_id="eleven_flash_v2_5", language_code="en", seed=4294967295, previous_text="a",
                   next_text="b", previous_request_ids=["r1", "r2", "r3"], next_request_ids=[],
                   pronunciation_dictionary_locators=[{"pronunciation_dictionary_id": "p", "version_id": "v"}],
                   use_pvc_as_ivc=False, apply_text_normalization="off", apply_language_text_normalization=True,
                   audio_effects={}, voice_settings={"stability": 0.5, "speed": 1.1})
    # Optional fields may be null, as the official client sends them when told to.
    speak(client, model_id=None, voice_settings=None, seed=None)
    assert len(sync_calls(client)) == 2 and answer.content


@pytest.mark.parametrize(("body", "loc", "type_"), [
    ({}, ["body", "text"], "missing"),
    ({"text": None}, ["body", "text"], "string_type"),
    ({"text": 3}, ["body", "text"], "string_type"),
    ({"text": "x", "model_id": 1}, ["body", "model_id"], "string_type"),
    ({"text": "x", "voice_settings": "calm"}, ["body", "voice_settings"], "dict_type"),
    ({"text": "x", "seed": -1}, ["body", "seed"], "greater_than_equal"),
    ({"text": "x", "seed": 4294967296}, ["body", "seed"], "less_than_equal"),
    ({"text": "x", "seed": 1.5}, ["body", "seed"], "int_type"),
    ({"text": "x", "previous_request_ids": ["a", "b", "c", "d"]}, ["body", "previous_request_ids"], "too_long"),
    ({"text": "x", "next_request_ids": [1]}, ["body", "next_request_ids"], "string_type"),
    ({"text": "x", "apply_text_normalization": "maybe"}, ["body", "apply_text_normalization"], "enum"),
    ({"text": "x", "use_pvc_as_ivc": "yes"}, ["body", "use_pvc_as_ivc"], "bool_type"),
    ({"text": "x", "duration_s": -1}, ["body", "duration_s"], "value_error"),
    ({"text": "x", "outcome": "maybe"}, ["body", "outcome"], "value_error"),
    ({"text": "x", "output_duration_s": 0}, ["body", "output_duration_s"], "value_error"),
    (["text"], ["body"], "model_attributes_type"),
])
def test_a_body_that_does_not_parse_is_fastapis_422_and_no_call(client, body, loc, type_):
    response = client.post(f"{TTS}/{VOICE}", json=body, headers=KEY)
    assert response.status_code == 422, response.text
    (entry,) = response.json()["detail"]
    assert entry["loc"] == loc and entry["type"] == type_
    assert sync_calls(client) == {}


@pytest.mark.parametrize("content", [b"", b"{not json", b"NaN"])
def test_a_body_that_is_not_json_is_a_422(client, content):
    response = client.post(f"{TTS}/{VOICE}", content=content, headers={**KEY, "content-type": "application/json"})
    assert response.status_code == 422
    (entry,) = response.json()["detail"]
    assert entry["type"] in ("missing", "json_invalid")
    assert sync_calls(client) == {}


def test_a_bad_query_is_a_422(client):
    for params, name in (({"enable_logging": "perhaps"}, "enable_logging"),
                         ({"optimize_streaming_latency": "5"}, "optimize_streaming_latency")):
        response = client.post(f"{TTS}/{VOICE}", params=params, json={"text": "x"}, headers=KEY)
        assert response.status_code == 422
        assert [e["loc"] for e in response.json()["detail"]] == [["query", name]]


def test_a_failed_outcome_is_a_definite_400_after_its_duration_counted_and_not_in_history(client):
    started = time.monotonic()
    response = client.post(f"{TTS}/{VOICE}", json={"text": "no", "outcome": "failed", "duration_s": 0.3},
                           headers=KEY)
    assert time.monotonic() - started >= 0.3
    detail = assert_error(response, 400, "invalid_parameters")
    assert detail["type"] == "validation_error" and "failed" in detail["message"]
    assert sync_calls(client) == {hashlib.sha256(response.request.content).hexdigest(): 1}
    assert history(client)["history"] == []
    # Nothing was charged: the next item's character count starts at zero.
    speak(client, "abc")
    (item,) = history(client)["history"]
    assert (item["character_count_change_from"], item["character_count_change_to"]) == (0, 3)


# ------------------------------------------------------------------ sound generation


def test_sound_generation_is_audio_with_its_character_cost_and_never_in_history(client):
    response = client.post(SFX, json={"text": "A door slams", "duration_seconds": 2.5, "prompt_influence": 0.3,
                                      "loop": False, "model_id": "eleven_text_to_sound_v2", "output_bytes": 2048,
                                      "duration_s": 0},
                           params={"output_format": "mp3_22050_32"}, headers=KEY)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/mpeg" and response.headers["content-length"] == "2048"
    assert response.headers["character-cost"] == "50"
    assert hashlib.sha256(response.content).hexdigest() == output_sha256(response.headers["request-id"], 0, 2048)
    guessed = client.post(SFX, json={"text": "Rain", "duration_s": 0}, headers=KEY)
    assert guessed.status_code == 200 and guessed.headers["character-cost"] == "100"
    assert history(client)["history"] == []
    assert sorted(sync_calls(client).values()) == [1, 1]
    # The account's counter moved all the same.
    speak(client, "x")
    assert history(client)["history"][0]["character_count_change_from"] == 150


@pytest.mark.parametrize(("body", "name"), [
    ({"duration_seconds": 0.4}, "duration_seconds"), ({"duration_seconds": 31}, "duration_seconds"),
    ({"prompt_influence": 1.5}, "prompt_influence"), ({"loop": 1}, "loop"), ({"text": None}, "text"),
])
def test_a_bad_sound_generation_body_is_a_422(client, body, name):
    response = client.post(SFX, json={"text": "Rain", **body}, headers=KEY)
    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["detail"]] == [["body", name]]
    assert sync_calls(client) == {}


# ------------------------------------------------------------------ the history


def test_each_speech_call_is_one_history_item_with_its_audio(client):
    started = int(time.time())
    first = speak(client, "First words.", voice="voiceA", model_id="eleven_flash_v2_5", output_bytes=4000,
                  voice_settings={"stability": 0.4, "similarity_boost": 0.7}, params={"output_format": "pcm_16000"})
    second = speak(client, "Second.", voice="voiceB")
    newest, oldest = history(client)["history"]
    assert oldest == {
        "history_item_id": oldest["history_item_id"], "request_id": first.headers["request-id"],
        "voice_id": "voiceA", "model_id": "eleven_flash_v2_5", "voice_name": None, "voice_category": None,
        "text": "First words.", "date_unix": oldest["date_unix"], "character_count_change_from": 0,
        "character_count_change_to": 12, "content_type": "audio/mpeg", "state": "created",
        "settings": {"stability": 0.4, "similarity_boost": 0.7}, "share_link_id": None, "source": "TTS",
        "alignments": None, "dialogue": None, "output_format": "pcm_16000"}
    assert started <= oldest["date_unix"] <= time.time()
    # No model_id: the documented default.
    assert newest["request_id"] == second.headers["request-id"] and newest["model_id"] == "eleven_multilingual_v2"
    assert (newest["character_count_change_from"], newest["character_count_change_to"]) == (12, 19)
    assert newest["output_format"] == "mp3_44100_128" and newest["settings"] is None
    one = client.get(f"{HISTORY}/{oldest['history_item_id']}", headers=KEY)
    assert one.status_code == 200 and one.json() == oldest
    audio = client.get(f"{HISTORY}/{oldest['history_item_id']}/audio", headers=KEY)
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/mpeg"
    assert audio.content == first.content
    # The stream route's generations are in the history too.
    streamed = speak(client, "Third.", path="/stream")
    assert history(client)["history"][0]["request_id"] == streamed.headers["request-id"]


def test_a_wav_generation_keeps_its_type_and_bytes_in_history(client):
    made = speak(client, output_duration_s=0.2, params={"output_format": "wav_8000"})
    (item,) = history(client)["history"]
    assert item["content_type"] == "audio/wav" and item["output_format"] == "wav_8000"
    audio = client.get(f"{HISTORY}/{item['history_item_id']}/audio", headers=KEY)
    assert audio.content == made.content and audio.headers["content-length"] == str(44 + 1600 * 2)


def test_a_generation_whose_client_left_lands_in_history_once_done(client, sim_url):
    before = int(time.time())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim_url}{TTS}/{VOICE}", json={"text": "Left early.", "duration_s": 1.0}, headers=KEY,
                   timeout=httpx.Timeout(5, read=0.2), trust_env=False)
    assert history(client)["history"] == []  # not done yet
    assert client.get(f"{HISTORY}/unknown", headers=KEY).status_code == 404
    page = wait_until(lambda: (p := history(client, voice_id=VOICE, date_after_unix=before))["history"] and p, 5,
                      "the history item")
    (item,) = page["history"]
    assert item["text"] == "Left early." and len(sync_calls(client)) == 1


def test_enable_logging_false_keeps_a_call_out_of_history(client):
    response = speak(client, "Private.", params={"enable_logging": "false"})
    assert response.content and history(client)["history"] == []
    assert len(sync_calls(client)) == 1


def test_the_history_pages_newest_first_and_by_start_after(client):
    made = [speak(client, f"line {i}").headers["request-id"] for i in range(5)]
    walked: list[str] = []
    after = None
    while True:
        page = history(client, page_size=2, **({"start_after_history_item_id": after} if after else {}))
        walked += [item["request_id"] for item in page["history"]]
        assert page["last_history_item_id"] == page["history"][-1]["history_item_id"]
        assert page["scanned_until"] == page["history"][-1]["date_unix"]
        if not page["has_more"]:
            break
        after = page["last_history_item_id"]
    assert walked == made[::-1]
    ascending = history(client, sort_direction="asc", page_size=3)
    assert [i["request_id"] for i in ascending["history"]] == made[:3] and ascending["has_more"]
    after_first = history(client, sort_direction="asc", start_after_history_item_id=ascending["history"][0][
        "history_item_id"])
    assert [i["request_id"] for i in after_first["history"]] == made[1:]


def test_the_history_filters(client):
    speak(client, "The Quick brown fox", voice="v1", model_id="eleven_v3")
    speak(client, "A lazy dog", voice="v1", model_id="eleven_flash_v2_5")
    speak(client, "quick thinking", voice="v2", model_id="eleven_v3")

    def texts(**params) -> list[str]:
        return [item["text"] for item in history(client, **params)["history"]]

    assert texts(voice_id="v1") == ["A lazy dog", "The Quick brown fox"]
    assert texts(voice_id="v1", model_id="eleven_v3") == ["The Quick brown fox"]
    assert texts(search="QUICK") == ["quick thinking", "The Quick brown fox"]
    assert texts(source="TTS", voice_id="v2") == ["quick thinking"]
    assert texts(source="STS") == [] and texts(source="Flows") == [] and texts(voice_id="v3") == []
    dates = [item["date_unix"] for item in history(client)["history"]]
    assert len(texts(date_after_unix=min(dates))) == 3  # inclusive
    assert texts(date_after_unix=max(dates) + 1) == []
    assert texts(date_before_unix=min(dates)) == []  # exclusive
    assert len(texts(date_before_unix=max(dates) + 1)) == 3
    empty = history(client, voice_id="nobody")
    assert empty == {"history": [], "last_history_item_id": None, "has_more": False, "scanned_until": None}


@pytest.mark.parametrize("params", [
    {"page_size": "0"}, {"page_size": "1001"}, {"page_size": "ten"}, {"sort_direction": "up"},
    {"source": "SFX"}, {"date_after_unix": "yesterday"},
])
def test_a_bad_history_query_is_a_422(client, params):
    response = client.get(HISTORY, params=params, headers=KEY)
    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["detail"]] == [["query", next(iter(params))]]


def test_start_after_an_unknown_item_is_a_400(client):
    detail = assert_error(client.get(HISTORY, params={"start_after_history_item_id": "nope"}, headers=KEY), 400,
                          "invalid_parameters")
    assert detail["param"] == "start_after_history_item_id"
    assert_error(client.get(f"{HISTORY}/nope/audio", headers=KEY), 404, "history_item_not_found")


def test_reset_forgets_the_history_and_the_character_counter(client):
    speak(client, "Before the reset.")
    client.post("/_sim/reset").raise_for_status()
    assert history(client)["history"] == [] and sync_calls(client) == {}
    speak(client, "After.")
    (item,) = history(client)["history"]
    assert item["character_count_change_from"] == 0


# ------------------------------------------------------------------ faults and stats


def test_sync_calls_are_counted_by_their_raw_body(client):
    raw = json.dumps({"text": "Same words.", "model_id": "eleven_v3", "duration_s": 0}).encode()
    for _ in range(2):
        response = client.post(f"{TTS}/{VOICE}", content=raw, headers={**KEY, "content-type": "application/json"})
        assert response.status_code == 200
    client.post(SFX, json={"text": "Thunder", "duration_s": 0}, headers=KEY).raise_for_status()
    counted = sync_calls(client)
    assert counted[hashlib.sha256(raw).hexdigest()] == 2 and sorted(counted.values()) == [1, 2]
    stats = client.get("/_sim/stats").json()
    assert stats["tasks_created"] == 0 and stats["status_calls"] == 0


@pytest.mark.parametrize("path", [f"{TTS}/{VOICE}", f"{TTS}/{VOICE}/stream", SFX])
def test_throttle_is_the_documented_429_with_retry_after_and_no_call(client, path):
    client.post("/_sim/faults", json={"throttle": 1}).raise_for_status()
    response = client.post(path, json={"text": "Busy?"}, headers=KEY)
    detail = assert_error(response, 429, "rate_limit_exceeded")
    assert detail["type"] == "rate_limit_error" and response.headers["retry-after"] == "1"
    assert_error(client.get(HISTORY, headers=KEY), 429, "rate_limit_exceeded")
    assert sync_calls(client) == {}


@pytest.mark.parametrize("path", [f"{TTS}/{VOICE}", SFX])
def test_submit_error_is_a_500_and_no_call(client, path):
    client.post("/_sim/faults", json={"submit_error": 1}).raise_for_status()
    assert_error(client.post(path, json={"text": "Broken?"}, headers=KEY), 500, "internal_error")
    assert sync_calls(client) == {} and client.get("/_sim/stats").json()["tasks_created"] == 0


def test_submit_timeout_after_create_does_the_work_and_drops_the_answer(client, sim_url):
    client.post("/_sim/faults", json={"submit_timeout_after_create": 1}).raise_for_status()
    raw = json.dumps({"text": "Lost answer.", "duration_s": 0}).encode()
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{sim_url}{TTS}/{VOICE}", content=raw, headers={**KEY, "content-type": "application/json"},
                   timeout=5, trust_env=False)
    client.delete("/_sim/faults").raise_for_status()
    (item,) = history(client)["history"]
    assert item["text"] == "Lost answer."
    assert sync_calls(client) == {hashlib.sha256(raw).hexdigest(): 1}
    audio = client.get(f"{HISTORY}/{item['history_item_id']}/audio", headers=KEY)
    assert hashlib.sha256(audio.content).hexdigest() == output_sha256(item["request_id"], 0, 1024)
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_status_error_and_download_error_on_the_history_reads(client):
    speak(client)
    (item,) = history(client)["history"]
    client.post("/_sim/faults", json={"status_error": 1, "download_error": 1}).raise_for_status()
    assert_error(client.get(HISTORY, headers=KEY), 500, "internal_error")
    assert_error(client.get(f"{HISTORY}/{item['history_item_id']}", headers=KEY), 500, "internal_error")
    assert_error(client.get(f"{HISTORY}/{item['history_item_id']}/audio", headers=KEY), 500, "internal_error")


# ------------------------------------------------------------------ pure parts


def test_wav_header_is_what_the_wave_module_reads():
    data = b"\x01\x02" * 80
    with wave.open(io.BytesIO(wav_header(16000, len(data)) + data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (1, 2, 16000, 80)
        assert wav.readframes(80) == data


@pytest.mark.parametrize(("output_format", "rate"), [
    ("mp3_44100_128", 44100), ("pcm_8000", 8000), ("wav_48000", 48000), ("ulaw_8000", 8000),
    ("opus_48000_32", 48000), ("mp3_22050_32", 22050),
])
def test_sample_rate_of_an_output_format(output_format, rate):
    assert sample_rate(output_format) == rate


@pytest.mark.parametrize(("duration", "cost"), [(None, 100), (0.5, 10), (2.5, 50), (30, 600), (1.01, 21)])
def test_sound_cost(duration, cost):
    assert sound_cost(duration) == cost == math.ceil((duration or 5.0) * 20)


def test_call_audio():
    controls = Controls(output_bytes=10)
    assert call_audio("r", controls, None, "mp3_44100_128", None) == Audio("r", 10, "audio/mpeg")
    assert call_audio("r", controls, 0.5, "pcm_16000", None) == Audio("r", 16000, "audio/wav", 16000)
    assert call_audio("r", controls, None, "pcm_16000", "audio/L16") == Audio("r", 10, "audio/L16")
    assert Audio("r", 16000, "audio/wav", 16000).length == 16044


@pytest.mark.parametrize(("body", "fields", "expected"), [
    ({"text": "x"}, TTS_FIELDS, []),
    ({"text": "x", "duration_s": "ignored here", "unknown": object()}, TTS_FIELDS, []),
    (None, TTS_FIELDS, [(["body"], "missing")]),
    ({"text": "x", "seed": True}, TTS_FIELDS, [(["body", "seed"], "int_type")]),
    ({"text": "x", "pronunciation_dictionary_locators": [1]}, TTS_FIELDS,
     [(["body", "pronunciation_dictionary_locators"], "dict_type")]),
    ({"text": "x", "duration_seconds": 1}, SFX_FIELDS, []),
    ({"text": "x", "duration_seconds": "1"}, SFX_FIELDS, [(["body", "duration_seconds"], "float_type")]),
    ({"model_id": 2}, SFX_FIELDS, [(["body", "text"], "missing"), (["body", "model_id"], "string_type")]),
])
def test_check_body(body, fields, expected):
    assert [(e["loc"], e["type"]) for e in check_body(body, fields)] == expected


def test_parse_call_query_defaults_and_the_latency_parameter_only_where_declared():
    assert parse_call_query({}, ("mp3_44100_128",), latency=True) == (
        {"output_format": "mp3_44100_128", "enable_logging": True}, [])
    # Sound generation declares no optimize_streaming_latency: FastAPI ignores it there.
    assert parse_call_query({"optimize_streaming_latency": "9"}, ("mp3_44100_128",), latency=False)[1] == []
    assert parse_call_query({"enable_logging": "0"}, ("mp3_44100_128",), latency=False)[0]["enable_logging"] is False


def _item(n: int, *, voice: str = "v", done_at: float | None = None) -> HistoryItem:
    return HistoryItem(history_item_id=f"h{n}", request_id=f"r{n}", voice_id=voice, model_id="m", text=f"text {n}",
                       settings=None, output_format="mp3_44100_128", audio=Audio(f"r{n}", 1, "audio/mpeg"),
                       done_at=1000.0 + n if done_at is None else done_at, seq=n, characters_from=0,
                       characters_to=0)


def test_history_page():
    items = {i.history_item_id: i for i in (_item(1), _item(2, voice="w"), _item(3), _item(4, done_at=2000.0))}
    query, errors = parse_history_query({})
    assert errors == [] and query["page_size"] == 100 and query["sort_direction"] == "desc"
    page = history_page(items, query, now=1500.0)  # h4 is not done at 1500
    assert page is not None and [i.history_item_id for i in page[0]] == ["h3", "h2", "h1"] and not page[1]
    query, _ = parse_history_query({"page_size": "1", "start_after_history_item_id": "h3", "voice_id": "v"})
    page = history_page(items, query, now=1500.0)
    assert page is not None and [i.history_item_id for i in page[0]] == ["h1"] and not page[1]
    query, _ = parse_history_query({"start_after_history_item_id": "h9"})
    assert history_page(items, query, now=1500.0) is None
    # Two items done in the same instant keep their creation order.
    tied = {i.history_item_id: i for i in (_item(1, done_at=5.0), _item(2, done_at=5.0))}
    query, _ = parse_history_query({"sort_direction": "asc"})
    page = history_page(tied, query, now=5.0)
    assert page is not None and [i.history_item_id for i in page[0]] == ["h1", "h2"]
