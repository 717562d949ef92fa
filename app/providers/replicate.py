"""Replicate (https://replicate.com/docs/reference/http).

No idempotency key exists, so a lost submit answer is recovered with
`find`: Replicate lists our predictions newest first, from a `created_after`
time on, each with the model, version and input it was made with (not the
`webhook`: the documented prediction carries none). A prediction made since
the job's first submit call, for the model we named and with exactly the
input we sent, may be the job's; the submit step drops those already saved
on another job and adopts only a single one left. Webhooks are signed with
Standard Webhooks using the account's signing secret.

Trainings (`train:owner/name:version`). A job's model of that form creates
a training of that trainer version (`POST /v1/models/{owner}/{name}/versions/
{version}/trainings`), pushing its new version to `input.destination`: that
key is taken out of the input and sent as the body's `destination`, the rest
of the input is the training's `input`. A destination that is missing or not
`owner/name` is refused before anything is sent. The training's id is the
task id and `Submitted.operation` says it is a training, so its reads and
cancel use `/v1/trainings/{id}` (the paths are built, never taken from the
answer's `urls`: the create answer's point at /v1/predictions/{id}, in the
OpenAPI example and in replicate-python's recorded trainings-create.yaml,
and a later read's at /v1/trainings/{id}). Choices where the documents are
silent:
- Outputs: a training's `output` is `{version, weights}` ("the version of
  the model created by the training" is `destination:<id>` in every recorded
  answer, and replicate 1.0.7 parses it as `owner/name:version`). `weights`,
  a file URL, is output 0, labelled "weights"; the whole output object is
  then stored as one JSON value labelled "output", so the new version id is
  kept with the job. A success with neither a version nor weights (an
  `output` of null) is a failure that says so.
- `Cancel-After` is documented for predictions only: a training is sent
  none, and its job's give-up is ours alone.
- Look-up: `GET /v1/trainings` documents no query parameter (no
  `created_after`). `find` pages through it newest first and stops at the
  first page that reaches back past the job's window (its first submit call,
  less the clock-skew margin); a training in that window of the same trainer
  version with exactly the input sent is a candidate, unless its output
  names another destination (the documented training carries no
  `destination` field: only a finished one's `output.version` shows it).
- Timings: trainings run for minutes to hours. Their jobs are polled on a
  slower schedule and give up after a day by default
  (GIVE_UP_AFTER_S_REPLICATE still wins).
- `data_removed: true` is honoured on a training as on a prediction (seen
  in real training answers, though not in the training schema).
"""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx

from app.providers.base import (
    Observation,
    OutputValue,
    Provider,
    ProviderFacts,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
    claimed_id,
    json_value,
    text_value,
    webhook_field,
)
from app.providers.http import (
    Clients,
    Secrets,
    collect_urls,
    ended,
    host_of,
    json_object,
    read_call,
    same_origin,
    submit_call,
)
from app.providers.keycache import RefetchingCache
from app.signing.webhooks import verify_standard_webhooks
from app.vocabulary import ProviderName

NAME = ProviderName.REPLICATE

_STATES = {
    "starting": TaskState.RUNNING,
    "processing": TaskState.RUNNING,
    "succeeded": TaskState.SUCCEEDED,
    "failed": TaskState.FAILED,
    "canceled": TaskState.CANCELLED,
    "cancelled": TaskState.CANCELLED,
    "aborted": TaskState.CANCELLED,
}
_NAME_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_MODEL_RE = re.compile(rf"({_NAME_PART})/({_NAME_PART})")
_VERSION_RE = re.compile(r"[A-Za-z0-9]{1,128}")
# A secret that fails to verify is fetched again at most this often.
SECRET_REFRESH_S = 60.0
# Replicate stamps `created_at` by its clock, our first submit time is by
# the database's: look this much further back than that time.
FIND_CLOCK_SKEW_S = 60.0
# The shortest `Cancel-After` the API allows.
MIN_CANCEL_AFTER_S = 5
# A job's model naming a training: `train:owner/name:version`.
TRAINING_PREFIX = "train:"
# `Submitted.operation` of a training (jobs.provider_operation): its reads
# and cancel go to /v1/trainings.
TRAINING_KIND = "training"
# Trainings run for minutes to hours ("As models can take several minutes or
# more to train", trainings.create): a slower poll, and a day to give up.
TRAINING_POLL_DELAYS_S = (5.0, 10.0, 20.0, 30.0, 60.0)
TRAINING_GIVE_UP_S = 24 * 3600.0


def cancel_after(deadline_at: datetime | None, now: datetime) -> str | None:
    """The `Cancel-After` header for a job due to give up at `deadline_at`
    (pure): the whole seconds left, so Replicate stops the prediction no
    later than we would give up on it. Replicate measures that lifetime from
    the prediction's creation, a moment after `now`: it stops a hair early,
    never late. None (no header) without a deadline or with less than the
    allowed 5 s left."""
    if deadline_at is None:
        return None
    seconds = math.floor((deadline_at - now).total_seconds())
    return f"{seconds}s" if seconds >= MIN_CANCEL_AFTER_S else None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def stopped_at_deadline(body: dict) -> bool:
    """Whether Replicate stopped the prediction at its `Cancel-After`
    deadline (pure): `aborted` is the deadline passing before it started
    (the OpenAPI status enum; changelog 2025-10-16); a `canceled` one with a
    `deadline` that had passed when it completed reached it while running.
    A user's cancel before the deadline is neither."""
    if body.get("status") == "aborted":
        return True
    if body.get("status") != "canceled":
        return False
    deadline, completed = _parse_time(body.get("deadline")), _parse_time(body.get("completed_at"))
    return deadline is not None and completed is not None and completed >= deadline


def route_for_model(model: str) -> tuple[str, dict[str, Any]]:
    """The create path and the body fields that name the model (pure):
    `owner/name:version` or a bare version id → /v1/predictions with
    `version`; `owner/name` → the model's own predictions route."""
    if not isinstance(model, str):
        raise Rejected(f"{NAME}: model must be a string")
    if ":" in model:
        name, _, version = model.partition(":")
        if _MODEL_RE.fullmatch(name) and _VERSION_RE.fullmatch(version):
            return "/v1/predictions", {"version": version}
    elif "/" in model:
        match = _MODEL_RE.fullmatch(model)
        if match:
            owner, name = match.groups()
            return f"/v1/models/{owner}/{name}/predictions", {}
    elif _VERSION_RE.fullmatch(model):
        return "/v1/predictions", {"version": model}
    raise Rejected(f"{NAME}: model must be owner/name, owner/name:version or a version id")


@dataclass(frozen=True)
class TrainingRef:
    """The trainer version a `train:owner/name:version` model names."""

    owner: str
    name: str
    version: str

    @property
    def create_path(self) -> str:
        return f"/v1/models/{self.owner}/{self.name}/versions/{self.version}/trainings"


def is_training_model(model: Any) -> bool:
    """Whether a job's model asks for a training (pure)."""
    return isinstance(model, str) and model.startswith(TRAINING_PREFIX)


def training_ref(model: Any) -> TrainingRef | None:
    """The trainer a job's model names when it is a training (pure): None
    for any other model; Rejected for a `train:` model that is not
    `train:owner/name:version`."""
    if not is_training_model(model):
        return None
    name, sep, version = model[len(TRAINING_PREFIX):].partition(":")
    match = _MODEL_RE.fullmatch(name)
    if not sep or match is None or not _VERSION_RE.fullmatch(version):
        raise Rejected(f"{NAME}: a training's model must be train:owner/name:version")
    owner, model_name = match.groups()
    return TrainingRef(owner, model_name, version)


def training_body(job_input: Mapping[str, Any]) -> dict[str, Any]:
    """The training create body for a job's input (pure): `destination`
    taken out of it, the rest the training's `input`. Rejected (nothing
    sent) when the destination is missing or not `owner/name`, the form the
    API asks for."""
    destination = job_input.get("destination")
    if not isinstance(destination, str) or not _MODEL_RE.fullmatch(destination):
        raise Rejected(f"{NAME}: a training needs input.destination, the model its new version is pushed to, "
                       "as owner/name")
    return {"destination": destination, "input": {k: v for k, v in job_input.items() if k != "destination"}}


def sent_training(request: SubmitRequest) -> tuple[TrainingRef, dict[str, Any]] | None:
    """The trainer and the create body (as it went on the wire) of a
    training job's submit (pure); None for a prediction's, and for one that
    could never have been sent (its submit was refused): nothing of ours to
    look for."""
    try:
        ref = training_ref(request.model)
        return None if ref is None else (ref, json.loads(json.dumps(training_body(request.input))))
    except Rejected:
        return None


def is_training(task: Task) -> bool:
    """Whether a stored task is a training (pure): its operation says so;
    a task saved without one (by an operator) is known by its job's model."""
    if task.operation is not None and task.operation.get("kind") == TRAINING_KIND:
        return True
    return is_training_model(task.model)


def pushed_to(output: Any) -> str | None:
    """The model a finished training pushed its new version to (pure), from
    its `output.version` (`owner/name:<id>`); None when it does not say."""
    version = output.get("version") if isinstance(output, dict) else None
    if not isinstance(version, str):
        return None
    name, sep, _ = version.partition(":")
    return name if sep and _MODEL_RE.fullmatch(name) else None


def trained_by(training: Any, ref: TrainingRef, sent: Mapping[str, Any]) -> bool:
    """Whether a listed training can be the one a submit of `ref` with the
    create body `sent` made (pure): the same trainer version, exactly the
    input sent, and no other destination in its output (an unfinished one
    names none)."""
    if not isinstance(training, dict) or not isinstance(training.get("id"), str) or not training["id"]:
        return False
    if training.get("version") != ref.version:
        return False
    if pushed_to(training.get("output")) not in (None, sent["destination"]):
        return False
    return same_json(training.get("input"), sent["input"])


def confirms_training(training: dict, ref: TrainingRef, sent: Mapping[str, Any]) -> bool:
    """Whether a training a verified webhook named can be this job's (pure):
    as `confirms` for a prediction (the input sent, or gone), and neither
    another trainer version nor another destination."""
    if "version" in training and training["version"] != ref.version:
        return False
    if pushed_to(training.get("output")) not in (None, sent["destination"]):
        return False
    return confirms(training, sent["input"])


def created_before(item: Any, since: datetime) -> bool:
    """Whether a listed item was created before `since` (pure); one whose
    `created_at` cannot be read is not."""
    created = _parse_time(item.get("created_at")) if isinstance(item, dict) else None
    return created is not None and created < since


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values (pure): objects whatever their key order, arrays
    in order, numbers by value (1 and 1.0 are one JSON number), and a
    boolean is no number (Python's `True == 1` is not JSON's)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b  # strings and null


def made_by(prediction: Any, model: str, sent_input: Any) -> bool:
    """Whether a listed prediction can be the one a submit of `model` with
    `sent_input` created (pure). A version submit is matched on the version
    id (the answer's `model` may be another name for it); a model submit on
    the model. The input must be exactly the one sent: after an hour the API
    removes it, and an older prediction matches nothing."""
    if not isinstance(prediction, dict) or not isinstance(prediction.get("id"), str) or not prediction["id"]:
        return False
    try:
        _, names = route_for_model(model)
    except Rejected:
        return False
    if "version" in names:
        if prediction.get("version") != names["version"]:
            return False
    elif prediction.get("model") != model:
        return False
    return same_json(prediction.get("input"), sent_input)


def confirms(prediction: dict, sent_input: Any) -> bool:
    """Whether a prediction a verified webhook named (to this job's own
    capability URL) can be this job's (pure): its input is the one sent, or
    gone (removed after an hour: the URL's token then vouches alone). Not
    its `model`: an official model's answer names the deployment that ran
    it (`replicate-internal/...` for `meta/meta-llama-3-8b-instruct`, in
    replicate-python's recorded answers)."""
    if prediction.get("data_removed") is True or prediction.get("input") is None:
        return True
    return same_json(prediction.get("input"), sent_input)


def _is_url(value: Any) -> bool:
    return bool(collect_urls(value)) if isinstance(value, str) else False  # the one rule of what a URL is


def outputs_of(output: Any) -> tuple[tuple[str, ...], tuple[OutputValue, ...]]:
    """A succeeded prediction's `output` (any JSON, the model's choice) as
    URLs to download and values to store (pure). A URL string, or a list of
    them, is files; any other string is text (LLMs answer one); a list with
    any string that is not a URL is one JSON value (LLMs stream token
    lists); other shapes give the URLs found anywhere in them (`{"video":
    url, "seed": 3}`: the video), or, with no URL in them, one JSON value.
    `null` (or an empty list) is no output."""
    if output is None or output == []:
        return (), ()
    if isinstance(output, str):
        if _is_url(output):
            return (output,), ()
        return (), (text_value(output),)
    if isinstance(output, list) and any(isinstance(item, str) and not _is_url(item) for item in output):
        return (), (json_value(output),)
    urls = collect_urls(output)
    if urls:
        return urls, ()
    return (), (json_value(output),)


WEIGHTS_LABEL = "weights"
OUTPUT_LABEL = "output"
NO_TRAINING_OUTPUT = "the training succeeded without an output: no new version, no weights"


def training_outputs(output: Any) -> tuple[tuple[str, ...], tuple[OutputValue, ...]]:
    """A succeeded training's `output` (`{version, weights}`) as URLs to
    download and values to store (pure): the `weights` URL, and the whole
    object as one JSON value (it holds the new version's id). Nothing for an
    output with neither a version nor a weights URL."""
    if not isinstance(output, dict):
        return (), ()
    weights, version = output.get("weights"), output.get("version")
    urls: tuple[str, ...] = (weights,) if isinstance(weights, str) and _is_url(weights) else ()
    if not urls and not (isinstance(version, str) and version):
        return (), ()
    return urls, (json_value(output, OUTPUT_LABEL),)


def _state_of(body: dict, secrets: Secrets, what: str) -> TaskState:
    status = body.get("status")
    state = _STATES.get(status) if isinstance(status, str) else None  # a list or an object is no status
    if state is None:
        raise Transient(f"{NAME}: unknown {what} status {secrets.mask(str(status), 40)!r}")
    return state


def _not_succeeded(state: TaskState, body: dict, secrets: Secrets, what: str) -> Observation:
    if state is TaskState.FAILED:
        return ended(state, secrets, body.get("error"), fallback=f"the {what} failed")
    if state is TaskState.CANCELLED:
        seen = ended(state, secrets, body.get("error"))
        return replace(seen, stopped_at_deadline=stopped_at_deadline(body))
    return Observation(state=state)


def observation_from_prediction(body: dict, secrets: Secrets) -> Observation:
    """A prediction JSON as an Observation (pure). An hour after it ends the
    API removes a prediction's input and output (`data_removed: true`,
    `output: null`): a success with its outputs gone."""
    state = _state_of(body, secrets, "prediction")
    if state is not TaskState.SUCCEEDED:
        return _not_succeeded(state, body, secrets, "prediction")
    if body.get("data_removed") is True:
        return Observation(state=state, output_removed=True)
    urls, values = outputs_of(body.get("output"))
    return Observation(state=state, output_urls=urls, values=values)


def observation_from_training(body: dict, secrets: Secrets) -> Observation:
    """A training JSON as an Observation (pure): its weights (labelled
    "weights") and its output object (labelled "output"). A success without
    either is a failure that says so."""
    state = _state_of(body, secrets, "training")
    if state is not TaskState.SUCCEEDED:
        return _not_succeeded(state, body, secrets, "training")
    if body.get("data_removed") is True:
        return Observation(state=state, output_removed=True)
    urls, values = training_outputs(body.get("output"))
    if not urls and not values:
        return ended(TaskState.FAILED, secrets, fallback=NO_TRAINING_OUTPUT)
    return Observation(state=state, output_urls=urls, values=values, url_labels=(WEIGHTS_LABEL,) * len(urls))


class ReplicateProvider(Provider):
    def __init__(
        self,
        base_url: str,
        api_token: str | None,
        *,
        webhook_secret: str | None = None,
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
        stale_after_s: float = 60.0,
        find_max_pages: int = 5,
        find_max_age_s: float = 6 * 3600.0,
        secret_refresh_s: float = SECRET_REFRESH_S,
    ):
        self.base_url = base_url.rstrip("/")
        self._token = api_token
        self._configured_secret = webhook_secret
        # Without a configured secret, the account's is fetched, and fetched
        # again when a signature fails (it may have been rotated).
        self._fetched_secret = RefetchingCache(self._fetch_secret, max_age_s=math.inf,
                                               min_refetch_s=secret_refresh_s)
        self._http = Clients(timeout_s, client)
        self._find_max_pages = find_max_pages
        self._find_max_age = timedelta(seconds=find_max_age_s)
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="standard-webhooks",
            idempotent_submit=False,
            can_find=True,
            stale_after_s=stale_after_s,
            output_hosts=("replicate.delivery", ".replicate.delivery", host_of(self.base_url)),
            output_ttl_s=3600.0,
            # "You'll need to pass the Authorization header to request them"
            # (the OpenAPI document, predictions.get): its file hosts, and
            # never the API's. An output is the model's to choose (any
            # model, an owner's own included): with the token, an output
            # URL naming the API would copy the account's predictions, or
            # its webhook secret, into the owner's job.
            credential_hosts=("replicate.delivery", ".replicate.delivery"),
        )
        self._training_facts = replace(self.facts, poll_delays_s=TRAINING_POLL_DELAYS_S,
                                       give_up_after_s=TRAINING_GIVE_UP_S)

    def __repr__(self) -> str:
        return f"ReplicateProvider({self.base_url!r})"

    def facts_for(self, model: str) -> ProviderFacts:
        return self._training_facts if is_training_model(model) else self.facts

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._token, self._configured_secret, self._fetched_secret.value)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def download_credentials(self) -> dict[str, str]:
        return self._headers()

    def _prediction_url(self, task_id: str, suffix: str = "") -> str:
        return f"{self.base_url}/v1/predictions/{quote(task_id, safe='')}{suffix}"

    def _training_url(self, task_id: str, suffix: str = "") -> str:
        return f"{self.base_url}/v1/trainings/{quote(task_id, safe='')}{suffix}"

    def _task_url(self, task: Task, suffix: str = "") -> str:
        return (self._training_url if is_training(task) else self._prediction_url)(task.task_id, suffix)

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        headers = self._headers()
        ref = training_ref(request.model)
        operation: dict[str, str] | None = None
        if ref is not None:
            # No `Cancel-After`: it is documented for predictions only.
            path, body = ref.create_path, training_body(request.input)
            operation = {"kind": TRAINING_KIND}
        else:
            path, body = route_for_model(request.model)
            body["input"] = dict(request.input)
            lifetime = cancel_after(request.deadline_at, datetime.now(UTC))
            if lifetime is not None:
                # Replicate's own give-up: an `aborted` prediction (the deadline
                # passed before it started) is not charged (changelog 2025-10-16).
                headers["Cancel-After"] = lifetime
        if request.callback_url:
            body["webhook"] = request.callback_url
            body["webhook_events_filter"] = ["completed"]
        response = await submit_call(
            self._http.submits, NAME, "POST", self.base_url + path,
            json=body, headers=headers, secrets=self._secrets.plus_callback(request.callback_url),
        )
        data = json_object(response, NAME, Uncertain)
        task_id = data.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise Uncertain(f"{NAME}: submit answer has no {'training' if ref else 'prediction'} id")
        return Submitted(task_id=task_id, operation=operation)

    async def status(self, task: Task) -> Observation:
        response = await read_call(
            self._http.reads, NAME, "GET", self._task_url(task),
            headers=self._headers(), secrets=self._secrets,
        )
        body = json_object(response, NAME, Transient)
        if is_training(task):
            return observation_from_training(body, self._secrets)
        return observation_from_prediction(body, self._secrets)

    async def cancel(self, task: Task) -> None:
        try:
            await read_call(
                self._http.reads, NAME, "POST", self._task_url(task, "/cancel"),
                headers=self._headers(), secrets=self._secrets, pass_statuses=(409, 422),
            )
        except Rejected:
            return None  # no such prediction or training: nothing to cancel

    async def find(self, request: SubmitRequest) -> Submitted | None:
        """The one prediction (or training) that can be this submit's, or
        None (none, or several: which one is ours cannot be told). Without
        the database's knowledge of the tasks other jobs hold; the submit
        step asks `find_candidates`."""
        candidates = await self.find_candidates(request)
        return candidates[0] if len(candidates) == 1 else None

    async def find_candidates(self, request: SubmitRequest) -> tuple[Submitted, ...]:
        """The predictions made since the job's first submit call (less the
        clock-skew margin; without that time, within `find_max_age_s`) for
        the model and with the exact input the submit sent, newest first.
        None seen if the window holds more than `find_max_pages` pages: a
        match on a page not read could make any other ambiguous. A training
        is looked for the same way among the trainings (`trained_by`), the
        window read off their `created_at` (the list has no filter)."""
        since = request.first_attempt_at or datetime.now(UTC) - self._find_max_age
        since -= timedelta(seconds=FIND_CLOCK_SKEW_S)
        if is_training_model(request.model):
            training = sent_training(request)
            if training is None:
                return ()
            ref, sent = training
            ids = await self._listed(
                f"{self.base_url}/v1/trainings", None,
                matches=lambda item: not created_before(item, since) and trained_by(item, ref, sent),
                past_window=lambda item: created_before(item, since))
            return tuple(Submitted(task_id=task_id, operation={"kind": TRAINING_KIND}) for task_id in ids)
        sent_input = json.loads(json.dumps(dict(request.input)))  # as it went on the wire
        ids = await self._listed(
            f"{self.base_url}/v1/predictions", {"created_after": since.astimezone(UTC).isoformat()},
            matches=lambda item: made_by(item, request.model, sent_input),
            past_window=lambda item: False)  # the server filters on `created_after`
        return tuple(Submitted(task_id=task_id) for task_id in ids)

    async def _listed(self, url: str, params: dict[str, str] | None, *, matches: Callable[[Any], bool],
                      past_window: Callable[[Any], bool]) -> tuple[str, ...]:
        """The ids of the listed items that `matches`, reading pages (newest
        first) until the last, or one with an item `past_window`; none at all
        when that takes more than `find_max_pages` pages."""
        found: list[str] = []
        for _ in range(self._find_max_pages):
            response = await read_call(
                self._http.reads, NAME, "GET", url, params=params,
                headers=self._headers(), secrets=self._secrets, not_found=None,
            )
            page = json_object(response, NAME, Transient)
            results = page.get("results")
            if not isinstance(results, list):
                raise Transient(f"{NAME}: the list has no results")
            found += [item["id"] for item in results if matches(item)]
            next_url = page.get("next")
            if not next_url or any(past_window(item) for item in results):
                return tuple(dict.fromkeys(found))  # an item listed twice (pages shifted) counts once
            # Follow only links on the API's own origin: the token goes with them.
            if not same_origin(next_url, self.base_url):
                return ()
            url, params = next_url, None  # `next` carries the filters
        return ()

    async def _fetch_secret(self) -> str | None:
        response = await read_call(
            self._http.reads, NAME, "GET", f"{self.base_url}/v1/webhooks/default/secret",
            headers=self._headers(), secrets=self._secrets, not_found=None,
        )
        key = json_object(response, NAME, Transient).get("key")
        return key if isinstance(key, str) and key else None

    async def _secret(self, *, refresh: bool) -> str | None:
        if self._configured_secret:
            return self._configured_secret
        return await self._fetched_secret.get(refresh=refresh)

    async def verify(self, webhook: WebhookRequest) -> bool:
        try:
            secret = await self._secret(refresh=False)
            if secret and verify_standard_webhooks(
                webhook.headers, webhook.raw_body, secret, time.time()
            ):
                return True
            if self._configured_secret:
                return False
            # The account secret may have been rotated: fetch it again, at
            # most once a minute, and try once more.
            fresh = await self._secret(refresh=True)
            if not fresh or fresh == secret:
                return False
            return verify_standard_webhooks(webhook.headers, webhook.raw_body, fresh, time.time())
        except Exception:
            return False

    def webhook_task_id(self, webhook: WebhookRequest) -> str | None:
        # A webhook's body is the prediction or the training (signed whole): its `id`.
        return claimed_id(webhook_field(webhook.raw_body, "id"))

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """The prediction (or, for a training's job, the training) read with
        our token (404: not ours, or no such one); made with the input the
        job sent, while Replicate still shows it (`confirms`,
        `confirms_training`)."""
        training = sent_training(request)
        if training is None and is_training_model(request.model):
            return None  # a training job whose submit could never have been sent
        task = Task(task_id=task_id, operation={"kind": TRAINING_KIND} if training else None, model=request.model)
        try:
            response = await read_call(self._http.reads, NAME, "GET", self._task_url(task),
                                       headers=self._headers(), secrets=self._secrets)
        except Rejected:
            return None
        answer = json_object(response, NAME, Transient)
        if training is not None:
            ref, sent = training
            ours = confirms_training(answer, ref, sent)
            return Submitted(task_id=task_id, operation=task.operation) if ours else None
        sent_input = json.loads(json.dumps(dict(request.input)))
        return Submitted(task_id=task_id) if confirms(answer, sent_input) else None

    async def aclose(self) -> None:
        await self._http.aclose()
