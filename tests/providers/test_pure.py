"""The adapters' pure decisions: status mapping, URL collection, model
routing, KIE body codes, message scrubbing. No I/O."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from app.config import load_settings
from app.providers import KNOWN_PROVIDERS, build_providers, close_providers
from app.providers.base import Rejected, TaskState, Transient, Uncertain
from app.providers.fal import app_id, documented_urls, is_request_outcome, operation_urls, result_observation
from app.providers.http import NO_SECRETS, Secrets, collect_urls, retry_after_seconds, same_origin
from app.providers.kie import observation_from_record, result_urls, submit_outcome, with_token
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
    assert obs.output_urls == ("http://h/o/1",)
    assert obs.cost == 7 and obs.error is None


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


@pytest.mark.parametrize("output, urls", [
    ("https://replicate.delivery/a.png", ("https://replicate.delivery/a.png",)),
    (["https://r.delivery/1.png", "https://r.delivery/2.png"], ("https://r.delivery/1.png", "https://r.delivery/2.png")),
    ({"video": "https://r.delivery/v.mp4", "frames": [["https://r.delivery/f.png"]], "seed": 3},
     ("https://r.delivery/v.mp4", "https://r.delivery/f.png")),
    ("hello Alice", ()),
    (None, ()),
])
def test_replicate_collects_url_strings_from_any_output_shape(output, urls):
    obs = observation_from_prediction({"status": "succeeded", "output": output}, NO_SECRETS)
    assert obs.output_urls == urls and obs.cost is None


def test_replicate_failure_reason():
    obs = observation_from_prediction({"status": "failed", "error": "CUDA out of memory"}, NO_SECRETS)
    assert obs.state is TaskState.FAILED and obs.error == "CUDA out of memory"


# ------------------------------------------------------------------ fal


@pytest.mark.parametrize("model, app", [
    ("fal-ai/fast-sdxl", "fal-ai/fast-sdxl"),
    ("fal-ai/flux/dev", "fal-ai/flux"),
    ("fal-ai/kling-video/v2/master/text-to-video", "fal-ai/kling-video"),
])
def test_fal_status_urls_drop_the_subpath(model, app):
    assert app_id(model) == app
    urls = documented_urls("https://queue.fal.run", model, "req-1")
    assert urls == {
        "status_url": f"https://queue.fal.run/{app}/requests/req-1/status",
        "response_url": f"https://queue.fal.run/{app}/requests/req-1",
        "cancel_url": f"https://queue.fal.run/{app}/requests/req-1/cancel",
    }


@pytest.mark.parametrize("model", ["", "/x", "a/../b", "a//b", "a/b?c", "a/b#c", "http://evil/x"])
def test_fal_bad_model_is_rejected(model):
    with pytest.raises(Rejected):
        app_id(model)


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
    assert observation_from_record({"state": state, "resultJson": "", "failMsg": ""}, NO_SECRETS).state is mapped


def test_kie_success_reads_result_json():
    data = {"state": "success", "resultJson": json.dumps({"resultUrls": ["https://tempfile.aiquickdraw.com/a.png"]})}
    assert observation_from_record(data, NO_SECRETS).output_urls == ("https://tempfile.aiquickdraw.com/a.png",)
    assert result_urls({"resultUrls": ["https://x/1", 3]}) == ("https://x/1",)
    assert result_urls("not json") == ()


def test_kie_failure_reason():
    obs = observation_from_record({"state": "fail", "failCode": "501", "failMsg": "content policy"}, NO_SECRETS)
    assert obs.state is TaskState.FAILED and obs.error == "content policy"


@pytest.mark.parametrize("code, error", [
    (400, Rejected), (401, Rejected), (402, Rejected), (422, Rejected), (505, Rejected),
    (429, Transient), (455, Transient),
    (500, Uncertain), (501, Uncertain), (None, Uncertain),
])
def test_kie_body_codes(code, error):
    with pytest.raises(error):
        submit_outcome({"code": code, "msg": "nope", "data": None}, NO_SECRETS)


def test_kie_success_code_gives_the_task_id():
    assert submit_outcome({"code": 200, "msg": "success", "data": {"taskId": "task_1"}}, NO_SECRETS) == "task_1"
    with pytest.raises(Uncertain):
        submit_outcome({"code": 200, "data": {}}, NO_SECRETS)


def test_kie_token_joins_the_callback_url():
    assert with_token("https://a/webhooks/kie/job_1", "t0k") == "https://a/webhooks/kie/job_1?token=t0k"
    assert with_token("https://a/x?y=1", "t0k") == "https://a/x?y=1&token=t0k"


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
