"""Replicate's own Python client (replicate 1.x) against the simulator's
/replicate protocol: every answer the simulator gives must parse in the
client's own types (pydantic models: required fields, `status` literals,
`urls` as strings only). The client is only a reference here; longcall
never submits with it.

`Client(base_url=...)` takes the base without `/v1`: the client adds it.
The simulator serves plain http on loopback, so the client leaves its
output URLs as strings (it wraps only https: and data: URLs in FileOutput).

`run` is driven with an `owner/name` ref only: with `owner/name:version`
it also reads `GET /v1/models/{owner}/{name}/versions/{id}`, which the
simulator does not serve."""
from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
import replicate
from replicate.pagination import Page
from replicate.prediction import Prediction
from replicate.training import Training

from app.providers.base import SubmitRequest, Task, TaskState, Uncertain
from app.providers.replicate import ReplicateProvider
from app.simulator import output_sha256
from tests.simulator.helpers import ServedApp
from tests.support.simulator import clear_faults, set_faults, stats

TOKEN = "r8_reference_token"
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
PAGE_SIZE = 3


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    # A small page, so the list's pages are walked with a few predictions;
    # a short hold, so a lost create answer is dropped soon.
    from app.simulator import create_app

    served = ServedApp(create_app(replicate_page_size=PAGE_SIZE, hold_s=2.0)).start()
    yield served.url
    served.stop()


@pytest.fixture
def client(simulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[replicate.Client]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "REPLICATE_API_TOKEN", "REPLICATE_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REPLICATE_POLL_INTERVAL", "0.05")  # read by Client() for wait() and run()
    clear_faults(simulator)
    yield replicate.Client(api_token=TOKEN, base_url=f"{simulator}/replicate")
    clear_faults(simulator)


def wait(client: replicate.Client, prediction: Prediction) -> Prediction:
    prediction.wait()  # polls GET /v1/predictions/{id}, each answer parsed as a Prediction
    return prediction


def test_create_by_version_get_and_wait(client, simulator):
    prediction = client.predictions.create(version=VERSION, input={"duration_s": 0.2, "output_bytes": 512})
    assert isinstance(prediction, Prediction)
    assert prediction.status == "starting" and prediction.version == VERSION
    assert prediction.input == {"duration_s": 0.2, "output_bytes": 512}
    assert set(prediction.urls) == {"web", "get", "cancel"}
    again = client.predictions.get(prediction.id)
    assert again.id == prediction.id and again.status in ("starting", "processing", "succeeded")
    done = wait(client, prediction)
    assert done.status == "succeeded" and done.completed_at and done.started_at
    assert done.metrics and done.metrics["predict_time"] >= 0
    (url,) = done.output
    assert isinstance(url, str) and url.startswith(simulator)
    body = httpx.get(url, trust_env=False).content
    assert hashlib.sha256(body).hexdigest() == output_sha256(done.id, 0, 512)


def test_create_by_model_and_output_text(client):
    prediction = client.models.predictions.create(model="acme/writer",
                                                  input={"duration_s": 0.1, "output_text": "hello Alice"})
    assert prediction.model == "acme/writer" and len(prediction.version) == 64
    assert wait(client, prediction).output == "hello Alice"


def test_a_failed_prediction_has_its_error(client):
    prediction = client.predictions.create(version=VERSION, input={"duration_s": 0.1, "outcome": "failed"})
    done = wait(client, prediction)
    assert done.status == "failed" and isinstance(done.error, str) and done.error


def test_cancel(client):
    prediction = client.predictions.create(version=VERSION, input={"duration_s": 30})
    client.predictions.cancel(prediction.id)
    canceled = client.predictions.get(prediction.id)
    assert canceled.status == "canceled" and canceled.completed_at
    prediction.reload()
    assert prediction.status == "canceled"
    # Prediction.cancel() parses the answer into the prediction itself
    other = client.predictions.create(version=VERSION, input={"duration_s": 30})
    other.cancel()
    assert other.status == "canceled"


def test_list_walks_every_page_newest_first(client):
    tag = secrets.token_hex(4)
    made = [client.predictions.create(version=VERSION, input={"duration_s": 30, "tag": tag}).id for _ in range(7)]
    page = client.predictions.list()
    assert isinstance(page, Page) and page.previous is None and len(page.results) == PAGE_SIZE
    listed: list[str] = []
    while True:
        assert all(isinstance(p, Prediction) for p in page.results)
        listed += [p.id for p in page.results if p.input.get("tag") == tag]
        if page.next is None:
            break
        page = client.predictions.list(page.next)
    assert listed == made[::-1]
    for prediction_id in made:
        client.predictions.cancel(prediction_id)


def test_run_polls_until_done(client, simulator):
    output = client.run("acme/painter", input={"duration_s": 0.3, "outputs": 2, "output_bytes": 256})
    assert isinstance(output, list) and len(output) == 2
    assert all(isinstance(url, str) and url.startswith(simulator) for url in output)
    assert client.run("acme/writer", input={"duration_s": 0.1, "output_text": "a poem"}) == "a poem"
    with pytest.raises(replicate.exceptions.ModelError):
        client.run("acme/painter", input={"duration_s": 0.1, "outcome": "failed"})


def test_errors_are_replicate_errors(client, simulator):
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        client.predictions.get("nosuchprediction")
    assert caught.value.status == 404
    stranger = replicate.Client(api_token="", base_url=f"{simulator}/replicate")
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        stranger.predictions.list()
    assert caught.value.status == 401


def test_a_blocking_create_answers_the_finished_prediction(client):
    # wait=n sends `Prefer: wait=n`: the simulator holds the answer until the end.
    prediction = client.predictions.create(version=VERSION, input={"duration_s": 0.2, "output_text": "done"},
                                           wait=5)
    assert prediction.status == "succeeded" and prediction.output == "done"


def test_a_throttled_create_is_the_documented_429(client, simulator):
    before = stats(simulator)["tasks_created"]
    set_faults(simulator, throttle=1)
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        client.predictions.create(version=VERSION, input={"duration_s": 1})  # POST: the client never retries it
    assert caught.value.status == 429 and caught.value.detail.startswith("Request was throttled.")
    assert stats(simulator)["tasks_created"] == before


async def test_our_adapter_reads_a_throttle_as_try_later(simulator):
    from app.providers.base import Transient

    set_faults(simulator, throttle=1)
    provider = ReplicateProvider(f"{simulator}/replicate", TOKEN, webhook_secret="whsec_" + "A" * 32)
    try:
        with pytest.raises(Transient) as caught:
            await provider.submit(SubmitRequest(job_id="job_t", model="acme/m", input={}, callback_url=None), "k")
        assert caught.value.retry_after == 1
    finally:
        clear_faults(simulator)
        await provider.aclose()


# ------------------------------------------------------------------ a lost create answer, found again


async def test_an_in_doubt_submit_is_found_by_model_and_input(client, simulator):
    """The create is made and its answer lost; our adapter lists the
    predictions made since the first call for the same model and input, and
    finds exactly the one: it runs and succeeds, and it is the only one."""
    # Pages of 3 here (Replicate's are 100): enough of them to reach the end.
    adapter = ReplicateProvider(f"{simulator}/replicate", TOKEN, timeout_s=1.0, find_max_pages=100)
    try:
        job_id = "job_" + secrets.token_hex(12)
        same = {"duration_s": 0.3, "prompt": f"for {job_id}"}
        # someone else's prediction, a moment before: another model, and the same model with other input
        client.models.predictions.create(model="acme/other", input=same)
        client.models.predictions.create(model="acme/painter", input={**same, "prompt": "not ours"})
        request = SubmitRequest(job_id=job_id, model="acme/painter", input=same, callback_url=None,
                                first_attempt_at=datetime.now(UTC))
        before = stats(simulator)["tasks_created"]
        set_faults(simulator, submit_timeout_after_create=1)
        with pytest.raises(Uncertain):
            await adapter.submit(request, job_id)
        clear_faults(simulator)
        assert stats(simulator)["tasks_created"] == before + 1
        (found,) = await adapter.find_candidates(request)
        made = client.predictions.get(found.task_id)
        assert made.model == "acme/painter" and made.input == same
        task = Task(task_id=found.task_id, model=request.model)
        deadline = time.monotonic() + 10
        while (observation := await adapter.status(task)).state is TaskState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert observation.state is TaskState.SUCCEEDED and len(observation.output_urls) == 1
        assert stats(simulator)["tasks_created"] == before + 1  # looking it up made nothing
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------ trainings
#
# replicate 1.0.7's `Training` (replicate/training.py): `id`, `model`,
# `version` and `status` required (`status` one of starting, processing,
# succeeded, failed, canceled), `urls` strings only; `_json_to_training`
# parses a finished training's `output.version` as `owner/name:version`
# (a bare id would raise) and sets `destination` from it.

TRAINER_VERSION = "39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"


def wait_training(client: replicate.Client, training: Training) -> Training:
    deadline = time.monotonic() + 10
    while training.status in ("starting", "processing"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
        training.reload()  # GET /v1/trainings/{id}, parsed as a Training
    return training


def test_a_training_created_read_and_finished(client, simulator):
    training = client.trainings.create(model="stability-ai/sdxl", version=TRAINER_VERSION,
                                       destination="acme/my-sdxl",
                                       input={"duration_s": 0.2, "output_bytes": 512, "input_images": "x.zip"})
    assert isinstance(training, Training)
    assert (training.status, training.model, training.version) == ("starting", "stability-ai/sdxl", TRAINER_VERSION)
    assert training.input == {"duration_s": 0.2, "output_bytes": 512, "input_images": "x.zip"}
    assert training.output is None and training.destination is None  # not shown until it is done
    again = client.trainings.get(training.id)
    assert isinstance(again, Training) and again.id == training.id
    done = wait_training(client, training)
    assert done.status == "succeeded" and done.completed_at and done.started_at
    assert done.destination == "acme/my-sdxl"  # from output.version, as the client reads it
    assert done.output["version"].startswith("acme/my-sdxl:")
    body = httpx.get(done.output["weights"], trust_env=False).content
    assert hashlib.sha256(body).hexdigest() == output_sha256(done.id, 0, 512)


def test_a_training_created_by_the_version_shorthand(client):
    training = client.trainings.create(version=f"stability-ai/sdxl:{TRAINER_VERSION}", destination="acme/my-sdxl",
                                       input={"duration_s": 30})
    assert training.model == "stability-ai/sdxl" and training.version == TRAINER_VERSION
    canceled = client.trainings.cancel(training.id)
    assert isinstance(canceled, Training) and canceled.status == "canceled" and canceled.completed_at


def test_a_failed_and_a_canceled_training(client):
    failed = client.trainings.create(model="stability-ai/sdxl", version=TRAINER_VERSION, destination="acme/x",
                                     input={"duration_s": 0.1, "outcome": "failed"})
    done = wait_training(client, failed)
    assert done.status == "failed" and isinstance(done.error, str) and done.error and done.output is None
    running = client.trainings.create(model="stability-ai/sdxl", version=TRAINER_VERSION, destination="acme/x",
                                      input={"duration_s": 30})
    running.cancel()  # Training.cancel() parses the answer into the training itself
    assert running.status == "canceled"
    running.reload()
    assert running.status == "canceled"


def test_the_trainings_list_walks_every_page_newest_first(client):
    tag = secrets.token_hex(4)
    made = [client.trainings.create(model="acme/trainer", version=TRAINER_VERSION, destination="acme/x",
                                    input={"duration_s": 30, "tag": tag}).id for _ in range(5)]
    page = client.trainings.list()
    assert isinstance(page, Page) and page.previous is None and len(page.results) == PAGE_SIZE
    listed: list[str] = []
    while True:
        assert all(isinstance(t, Training) for t in page.results)
        listed += [t.id for t in page.results if (t.input or {}).get("tag") == tag]
        if page.next is None:
            break
        page = client.trainings.list(page.next)
    assert listed == made[::-1]
    for training_id in made:
        client.trainings.cancel(training_id)


def test_training_errors_are_replicate_errors(client):
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        client.trainings.create(model="stability-ai/sdxl", version=TRAINER_VERSION, destination="<invalid>",
                                input={})
    assert caught.value.status == 404 and caught.value.detail == "The specified training destination does not exist"
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        client.trainings.get("nosuchtraining")
    assert caught.value.status == 404


async def test_an_in_doubt_training_is_found_by_our_adapter_and_the_client_reads_it(client, simulator):
    """The create is made and its answer lost; our adapter finds the one
    training in its window; the client reads the same training, which
    succeeds once, to the destination we named."""
    adapter = ReplicateProvider(f"{simulator}/replicate", TOKEN, timeout_s=1.0, find_max_pages=100)
    try:
        job_id = "job_" + secrets.token_hex(12)
        request = SubmitRequest(job_id=job_id, model=f"train:acme/trainer:{TRAINER_VERSION}",
                                input={"destination": "acme/mine", "duration_s": 0.3, "prompt": f"for {job_id}"},
                                callback_url=None, first_attempt_at=datetime.now(UTC))
        before = stats(simulator)["tasks_created"]
        set_faults(simulator, submit_timeout_after_create=1)
        with pytest.raises(Uncertain):
            await adapter.submit(request, job_id)
        clear_faults(simulator)
        (found,) = await adapter.find_candidates(request)
        made = wait_training(client, client.trainings.get(found.task_id))
        assert made.status == "succeeded" and made.destination == "acme/mine"
        assert made.input == {"duration_s": 0.3, "prompt": f"for {job_id}"}
        observation = await adapter.status(Task(found.task_id, found.operation, request.model))
        assert observation.state is TaskState.SUCCEEDED and observation.output_urls == (made.output["weights"],)
        assert stats(simulator)["tasks_created"] == before + 1
    finally:
        await adapter.aclose()
