"""Google's Gemini API under /gemini: Veo's predictLongRunning, the operation
it answers, the Files API download, Google's JSON errors, and the faults.
The shapes are those of googleapis' prediction_service.proto and
google-genai's converters (see app/simulator/gemini.py)."""
from __future__ import annotations

import hashlib
import re
import time

import httpx
import pytest

from app.simulator import output_sha256
from app.simulator.gemini import OP_ID_LEN, RESPONSE_TYPE, parse_file_id

from .helpers import wait_until

KEY = {"x-goog-api-key": "gemini-test-key"}
MODEL = "veo-3.1-generate-preview"
PREDICT = f"/gemini/v1beta/models/{MODEL}:predictLongRunning"


def body(prompt: str = "a cat", **parameters) -> dict:
    return {"instances": [{"prompt": prompt}], "parameters": parameters}


def submit(client: httpx.Client, **parameters) -> str:
    response = client.post(PREDICT, json=body(**parameters), headers=KEY)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"name"}  # running: `done: false` left out, as proto3 JSON does
    return answer["name"]


def operation(client: httpx.Client, name: str, headers: dict | None = None) -> httpx.Response:
    return client.get(f"/gemini/v1beta/{name}", headers=KEY if headers is None else headers)


def wait_done(client: httpx.Client, name: str) -> dict:
    return wait_until(lambda: (o := operation(client, name).json()).get("done") and o, 5, "the operation")


def rpc(response: httpx.Response, http_status: int, status: str) -> dict:
    """Google's JSON error answer, exactly its fields."""
    assert response.status_code == http_status, response.text
    error = response.json()["error"]
    assert set(error) <= {"code", "message", "status", "details"}
    assert (error["code"], error["status"]) == (http_status, status) and error["message"]
    return error


def created(client: httpx.Client) -> int:
    return client.get("/_sim/stats").json()["tasks_created"]


def faults(client: httpx.Client, **rates) -> None:
    client.post("/_sim/faults", json=rates).raise_for_status()


# ------------------------------------------------------------------ the operation's life


def test_an_operation_runs_then_is_done_with_one_file_link_per_sample(client, sim_url):
    name = submit(client, duration_s=0.3, sampleCount=2, output_bytes=700)
    match = re.fullmatch(rf"models/{re.escape(MODEL)}/operations/([0-9a-f]{{{OP_ID_LEN}}})", name)
    assert match, name
    assert operation(client, name).json() == {"name": name}

    done = wait_done(client, name)
    assert set(done) == {"name", "done", "response"} and done["name"] == name
    assert done["response"]["@type"] == RESPONSE_TYPE
    samples = done["response"]["generateVideoResponse"]["generatedSamples"]
    assert set(done["response"]["generateVideoResponse"]) == {"generatedSamples"}  # no filter: no count
    assert [set(s) for s in samples] == [{"video"}, {"video"}]
    uris = [s["video"]["uri"] for s in samples]
    assert all(set(s["video"]) == {"uri"} for s in samples)
    op_id = match.group(1)
    for index, uri in enumerate(uris):
        # The Files API link, its id in letters and digits (the SDK's t_file_name takes [a-z0-9]+).
        file_id = re.fullmatch(rf"{re.escape(sim_url)}/gemini/v1beta/files/([a-z0-9]+):download\?alt=media",
                               uri).group(1)
        assert parse_file_id(file_id) == (op_id, index)
        got = client.get(uri, headers=KEY)
        assert got.status_code == 200 and got.headers["content-type"] == "video/mp4"
        assert hashlib.sha256(got.content).hexdigest() == output_sha256(op_id, index, 700)


def test_the_outputs_control_counts_the_videos_without_sample_count(client):
    name = submit(client, duration_s=0, outputs=3)
    assert len(wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"]) == 3


def test_no_video_and_no_error_is_what_a_fully_filtered_operation_looks_like(client):
    name = submit(client, duration_s=0, outputs=0)
    done = wait_done(client, name)
    assert done["response"] == {"@type": RESPONSE_TYPE, "generateVideoResponse": {}}
    assert "error" not in done


def test_a_failed_operation_is_done_with_a_google_rpc_status(client):
    name = submit(client, duration_s=0.1, outcome="failed")
    done = wait_done(client, name)
    assert set(done) == {"name", "done", "error"}
    assert set(done["error"]) == {"code", "message"} and done["error"]["code"] == 13
    assert "failed" in done["error"]["message"]


def test_content_type_and_the_key_query_parameter(client):
    name = submit(client, duration_s=0, content_type="video/webm", output_bytes=10)
    uri = wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    got = client.get(f"{uri}&key=as-a-query-parameter")
    assert got.status_code == 200 and got.headers["content-type"] == "video/webm" and len(got.content) == 10
    assert operation(client, name, headers={}).status_code == 403
    assert client.get(f"/gemini/v1beta/{name}", params={"key": "k"}).json()["done"] is True


def test_videos_last_their_lifetime_then_answer_404_while_the_operation_still_names_them(client):
    name = submit(client, duration_s=0, output_ttl_s=0.3)
    uri = wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    assert client.get(uri, headers=KEY).status_code == 200
    time.sleep(0.4)
    rpc(client.get(uri, headers=KEY), 404, "NOT_FOUND")
    assert operation(client, name).json()["response"]["generateVideoResponse"]["generatedSamples"][0]["video"] \
        == {"uri": uri}


def test_a_video_is_not_served_before_it_exists_nor_past_its_samples(client, sim_url):
    name = submit(client, duration_s=5, sampleCount=1)
    op_id = name.rpartition("/")[2]
    for index in (0, 1):
        rpc(client.get(f"/gemini/v1beta/files/{op_id}{index}:download", params={"alt": "media"}, headers=KEY),
            404, "NOT_FOUND")
    rpc(client.get("/gemini/v1beta/files/abc:download", params={"alt": "media"}, headers=KEY), 404, "NOT_FOUND")


# ------------------------------------------------------------------ refusals


def test_every_route_needs_an_api_key(client):
    error = rpc(client.post(PREDICT, json=body()), 403, "PERMISSION_DENIED")
    assert "API Key" in error["message"]
    rpc(client.post(PREDICT, json=body(), headers={"x-goog-api-key": ""}), 403, "PERMISSION_DENIED")
    assert created(client) == 0
    name = submit(client, duration_s=0)
    rpc(operation(client, name, headers={}), 403, "PERMISSION_DENIED")
    uri = wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    rpc(client.get(uri), 403, "PERMISSION_DENIED")
    # A Bearer token is not an API key.
    rpc(client.get(uri, headers={"Authorization": "Bearer gemini-test-key"}), 403, "PERMISSION_DENIED")


@pytest.mark.parametrize(("sent", "says"), [
    ([1, 2], "JSON object"),
    ({"instances": []}, "instances"),
    ({"instances": ["a cat"]}, "instances"),
    ({"parameters": {}}, "instances"),
    ({"instances": [{"prompt": "a"}], "webhookConfig": {"uris": ["https://x"]}}, 'Unknown name "webhookConfig"'),
    (body(duration_s="soon"), "parameters.duration_s must be a number"),
    (body(sampleCount=5), "parameters.sampleCount must be a whole number from 1 to 4"),
    (body(sampleCount=True), "parameters.sampleCount"),
    (body(sampleCount=2, outputs=3), "parameters.outputs must equal sampleCount"),
    (body(output_text="hello"), "parameters.output_text is not supported"),
    ({"instances": [{"prompt": "a"}], "parameters": [1]}, "parameters must be an object"),
])
def test_a_bad_body_is_invalid_argument_and_creates_nothing(client, sent, says):
    error = rpc(client.post(PREDICT, json=sent, headers=KEY), 400, "INVALID_ARGUMENT")
    assert says in error["message"]
    assert created(client) == 0


def test_a_body_that_is_not_json_is_invalid_argument(client):
    response = client.post(PREDICT, content=b"{nope", headers={**KEY, "content-type": "application/json"})
    rpc(response, 400, "INVALID_ARGUMENT")


def test_sample_count_given_as_a_whole_float_is_taken(client):
    name = submit(client, duration_s=0, sampleCount=2.0, outputs=2)
    assert len(wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"]) == 2


def test_unknown_operations_files_and_routes_are_not_found(client):
    rpc(operation(client, f"models/{MODEL}/operations/{'0' * OP_ID_LEN}"), 404, "NOT_FOUND")
    name = submit(client, duration_s=5)
    rpc(operation(client, name.replace(MODEL, "veo-2.0-generate-001")), 404, "NOT_FOUND")  # another model's
    rpc(client.get("/gemini/v1beta/nosuchthing", headers=KEY), 404, "NOT_FOUND")
    # No cancel: the API binds CancelOperation to batches only.
    rpc(client.post(f"/gemini/v1beta/{name}:cancel", headers=KEY), 404, "NOT_FOUND")
    assert "done" not in operation(client, name).json()


def test_a_download_wants_alt_media(client):
    name = submit(client, duration_s=0)
    uri = wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    rpc(client.get(uri.partition("?")[0], headers=KEY), 400, "INVALID_ARGUMENT")
    rpc(client.get(uri.partition("?")[0], params={"alt": "json"}, headers=KEY), 400, "INVALID_ARGUMENT")


# ------------------------------------------------------------------ faults


def test_submit_error_is_internal_and_creates_nothing(client):
    faults(client, submit_error=1)
    rpc(client.post(PREDICT, json=body(), headers=KEY), 500, "INTERNAL")
    assert created(client) == 0


def test_throttle_is_resource_exhausted_with_retry_after_and_retry_info(client):
    name = submit(client, duration_s=5)
    faults(client, throttle=1)
    for response in (client.post(PREDICT, json=body(), headers=KEY), operation(client, name)):
        error = rpc(response, 429, "RESOURCE_EXHAUSTED")
        assert response.headers["retry-after"] == "1"
        assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}]
    assert created(client) == 1


def test_status_error_is_internal_and_counted_as_a_status_call(client):
    name = submit(client, duration_s=5)
    before = client.get("/_sim/stats").json()["status_calls"]
    faults(client, status_error=1)
    rpc(operation(client, name), 500, "INTERNAL")
    faults(client)
    assert operation(client, name).status_code == 200
    assert client.get("/_sim/stats").json()["status_calls"] == before + 2


def test_download_error_is_internal(client):
    name = submit(client, duration_s=0)
    uri = wait_done(client, name)["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    faults(client, download_error=1)
    rpc(client.get(uri, headers=KEY), 500, "INTERNAL")
    faults(client)
    assert client.get(uri, headers=KEY).status_code == 200


def test_submit_timeout_after_create_creates_the_operation_and_never_answers(client, sim_url):
    faults(client, submit_timeout_after_create=1)
    with httpx.Client(base_url=sim_url, timeout=0.3, trust_env=False) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post(PREDICT, json=body(duration_s=5), headers=KEY)
    assert created(client) == 1
