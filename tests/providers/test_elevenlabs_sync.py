"""ElevenLabs' sync models in the adapter — speech (`text-to-speech/<voice_id>`)
and sound effects (`sound-generation`), and a lost speech call recovered from
the speech history: the pure decisions as tables, then the adapter over real
HTTP against the simulator's /elevenlabs sync routes and, for answers the
simulator does not give, a scripted ElevenLabs on loopback.

Sources: https://elevenlabs.io/docs/api-reference/text-to-speech/convert,
.../text-to-sound-effects/convert, .../history/list, .../history/get-audio;
elevenlabs-python's text_to_speech/raw_client.py (`params=` enable_logging,
optimize_streaming_latency, output_format), text_to_sound_effects/raw_client.py
(`params=` output_format only), history/raw_client.py (the list's query) and
types/speech_history_item_response.py (an item's fields); the OpenAPI in
elevenlabs-docs (fern/apis/api/openapi.json: `model_id` defaults to
eleven_multilingual_v2).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from starlette.responses import JSONResponse, Response

from app.download_errors import OutputTooLarge
from app.providers.base import (
    Observation,
    ProviderError,
    ProviderKind,
    Rejected,
    SubmitRequest,
    TaskState,
    Transient,
    Uncertain,
    Usage,
    UsageUnit,
)
from app.providers.elevenlabs import (
    FIND_CLOCK_SKEW_S,
    SOUND_QUERY,
    SPEECH_QUERY,
    ElevenLabsProvider,
    SyncEndpoint,
    call_parts,
    call_text,
    characters_used,
    history_cursor,
    history_item_matches,
    history_matches,
    history_reaches_back,
    recovery_since,
    sync_endpoint,
)
from app.simulator import output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import reset, set_faults, stats

from .scripted import Script, Seen

KEY = "sk_elevenlabs_sync_test_key_0123456789"
VOICE = "21m00Tcm4TlvDq8ikWAM"
SPEECH = f"text-to-speech/{VOICE}"
DEFAULT_MODEL_ID = "eleven_multilingual_v2"


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def call_request(model: str = SPEECH, *, started: datetime | None = None, timeout_s: float = 10.0,
                 **job_input: Any) -> SubmitRequest:
    return SubmitRequest(job_id=new_job_id(), model=model, input=job_input, callback_url=None,
                         first_attempt_at=started, call_timeout_s=timeout_s)


def speech(text: str = "Hello there.", *, voice: str = VOICE, started: datetime | None = None,
           timeout_s: float = 10.0, **job_input: Any) -> SubmitRequest:
    """A speech job whose generation is done at once (the simulator's `duration_s`, 1 s unless told)."""
    return call_request(f"text-to-speech/{voice}", started=started, timeout_s=timeout_s,
                        **{"text": text, "duration_s": 0, **job_input})


def sound(text: str = "A door slams", **job_input: Any) -> SubmitRequest:
    return call_request("sound-generation", **{"text": text, "duration_s": 0, **job_input})


def spooled(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def read(observation: Observation) -> bytes:
    (file,) = observation.files
    return Path(file.path).read_bytes()


# ================================================================== pure


@pytest.mark.parametrize(("model", "expected"), [
    (SPEECH, SyncEndpoint(f"/v1/text-to-speech/{VOICE}", SPEECH_QUERY, VOICE)),
    ("text-to-speech/a voice+id?x#y", SyncEndpoint("/v1/text-to-speech/a%20voice%2Bid%3Fx%23y", SPEECH_QUERY,
                                                   "a voice+id?x#y")),
    ("text-to-speech/..x", SyncEndpoint("/v1/text-to-speech/..x", SPEECH_QUERY, "..x")),
    ("sound-generation", SyncEndpoint("/v1/sound-generation", SOUND_QUERY)),
])
def test_the_endpoint_of_a_sync_model(model, expected):
    endpoint = sync_endpoint(model)
    assert endpoint == expected
    assert endpoint.can_recover is (expected.voice_id is not None)


@pytest.mark.parametrize(("model", "says"), [
    ("dubbing", "dubbing is an async model: it is submitted, never called"),
    ("text-to-speech/", "with a voice id"),
    ("text-to-speech/a/b", "with a voice id"),
    ("text-to-speech/a/stream", "with a voice id"),
    ("text-to-speech/..", "with a voice id"),  # a dot segment: the URL would resolve it away
    ("text-to-speech/.", "with a voice id"),
    ("text-to-speech", "model must be text-to-speech/<voice_id>, sound-generation or dubbing"),
    ("speech-to-text", "model must be text-to-speech/<voice_id>, sound-generation or dubbing"),
    ("", "model must be"),
    ("Sound-Generation", "model must be"),
])
def test_what_is_no_sync_model(model, says):
    with pytest.raises(Rejected, match=says.replace("?", r"\?")):
        sync_endpoint(model)


def test_the_query_parameters_are_the_clients():
    # text_to_speech/raw_client.py and text_to_sound_effects/raw_client.py: their `params=`.
    assert set(SPEECH_QUERY) == {"enable_logging", "optimize_streaming_latency", "output_format"}
    assert SOUND_QUERY == ("output_format",)


@pytest.mark.parametrize(("job_input", "text"), [
    ({"text": "Hi"}, "Hi"), ({"text": " "}, " "), ({"text": "héllo ✓"}, "héllo ✓"),
    ({}, None), ({"text": ""}, None), ({"text": None}, None), ({"text": 3}, None), ({"text": ["a"]}, None),
    ({"prompt": "Hi"}, None),
])
def test_the_input_text(job_input, text):
    if text is None:
        with pytest.raises(Rejected, match="input.text is required: a non-empty string"):
            call_text(job_input)
    else:
        assert call_text(job_input) == text


@pytest.mark.parametrize(("model", "job_input", "body", "query"), [
    (SPEECH, {"text": "Hi", "model_id": "eleven_v3", "output_format": "pcm_16000", "enable_logging": False,
              "optimize_streaming_latency": 3, "voice_settings": {"stability": 0.5}},
     {"text": "Hi", "model_id": "eleven_v3", "voice_settings": {"stability": 0.5}},
     {"output_format": "pcm_16000", "enable_logging": "false", "optimize_streaming_latency": "3"}),
    (SPEECH, {"text": "Hi", "enable_logging": True, "optimize_streaming_latency": 0},
     {"text": "Hi"}, {"enable_logging": "true", "optimize_streaming_latency": "0"}),
    # null query values are left out, as the official client leaves them; null body fields stay as written.
    (SPEECH, {"text": "Hi", "output_format": None, "seed": None}, {"text": "Hi", "seed": None}, {}),
    # Sound generation declares output_format alone: anything else is the body's.
    ("sound-generation", {"text": "Rain", "output_format": "mp3_22050_32", "enable_logging": False,
                          "optimize_streaming_latency": 1, "duration_seconds": 2.5},
     {"text": "Rain", "enable_logging": False, "optimize_streaming_latency": 1, "duration_seconds": 2.5},
     {"output_format": "mp3_22050_32"}),
])
def test_the_input_splits_into_the_body_and_the_query(model, job_input, body, query):
    assert call_parts(job_input, sync_endpoint(model)) == (body, query)


@pytest.mark.parametrize(("key", "value", "says"), [
    ("enable_logging", "false", "input.enable_logging must be a boolean"),
    ("enable_logging", 0, "input.enable_logging must be a boolean"),
    ("optimize_streaming_latency", True, "input.optimize_streaming_latency must be an integer"),
    ("optimize_streaming_latency", 1.5, "input.optimize_streaming_latency must be an integer"),
    ("optimize_streaming_latency", "3", "input.optimize_streaming_latency must be an integer"),
    ("output_format", 128, "input.output_format must be a string"),
    ("output_format", ["mp3_44100_128"], "input.output_format must be a string"),
])
def test_a_query_value_of_another_type_is_refused(key, value, says):
    with pytest.raises(Rejected, match=says):
        call_parts({"text": "Hi", key: value}, sync_endpoint(SPEECH))


@pytest.mark.parametrize(("text", "characters"), [
    ("abc", 3.0), ("", 0.0), ("héllo ✓", 7.0),  # characters of the str, not its UTF-8 bytes
])
def test_the_characters_a_call_used_are_the_texts(text, characters):
    assert characters_used(text) == characters


SINCE = 1_700_000_000
ITEM = {"history_item_id": "h1", "request_id": "r1", "voice_id": VOICE, "model_id": DEFAULT_MODEL_ID,
        "text": "Hello there.", "date_unix": SINCE, "source": "TTS", "content_type": "audio/mpeg",
        "state": "created", "character_count_change_from": 0, "character_count_change_to": 12}


@pytest.mark.parametrize(("change", "matches"), [
    ({}, True),
    ({"date_unix": SINCE + 500}, True),
    ({"request_id": None}, True),
    ({"date_unix": SINCE - 1}, False),  # made before the window
    ({"date_unix": None}, False),
    ({"date_unix": "1700000000"}, False),
    ({"date_unix": True}, False),
    ({"source": "STS"}, False),
    ({"source": None}, False),
    ({"voice_id": "another"}, False),
    ({"model_id": "eleven_v3"}, False),
    ({"model_id": None}, False),
    ({"text": "Hello there"}, False),  # the text exactly
    ({"text": "hello there."}, False),
    ({"text": "Hello there. "}, False),
    ({"history_item_id": None}, False),  # no id to read its audio by
    ({"history_item_id": "h 1"}, False),
])
def test_a_history_item_is_this_calls_only_when_everything_matches(change, matches):
    item = {**ITEM, **change}
    assert history_item_matches(item, voice_id=VOICE, model_id=DEFAULT_MODEL_ID, text="Hello there.",
                                since_unix=SINCE) is matches


def test_the_matches_of_a_page():
    other = {**ITEM, "history_item_id": "h2", "text": "Other."}
    twin = {**ITEM, "history_item_id": "h3"}
    page = [other, "not an item", None, ITEM, twin]
    assert history_matches(page, voice_id=VOICE, model_id=DEFAULT_MODEL_ID, text="Hello there.",
                           since_unix=SINCE) == [ITEM, twin]
    assert history_matches([], voice_id=VOICE, model_id=DEFAULT_MODEL_ID, text="x", since_unix=SINCE) == []


@pytest.mark.parametrize(("dates", "reaches"), [
    ([SINCE + 5, SINCE], False), ([SINCE + 5, SINCE - 1], True), ([], False), ([None, "x"], False),
    ([SINCE - 3600], True),
])
def test_a_newest_first_page_reaches_back_past_the_window(dates, reaches):
    assert history_reaches_back([{"date_unix": d} for d in dates], SINCE) is reaches


@pytest.mark.parametrize(("page", "cursor"), [
    ({"history": [ITEM], "last_history_item_id": "h1", "has_more": True}, "h1"),
    ({"history": [ITEM], "last_history_item_id": None, "has_more": True}, "h1"),  # the last item's id
    ({"history": [ITEM], "last_history_item_id": "h1", "has_more": False}, None),
    ({"history": [ITEM], "last_history_item_id": "h1"}, None),
    ({"history": [ITEM], "last_history_item_id": "h1", "has_more": "true"}, None),
    ({"history": [], "last_history_item_id": None, "has_more": True}, None),
    ({"history": [{"x": 1}], "last_history_item_id": "", "has_more": True}, None),
])
def test_the_next_history_page(page, cursor):
    assert history_cursor(page) == cursor


def test_the_window_starts_at_the_call_less_the_clock_skew_margin():
    started = datetime.fromtimestamp(SINCE + 0.9, UTC)
    assert recovery_since(started) == SINCE - int(FIND_CLOCK_SKEW_S)


@pytest.mark.parametrize(("model", "kind", "can_recover"), [
    (SPEECH, ProviderKind.SYNC, True),
    ("sound-generation", ProviderKind.SYNC, False),  # sound effects are not in the history
    ("text-to-speech/a/b", ProviderKind.SYNC, False),  # refused by call: nothing to recover
    ("speech-to-text", ProviderKind.SYNC, False),
    ("dubbing", ProviderKind.ASYNC, False),
])
def test_the_facts_of_each_model(model, kind, can_recover):
    provider = ElevenLabsProvider("https://api.elevenlabs.io", KEY)
    facts = provider.facts_for(model)
    assert facts.kind is kind and facts.can_recover is can_recover
    if kind is ProviderKind.ASYNC:
        assert facts == provider.facts  # dubbing's are as they were
    else:
        assert (facts.call_timeout_s, facts.stale_after_s) == (600, 900)
        assert facts.webhook_scheme == "none" and not facts.can_cancel and not facts.can_find
        assert not facts.idempotent_submit
    assert KEY not in repr(provider)


async def test_dubbing_and_unknown_models_are_not_called_and_sync_models_not_submitted(closed_port_url):
    provider = ElevenLabsProvider(closed_port_url, KEY)
    try:
        dub = call_request("dubbing", source_url="https://media.example.com/a.mp4", target_lang="es")
        with pytest.raises(Rejected, match="dubbing is an async model"):
            await provider.call(dub)
        with pytest.raises(Rejected, match="model must be text-to-speech/<voice_id>"):
            await provider.call(call_request("music", text="A song"))
        for request in (speech(), sound()):
            with pytest.raises(Rejected, match="model must be dubbing; "):
                await provider.submit(request, request.job_id)
        # Refused before sending: nothing listens there, so a sent request would be Transient.
        with pytest.raises(Rejected, match="input.text"):
            await provider.call(call_request(SPEECH, text=""))
        with pytest.raises(Rejected, match="input.enable_logging"):
            await provider.call(speech(enable_logging="no"))
        with pytest.raises(Transient, match="could not connect"):
            await provider.call(speech())
    finally:
        await provider.aclose()


# ================================================================== against the simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    from app.simulator import create_app

    # A short hold: a dropped answer is dropped 1 s after the call.
    served = ServedApp(create_app(hold_s=1.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    directory = tmp_path / "spool"
    directory.mkdir()
    return directory


@pytest.fixture
async def adapter(simulator, spool):
    reset(simulator)  # forgets the history, the sync call counts and the faults
    provider = ElevenLabsProvider(f"{simulator}/elevenlabs", KEY, timeout_s=5.0, spool_dir=str(spool))
    yield provider
    await provider.aclose()
    reset(simulator)


def history_items(simulator: str, **params: Any) -> list[dict]:
    response = httpx.get(f"{simulator}/elevenlabs/v1/history", params=params, headers={"xi-api-key": KEY},
                         trust_env=False)
    response.raise_for_status()
    return response.json()["history"]


def history_audio(simulator: str, item: dict) -> httpx.Response:
    response = httpx.get(f"{simulator}/elevenlabs/v1/history/{item['history_item_id']}/audio",
                         headers={"xi-api-key": KEY}, trust_env=False)
    response.raise_for_status()
    return response


def sync_calls(simulator: str) -> list[int]:
    return sorted(stats(simulator)["sync_calls_by_body"].values())


async def test_speech_is_the_audio_with_its_characters_and_request_id(adapter, simulator, spool):
    text = "Twelve chars"
    result = await adapter.call(speech(text, output_bytes=70_000))
    assert result.state is TaskState.SUCCEEDED and result.output_urls == () and result.values == ()
    (file,) = result.files
    assert Path(file.path).parent == spool and spooled(spool) == [os.path.basename(file.path)]
    assert file.content_type == "audio/mpeg" and file.bytes == 70_000
    data = read(result)
    assert hashlib.sha256(data).hexdigest() == file.sha256 == output_sha256(result.request_id, 0, 70_000)
    assert result.usage == (Usage(UsageUnit.CHARACTERS, 12.0),)  # the simulator's character-cost: len(text)
    (item,) = history_items(simulator)
    assert item["request_id"] == result.request_id and item["text"] == text
    assert item["model_id"] == DEFAULT_MODEL_ID and item["voice_id"] == VOICE
    assert sync_calls(simulator) == [1]


async def test_the_query_parameters_reach_the_api_as_its_query(adapter, simulator):
    # output_format picks the WAV's sample rate: it reached the simulator as the query.
    result = await adapter.call(speech("Wave.", output_format="pcm_22050", output_duration_s=0.1,
                                       optimize_streaming_latency=2))
    data = read(result)
    assert result.files[0].content_type == "audio/wav" and data[:4] == b"RIFF"
    assert struct.unpack("<I", data[24:28])[0] == 22050
    (item,) = history_items(simulator)
    assert item["output_format"] == "pcm_22050"


async def test_sound_effects_are_audio_measured_by_their_texts_characters(adapter, simulator):
    result = await adapter.call(sound("A door slams", duration_seconds=2.5, prompt_influence=0.3, output_bytes=2048,
                                      output_format="mp3_22050_32"))
    (file,) = result.files
    assert file.content_type == "audio/mpeg" and file.bytes == 2048
    assert file.sha256 == hashlib.sha256(read(result)).hexdigest() == output_sha256(result.request_id, 0, 2048)
    # The text's characters, not the character-cost header (50: ElevenLabs' credits for 2.5 s).
    assert result.usage == (Usage(UsageUnit.CHARACTERS, float(len("A door slams"))),)
    assert result.request_id and sync_calls(simulator) == [1]
    # Not in the history: there is nothing to recover a sound effect from.
    assert history_items(simulator) == []
    assert await adapter.recover(dataclasses.replace(sound("A door slams"), first_attempt_at=datetime.now(UTC))) \
        is None


async def test_a_429_is_transient_with_its_retry_after_and_nothing_called(adapter, simulator, spool):
    set_faults(simulator, throttle=1)
    for request in (speech(), sound()):
        with pytest.raises(Transient) as caught:
            await adapter.call(request)
        assert caught.value.retry_after == 1 and "HTTP 429" in str(caught.value)
        assert "rate_limit_exceeded" in str(caught.value) and KEY not in str(caught.value)
    assert sync_calls(simulator) == [] and spooled(spool) == []


@pytest.mark.parametrize("job_input", [
    {"outcome": "failed"},  # a definite 400 invalid_parameters
    {"seed": -1},  # FastAPI's 422
    {"output_format": "flac"},  # the query's enum: 422 on the query
])
async def test_a_4xx_is_rejected_and_leaves_no_file(adapter, spool, job_input):
    with pytest.raises(Rejected, match="call rejected \\(HTTP 4") as caught:
        await adapter.call(speech(**job_input))
    assert KEY not in str(caught.value) and spooled(spool) == []


async def test_a_500_is_uncertain_and_leaves_no_file(adapter, simulator, spool):
    set_faults(simulator, submit_error=1)
    for request in (speech(), sound()):
        with pytest.raises(Uncertain, match="HTTP 500") as caught:
            await adapter.call(request)
        assert KEY not in str(caught.value)
    assert spooled(spool) == []


async def test_a_timeout_is_uncertain(adapter, spool):
    with pytest.raises(Uncertain, match="in time"):
        await adapter.call(speech(duration_s=5, timeout_s=0.3))
    assert spooled(spool) == []


async def test_a_lost_answer_is_uncertain_then_recovered_from_the_history(adapter, simulator, spool):
    set_faults(simulator, submit_timeout_after_create=1)
    started = datetime.now(UTC)
    request = speech("Lost answer.", started=started, output_bytes=3000, voice_settings={"stability": 0.4})
    with pytest.raises(Uncertain) as caught:
        await adapter.call(request)
    assert KEY not in str(caught.value) and spooled(spool) == []
    set_faults(simulator)
    (item,) = history_items(simulator)
    served = history_audio(simulator, item).content
    found = await adapter.recover(request)
    assert found is not None and found.state is TaskState.SUCCEEDED
    (file,) = found.files
    assert read(found) == served and file.sha256 == hashlib.sha256(served).hexdigest()
    assert file.sha256 == output_sha256(item["request_id"], 0, 3000) and file.bytes == 3000
    assert file.content_type == "audio/mpeg" and Path(file.path).parent == spool
    assert found.usage == (Usage(UsageUnit.CHARACTERS, 12.0),) and found.request_id == item["request_id"]
    assert sync_calls(simulator) == [1]  # one call, made once: recovering made none


async def test_the_same_call_recovers_as_the_call_answered(adapter, simulator):
    started = datetime.now(UTC)
    request = speech("Answered once.", started=started, model_id="eleven_flash_v2_5")
    answered = await adapter.call(request)
    found = await adapter.recover(request)
    assert found is not None
    assert read(found) == read(answered) and found.request_id == answered.request_id
    assert found.usage == answered.usage and found.files[0].content_type == answered.files[0].content_type
    # The default model is not this one: a job that did not name it matches nothing.
    assert await adapter.recover(speech("Answered once.", started=started)) is None
    assert await adapter.recover(speech("Answered once.", voice="anotherVoice", started=started)) is None
    assert await adapter.recover(speech("Answered once!", started=started, model_id="eleven_flash_v2_5")) is None


async def test_two_identical_calls_in_the_window_are_ambiguous(adapter, simulator, spool):
    started = datetime.now(UTC)
    for _ in range(2):
        await adapter.call(speech("Said twice.", started=started))
    for file in spooled(spool):
        os.unlink(spool / file)
    with pytest.raises(Rejected, match="2 history items .* ambiguous"):
        await adapter.recover(speech("Said twice.", started=started))
    assert spooled(spool) == [] and len(history_items(simulator)) == 2


async def test_a_generation_before_the_window_is_not_adopted(adapter, simulator):
    await adapter.call(speech("Said long ago."))
    (item,) = history_items(simulator)
    # This call started after that item was made, by more than the clock-skew margin.
    later = datetime.fromtimestamp(item["date_unix"], UTC) + timedelta(seconds=FIND_CLOCK_SKEW_S + 2)
    assert await adapter.recover(speech("Said long ago.", started=later)) is None
    # Within the margin it is this call's.
    near = datetime.fromtimestamp(item["date_unix"], UTC) + timedelta(seconds=FIND_CLOCK_SKEW_S - 2)
    assert await adapter.recover(speech("Said long ago.", started=near)) is not None


async def test_a_call_still_running_is_not_in_the_history_yet(adapter):
    request = speech("Still speaking.", started=datetime.now(UTC), duration_s=5, timeout_s=0.3)
    with pytest.raises(Uncertain):
        await adapter.call(request)
    assert await adapter.recover(request) is None  # not done: looked up again later


async def test_without_logging_there_is_no_history_to_recover_from(adapter, simulator):
    request = speech("Private.", started=datetime.now(UTC), enable_logging=False)
    assert read(await adapter.call(request))
    assert history_items(simulator) == []
    assert await adapter.recover(request) is None


async def test_failed_history_reads_are_transient_and_leave_no_file(adapter, simulator, spool):
    request = speech("Read me back.", started=datetime.now(UTC))
    await adapter.call(request)
    for file in spooled(spool):
        os.unlink(spool / file)
    for fault in ("status_error", "download_error", "throttle"):
        set_faults(simulator, **{fault: 1})
        with pytest.raises(Transient) as caught:
            await adapter.recover(request)
        assert KEY not in str(caught.value), fault
        assert spooled(spool) == [], fault
    set_faults(simulator)
    assert await adapter.recover(request) is not None


async def test_an_answer_over_the_cap_is_output_too_large_and_leaves_no_file(simulator, spool):
    reset(simulator)
    provider = ElevenLabsProvider(f"{simulator}/elevenlabs", KEY, max_output_bytes=1000, spool_dir=str(spool))
    try:
        request = speech("Too long.", started=datetime.now(UTC), output_bytes=5000)
        with pytest.raises(OutputTooLarge):
            await provider.call(request)
        assert spooled(spool) == []
        with pytest.raises(OutputTooLarge):  # the history's copy is capped the same
            await provider.recover(request)
        assert spooled(spool) == []
        exact = await provider.call(speech("Just right.", output_bytes=1000))
        assert exact.files[0].bytes == 1000
    finally:
        await provider.aclose()
        reset(simulator)


async def test_connection_refused_is_transient(closed_port_url, spool):
    provider = ElevenLabsProvider(closed_port_url, KEY, spool_dir=str(spool))
    try:
        with pytest.raises(Transient):
            await provider.call(speech())
        with pytest.raises(Transient):
            await provider.recover(speech(started=datetime.now(UTC)))
    finally:
        await provider.aclose()
    assert spooled(spool) == []


# ================================================================== against a scripted ElevenLabs


@pytest.fixture
async def scripted(script: Script, spool):
    provider = ElevenLabsProvider(script.url, KEY, timeout_s=2.0, find_max_pages=3, spool_dir=str(spool))
    yield provider, script
    await provider.aclose()


def audio_answer(data: bytes = b"ID3audio", headers: dict | None = None, media_type: str = "audio/mpeg"):
    def handler(seen: Seen) -> Response:
        return Response(data, media_type=media_type, headers=headers)
    return handler


async def test_the_call_is_the_documented_request(scripted):
    provider, script = scripted
    script.handler = audio_answer(headers={"request-id": "req_1", "character-cost": "9"})
    request = call_request("text-to-speech/my voice?x#y", text="Hello.", model_id="eleven_v3",
                           output_format="pcm_16000", enable_logging=True, optimize_streaming_latency=1, seed=7)
    result = await provider.call(request)
    (seen,) = script.seen
    # The voice id arrived whole in the path: its '?' and '#' started no query and no fragment.
    assert (seen.method, unquote(seen.path)) == ("POST", "/v1/text-to-speech/my voice?x#y")
    assert seen.query == {"output_format": "pcm_16000", "enable_logging": "true", "optimize_streaming_latency": "1"}
    assert httpx.Response(200, content=seen.body).json() == {"text": "Hello.", "model_id": "eleven_v3", "seed": 7}
    assert seen.headers["xi-api-key"] == KEY and "authorization" not in seen.headers
    assert seen.headers["content-type"] == "application/json"
    # The text's 6 characters, not the character-cost of 9 (a model's own rate).
    assert result.request_id == "req_1" and result.usage == (Usage(UsageUnit.CHARACTERS, 6.0),)
    assert read(result) == b"ID3audio" and result.files[0].content_type == "audio/mpeg"


async def test_sound_generation_sends_only_output_format_as_its_query(scripted):
    provider, script = scripted
    script.handler = audio_answer(media_type="audio/ogg")
    result = await provider.call(call_request("sound-generation", text="Rain", output_format="opus_48000_64",
                                              enable_logging=False, duration_seconds=3))
    (seen,) = script.seen
    assert seen.path == "/v1/sound-generation" and seen.query == {"output_format": "opus_48000_64"}
    assert httpx.Response(200, content=seen.body).json() == {"text": "Rain", "enable_logging": False,
                                                            "duration_seconds": 3}
    # No character-cost, no request-id: the text's characters, no id.
    assert result.usage == (Usage(UsageUnit.CHARACTERS, 4.0),) and result.request_id is None
    assert result.files[0].content_type == "audio/ogg"


@pytest.mark.parametrize(("headers", "characters", "request_id"), [
    ({"character-cost": "2.5", "request-id": "a b"}, 5.0, None),  # not a whole number; not an id
    ({"character-cost": "", "request-id": "x" * 201}, 5.0, None),
    ({"character-cost": "40", "request-id": "r-1"}, 5.0, "r-1"),  # the text's, whatever the header
])
async def test_odd_headers(scripted, headers, characters, request_id):
    provider, script = scripted
    script.handler = audio_answer(headers=headers)
    result = await provider.call(call_request(SPEECH, text="Hello"))
    assert result.usage == (Usage(UsageUnit.CHARACTERS, characters),) and result.request_id == request_id


async def test_an_empty_answer_is_uncertain_and_leaves_no_file(scripted, spool):
    provider, script = scripted
    script.handler = audio_answer(b"")
    with pytest.raises(Uncertain, match="no audio"):
        await provider.call(speech())
    assert spooled(spool) == []


@pytest.mark.parametrize(("status", "error"), [(400, Rejected), (401, Rejected), (422, Rejected), (429, Transient),
                                               (503, Transient), (500, Uncertain), (502, Uncertain)])
async def test_the_key_never_reaches_a_message(scripted, spool, status, error):
    provider, script = scripted
    echo = {"detail": {"type": "validation_error", "code": "invalid_parameters",
                       "message": f"key {KEY} is not allowed", "status": "invalid_parameters", "request_id": "r"}}
    script.answer(status, echo)
    messages = []
    for request in (speech(), sound()):
        with pytest.raises(error) as caught:
            await provider.call(request)
        messages.append(str(caught.value))
    with pytest.raises(Transient) as on_history:
        await provider.recover(speech(started=datetime.now(UTC)))
    messages.append(str(on_history.value))
    assert all(KEY not in m and "[redacted]" in m for m in messages), messages
    assert spooled(spool) == [] and KEY not in repr(provider)


async def test_recover_asks_for_the_voices_speech_newest_first(scripted):
    provider, script = scripted
    script.answer(200, {"history": [], "last_history_item_id": None, "has_more": False, "scanned_until": None})
    assert await provider.recover(speech(voice="my voice", started=datetime.now(UTC))) is None
    (seen,) = script.seen
    assert (seen.method, seen.path) == ("GET", "/v1/history")
    assert seen.query == {"voice_id": "my voice", "source": "TTS", "page_size": "100", "sort_direction": "desc"}
    assert seen.headers["xi-api-key"] == KEY


async def test_no_request_without_logging_or_without_a_start(scripted):
    provider, script = scripted
    assert await provider.recover(speech(started=datetime.now(UTC), enable_logging=False)) is None
    assert await provider.recover(speech(started=None)) is None
    assert await provider.recover(dataclasses.replace(sound(), first_attempt_at=datetime.now(UTC))) is None
    assert script.seen == []


def history_server(script: Script, pages: list[list[dict]], audio: bytes = b"RIFFaudio") -> None:
    """The history as pages (newest first), paged by start_after_history_item_id; each item's audio."""
    def handler(seen: Seen) -> Response:
        if seen.path.endswith("/audio"):
            return Response(audio, media_type="audio/wav")
        after = seen.query.get("start_after_history_item_id")
        index = 0 if after is None else next(i + 1 for i, page in enumerate(pages)
                                             if page and page[-1]["history_item_id"] == after)
        page = pages[index] if index < len(pages) else []
        return JSONResponse({"history": page, "last_history_item_id": page[-1]["history_item_id"] if page else None,
                             "has_more": index + 1 < len(pages), "scanned_until": None})
    script.handler = handler


def item_at(n: int, date_unix: int, text: str = "Hello there.", **fields: Any) -> dict:
    return {**ITEM, "history_item_id": f"h{n}", "request_id": f"r{n}", "date_unix": date_unix, "text": text,
            **fields}


async def test_the_item_is_found_pages_back_and_the_paging_stops_at_the_window(scripted, spool):
    provider, script = scripted
    started = datetime.now(UTC)
    now = int(started.timestamp())
    old = now - 3600
    history_server(script, [[item_at(1, now + 3, "Other."), item_at(2, now + 2, "Other.")],
                            [item_at(3, now + 1), item_at(4, old, "Older.")],
                            [item_at(5, old - 1)]])  # never read: the window ended on page 2
    found = await provider.recover(speech(started=started))
    assert found is not None and read(found) == b"RIFFaudio" and found.request_id == "r3"
    assert found.files[0].content_type == "audio/wav" and found.usage == (Usage(UsageUnit.CHARACTERS, 12.0),)
    assert [(s.path, s.query.get("start_after_history_item_id")) for s in script.seen] == [
        ("/v1/history", None), ("/v1/history", "h2"), ("/v1/history/h3/audio", None)]
    assert spooled(spool) == [os.path.basename(found.files[0].path)]


async def test_a_match_and_its_twin_on_another_page_are_ambiguous(scripted, spool):
    provider, script = scripted
    started = datetime.now(UTC)
    now = int(started.timestamp())
    history_server(script, [[item_at(1, now + 2)], [item_at(2, now + 1)]])
    with pytest.raises(Rejected, match="ambiguous"):
        await provider.recover(speech(started=started))
    assert all(not s.path.endswith("/audio") for s in script.seen) and spooled(spool) == []


async def test_a_window_longer_than_the_page_bound_is_not_told_apart(scripted):
    provider, script = scripted
    started = datetime.now(UTC)
    now = int(started.timestamp())
    history_server(script, [[item_at(1, now + 9)], [item_at(2, now + 8, "Other.")], [item_at(3, now + 7, "Other.")],
                            [item_at(4, now + 6, "Other.")]])
    with pytest.raises(Rejected, match="longer than 3 pages"):
        await provider.recover(speech(started=started))
    assert len(script.seen) == 3


@pytest.mark.parametrize("answer", [["a", "list"], {"history": "none"}, {"items": []}])
async def test_a_history_answer_we_cannot_read_is_transient(scripted, answer):
    provider, script = scripted
    script.answer(200, answer)
    with pytest.raises(Transient):
        await provider.recover(speech(started=datetime.now(UTC)))


async def test_history_audio_that_is_gone_or_empty_is_transient(scripted, spool):
    provider, script = scripted
    started = datetime.now(UTC)
    page = {"history": [item_at(1, int(started.timestamp()))], "last_history_item_id": "h1", "has_more": False}

    for audio in (JSONResponse({"detail": {"message": "History item not found."}}, status_code=404),
                  Response(b"", media_type="audio/mpeg")):
        def handler(seen: Seen, audio: Response = audio) -> Response:
            return audio if seen.path.endswith("/audio") else JSONResponse(page)
        script.handler = handler
        with pytest.raises(ProviderError) as caught:
            await provider.recover(speech(started=started))
        assert type(caught.value) is Transient
        assert spooled(spool) == []


@pytest.mark.parametrize(("content_type", "audio"), [
    ("audio/mpeg", True), ("audio/wav", True), ("Audio/Ogg; codecs=opus", True), (None, True),
    ("application/octet-stream", True), ("application/json", False), ("text/html; charset=utf-8", False),
])
def test_only_audio_is_taken_as_the_answer(content_type, audio):
    from app.providers.elevenlabs import is_audio

    assert is_audio(content_type) is audio
