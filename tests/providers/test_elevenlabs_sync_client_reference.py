"""ElevenLabs' own Python client (elevenlabs 2.x) against the simulator's
sync calls under /elevenlabs: text to speech (and its stream), sound
effects, and the speech history that recovers a TTS answer lost on the way.
Every audio answer must be the bytes the simulator promises, and every JSON
answer one of the client's types, whole (its required fields there) and with
no field the type does not declare. The client is only a reference here.

`ElevenLabs(base_url=...)` takes the base without `/v1`. Its models are
Fern's UncheckedBaseModel, which parse without checking: `strictly`
validates what it parsed. Its own retries (429 and 5xx, twice by default)
are turned off where a test wants to see the error."""
from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
import pytest
from elevenlabs import ElevenLabs, VoiceSettings
from elevenlabs.core.api_error import ApiError
from elevenlabs.errors import UnprocessableEntityError
from elevenlabs.types import GetSpeechHistoryResponse, SpeechHistoryItemResponse

from app.simulator import output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, reset, set_faults

KEY = "sk_elevenlabs_reference_key"
MODEL = "eleven_multilingual_v2"
NO_RETRIES: Any = {"max_retries": 0}
Model = TypeVar("Model", GetSpeechHistoryResponse, SpeechHistoryItemResponse)


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    from app.simulator import create_app

    served = ServedApp(create_app(hold_s=2.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
def client(simulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ElevenLabs]:
    # Its httpx client trusts the environment: no proxy between it and the
    # loopback simulator, and no key but ours.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "ELEVENLABS_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    reset(simulator)
    yield ElevenLabs(api_key=KEY, base_url=f"{simulator}/elevenlabs", timeout=10)
    clear_faults(simulator)


def strictly(model: type[Model], value: Any) -> Model:
    """`value`, as the client parsed it, is a whole `model`: validated
    (required fields present, of their types), nothing undeclared."""
    assert isinstance(value, model), type(value)
    assert not value.model_extra, value.model_extra
    if isinstance(value, GetSpeechHistoryResponse):
        for item in value.history:
            strictly(SpeechHistoryItemResponse, item)
    return model.model_validate(value.model_dump(mode="json"))


def controls(**values: Any) -> Any:
    # The simulator's controls ride in the JSON body, beside the fields the client declares.
    return {"additional_body_parameters": {"duration_s": 0, **values}, "max_retries": 0}


def voice() -> str:
    return "voice" + secrets.token_hex(6)


def test_speech_is_the_audio_with_its_request_id_and_character_cost(client):
    text = "The quick brown fox."
    with client.text_to_speech.with_raw_response.convert(
            voice(), text=text, model_id="eleven_flash_v2_5", output_format="mp3_44100_128", language_code="en",
            voice_settings=VoiceSettings(stability=0.5, similarity_boost=0.75, speed=1.0), seed=7,
            previous_request_ids=[], apply_text_normalization="auto",
            request_options=controls(output_bytes=6000)) as response:
        audio = b"".join(response.data)
        headers = response.headers
    assert headers["content-type"] == "audio/mpeg" and headers["character-cost"] == str(len(text))
    assert hashlib.sha256(audio).hexdigest() == output_sha256(headers["request-id"], 0, 6000)
    # The plain call yields the bytes; so does the stream route.
    assert len(b"".join(client.text_to_speech.convert(voice(), text="Hi.", request_options=controls()))) == 1024
    streamed = b"".join(client.text_to_speech.stream(voice(), text="Hi.", output_format="pcm_16000",
                                                     optimize_streaming_latency=1,
                                                     request_options=controls(output_bytes=3000)))
    assert len(streamed) == 3000


def test_sound_effects_are_audio_and_not_in_history(client):
    with client.text_to_sound_effects.with_raw_response.convert(
            text="Footsteps on gravel", duration_seconds=1.5, prompt_influence=0.3, loop=False,
            model_id="eleven_text_to_sound_v2", output_format="mp3_44100_128",
            request_options=controls(output_bytes=2048)) as response:
        audio = b"".join(response.data)
        headers = response.headers
    assert headers["character-cost"] == "30"
    assert hashlib.sha256(audio).hexdigest() == output_sha256(headers["request-id"], 0, 2048)
    assert strictly(GetSpeechHistoryResponse, client.history.list()).history == []


def test_history_finds_a_generation_by_voice_model_and_text_after_a_time(client):
    speaker, started = voice(), int(time.time())
    text = "Recover me, " + secrets.token_hex(4)
    with client.text_to_speech.with_raw_response.convert(speaker, text=text, model_id=MODEL,
                                                         request_options=controls(output_bytes=4096)) as response:
        audio = b"".join(response.data)
        request_id = response.headers["request-id"]
    b"".join(client.text_to_speech.convert(speaker, text="Another text.", model_id=MODEL, request_options=controls()))
    b"".join(client.text_to_speech.convert(speaker, text=text, model_id="eleven_v3", request_options=controls()))
    page = strictly(GetSpeechHistoryResponse, client.history.list(
        voice_id=speaker, model_id=MODEL, date_after_unix=started, source="TTS", page_size=100))
    (found,) = [item for item in page.history if item.text == text]
    assert found.request_id == request_id and found.voice_id == speaker and found.model_id == MODEL
    assert found.date_unix >= started and found.source == "TTS" and found.content_type == "audio/mpeg"
    assert found.character_count_change_to - found.character_count_change_from == len(text)
    assert page.has_more is False and page.last_history_item_id == page.history[-1].history_item_id
    one = strictly(SpeechHistoryItemResponse, client.history.get(found.history_item_id))
    assert one == found
    assert b"".join(client.history.get_audio(found.history_item_id)) == audio


def test_history_pages_with_the_clients_parameters(client):
    speaker = voice()
    made = []
    for i in range(5):
        with client.text_to_speech.with_raw_response.convert(speaker, text=f"Line {i}.",
                                                             request_options=controls()) as response:
            b"".join(response.data)
            made.append(response.headers["request-id"])
    walked: list[str] = []
    after = None
    while True:
        page = strictly(GetSpeechHistoryResponse, client.history.list(
            voice_id=speaker, page_size=2, start_after_history_item_id=after, sort_direction="desc"))
        walked += [item.request_id for item in page.history]
        if not page.has_more:
            break
        after = page.last_history_item_id
    assert walked == made[::-1]
    oldest = strictly(GetSpeechHistoryResponse, client.history.list(voice_id=speaker, sort_direction="asc",
                                                                    search="line"))
    assert [item.request_id for item in oldest.history] == made


def test_a_lost_answer_is_found_in_history_with_its_bytes(client, simulator):
    speaker, started = voice(), int(time.time())
    set_faults(simulator, submit_timeout_after_create=1)
    with pytest.raises(httpx.TransportError):
        b"".join(client.text_to_speech.convert(speaker, text="Lost on the way.", model_id=MODEL,
                                               request_options={**controls(output_bytes=8192),
                                                                "timeout_in_seconds": 5}))
    clear_faults(simulator)
    page = strictly(GetSpeechHistoryResponse, client.history.list(voice_id=speaker, model_id=MODEL,
                                                                  date_after_unix=started, source="TTS"))
    (found,) = page.history
    assert found.text == "Lost on the way." and found.request_id
    audio = b"".join(client.history.get_audio(found.history_item_id))
    assert hashlib.sha256(audio).hexdigest() == output_sha256(found.request_id, 0, 8192)


def test_errors_are_the_clients_errors(client, simulator):
    with pytest.raises(UnprocessableEntityError) as invalid:
        b"".join(client.text_to_speech.convert(voice(), text="x", output_format="flac", request_options=NO_RETRIES))
    assert invalid.value.body["detail"][0]["loc"] == ["query", "output_format"]
    with pytest.raises(UnprocessableEntityError):
        client.history.list(page_size=5000)
    with pytest.raises(ApiError) as failed:
        b"".join(client.text_to_speech.convert(voice(), text="x", request_options=controls(outcome="failed")))
    assert failed.value.status_code == 400 and failed.value.body["detail"]["code"] == "invalid_parameters"
    stranger = ElevenLabs(api_key="", base_url=f"{simulator}/elevenlabs")  # sends no xi-api-key
    with pytest.raises(ApiError) as unauthorized:
        stranger.history.list()
    assert unauthorized.value.status_code == 401
    assert unauthorized.value.body["detail"]["status"] == "needs_authorization"


def test_throttle_is_a_429_the_client_would_wait_on(client, simulator):
    set_faults(simulator, throttle=1)
    with pytest.raises(ApiError) as caught:
        b"".join(client.text_to_speech.convert(voice(), text="Busy?", request_options=NO_RETRIES))
    assert caught.value.status_code == 429 and caught.value.headers["retry-after"] == "1"
    assert caught.value.body["detail"]["code"] == "rate_limit_exceeded"
    with pytest.raises(ApiError) as listed:
        client.history.list(request_options=NO_RETRIES)
    assert listed.value.status_code == 429
