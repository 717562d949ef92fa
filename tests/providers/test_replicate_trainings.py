"""Replicate trainings in the adapter: a job's model `train:owner/name:version`
creates a training of that trainer version, pushing its new version to
`input.destination`.

Pure decisions first, as table tests over documented and recorded bodies:
- Replicate's OpenAPI document (the copy in repo tryAGI/Replicate,
  src/libs/Replicate/openapi.json, commit 6c8ab8e): trainings.create,
  trainings.get and trainings.list examples, schemas_training_request and
  schemas_training_response;
- answers recorded from the live API in repo replicate/replicate-python,
  tests/cassettes/ (commit 0110c2c): trainings-create.yaml,
  trainings-get.yaml, trainings-cancel.yaml;
- a succeeded training as the live API answered it, marked "recorded
  elsewhere" below, its `output.version` `owner/name:<64 hex>`, the form
  replicate 1.0.7's `_json_to_training` parses.
Then the adapter over real HTTP against the simulator's /replicate protocol,
and against a scripted Replicate on loopback for what the simulator cannot
show (the exact body and headers our submit sends; a recorded answer read
back; a list page whose `next` leaves the API's origin).
"""
from __future__ import annotations

import base64
import hashlib
import json
import secrets as pysecrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from app.providers.base import (
    JSON_CONTENT_TYPE,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
)
from app.providers.http import Secrets
from app.providers.replicate import (
    NO_TRAINING_OUTPUT,
    TRAINING_GIVE_UP_S,
    TRAINING_POLL_DELAYS_S,
    ReplicateProvider,
    TrainingRef,
    confirms_training,
    created_before,
    is_training,
    observation_from_prediction,
    observation_from_training,
    pushed_to,
    route_for_model,
    trained_by,
    training_body,
    training_outputs,
    training_ref,
)
from app.simulator import create_app, output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults, stats

TOKEN = "r8_trainings_test_token"
SECRETS = Secrets(TOKEN)
SDXL = "39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"
DOC_VERSION = "da77bc59ee60423279fd632efb4795ab731d9e3ca9705ef3341091fb989b7eaf"
SDXL_REF = TrainingRef("stability-ai", "sdxl", SDXL)
IMAGES = "https://replicate.delivery/pbxt/JMV5OrEWpBAC5gO8rre0tPOyJIOkaXvG0TWfVJ9b4zhLeEUY/data.zip"
REC_INPUT = {"input_images": IMAGES, "use_face_detection_instead": True}

# openapi.json, trainings.create: the create answer (its urls at /v1/predictions).
DOC_CREATED = {
    "id": "zz4ibbonubfz7carwiefibzgga", "model": "stability-ai/sdxl", "version": DOC_VERSION,
    "input": {"input_images": "https://example.com/my-input-images.zip"}, "logs": "", "error": None,
    "status": "starting", "created_at": "2023-09-08T16:32:56.990893084Z",
    "urls": {"web": "https://replicate.com/p/zz4ibbonubfz7carwiefibzgga",
             "get": "https://api.replicate.com/v1/predictions/zz4ibbonubfz7carwiefibzgga",
             "cancel": "https://api.replicate.com/v1/predictions/zz4ibbonubfz7carwiefibzgga/cancel"},
}
# openapi.json, trainings.get: the documented training, succeeded (its
# output's values are the document's own "..."; its trailing comma dropped).
DOC_SUCCEEDED = {
    "completed_at": "2023-09-08T16:41:19.826523Z", "created_at": "2023-09-08T16:32:57.018467Z", "error": None,
    "id": "zz4ibbonubfz7carwiefibzgga", "input": {"input_images": "https://example.com/my-input-images.zip"},
    "logs": "...", "metrics": {"predict_time": 502.713876}, "output": {"version": "...", "weights": "..."},
    "started_at": "2023-09-08T16:32:57.112647Z", "status": "succeeded",
    "urls": {"web": "https://replicate.com/p/zz4ibbonubfz7carwiefibzgga",
             "get": "https://api.replicate.com/v1/trainings/zz4ibbonubfz7carwiefibzgga",
             "cancel": "https://api.replicate.com/v1/trainings/zz4ibbonubfz7carwiefibzgga/cancel"},
    "model": "stability-ai/sdxl", "version": DOC_VERSION,
}
# replicate-python tests/cassettes/trainings-create.yaml: the 201.
REC_CREATED = {
    "id": "wj4is6lbdqqkdepnwpr6v2kuva", "model": "stability-ai/sdxl", "version": SDXL, "input": REC_INPUT,
    "logs": "", "error": None, "status": "starting", "created_at": "2023-08-16T19:33:26.678378653Z",
    "urls": {"cancel": "https://api.replicate.com/v1/predictions/wj4is6lbdqqkdepnwpr6v2kuva/cancel",
             "get": "https://api.replicate.com/v1/predictions/wj4is6lbdqqkdepnwpr6v2kuva"},
}
# replicate-python tests/cassettes/trainings-get.yaml: a training running.
REC_PROCESSING = {
    "completed_at": None, "created_at": "2023-08-16T19:33:26.906823Z", "error": None,
    "id": "medrnz3bm5dd6ultvad2tejrte", "input": REC_INPUT, "logs": None, "metrics": {}, "output": None,
    "started_at": "2023-08-16T19:33:42.114513Z", "status": "processing",
    "urls": {"get": "https://api.replicate.com/v1/trainings/medrnz3bm5dd6ultvad2tejrte",
             "cancel": "https://api.replicate.com/v1/trainings/medrnz3bm5dd6ultvad2tejrte/cancel"},
    "model": "stability-ai/sdxl", "version": SDXL, "webhook_completed": None,
}
# replicate-python tests/cassettes/trainings-cancel.yaml: the cancel's answer.
REC_CANCELED = {
    "completed_at": "2023-08-16T19:33:27.215203Z", "created_at": "2023-08-16T19:33:27.135361Z", "error": None,
    "id": "xxi2kydbnla3ocjp64sclkewku", "input": REC_INPUT, "logs": None, "metrics": {"predict_time": 3e-06},
    "output": None, "started_at": "2023-08-16T19:33:27.215200Z", "status": "canceled",
    "urls": {"get": "https://api.replicate.com/v1/predictions/xxi2kydbnla3ocjp64sclkewku",
             "cancel": "https://api.replicate.com/v1/predictions/xxi2kydbnla3ocjp64sclkewku/cancel"},
    "model": "stability-ai/sdxl", "version": SDXL, "webhook_completed": None,
}
# Recorded elsewhere: replicate-python has no recording of a finished
# training, so this is a third-party copy of a live answer (2024-12, found in
# the public code index, which names no repository for it; its owner renamed,
# its input trimmed). Two other live answers there (2024-10) have the same
# shapes: `output.version` `destination:<64 hex>`, `weights` on
# replicate.delivery, and the undocumented `data_removed`.
NEW_VERSION = "acme/shikhar_flux:925da5f563c07bb620a3bf3cc2185079b1cfc7d62f47a9c234e67dbc36eab738"
WEIGHTS = "https://replicate.delivery/xezq/nAhWcGRcC2acElRYzK0ukvw1ANLiE8TKfYdYGtHsVSRVa5fTA/trained_model.tar"
FLUX_TRAINER = "e440909d3512c31646ee2e0c7d6f6f4923224863a6a10c494606e79fb5844497"
LIVE_SUCCEEDED = {
    "completed_at": "2024-12-29T16:39:07.017584Z", "created_at": "2024-12-29T16:11:12.069000Z",
    "data_removed": False, "error": None, "id": "yhyxz6wh8nrme0cm2cqr2yxkqc",
    "input": {"steps": 1500, "input_images": "https://replicate.delivery/pbxt/x/pics.zip", "trigger_word": "TOK"},
    "logs": "", "metrics": {"predict_time": 1674.940257378, "total_time": 1674.948584},
    "output": {"version": NEW_VERSION, "weights": WEIGHTS},
    "started_at": "2024-12-29T16:11:12.077327Z", "status": "succeeded",
    "urls": {"get": "https://api.replicate.com/v1/trainings/yhyxz6wh8nrme0cm2cqr2yxkqc",
             "cancel": "https://api.replicate.com/v1/trainings/yhyxz6wh8nrme0cm2cqr2yxkqc/cancel"},
    "version": FLUX_TRAINER,
}


# ================================================================== pure

@pytest.mark.parametrize("model, ref", [
    (f"train:stability-ai/sdxl:{SDXL}", SDXL_REF),
    ("train:ostris/flux-dev-lora-trainer:e440909d", TrainingRef("ostris", "flux-dev-lora-trainer", "e440909d")),
    ("stability-ai/sdxl", None),
    (f"stability-ai/sdxl:{SDXL}", None),
    (SDXL, None),
    (None, None),
])
def test_training_ref(model, ref):
    assert training_ref(model) == ref


def test_the_create_path_is_the_trainer_versions_trainings():
    assert SDXL_REF.create_path == f"/v1/models/stability-ai/sdxl/versions/{SDXL}/trainings"


@pytest.mark.parametrize("model", [
    "train:", "train:a/b", "train:a/b:", "train::v", "train:a:v", "train:a/b/c:v", "train:../x:v", "train:a/b:v:w",
    "train:a b/c:v", "train:a/b:v?x",
])
def test_a_malformed_training_model_is_rejected_before_sending(model):
    with pytest.raises(Rejected):
        training_ref(model)


def test_a_training_model_is_no_prediction_model():
    with pytest.raises(Rejected):
        route_for_model(f"train:stability-ai/sdxl:{SDXL}")


def test_the_destination_leaves_the_input_for_the_body():
    job_input = {"destination": "acme/my-sdxl", **REC_INPUT}
    assert training_body(job_input) == {"destination": "acme/my-sdxl", "input": REC_INPUT}
    assert job_input["destination"] == "acme/my-sdxl"  # the job's own input is untouched


@pytest.mark.parametrize("job_input", [
    {}, {"destination": None}, {"destination": 3}, {"destination": ""}, {"destination": "acme"},
    {"destination": "acme/my-sdxl:abc"}, {"destination": "a/b/c"}, {"destination": "<invalid>"},
    {"destination": "acme/my sdxl"},
])
def test_a_missing_or_malformed_destination_is_rejected(job_input):
    with pytest.raises(Rejected) as caught:
        training_body({**job_input, "input_images": IMAGES})
    assert "input.destination" in str(caught.value) and "owner/name" in str(caught.value)


@pytest.mark.parametrize("task, training", [
    (Task("t", {"kind": "training"}, "acme/anything"), True),
    (Task("t", None, f"train:stability-ai/sdxl:{SDXL}"), True),
    (Task("t", {}, f"train:stability-ai/sdxl:{SDXL}"), True),
    (Task("t", None, "stability-ai/sdxl"), False),
    (Task("t", None, None), False),
    (Task("t", {"kind": "prediction"}, "stability-ai/sdxl"), False),
])
def test_is_training(task, training):
    assert is_training(task) is training


@pytest.mark.parametrize("output, destination", [
    ({"version": NEW_VERSION, "weights": WEIGHTS}, "acme/shikhar_flux"),
    ({"version": "..."}, None),  # the document's placeholder
    ({"version": "925da5f5"}, None),
    ({"version": "a/b/c:1"}, None),
    ({"weights": WEIGHTS}, None),
    (None, None),
    ("acme/x:1", None),
])
def test_pushed_to(output, destination):
    assert pushed_to(output) == destination


@pytest.mark.parametrize("body", [
    pytest.param(DOC_CREATED, id="doc-created"),
    pytest.param(REC_CREATED, id="recorded-created"),
    pytest.param(REC_PROCESSING, id="recorded-processing"),
])
def test_a_training_not_finished_is_running(body):
    assert observation_from_training(body, SECRETS).state is TaskState.RUNNING


def test_a_recorded_success_gives_the_weights_and_the_output_object():
    seen = observation_from_training(LIVE_SUCCEEDED, SECRETS)
    assert seen.state is TaskState.SUCCEEDED and seen.error is None
    assert seen.output_urls == (WEIGHTS,) and seen.url_labels == ("weights",)
    (value,) = seen.values
    assert (value.label, value.content_type) == ("output", JSON_CONTENT_TYPE)
    assert json.loads(value.data) == {"version": NEW_VERSION, "weights": WEIGHTS}


def test_the_documented_success_keeps_its_output_object():
    # The document's weights "..." is no URL: nothing to download, the object kept.
    seen = observation_from_training(DOC_SUCCEEDED, SECRETS)
    assert seen.state is TaskState.SUCCEEDED and seen.output_urls == () and seen.url_labels == ()
    assert [json.loads(v.data) for v in seen.values] == [{"version": "...", "weights": "..."}]


@pytest.mark.parametrize("output, urls, kept", [
    ({"version": NEW_VERSION, "weights": WEIGHTS}, (WEIGHTS,), True),
    ({"version": NEW_VERSION}, (), True),
    ({"weights": WEIGHTS}, (WEIGHTS,), True),
    ({"version": NEW_VERSION, "weights": 3}, (), True),
    ({"version": "", "weights": "not a url"}, (), False),
    ({}, (), False),
    (None, (), False),
    ([WEIGHTS], (), False),
    (WEIGHTS, (), False),
])
def test_training_outputs_of_every_shape(output, urls, kept):
    got_urls, values = training_outputs(output)
    assert got_urls == urls
    assert [json.loads(v.data) for v in values] == ([output] if kept else [])


@pytest.mark.parametrize("output", [None, {}, {"version": ""}])
def test_a_success_without_a_version_or_weights_is_a_failure_that_says_so(output):
    seen = observation_from_training({**LIVE_SUCCEEDED, "output": output}, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == NO_TRAINING_OUTPUT
    assert seen.output_urls == () and seen.values == ()


def test_a_success_whose_data_was_removed_says_so():
    seen = observation_from_training({**LIVE_SUCCEEDED, "data_removed": True, "output": None}, SECRETS)
    assert seen.state is TaskState.SUCCEEDED and seen.output_removed


def test_a_canceled_training_is_cancelled_and_aborted_one_stopped_at_a_deadline():
    canceled = observation_from_training(REC_CANCELED, SECRETS)
    assert canceled.state is TaskState.CANCELLED and not canceled.stopped_at_deadline
    # schemas_training_response's `aborted`: terminated before it started.
    aborted = observation_from_training({**DOC_CREATED, "status": "aborted"}, SECRETS)
    assert aborted.state is TaskState.CANCELLED and aborted.stopped_at_deadline


def test_a_failure_carries_its_error_without_the_token():
    failed = {**REC_PROCESSING, "status": "failed", "error": f"bad input_images (token {TOKEN})"}
    seen = observation_from_training(failed, SECRETS)
    assert seen.state is TaskState.FAILED and seen.error == "bad input_images (token [redacted])"
    assert observation_from_training({**failed, "error": None}, SECRETS).error == "the training failed"


@pytest.mark.parametrize("status", ["cancelled-ish", None, 3, ["succeeded"], {"s": 1}])
def test_an_unknown_status_is_asked_again(status):
    for read in (observation_from_training, observation_from_prediction):
        with pytest.raises(Transient):
            read({**REC_PROCESSING, "status": status}, SECRETS)
    with pytest.raises(Transient) as caught:
        observation_from_training({**REC_PROCESSING, "status": f"weird {TOKEN}"}, SECRETS)
    assert TOKEN not in str(caught.value)


SENT = {"destination": "acme/shikhar_flux", "input": LIVE_SUCCEEDED["input"]}
FLUX_REF = TrainingRef("ostris", "flux-dev-lora-trainer", FLUX_TRAINER)


@pytest.mark.parametrize("training, ours", [
    (LIVE_SUCCEEDED, True),
    ({**LIVE_SUCCEEDED, "output": None, "status": "processing"}, True),  # no destination shown yet
    ({**LIVE_SUCCEEDED, "output": {"version": "someone/else:1", "weights": WEIGHTS}}, False),
    ({**LIVE_SUCCEEDED, "version": SDXL}, False),
    ({**LIVE_SUCCEEDED, "input": {**LIVE_SUCCEEDED["input"], "steps": 1000}}, False),
    ({**LIVE_SUCCEEDED, "input": {**LIVE_SUCCEEDED["input"], "steps": 1500.0}}, True),  # one JSON number
    ({**LIVE_SUCCEEDED, "input": None}, False),  # removed: an old one matches nothing
    ({**LIVE_SUCCEEDED, "id": ""}, False),
    ("not an object", False),
])
def test_trained_by(training, ours):
    assert trained_by(training, FLUX_REF, SENT) is ours


@pytest.mark.parametrize("training, ours", [
    (LIVE_SUCCEEDED, True),
    ({**LIVE_SUCCEEDED, "input": None, "output": None}, True),  # removed: the URL's token vouches
    ({**LIVE_SUCCEEDED, "input": {"steps": 1}}, False),
    ({**LIVE_SUCCEEDED, "version": SDXL}, False),
    ({**LIVE_SUCCEEDED, "output": {"version": "someone/else:1"}}, False),
])
def test_confirms_training(training, ours):
    assert confirms_training(training, FLUX_REF, SENT) is ours


@pytest.mark.parametrize("item, before", [
    ({"created_at": "2024-12-29T16:11:12.069000Z"}, True),
    ({"created_at": "2024-12-29T16:11:14Z"}, False),
    ({"created_at": "2024-12-29T16:11:13+00:00"}, False),  # the moment itself is inside
    ({"created_at": "yesterday"}, False),
    ({}, False),
    ("x", False),
])
def test_created_before(item, before):
    assert created_before(item, datetime(2024, 12, 29, 16, 11, 13, tzinfo=UTC)) is before


def test_training_jobs_have_training_timings():
    adapter = ReplicateProvider("https://api.replicate.com", None)
    facts = adapter.facts_for(f"train:stability-ai/sdxl:{SDXL}")
    assert facts.poll_delays_s == TRAINING_POLL_DELAYS_S and facts.give_up_after_s == TRAINING_GIVE_UP_S
    assert facts.output_hosts == adapter.facts.output_hosts and facts.credential_hosts == adapter.facts.credential_hosts
    assert adapter.facts_for("stability-ai/sdxl") is adapter.facts


# ================================================================== over HTTP, against the simulator

PAGE_SIZE = 2
TRAINER = f"train:acme/trainer:{SDXL}"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    served = ServedApp(create_app(replicate_page_size=PAGE_SIZE, hold_s=2.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
async def adapter(simulator):
    clear_faults(simulator)
    provider = ReplicateProvider(f"{simulator}/replicate", TOKEN, timeout_s=1.0, find_max_pages=50)
    yield provider
    clear_faults(simulator)
    await provider.aclose()


def training_request(**input) -> SubmitRequest:
    job_id = "job_" + pysecrets.token_hex(12)
    return SubmitRequest(job_id=job_id, model=TRAINER,
                         input={"destination": "acme/my-model", "prompt": f"for {job_id}", **input},
                         callback_url=None, first_attempt_at=datetime.now(UTC))


def read_training(simulator: str, training_id: str) -> dict:
    response = httpx.get(f"{simulator}/replicate/v1/trainings/{training_id}", headers=AUTH, trust_env=False)
    response.raise_for_status()
    return response.json()


async def settled(adapter: ReplicateProvider, task: Task):
    deadline = time.monotonic() + 10
    while (seen := await adapter.status(task)).state is TaskState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return seen


async def test_submit_status_success_with_the_weights_and_the_new_version(adapter, simulator):
    request = training_request(duration_s=0.2, output_bytes=2048)
    submitted = await adapter.submit(request, request.job_id)
    assert submitted.operation == {"kind": "training"}
    made = read_training(simulator, submitted.task_id)
    # The destination went in the body; the input the trainer gets is the rest.
    assert made["input"] == {"prompt": request.input["prompt"], "duration_s": 0.2, "output_bytes": 2048}
    assert (made["model"], made["version"]) == ("acme/trainer", SDXL)
    seen = await settled(adapter, Task(submitted.task_id, submitted.operation, request.model))
    assert seen.state is TaskState.SUCCEEDED and seen.url_labels == ("weights",)
    (weights,) = seen.output_urls
    body = httpx.get(weights, trust_env=False).content
    assert hashlib.sha256(body).hexdigest() == output_sha256(submitted.task_id, 0, 2048)
    (output,) = seen.values
    assert output.label == "output" and json.loads(output.data) == read_training(simulator, submitted.task_id)["output"]
    assert json.loads(output.data)["version"].startswith("acme/my-model:")


async def test_a_task_saved_without_its_operation_is_read_as_a_training_by_its_model(adapter):
    request = training_request(duration_s=0)
    submitted = await adapter.submit(request, request.job_id)
    seen = await settled(adapter, Task(submitted.task_id, None, request.model))
    assert seen.state is TaskState.SUCCEEDED and seen.url_labels == ("weights",)


async def test_a_failed_training_is_failed_with_its_error(adapter):
    request = training_request(duration_s=0.1, outcome="failed")
    submitted = await adapter.submit(request, request.job_id)
    seen = await settled(adapter, Task(submitted.task_id, submitted.operation, request.model))
    assert seen.state is TaskState.FAILED and seen.error and seen.output_urls == ()


async def test_a_training_that_pushed_nothing_fails(adapter):
    request = training_request(duration_s=0, outputs=0)
    submitted = await adapter.submit(request, request.job_id)
    seen = await settled(adapter, Task(submitted.task_id, submitted.operation, request.model))
    assert (seen.state, seen.error) == (TaskState.FAILED, NO_TRAINING_OUTPUT)


async def test_cancel_stops_the_training(adapter, simulator):
    request = training_request(duration_s=30)
    submitted = await adapter.submit(request, request.job_id)
    await adapter.cancel(Task(submitted.task_id, submitted.operation, request.model))
    assert read_training(simulator, submitted.task_id)["status"] == "canceled"
    seen = await adapter.status(Task(submitted.task_id, submitted.operation, request.model))
    assert seen.state is TaskState.CANCELLED and not seen.stopped_at_deadline
    await adapter.cancel(Task("nosuchtraining", {"kind": "training"}, request.model))  # nothing to cancel


async def test_a_missing_destination_is_rejected_and_nothing_is_made(adapter, simulator):
    before = stats(simulator)["tasks_created"]
    for job_input in ({"input_images": IMAGES}, {"destination": "no-slash"}):
        with pytest.raises(Rejected):
            await adapter.submit(SubmitRequest("job_x", TRAINER, job_input, None), "job_x")
    with pytest.raises(Rejected):
        await adapter.submit(SubmitRequest("job_x", "train:acme/trainer", {"destination": "a/b"}, None), "job_x")
    assert stats(simulator)["tasks_created"] == before


async def test_a_throttle_is_try_later_with_its_retry_after(adapter, simulator):
    request = training_request(duration_s=30)
    submitted = await adapter.submit(request, request.job_id)
    set_faults(simulator, throttle=1)
    with pytest.raises(Transient) as on_submit:
        await adapter.submit(training_request(), "k")
    with pytest.raises(Transient) as on_status:
        await adapter.status(Task(submitted.task_id, submitted.operation, request.model))
    assert on_submit.value.retry_after == 1 and on_status.value.retry_after == 1
    assert TOKEN not in str(on_submit.value) and TOKEN not in str(on_status.value)


async def test_an_in_doubt_create_is_found_by_version_destination_and_input(adapter, simulator):
    """The create is made and its answer lost; the look-up pages through the
    trainings newest first and finds exactly it, not its neighbours (other
    input, another trainer version)."""
    request = training_request(duration_s=0.3)
    body = training_body(request.input)

    def make(version: str, destination: str, input: dict) -> str:
        response = httpx.post(f"{simulator}/replicate/v1/models/acme/trainer/versions/{version}/trainings",
                              json={"destination": destination, "input": input}, headers=AUTH, trust_env=False)
        return response.raise_for_status().json()["id"]

    make(SDXL, "acme/my-model", {**body["input"], "prompt": "not ours"})
    make("0" * 64, "acme/my-model", body["input"])
    before = stats(simulator)["tasks_created"]
    set_faults(simulator, submit_timeout_after_create=1)
    with pytest.raises(Uncertain):
        await adapter.submit(request, request.job_id)
    clear_faults(simulator)
    assert stats(simulator)["tasks_created"] == before + 1
    (found,) = await adapter.find_candidates(request)
    assert found.operation == {"kind": "training"}
    assert read_training(simulator, found.task_id)["input"] == body["input"]
    assert await adapter.find(request) == found
    seen = await settled(adapter, Task(found.task_id, found.operation, request.model))
    assert seen.state is TaskState.SUCCEEDED and len(seen.output_urls) == 1
    assert stats(simulator)["tasks_created"] == before + 1  # looking it up made nothing


async def test_another_destination_is_told_apart_once_finished(adapter, simulator):
    """The same trainer and input, pushed elsewhere: only a finished
    training's output shows its destination."""
    request = training_request(duration_s=0)
    body = training_body(request.input)
    theirs = httpx.post(f"{simulator}/replicate/v1/models/acme/trainer/versions/{SDXL}/trainings",
                        json={"destination": "acme/other-model", "input": body["input"]}, headers=AUTH,
                        trust_env=False).json()["id"]
    ours = (await adapter.submit(request, request.job_id)).task_id
    time.sleep(0.05)
    assert {c.task_id for c in await adapter.find_candidates(request)} == {ours}
    assert theirs != ours


async def test_the_look_up_stops_at_the_window_and_reads_no_further(adapter, simulator):
    """Pages of 2: trainings made before the window are never matched, and
    the walk stops at the first page that reaches back past it."""
    request = training_request(duration_s=30)
    old = [(await adapter.submit(request, request.job_id)).task_id for _ in range(3)]
    later = SubmitRequest(request.job_id, request.model, request.input, None,
                          first_attempt_at=datetime.now(UTC) + timedelta(seconds=61))
    status_before = stats(simulator)["status_calls"]
    assert await adapter.find_candidates(later) == ()
    assert {c.task_id for c in await adapter.find_candidates(request)} == set(old)  # several: ambiguous
    assert await adapter.find(request) is None
    assert stats(simulator)["status_calls"] == status_before  # lists are no status reads
    for task_id in old:
        await adapter.cancel(Task(task_id, {"kind": "training"}, request.model))


async def test_a_window_longer_than_the_pages_read_finds_nothing(simulator):
    provider = ReplicateProvider(f"{simulator}/replicate", TOKEN, find_max_pages=1)
    try:
        request = training_request(duration_s=30)
        made = [(await provider.submit(request, request.job_id)).task_id for _ in range(3)]
        # Three in the window, two per page, one page read: a match on a page
        # not read could make any other ambiguous.
        assert await provider.find_candidates(request) == ()
        for task_id in made:
            await provider.cancel(Task(task_id, {"kind": "training"}, request.model))
    finally:
        await provider.aclose()


async def test_a_webhook_named_training_is_confirmed_by_reading_the_training(adapter, simulator, receiver):
    secret = httpx.get(f"{simulator}/replicate/v1/webhooks/default/secret", headers=AUTH,
                       trust_env=False).json()["key"]
    request = training_request(duration_s=0.1)
    request = SubmitRequest(request.job_id, request.model, request.input,
                            f"{receiver.url}/webhooks/replicate/{request.job_id}?token=capability")
    submitted = await adapter.submit(request, request.job_id)
    arrival = await receiver.wait_for(f"/webhooks/replicate/{request.job_id}")
    webhook = WebhookRequest(job_id=request.job_id, headers=arrival.headers, query=arrival.query,
                             raw_body=arrival.body)
    fetching = ReplicateProvider(f"{simulator}/replicate", TOKEN)  # the account secret, fetched
    configured = ReplicateProvider(f"{simulator}/replicate", TOKEN, webhook_secret=secret)
    another = ReplicateProvider(f"{simulator}/replicate", TOKEN,
                                webhook_secret="whsec_" + base64.b64encode(bytes(32)).decode())
    try:
        assert await fetching.verify(webhook) and await configured.verify(webhook)
        assert not await another.verify(webhook)
    finally:
        for provider in (fetching, configured, another):
            await provider.aclose()
    assert adapter.webhook_task_id(webhook) == submitted.task_id
    assert await adapter.confirm_task(submitted.task_id, request) == Submitted(submitted.task_id,
                                                                               {"kind": "training"})
    # Another job's input, a prediction's id, an unknown id: not this job's.
    other = SubmitRequest("job_o", TRAINER, {**request.input, "prompt": "other"}, None)
    assert await adapter.confirm_task(submitted.task_id, other) is None
    prediction = httpx.post(f"{simulator}/replicate/v1/predictions",
                            json={"version": SDXL, "input": training_body(request.input)["input"]},
                            headers=AUTH, trust_env=False).json()["id"]
    assert await adapter.confirm_task(prediction, request) is None
    assert await adapter.confirm_task("nosuchtraining", request) is None
    assert await adapter.confirm_task(submitted.task_id, SubmitRequest("j", TRAINER, {}, None)) is None


# ================================================================== what our submit sends

async def test_the_submit_body_and_headers(script):
    """A scripted Replicate records the create: the trainer's path, the
    destination in the body, the webhook for `completed` only, and no
    Cancel-After even with a deadline (it is documented for predictions)."""
    script.answer(201, REC_CREATED)
    provider = ReplicateProvider(script.url, TOKEN)
    try:
        request = SubmitRequest("job_1", f"train:stability-ai/sdxl:{SDXL}",
                                {"destination": "acme/my-sdxl", **REC_INPUT},
                                "https://longcall.example/webhooks/replicate/job_1?token=t0k3n",
                                deadline_at=datetime.now(UTC) + timedelta(hours=1))
        submitted = await provider.submit(request, "job_1")
        # The create answer's urls point at /v1/predictions: not followed.
        assert submitted == Submitted("wj4is6lbdqqkdepnwpr6v2kuva", {"kind": "training"})
        (seen,) = script.seen
        assert (seen.method, seen.path) == ("POST", f"/v1/models/stability-ai/sdxl/versions/{SDXL}/trainings")
        assert json.loads(seen.body) == {"destination": "acme/my-sdxl", "input": REC_INPUT,
                                         "webhook": request.callback_url, "webhook_events_filter": ["completed"]}
        assert "cancel-after" not in seen.headers and seen.headers["authorization"] == f"Bearer {TOKEN}"
        script.answer(200, REC_PROCESSING)
        await provider.status(Task(submitted.task_id, submitted.operation, request.model))
        await provider.cancel(Task(submitted.task_id, submitted.operation, request.model))
        assert [(s.method, s.path) for s in script.seen[1:]] == [
            ("GET", "/v1/trainings/wj4is6lbdqqkdepnwpr6v2kuva"),
            ("POST", "/v1/trainings/wj4is6lbdqqkdepnwpr6v2kuva/cancel")]
    finally:
        await provider.aclose()


async def test_a_submit_answer_without_an_id_is_in_doubt(script):
    script.answer(201, {**REC_CREATED, "id": None})
    provider = ReplicateProvider(script.url, TOKEN)
    try:
        with pytest.raises(Uncertain) as caught:
            await provider.submit(SubmitRequest("j", TRAINER, {"destination": "a/b"}, None), "j")
        assert "training id" in str(caught.value)
    finally:
        await provider.aclose()


async def test_the_look_up_of_an_unfiltered_list_sends_no_filter(script):
    """GET /v1/trainings documents no query parameter: none is sent, the
    window is read off each training's `created_at`, and a `next` off the
    API's origin is not followed (the token would go with it)."""
    now = datetime.now(UTC)
    ours_input = {"prompt": "p"}
    page = {"previous": None, "next": "https://elsewhere.example/v1/trainings?cursor=x",
            "results": [{**REC_CREATED, "id": "t1", "version": SDXL, "input": ours_input,
                         "created_at": now.isoformat()}]}
    script.answer(200, page)
    provider = ReplicateProvider(script.url, TOKEN)
    try:
        request = SubmitRequest("j", f"train:stability-ai/sdxl:{SDXL}", {"destination": "a/b", **ours_input}, None,
                                first_attempt_at=now)
        assert await provider.find_candidates(request) == ()  # the next page is not ours to read
        assert [(s.path, s.query) for s in script.seen] == [("/v1/trainings", {})]
        script.answer(200, {**page, "next": None})
        assert await provider.find_candidates(request) == (Submitted("t1", {"kind": "training"}),)
        old = {**page, "results": page["results"] + [{**REC_CREATED, "created_at": "2023-08-16T19:33:26Z"}]}
        script.seen.clear()
        script.answer(200, old)  # reaches back past the window: its `next` is not read
        assert await provider.find_candidates(request) == (Submitted("t1", {"kind": "training"}),)
        assert len(script.seen) == 1
    finally:
        await provider.aclose()
