"""ElevenLabs' own Python client (elevenlabs 2.x) against the simulator's
/elevenlabs protocol, and against our adapter: every answer the simulator
gives must be one of the client's types, whole (its required fields there)
and with no field the type does not declare, and a dub one side made must be
readable by the other. The client is only a reference here; longcall never
submits with it.

`ElevenLabs(base_url=...)` takes the base without `/v1`: the client adds
`v1/dubbing`. Its models are Fern's UncheckedBaseModel, which parse without
checking: `strictly` validates what it parsed, so a missing field fails.
Its own retries (429 and 5xx, twice by default) are turned off where a test
wants to see the error."""
from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any, TypeVar

import pytest
from elevenlabs import ElevenLabs
from elevenlabs.core.api_error import ApiError
from elevenlabs.errors import TooEarlyError, UnprocessableEntityError
from elevenlabs.types import DoDubbingResponse, DubbingMetadataPageResponseModel, DubbingMetadataResponse

from app.providers.base import SubmitRequest, Task, TaskState
from app.providers.elevenlabs import ElevenLabsProvider
from app.simulator import output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults

KEY = "sk_elevenlabs_reference_key"
SOURCE = "https://media.example.com/talks/keynote.mp4"
NO_RETRIES: Any = {"max_retries": 0}
Model = TypeVar("Model", DoDubbingResponse, DubbingMetadataResponse, DubbingMetadataPageResponseModel)


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
    clear_faults(simulator)
    yield ElevenLabs(api_key=KEY, base_url=f"{simulator}/elevenlabs", timeout=10)
    clear_faults(simulator)


def strictly(model: type[Model], value: Any) -> Model:
    """`value`, as the client parsed it, is a whole `model`: validated
    (required fields present, of their types), nothing undeclared."""
    assert isinstance(value, model), type(value)
    assert not value.model_extra, value.model_extra
    if isinstance(value, DubbingMetadataPageResponseModel):
        for dub in value.dubs:
            strictly(DubbingMetadataResponse, dub)
    return model.model_validate(value.model_dump(mode="json"))


def controls(**values: Any) -> Any:
    # The simulator's controls ride as form fields the client does not declare.
    return {"additional_body_parameters": values}


def create(client: ElevenLabs, **fields: Any) -> DoDubbingResponse:
    params: dict[str, Any] = {"source_url": SOURCE, "target_lang": "es", "name": "job_" + secrets.token_hex(6)}
    wanted = {k: fields.pop(k) for k in list(fields) if k in ("duration_s", "outcome", "output_bytes")}
    params.update(fields)
    return strictly(DoDubbingResponse, client.dubbing.create(**params, request_options=controls(**wanted)))


def wait(client: ElevenLabs, dubbing_id: str, timeout_s: float = 10.0) -> DubbingMetadataResponse:
    deadline = time.monotonic() + timeout_s
    while True:
        dub = strictly(DubbingMetadataResponse, client.dubbing.get(dubbing_id))
        if dub.status in ("dubbed", "failed") or time.monotonic() > deadline:
            return dub
        time.sleep(0.05)


def test_create_get_wait_and_the_audio(client):
    made = create(client, duration_s=0.3, output_bytes=4096, source_lang="en", num_speakers=2, watermark=True,
                  dubbing_studio=False)
    assert made.expected_duration_sec == 0.3 and len(made.dubbing_id) == 20
    first = strictly(DubbingMetadataResponse, client.dubbing.get(made.dubbing_id))
    assert first.status in ("queued", "preparing", "dubbing") and first.target_languages == ["es"]
    assert isinstance(first.created_at, datetime) and first.created_at.tzinfo is not None
    done = wait(client, made.dubbing_id)
    assert done.status == "dubbed" and done.source_language == "en" and done.error is None
    audio = b"".join(client.dubbing.audio.get(made.dubbing_id, "es"))
    assert hashlib.sha256(audio).hexdigest() == output_sha256(made.dubbing_id, 0, 4096)


def test_a_failed_dub_has_its_error(client):
    made = create(client, duration_s=0.1, outcome="failed")
    done = wait(client, made.dubbing_id)
    assert done.status == "failed" and isinstance(done.error, str) and done.error


def test_list_pages_by_cursor_in_either_order(client):
    tag = secrets.token_hex(4)
    made = [create(client, duration_s=30, name=f"{tag}-{i}").dubbing_id for i in range(5)]
    listed: list[str] = []
    cursor = None
    while True:
        page = strictly(DubbingMetadataPageResponseModel, client.dubbing.list(page_size=2, cursor=cursor))
        listed += [d.dubbing_id for d in page.dubs if d.name.startswith(tag)]
        if not page.has_more:
            assert page.next_cursor is None
            break
        cursor = page.next_cursor
    assert listed == made[::-1]  # newest first
    oldest = strictly(DubbingMetadataPageResponseModel,
                      client.dubbing.list(order_by="created_at", order_direction="ASCENDING", page_size=200))
    assert [d.dubbing_id for d in oldest.dubs if d.name.startswith(tag)] == made
    # The client's list filters, as it encodes them (repeated keys).
    running = client.dubbing.list(dubbing_statuses=["queued", "preparing", "dubbing"], target_language_codes=["es"],
                                  filter_by_creator="personal", page_size=200)
    assert set(made) <= {d.dubbing_id for d in strictly(DubbingMetadataPageResponseModel, running).dubs}
    assert strictly(DubbingMetadataPageResponseModel, client.dubbing.list(dubbing_status="failed",
                                                                          target_language_codes="zz")).dubs == []


def test_errors_are_the_clients_errors(client, simulator):
    with pytest.raises(ApiError) as caught:
        client.dubbing.get("nosuchdub")
    assert caught.value.status_code == 404 and caught.value.body["detail"]["type"] == "not_found"
    with pytest.raises(UnprocessableEntityError) as invalid:
        client.dubbing.create(source_url=SOURCE)  # no target_lang
    assert invalid.value.body["detail"][0]["loc"] == ["body", "target_lang"]
    made = create(client, duration_s=30)
    with pytest.raises(TooEarlyError):
        b"".join(client.dubbing.audio.get(made.dubbing_id, "es"))
    stranger = ElevenLabs(api_key="", base_url=f"{simulator}/elevenlabs")  # sends no xi-api-key
    with pytest.raises(ApiError) as unauthorized:
        stranger.dubbing.list()
    assert unauthorized.value.status_code == 401
    assert unauthorized.value.body["detail"]["status"] == "needs_authorization"


def test_throttle_is_a_429_the_client_would_wait_on(client, simulator):
    made = create(client, duration_s=30)
    set_faults(simulator, throttle=1)
    with pytest.raises(ApiError) as caught:
        client.dubbing.get(made.dubbing_id, request_options=NO_RETRIES)
    assert caught.value.status_code == 429 and caught.value.headers["retry-after"] == "1"
    assert caught.value.body["detail"]["code"] == "rate_limit_exceeded"


async def test_the_adapter_and_the_client_read_each_others_dubs(client, simulator):
    adapter = ElevenLabsProvider(f"{simulator}/elevenlabs", KEY, timeout_s=5)
    try:
        request = SubmitRequest(job_id="job_" + secrets.token_hex(8), model="dubbing",
                                input={"source_url": SOURCE, "target_lang": "fr", "watermark": False,
                                       "num_speakers": 0, "duration_s": 0.2}, callback_url=None)
        submitted = await adapter.submit(request, request.job_id)
        # The client reads the adapter's dub, named after the job, with the form's values.
        seen = strictly(DubbingMetadataResponse, client.dubbing.get(submitted.task_id))
        assert seen.name == request.job_id and seen.target_languages == ["fr"]
        assert wait(client, submitted.task_id).status == "dubbed"
        # ...and the adapter reads the client's, with the language as its output's label.
        made = create(client, duration_s=0.1, target_lang="de")
        wait(client, made.dubbing_id)
        final = await adapter.status(Task(task_id=made.dubbing_id, model="dubbing"))
        assert final.state is TaskState.SUCCEEDED and final.url_labels == ("de",)
    finally:
        await adapter.aclose()
