"""KIE's Market API as KIE's own documentation shows it: each body here is
written from the documented field lists and examples, and must mean to the
adapter what KIE says it means. Pure: the adapter's parsing functions only.

Sources (docs.kie.ai):
- createTask: any Market model page, e.g. /market/seedream/4.5-edit, and its
  response code table (200, 401, 402, 404, 422, 429, 455, 500, 501, 505);
- recordInfo: /market/common/get-task-detail (`message` envelope on the
  current page, `msg` in an older rendering; states waiting, queuing,
  generating, success, fail; `param` and `resultJson` JSON strings; times
  in epoch milliseconds; `failCode` "" when none).
"""
from __future__ import annotations

import json

import pytest

from app.providers.base import Rejected, TaskState, Transient, Uncertain
from app.providers.http import Secrets
from app.providers.kie import record_outcome, submit_outcome

API_KEY = "kie-docs-api-key"
SECRETS = Secrets(API_KEY)

# ------------------------------------------------------------------ createTask

CREATE_SUCCESS = {"code": 200, "msg": "success", "data": {"taskId": "task_seedream_1765172101886"}}


def test_a_documented_create_answer_gives_its_task_id():
    assert submit_outcome(CREATE_SUCCESS, SECRETS) == "task_seedream_1765172101886"


# The code table, each with its documented name as the `msg`, and what the
# answer says about the task: a definite no (Rejected: the job fails,
# uncharged), a "not now" (Transient: nothing was taken, ask again later),
# or no statement (Uncertain: the task may exist, so it is never re-sent).
@pytest.mark.parametrize("code, msg, error", [
    (401, "Unauthorized", Rejected),
    (402, "Insufficient Credits", Rejected),
    (404, "Not Found", Rejected),
    (422, "Validation Error", Rejected),
    (429, "Rate Limited", Transient),
    (455, "Service Unavailable", Transient),  # "undergoing maintenance"
    # An unexpected server error does not say whether the task was created.
    (500, "Server Error", Uncertain),
    # At submit, "generation failed" is KIE's last word on this request: the job fails.
    (501, "Generation Failed", Rejected),
    (505, "Feature Disabled", Rejected),
])
def test_every_documented_create_code(code, msg, error):
    with pytest.raises(error) as caught:
        submit_outcome({"code": code, "msg": msg, "data": None}, SECRETS)
    assert f"code {code}" in str(caught.value) and str(caught.value).endswith(f": {msg}")


def test_a_create_answer_never_repeats_the_key():
    with pytest.raises(Rejected) as caught:
        submit_outcome({"code": 401, "msg": f"bad key Bearer {API_KEY}", "data": None}, SECRETS)
    assert API_KEY not in str(caught.value)


# ------------------------------------------------------------------ recordInfo

CREATE_TIME = 1698765400000
COMPLETE_TIME = 1698765432000
PARAM = json.dumps({
    "model": "grok-imagine/text-to-image",
    "callBackUrl": "https://your-domain.com/api/callback",
    "input": {"prompt": "Cinematic portrait...", "aspect_ratio": "3:2"},
})
RESULT_URL = "https://tempfile.aiquickdraw.com/generated-content.jpg"


def record(state: str, *, envelope: str = "message", **fields) -> dict:
    """A Get Task Details answer as the page shows it, in `state`; a task
    not yet finished has no result, no completeTime."""
    done = state in ("success", "fail")
    data = {
        "taskId": "task_12345678",
        "model": "grok-imagine/text-to-image",
        "state": state,
        "param": PARAM,
        "resultJson": json.dumps({"resultUrls": [RESULT_URL]}) if state == "success" else "",
        "failCode": "",
        "failMsg": "",
        "completeTime": COMPLETE_TIME if done else None,
        "createTime": CREATE_TIME,
        "updateTime": COMPLETE_TIME if done else CREATE_TIME,
        **fields,
    }
    return {"code": 200, envelope: "success", "data": data}


@pytest.mark.parametrize("envelope", ["message", "msg"])
@pytest.mark.parametrize("state", ["waiting", "queuing", "generating"])
def test_a_task_not_finished_is_running(state, envelope):
    seen = record_outcome(record(state, envelope=envelope), SECRETS)
    assert seen.state is TaskState.RUNNING and seen.output_urls == () and seen.error is None


@pytest.mark.parametrize("envelope", ["message", "msg"])
def test_the_documented_success(envelope):
    body = record("success", envelope=envelope)
    assert body["data"]["resultJson"] == '{"resultUrls": ["' + RESULT_URL + '"]}'  # a string, as documented
    seen = record_outcome(body, SECRETS)
    assert seen.state is TaskState.SUCCEEDED
    assert seen.output_urls == (RESULT_URL,)
    assert seen.cost is None  # KIE reports no cost here


def test_a_success_with_several_results_keeps_their_order():
    urls = [f"https://tempfile.aiquickdraw.com/{n}.png" for n in range(3)]
    seen = record_outcome(record("success", resultJson=json.dumps({"resultUrls": urls})), SECRETS)
    assert seen.output_urls == tuple(urls)


@pytest.mark.parametrize("envelope", ["message", "msg"])
def test_the_documented_failure(envelope):
    body = record("fail", envelope=envelope, failCode="500", failMsg="Internal server error, please try again")
    seen = record_outcome(body, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "Internal server error, please try again"
    assert seen.output_urls == ()


def test_a_failure_with_only_a_code_or_nothing_still_says_it_failed():
    assert record_outcome(record("fail", failCode="422"), SECRETS).error == "422"
    assert record_outcome(record("fail"), SECRETS).error == "the task failed"


def test_a_failure_message_never_repeats_the_key():
    seen = record_outcome(record("fail", failMsg=f"rejected for key {API_KEY}"), SECRETS)
    assert seen.state is TaskState.FAILED and API_KEY not in (seen.error or "")


@pytest.mark.parametrize("envelope", ["message", "msg"])
def test_code_404_is_no_such_task(envelope):
    with pytest.raises(Rejected, match="no such task"):
        record_outcome({"code": 404, envelope: "Task not found", "data": None}, SECRETS)


def test_code_501_is_a_failed_generation():
    # Get Task Details' table: 501 "Generation failed - check failMsg".
    body = record("fail", failCode="501", failMsg="content policy violation")
    seen = record_outcome({**body, "code": 501, "message": "Generation failed"}, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "content policy violation"
    seen = record_outcome({"code": 501, "message": "Generation failed", "data": None}, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "Generation failed"


def test_code_422_on_a_read_is_a_failed_task():
    # Get Task Details' table: 422 "Validation error in the original request"
    # with "check failMsg": the task failed (as a read to try again it would
    # now wait for the job's deadline).
    seen = record_outcome({**record("fail", failMsg="prompt too long"), "code": 422}, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "prompt too long"
    seen = record_outcome({"code": 422, "message": "Validation error in the original request", "data": None},
                          SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "Validation error in the original request"


@pytest.mark.parametrize("code, message", [
    (401, "Unauthorized"),
    (429, "Rate Limited"),
    (455, "Service Unavailable"),
    (500, "Internal server error"),
])
def test_other_read_codes_are_a_read_to_try_again(code, message):
    with pytest.raises(Transient) as caught:
        record_outcome({"code": code, "message": message, "data": None}, SECRETS)
    assert message in str(caught.value)


def test_a_state_kie_does_not_document_is_not_guessed():
    with pytest.raises(Transient, match="unknown task state"):
        record_outcome(record("processing"), SECRETS)


@pytest.mark.parametrize("code, msg, error", [
    # Codes the families' pages add to the table (/suno-api/generate-music, /runway-api/generate-ai-video).
    (409, "Conflict", Rejected),
    (451, "Failed to fetch the image", Rejected),
    (430, "Your call frequency is too high. Please try again later.", Transient),
])
def test_the_families_codes_mean_the_same_at_the_market(code, msg, error):
    with pytest.raises(error, match=f"code {code}"):
        submit_outcome({"code": code, "msg": msg, "data": None}, SECRETS)
