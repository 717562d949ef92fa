"""The adapters' pure decisions: status mapping, URL collection, model
routing, KIE body codes, message scrubbing. No I/O."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from app.config import load_settings
from app.providers import KNOWN_PROVIDERS, build_providers, close_providers
from app.providers.base import OutputValue, Rejected, TaskState, Transient, Uncertain
from app.providers.fal import documented_urls, is_request_outcome, operation_urls, queue_root, result_observation
from app.providers.http import NO_SECRETS, Secrets, collect_urls, retry_after_seconds, same_origin
from app.providers.kie import NO_OUTPUT, observation_from_record, result_urls, submit_outcome
from app.providers.replicate import cancel_after as replicate_cancel_after
from app.providers.replicate import observation_from_prediction, route_for_model
from app.providers.sim import observation_from_task

VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"


# ------------------------------------------------------------------ sim


@pytest.mark.parametrize("status, state", [
    ("queued", TaskState.RUNNING),
    ("running", TaskState.RUNNING),
    ("succeeded", TaskState.SUCCEEDED),
    ("failed", TaskState.FAILED),
    ("cancelled", TaskState.CANCELLED),
])
def test_sim_status_mapping(status, state):
    assert observation_from_task({"id": "t", "status": status}, NO_SECRETS).state is state


def test_sim_success_carries_outputs_and_cost():
    obs = observation_from_task({"status": "succeeded", "outputs": ["http://h/o/1", 5], "cost": 7}, NO_SECRETS)
    assert obs.output_urls == ("http://h/o/1",) and obs.values == ()
    assert obs.cost == 7 and obs.error is None


def test_sim_text_outputs_are_stored_as_text():
    """`output_text`: the entry is the text itself, not a URL to fetch."""
    obs = observation_from_task({"status": "succeeded", "outputs": ["héllo, wörld"], "cost": 1}, NO_SECRETS)
    assert obs.output_urls == ()
    assert obs.values == (OutputValue("héllo, wörld".encode(), "text/plain; charset=utf-8"),)


TEXT = "text/plain; charset=utf-8"


@pytest.mark.parametrize("outputs, urls, values", [
    (["http://h/o/1", "http://h/o/2"], ("http://h/o/1", "http://h/o/2"), ()),
    (["one answer"], (), (OutputValue(b"one answer", TEXT),)),
    # A list of strings that are not file URLs is one JSON output (CONTRACT.md),
    # with a URL among them too (as Replicate's `output`).
    (["alpha", "beta"], (), (OutputValue(b'["alpha","beta"]', "application/json"),)),
    (["http://h/o/1", "beta"], (), (OutputValue(b'["http://h/o/1","beta"]', "application/json"),)),
    ([], (), ()),
])
def test_sim_outputs_as_files_text_or_one_json_value(outputs, urls, values):
    obs = observation_from_task({"status": "succeeded", "outputs": outputs}, NO_SECRETS)
    assert (obs.output_urls, obs.values) == (urls, values)


def test_sim_failure_has_a_reason_even_without_one():
    assert observation_from_task({"status": "failed", "error": "boom"}, NO_SECRETS).error == "boom"
    assert observation_from_task({"status": "failed", "error": {"message": "bad"}}, NO_SECRETS).error == "bad"
    assert observation_from_task({"status": "failed", "error": None}, NO_SECRETS).error


@pytest.mark.parametrize("cost", [-1, True, "3", None])
def test_sim_nonsense_cost_is_no_cost(cost):
    assert observation_from_task({"status": "succeeded", "cost": cost}, NO_SECRETS).cost is None


def test_sim_unknown_status_is_transient():
    with pytest.raises(Transient):
        observation_from_task({"status": "exploded"}, NO_SECRETS)


# ------------------------------------------------------------------ replicate


@pytest.mark.parametrize("model, path, fields", [
    ("stability-ai/sdxl", "/v1/models/stability-ai/sdxl/predictions", {}),
    (f"stability-ai/sdxl:{VERSION}", "/v1/predictions", {"version": VERSION}),
    (VERSION, "/v1/predictions", {"version": VERSION}),
])
def test_replicate_routes(model, path, fields):
    assert route_for_model(model) == (path, fields)


@pytest.mark.parametrize("model", ["", "a/b/c", "a/b:", ":v", "../x/y", "a b/c", "own/na:me:v", "x?y"])
def test_replicate_bad_model_is_rejected_before_sending(model):
    with pytest.raises(Rejected):
        route_for_model(model)


@pytest.mark.parametrize("status, state", [
    ("starting", TaskState.RUNNING),
    ("processing", TaskState.RUNNING),
    ("succeeded", TaskState.SUCCEEDED),
    ("failed", TaskState.FAILED),
    ("canceled", TaskState.CANCELLED),
    ("aborted", TaskState.CANCELLED),
])
def test_replicate_status_mapping(status, state):
    assert observation_from_prediction({"status": status}, NO_SECRETS).state is state


# Replicate's documented prediction object (the HTTP API reference's
# replicate/hello-world example); rows change only what they test.
HELLO_WORLD = {
    "id": "gm3qorzdhgbfurvjtvhg6dckhu",
    "model": "replicate/hello-world",
    "version": VERSION,
    "input": {"text": "Alice"},
    "logs": "",
    "output": "hello Alice",
    "data_removed": False,
    "error": None,
    "status": "succeeded",
    "created_at": "2023-09-08T16:19:34.765994Z",
    "started_at": "2023-09-08T16:19:34.779176Z",
    "completed_at": "2023-09-08T16:19:34.791859Z",
    "urls": {"cancel": "https://api.replicate.com/v1/predictions/gm3qorzdhgbfurvjtvhg6dckhu/cancel",
             "get": "https://api.replicate.com/v1/predictions/gm3qorzdhgbfurvjtvhg6dckhu"},
    "metrics": {"predict_time": 0.012683},
}
TEXT_TYPE, JSON_TYPE = "text/plain; charset=utf-8", "application/json"


# output, data_removed -> URLs, values as (bytes, content type), removed
@pytest.mark.parametrize("output, removed, urls, values, gone", [
    ("hello Alice", False, (), ((b"hello Alice", TEXT_TYPE),), False),
    ("h\u00e9llo \U0001f600", False, (), (("h\u00e9llo \U0001f600".encode(), TEXT_TYPE),), False),
    ("", False, (), ((b"", TEXT_TYPE),), False),
    (["Hello", " Alice", "!"], False, (), ((b'["Hello"," Alice","!"]', JSON_TYPE),), False),
    (["see", "https://r.delivery/1.png"], False, (), ((b'["see","https://r.delivery/1.png"]', JSON_TYPE),), False),
    ("https://replicate.delivery/a.png", False, ("https://replicate.delivery/a.png",), (), False),
    (["https://r.delivery/1.png", "https://r.delivery/2.png"], False,
     ("https://r.delivery/1.png", "https://r.delivery/2.png"), (), False),
    ({"video": "https://r.delivery/v.mp4", "frames": [["https://r.delivery/f.png"]], "seed": 3}, False,
     ("https://r.delivery/v.mp4", "https://r.delivery/f.png"), (), False),
    ({"text": "a cat", "score": 0.5}, False, (), ((b'{"text":"a cat","score":0.5}', JSON_TYPE),), False),
    (42, False, (), ((b"42", JSON_TYPE),), False),
    (None, False, (), (), False),
    ([], False, (), (), False),
    # an hour after it ends the API removes the output
    (None, True, (), (), True),
    ("hello Alice", True, (), (), True),
    (["https://r.delivery/1.png"], True, (), (), True),
])
def test_replicate_outputs_of_every_shape(output, removed, urls, values, gone):
    obs = observation_from_prediction({**HELLO_WORLD, "output": output, "data_removed": removed}, NO_SECRETS)
    assert obs.state is TaskState.SUCCEEDED and obs.cost is None
    assert obs.output_urls == urls
    assert [(v.data, v.content_type, v.label) for v in obs.values] == [(d, t, None) for d, t in values]
    assert obs.output_removed is gone


def test_replicate_removed_data_of_a_failure_is_still_a_failure():
    body = {**HELLO_WORLD, "status": "failed", "output": None, "data_removed": True, "error": "CUDA out of memory"}
    obs = observation_from_prediction(body, NO_SECRETS)
    assert obs.state is TaskState.FAILED and not obs.output_removed and obs.error == "CUDA out of memory"


def test_replicate_failure_reason():
    obs = observation_from_prediction({"status": "failed", "error": "CUDA out of memory"}, NO_SECRETS)
    assert obs.state is TaskState.FAILED and obs.error == "CUDA out of memory"


# Cancel-After from the job's give-up deadline: the whole seconds left, at
# least 5 (the API's minimum), else no header.
@pytest.mark.parametrize("left_s, header", [
    (7200.0, "7200s"), (8.9, "8s"), (5.0, "5s"), (5.999, "5s"), (4.999, None), (0.0, None), (-30.0, None),
])
def test_replicate_cancel_after_from_the_deadline(left_s, header):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert replicate_cancel_after(now + timedelta(seconds=left_s), now) == header


def test_replicate_no_deadline_no_cancel_after():
    assert replicate_cancel_after(None, datetime(2026, 1, 1, tzinfo=UTC)) is None


DEADLINE = "2026-01-01T12:00:00.000000Z"


# Stopped at its deadline: aborted (before it started), or canceled at or
# after the `deadline` the prediction carries; a cancel before it is a
# cancel. Either way the state is CANCELLED.
@pytest.mark.parametrize("fields, at_deadline", [
    ({"status": "aborted"}, True),
    ({"status": "aborted", "deadline": DEADLINE, "completed_at": DEADLINE}, True),
    ({"status": "canceled", "deadline": DEADLINE, "completed_at": DEADLINE}, True),
    ({"status": "canceled", "deadline": DEADLINE, "completed_at": "2026-01-01T12:00:00.400000Z"}, True),
    ({"status": "canceled", "deadline": DEADLINE, "completed_at": "2026-01-01T11:59:59.000000Z"}, False),
    ({"status": "canceled", "completed_at": DEADLINE}, False),  # no Cancel-After was given
    ({"status": "canceled", "deadline": DEADLINE, "completed_at": None}, False),
    ({"status": "canceled", "deadline": "soon", "completed_at": DEADLINE}, False),
    ({"status": "canceled", "deadline": "2026-01-01T12:00:00+00:00", "completed_at": DEADLINE}, True),
])
def test_replicate_stopped_at_its_deadline(fields, at_deadline):
    obs = observation_from_prediction({**HELLO_WORLD, "output": None, **fields}, NO_SECRETS)
    assert obs.state is TaskState.CANCELLED and obs.stopped_at_deadline is at_deadline


def test_replicate_other_states_are_never_stopped_at_a_deadline():
    for status in ("starting", "processing", "succeeded", "failed"):
        body = {**HELLO_WORLD, "status": status, "deadline": DEADLINE, "completed_at": DEADLINE}
        assert observation_from_prediction(body, NO_SECRETS).stopped_at_deadline is False


# ------------------------------------------------------------------ fal


# fal-client's AppId.from_endpoint_id: two segments kept, three in the
# workflows/ and comfy/ namespaces, `<digits>-<name>` read as owner/name.
@pytest.mark.parametrize("model, root", [
    ("fal-ai/fast-sdxl", "fal-ai/fast-sdxl"),
    ("fal-ai/flux", "fal-ai/flux"),
    ("fal-ai/flux/dev", "fal-ai/flux"),
    ("fal-ai/kling-video/v2/master/text-to-video", "fal-ai/kling-video"),
    ("workflows/me/wf", "workflows/me/wf"),
    ("workflows/me/wf/sub/path", "workflows/me/wf"),
    ("comfy/me/wf/x", "comfy/me/wf"),
    ("123-myapp", "123/myapp"),
    ("1714827-joke-v2", "1714827/joke-v2"),
    ("me/workflows/x", "me/workflows"),  # a namespace only counts first
])
def test_fal_status_urls_name_the_queue_root_not_the_subpath(model, root):
    assert queue_root(model) == root
    urls = documented_urls("https://queue.fal.run", model, "req-1")
    assert urls == {
        "status_url": f"https://queue.fal.run/{root}/requests/req-1/status",
        "response_url": f"https://queue.fal.run/{root}/requests/req-1",
        "cancel_url": f"https://queue.fal.run/{root}/requests/req-1/cancel",
    }


@pytest.mark.parametrize("model", [
    "", "/x", "a/../b", "a//b", "a/b?c", "a/b#c", "http://evil/x", "a/b/",
    "flux",  # no owner, and not a numeric app id
    "123-", "-myapp", "123-my_app", "123-myapp\n",
    "workflows/me", "comfy/me", "workflows", "workflows/me/",  # a namespace needs owner and name
    None, 42,
])
def test_fal_bad_model_is_rejected(model):
    with pytest.raises(Rejected, match="fal endpoint id"):
        queue_root(model)


def test_fal_keeps_given_urls_only_on_our_origin():
    base = "http://127.0.0.1:9000/fal"
    given = {
        "status_url": "http://127.0.0.1:9000/fal/x/y/requests/r/status?logs=1",
        "response_url": "http://evil.example/steal",
        "cancel_url": "http://127.0.0.1:9001/fal/x/y/requests/r/cancel",
    }
    urls = operation_urls(base, "x/y", "r", given)
    assert urls["status_url"] == given["status_url"]
    assert urls["response_url"] == f"{base}/x/y/requests/r"
    assert urls["cancel_url"] == f"{base}/x/y/requests/r/cancel"


def test_fal_result_urls_come_from_url_fields_only():
    body = {
        "images": [{"url": "https://v3.fal.media/a.png", "content_type": "image/png"},
                   {"url": "https://v3.fal.media/b.png"}],
        "video": {"url": "https://fal.media/v.mp4"},
        "prompt": "https://not-an-output.example/x",
    }
    obs = result_observation(200, body, NO_SECRETS)
    assert obs.state is TaskState.SUCCEEDED
    assert obs.output_urls == ("https://v3.fal.media/a.png", "https://v3.fal.media/b.png", "https://fal.media/v.mp4")
    assert obs.values == ()


def test_a_fal_result_without_files_is_one_json_output():
    """A text model's answer (any-llm's `{"output": ...}`) is kept whole:
    a success with nothing stored would be a paid answer lost."""
    obs = result_observation(200, {"output": "héllo", "partial": False}, NO_SECRETS)
    assert obs.state is TaskState.SUCCEEDED and obs.output_urls == ()
    assert obs.values == (OutputValue('{"output":"héllo","partial":false}'.encode(), "application/json"),)


@pytest.mark.parametrize("code, body, state, reason", [
    (422, {"detail": [{"loc": ["body", "prompt"], "msg": "field required"}]}, TaskState.FAILED, "field required"),
    (504, {"detail": "Request timed out", "error_type": "request_timeout"}, TaskState.FAILED, "Request timed out"),
    (499, {"detail": "cancelled", "error_type": "client_cancelled"}, TaskState.CANCELLED, None),
])
def test_fal_failed_result(code, body, state, reason):
    obs = result_observation(code, body, NO_SECRETS)
    assert obs.state is state
    if reason:
        assert reason in obs.error


@pytest.mark.parametrize("code, body, outcome", [
    (422, {"detail": [{"msg": "field required"}]}, True),
    (400, {"detail": "Request was cancelled", "error_type": "client_cancelled"}, True),
    (504, {"detail": "Request timed out", "error_type": "request_timeout"}, True),
    (503, {"detail": "x", "error_type": "runner_disconnected"}, True),
    (500, {"detail": "oops", "error_type": "internal_error"}, False),  # the endpoint's own hiccup
    (500, {"detail": "oops"}, False),
    (502, None, False),
    (401, {"detail": "auth"}, False),
    (429, {"detail": "slow down"}, False),
])
def test_fal_which_error_answers_are_the_requests_outcome(code, body, outcome):
    assert is_request_outcome(code, body) is outcome


# ------------------------------------------------------------------ kie


@pytest.mark.parametrize("state, mapped", [
    ("waiting", TaskState.RUNNING),
    ("queuing", TaskState.RUNNING),
    ("generating", TaskState.RUNNING),
    ("success", TaskState.SUCCEEDED),
    ("fail", TaskState.FAILED),
])
def test_kie_state_mapping(state, mapped):
    result = json.dumps({"resultUrls": ["https://tempfile.aiquickdraw.com/a.png"]})
    assert observation_from_record({"state": state, "resultJson": result, "failMsg": ""}, NO_SECRETS).state is mapped


@pytest.mark.parametrize("result_json", ["", "not json", "{}", json.dumps({"resultUrls": []}),
                                         json.dumps({"resultUrls": [3, "ftp://x/a.png"]})])
def test_a_kie_market_success_with_nothing_to_store_is_a_failure(result_json):
    """Charged for nothing otherwise: the job succeeded with no output."""
    seen = observation_from_record({"state": "success", "resultJson": result_json}, NO_SECRETS)
    assert (seen.state, seen.error, seen.output_urls) == (TaskState.FAILED, NO_OUTPUT, ())


def test_kie_success_reads_result_json():
    data = {"state": "success", "resultJson": json.dumps({"resultUrls": ["https://tempfile.aiquickdraw.com/a.png"]})}
    assert observation_from_record(data, NO_SECRETS).output_urls == ("https://tempfile.aiquickdraw.com/a.png",)
    assert result_urls({"resultUrls": ["https://x/1", 3]}) == ("https://x/1",)
    assert result_urls("not json") == ()


def test_kie_failure_reason():
    obs = observation_from_record({"state": "fail", "failCode": "501", "failMsg": "content policy"}, NO_SECRETS)
    assert obs.state is TaskState.FAILED and obs.error == "content policy"


@pytest.mark.parametrize("code, error", [
    (401, Rejected), (402, Rejected), (404, Rejected), (422, Rejected), (501, Rejected), (505, Rejected),
    (429, Transient), (455, Transient),
    # 500 and codes KIE does not document (400, 433...) may have created the task.
    (500, Uncertain), (400, Uncertain), (433, Uncertain), (None, Uncertain),
])
def test_kie_body_codes(code, error):
    with pytest.raises(error):
        submit_outcome({"code": code, "msg": "nope", "data": None}, NO_SECRETS)


def test_kie_success_code_gives_the_task_id():
    assert submit_outcome({"code": 200, "msg": "success", "data": {"taskId": "task_1"}}, NO_SECRETS) == "task_1"
    with pytest.raises(Uncertain):
        submit_outcome({"code": 200, "data": {}}, NO_SECRETS)


# ------------------------------------------------------------------ shared helpers


def test_mask_hides_secrets_and_query_strings():
    text = Secrets("r8_SECRETVALUE").mask("bad key r8_SECRETVALUE for https://api.x/cb?token=abc&z=1 ok")
    assert "r8_SECRETVALUE" not in text and "token=abc" not in text
    assert "https://api.x/cb" in text
    assert len(NO_SECRETS.mask("x" * 1000)) <= 200


def test_retry_after_seconds_and_dates():
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert retry_after_seconds("-5") == 0.0


def test_collect_urls_dedups_and_ignores_non_http():
    assert collect_urls(["https://a/1", "https://a/1", "ftp://a/2", "data:x", {"u": "http://b/3"}]) == (
        "https://a/1", "http://b/3")


@pytest.mark.parametrize("text", ["https://example.com is the answer", "https://a/1\n", "http://a/ b",
                                  "https://a/\tb", "https://a/\x00"])
def test_text_that_starts_like_a_url_is_text(text):
    """A model's answer beginning with a URL is not a file to fetch (as
    one, an unknown host failed the job output_refused, refunded)."""
    from app.providers.replicate import outputs_of
    assert collect_urls(text) == ()
    urls, values = outputs_of(text)
    assert urls == () and [v.content_type for v in values] == ["text/plain; charset=utf-8"]


def test_reason_shapes():
    assert NO_SECRETS.reason(None) is None and NO_SECRETS.reason("") is None
    assert NO_SECRETS.reason({"message": "m"}) == "m"
    assert NO_SECRETS.reason([{"msg": "a"}, {"msg": "b"}]) == "a; b"


@pytest.mark.parametrize("url, ok", [
    ("http://127.0.0.1:9000/fal/x", True),
    ("http://127.0.0.1:9001/fal/x", False),
    ("https://127.0.0.1:9000/fal/x", False),
    ("http://user:pw@127.0.0.1:9000/x", False),
    (None, False),
])
def test_same_origin(url, ok):
    assert same_origin(url, "http://127.0.0.1:9000/fal") is ok


# ------------------------------------------------------------------ wiring


async def test_build_providers_makes_all_four_without_leaking_secrets():
    settings = load_settings({
        "SECRET_KEY": "s" * 32, "SIM_URL": "http://127.0.0.1:8787", "REPLICATE_API_TOKEN": "r8_tokentoken",
        "FAL_KEY": "falkeyfalkey",
        "KIE_API_KEY": "kiekeykiekey", "REPLICATE_WEBHOOK_SECRET": "whsec_c2VjcmV0c2VjcmV0",
    }, require_database=False)
    providers = build_providers(settings, timeout_s=2.0)
    try:
        assert tuple(providers) == KNOWN_PROVIDERS
        for name, provider in providers.items():
            assert provider.name == name
            text = repr(provider) + repr(provider.facts)
            for secret in ("r8_tokentoken", "falkeyfalkey", "kiekeykiekey", "whsec_", "s" * 32):
                assert secret not in text
        assert providers["sim"].facts.idempotent_submit and not providers["sim"].facts.can_find
        assert providers["replicate"].facts.can_find and not providers["replicate"].facts.idempotent_submit
        assert "replicate.delivery" in providers["replicate"].facts.output_hosts
        assert ".fal.media" in providers["fal"].facts.output_hosts
    finally:
        await close_providers(providers)


def test_replicate_credentials_go_only_to_its_file_hosts():
    """Never the API's host: an output is the model's to choose
    (tests/outbox/test_replicate_outputs.py)."""
    from app.providers.replicate import ReplicateProvider

    provider = ReplicateProvider("https://api.replicate.com", "r8_secret")
    assert provider.download_credentials() == {"Authorization": "Bearer r8_secret"}
    assert set(provider.facts.credential_hosts) == {"replicate.delivery", ".replicate.delivery"}
    assert "r8_secret" not in repr(provider.facts)
    # The other adapters send nothing to any output host.
    from app.providers.fal import FalProvider
    from app.providers.kie import KieProvider
    fal = FalProvider("https://queue.fal.run", "k", jwks_url="https://rest.fal.ai/.well-known/jwks.json")
    assert fal.download_credentials() == {}
    assert KieProvider("https://api.kie.ai", "k", secret_keys=[b"x" * 32]).download_credentials() == {}


@pytest.mark.parametrize("headers", [{"retry-after-ms": "1500"}, {"retry-after-ms": "1500", "retry-after": "9"},
                                     {"retry-after": "9"}, {"retry-after-ms": "soon", "retry-after": "4"},
                                     {"retry-after-ms": "250.5"}, {}])
def test_a_sync_calls_wait_is_read_as_the_official_clients_read_it(headers):
    import anthropic
    import openai

    from app.providers.http import sync_retry_after
    for client in (openai.OpenAI(api_key="x"), anthropic.Anthropic(api_key="x")):
        assert sync_retry_after(headers) == client._parse_retry_after_header(httpx.Headers(headers))
