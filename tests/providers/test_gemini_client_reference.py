"""Google's own client, google-genai (3.6), against the simulator's /gemini
protocol: every answer must parse in the client's types and errors, at the
paths the client addresses, with the key the way the client sends it. The
client is only a reference here; longcall never submits with it.

Pointed at the simulator with `HttpOptions(base_url=f"{sim}/gemini",
api_version="v1beta")`: the client joins base URL, version and path
(`_api_client.join_url_path`); 3.x's default version for the Developer API
is `v1`, so it is named. Its retries are off (`retry_options=None`: one
attempt), and the proxy variables are cleared so it reaches loopback.

google-genai 3.x no longer submits Veo jobs for the Developer API:
`models.generate_videos` raises "only supported in Gemini Enterprise Agent
Platform mode" (2.x sent `POST models/{model}:predictLongRunning` from
`_GenerateVideosParameters_to_mldev`). So the submit is sent through the
client's own transport, `client._api_client.request` — the one every public
method uses: its key header, URL joining and error classes — with the body
2.x's `_GenerateVideosConfig_to_mldev` builds (`instances[0].prompt`,
`parameters.sampleCount`, `durationSeconds`, `aspectRatio`), and its answer
parsed as 3.x parses operations (`GenerateVideosOperation.from_api_response`,
the Developer API's converter). `operations.get` and `files.download` are
the public calls.

`files.download` takes a file id out of a `Video.uri` only when the uri is
https (`_transformers.t_file_name`: `https://…/files/<[a-z0-9]+>`); the
simulator's links are plain http on loopback, so the video is handed over
with its uri's scheme made https: the client reads only the id from it and
downloads from its own base URL."""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from app.providers.base import SubmitRequest, Task, TaskState
from app.providers.gemini import GeminiProvider
from app.simulator import create_app, output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults, stats

KEY = "AIzaReferenceKey0123456789abcdefghijk"
MODEL = "veo-3.1-generate-preview"
POLL_S = 0.05

# What the client's Developer API converters read (_operations_converters.py:
# _GenerateVideosOperation_from_mldev, _GenerateVideosResponse_from_mldev,
# _GeneratedVideo_from_mldev, _Video_from_mldev), and the Any's @type: the
# simulator may answer nothing else.
OPERATION_FIELDS = {"name", "metadata", "done", "error", "response"}
RESPONSE_FIELDS = {"@type", "generateVideoResponse"}
VIDEO_RESPONSE_FIELDS = {"generatedSamples", "raiMediaFilteredCount", "raiMediaFilteredReasons"}
SAMPLE_FIELDS = {"video"}
VIDEO_FIELDS = {"uri", "encodedVideo", "encoding"}
STATUS_FIELDS = {"code", "message", "details"}  # google.rpc.Status


def only_documented(operation: dict[str, Any]) -> None:
    assert set(operation) <= OPERATION_FIELDS, operation
    if "error" in operation:
        assert set(operation["error"]) <= STATUS_FIELDS
    response = operation.get("response")
    if response is None:
        return
    assert set(response) <= RESPONSE_FIELDS
    video_response = response["generateVideoResponse"]
    assert set(video_response) <= VIDEO_RESPONSE_FIELDS
    for sample in video_response.get("generatedSamples", []):
        assert set(sample) <= SAMPLE_FIELDS and set(sample["video"]) <= VIDEO_FIELDS


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    served = ServedApp(create_app(hold_s=2.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
def client(simulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[genai.Client]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_API_VERSION", "GOOGLE_GENAI_USE_VERTEXAI",
                 "GOOGLE_GENAI_HTTP_CLIENT"):
        monkeypatch.delenv(name, raising=False)
    clear_faults(simulator)
    options = types.HttpOptions(base_url=f"{simulator}/gemini", api_version="v1beta", retry_options=None,
                                timeout=10_000)
    yield genai.Client(api_key=KEY, http_options=options)
    clear_faults(simulator)


def config_body(prompt: str, config: types.GenerateVideosConfig, **controls: Any) -> dict[str, Any]:
    """The body google-genai 2.x sent for `generate_videos(prompt=…,
    config=…)` to the Developer API (_GenerateVideosConfig_to_mldev), plus
    the simulator's controls in `parameters`."""
    parameters: dict[str, Any] = {}
    if config.number_of_videos is not None:
        parameters["sampleCount"] = config.number_of_videos
    if config.duration_seconds is not None:
        parameters["durationSeconds"] = config.duration_seconds
    if config.aspect_ratio is not None:
        parameters["aspectRatio"] = config.aspect_ratio
    if config.negative_prompt is not None:
        parameters["negativePrompt"] = config.negative_prompt
    return {"instances": [{"prompt": prompt}], "parameters": {**parameters, **controls}}


def raw(client: genai.Client, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    response = client._api_client.request(method, path, body or {})
    return json.loads(response.body)


def submit(client: genai.Client, body: dict[str, Any]) -> types.GenerateVideosOperation:
    answer = raw(client, "post", f"models/{MODEL}:predictLongRunning", body)
    only_documented(answer)
    return types.GenerateVideosOperation.from_api_response(answer, is_vertex_ai=False)


def wait(client: genai.Client, operation: types.GenerateVideosOperation) -> types.GenerateVideosOperation:
    deadline = time.monotonic() + 10
    while not operation.done:
        assert time.monotonic() < deadline, "the operation did not finish"
        time.sleep(POLL_S)
        operation = client.operations.get(operation)  # GET {name}, parsed as a GenerateVideosOperation
        assert isinstance(operation, types.GenerateVideosOperation)
    only_documented(raw(client, "get", operation.name))
    return operation


def as_https(video: types.Video) -> types.Video:
    assert video.uri and video.uri.startswith("http://")
    return types.Video(uri="https://" + video.uri.removeprefix("http://"))


def test_generate_videos_is_not_offered_for_the_developer_api_by_this_client(client, simulator):
    # The reason the submit below goes through the client's transport; if a
    # later 3.x offers it again, this says so and the test should use it.
    before = stats(simulator)["tasks_created"]
    with pytest.raises(ValueError, match="only supported in Gemini Enterprise Agent Platform"):
        client.models.generate_videos(model=MODEL, source=types.GenerateVideosSource(prompt="a cat"),
                                      config=types.GenerateVideosConfig(number_of_videos=1))
    assert stats(simulator)["tasks_created"] == before


def test_submit_poll_and_download_every_video(client, tmp_path):
    config = types.GenerateVideosConfig(number_of_videos=2, duration_seconds=8, aspect_ratio="16:9",
                                        negative_prompt="blur")
    operation = submit(client, config_body("a neon cat", config, duration_s=0.3, output_bytes=2048))
    assert operation.name.startswith(f"models/{MODEL}/operations/") and not operation.done
    assert operation.response is None and operation.error is None
    op_id = operation.name.rpartition("/")[2]

    done = wait(client, operation)
    assert done.error is None and done.response == done.result
    assert done.result.rai_media_filtered_count is None and done.result.rai_media_filtered_reasons is None
    generated = done.result.generated_videos
    assert len(generated) == 2
    for index, item in enumerate(generated):
        video = item.video
        assert video.uri and video.video_bytes is None and video.mime_type is None
        expected = output_sha256(op_id, index, 2048)
        handed = as_https(video)
        data = client.files.download(file=handed)  # GET files/{id}:download?alt=media, with the key
        assert hashlib.sha256(data).hexdigest() == expected and handed.video_bytes == data
        # Streamed to a file instead, and named the Files API way.
        target = tmp_path / f"video-{index}.mp4"
        file_id = video.uri.split("files/")[1].split(":")[0]
        client.files.download(file=f"files/{file_id}", destination=str(target))
        assert hashlib.sha256(target.read_bytes()).hexdigest() == expected


def test_a_failed_operation_carries_a_google_rpc_status(client):
    done = wait(client, submit(client, config_body("a cat", types.GenerateVideosConfig(), duration_s=0.1,
                                                   outcome="failed")))
    assert done.done is True and done.response is None and done.result is None
    assert done.error["code"] == 13 and "failed" in done.error["message"]


def test_no_video_and_no_error_parses_as_an_empty_response(client):
    done = wait(client, submit(client, config_body("a cat", types.GenerateVideosConfig(), duration_s=0,
                                                   outputs=0)))
    assert done.error is None and done.result is not None and done.result.generated_videos is None


def test_errors_parse_as_the_clients_errors(client, simulator):
    with pytest.raises(errors.ClientError) as bad:
        submit(client, {"instances": [], "parameters": {}})
    assert (bad.value.code, bad.value.status) == (400, "INVALID_ARGUMENT") and "instances" in bad.value.message
    missing = types.GenerateVideosOperation(name=f"models/{MODEL}/operations/{'0' * 20}")
    with pytest.raises(errors.ClientError) as gone:
        client.operations.get(missing)
    assert (gone.value.code, gone.value.status) == (404, "NOT_FOUND")

    running = submit(client, config_body("a cat", types.GenerateVideosConfig(), duration_s=30))
    set_faults(simulator, throttle=1)
    calls = stats(simulator)["status_calls"]
    with pytest.raises(errors.ClientError) as throttled:
        client.operations.get(running)
    assert (throttled.value.code, throttled.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert throttled.value.details["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}]
    assert stats(simulator)["status_calls"] == calls + 1  # one attempt: the client's retries are off
    set_faults(simulator, status_error=1)
    with pytest.raises(errors.ServerError) as internal:
        client.operations.get(running)
    assert (internal.value.code, internal.value.status) == (500, "INTERNAL")


def test_a_download_without_the_key_is_refused_in_the_clients_error_class(simulator):
    # The client always sends its key: the refusal of none is fetched with
    # a plain request and read by the client's own error class.
    done = httpx.get(f"{simulator}/gemini/v1beta/files/abc:download", params={"alt": "media"}, trust_env=False)
    with pytest.raises(errors.ClientError) as refused:
        errors.APIError.raise_for_response(done)
    assert (refused.value.code, refused.value.status) == (403, "PERMISSION_DENIED")


async def test_our_adapter_and_the_client_see_one_operation(client, simulator, tmp_path):
    adapter = GeminiProvider(f"{simulator}/gemini", KEY, timeout_s=5)
    try:
        body = config_body("a cat for both", types.GenerateVideosConfig(number_of_videos=1), duration_s=0.2,
                           output_bytes=512)
        request = SubmitRequest(job_id="job_reference", model=MODEL, input=body, callback_url=None)
        submitted = await adapter.submit(request, request.job_id)
        operation = wait(client, types.GenerateVideosOperation(name=submitted.task_id))
        seen = await adapter.status(Task(submitted.task_id, model=MODEL))
        assert seen.state is TaskState.SUCCEEDED
        assert list(seen.output_urls) == [g.video.uri for g in operation.result.generated_videos]
        data = client.files.download(file=as_https(operation.result.generated_videos[0].video))
        assert hashlib.sha256(data).hexdigest() == output_sha256(submitted.task_id.rpartition("/")[2], 0, 512)
    finally:
        await adapter.aclose()
