"""Replicate (https://replicate.com/docs/reference/http).

No idempotency key exists, so a lost submit answer is recovered with
`find`: Replicate lists our predictions newest first, from a `created_after`
time on, each with the model, version and input it was made with (not the
`webhook`: the documented prediction carries none). A prediction made since
the job's first submit call, for the model we named and with exactly the
input we sent, may be the job's; the submit step drops those already saved
on another job and adopts only a single one left. Webhooks are signed with
Standard Webhooks using the account's signing secret.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx

from app.providers.base import (
    JSON_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
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
        return (), (OutputValue(_utf8(output), TEXT_CONTENT_TYPE),)
    if isinstance(output, list) and any(isinstance(item, str) and not _is_url(item) for item in output):
        return (), (_json_value(output),)
    urls = collect_urls(output)
    if urls:
        return urls, ()
    return (), (_json_value(output),)


def _json_value(output: Any) -> OutputValue:
    # Compact, and the text as the model wrote it (no \u escapes for non-ASCII).
    return OutputValue(_utf8(json.dumps(output, separators=(",", ":"), ensure_ascii=False)), JSON_CONTENT_TYPE)


def _utf8(text: str) -> bytes:
    # A lone surrogate (JSON can carry "\ud800") has no UTF-8 form: it becomes "?".
    return text.encode("utf-8", "replace")


def observation_from_prediction(body: dict, secrets: Secrets) -> Observation:
    """A prediction JSON as an Observation (pure). An hour after it ends the
    API removes a prediction's input and output (`data_removed: true`,
    `output: null`): a success with its outputs gone."""
    state = _STATES.get(body.get("status"))  # type: ignore[arg-type]
    if state is None:
        raise Transient(f"{NAME}: unknown prediction status {secrets.mask(str(body.get('status')), 40)!r}")
    if state is TaskState.SUCCEEDED:
        if body.get("data_removed") is True:
            return Observation(state=state, output_removed=True)
        urls, values = outputs_of(body.get("output"))
        return Observation(state=state, output_urls=urls, values=values)
    if state is TaskState.FAILED:
        return ended(state, secrets, body.get("error"), fallback="the prediction failed")
    if state is TaskState.CANCELLED:
        seen = ended(state, secrets, body.get("error"))
        return replace(seen, stopped_at_deadline=stopped_at_deadline(body))
    return Observation(state=state)


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
            # (the OpenAPI document, predictions.get): files on Replicate's
            # own hosts, the API's included, and no other.
            credential_hosts=("replicate.delivery", ".replicate.delivery", host_of(self.base_url)),
        )

    def __repr__(self) -> str:
        return f"ReplicateProvider({self.base_url!r})"

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._token, self._configured_secret, self._fetched_secret.value)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def download_credentials(self) -> dict[str, str]:
        return self._headers()

    def _prediction_url(self, task_id: str, suffix: str = "") -> str:
        return f"{self.base_url}/v1/predictions/{quote(task_id, safe='')}{suffix}"

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        path, body = route_for_model(request.model)
        body["input"] = dict(request.input)
        if request.callback_url:
            body["webhook"] = request.callback_url
            body["webhook_events_filter"] = ["completed"]
        headers = self._headers()
        lifetime = cancel_after(request.deadline_at, datetime.now(UTC))
        if lifetime is not None:
            # Replicate's own give-up: an `aborted` prediction (the deadline
            # passed before it started) is not charged (changelog 2025-10-16).
            headers["Cancel-After"] = lifetime
        response = await submit_call(
            self._http.submits, NAME, "POST", self.base_url + path,
            json=body, headers=headers, secrets=self._secrets.plus_callback(request.callback_url),
        )
        data = json_object(response, NAME, Uncertain)
        task_id = data.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise Uncertain(f"{NAME}: submit answer has no prediction id")
        return Submitted(task_id=task_id)

    async def status(self, task: Task) -> Observation:
        response = await read_call(
            self._http.reads, NAME, "GET", self._prediction_url(task.task_id),
            headers=self._headers(), secrets=self._secrets,
        )
        return observation_from_prediction(json_object(response, NAME, Transient), self._secrets)

    async def cancel(self, task: Task) -> None:
        try:
            await read_call(
                self._http.reads, NAME, "POST", self._prediction_url(task.task_id, "/cancel"),
                headers=self._headers(), secrets=self._secrets, pass_statuses=(409, 422),
            )
        except Rejected:
            return None  # no such prediction: nothing to cancel

    async def find(self, request: SubmitRequest) -> Submitted | None:
        """The one prediction that can be this submit's, or None (none, or
        several: which one is ours cannot be told). Without the database's
        knowledge of the tasks other jobs hold; the submit step asks
        `find_candidates`."""
        candidates = await self.find_candidates(request)
        return candidates[0] if len(candidates) == 1 else None

    async def find_candidates(self, request: SubmitRequest) -> tuple[Submitted, ...]:
        """The predictions made since the job's first submit call (less the
        clock-skew margin; without that time, within `find_max_age_s`) for
        the model and with the exact input the submit sent, newest first.
        None seen if the window holds more than `find_max_pages` pages: a
        match on a page not read could make any other ambiguous."""
        since = request.first_attempt_at or datetime.now(UTC) - self._find_max_age
        since -= timedelta(seconds=FIND_CLOCK_SKEW_S)
        sent_input = json.loads(json.dumps(dict(request.input)))  # as it went on the wire
        url = f"{self.base_url}/v1/predictions"
        params: dict[str, str] | None = {"created_after": since.astimezone(UTC).isoformat()}
        found: list[Submitted] = []
        for _ in range(self._find_max_pages):
            response = await read_call(
                self._http.reads, NAME, "GET", url, params=params,
                headers=self._headers(), secrets=self._secrets, not_found=None,
            )
            page = json_object(response, NAME, Transient)
            results = page.get("results")
            if not isinstance(results, list):
                raise Transient(f"{NAME}: prediction list has no results")
            found += [Submitted(task_id=item["id"]) for item in results if made_by(item, request.model, sent_input)]
            next_url = page.get("next")
            if not next_url:
                return tuple(dict.fromkeys(found))  # a prediction listed twice (pages shifted) counts once
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
        # A webhook's body is the prediction (signed whole): its `id`.
        return claimed_id(webhook_field(webhook.raw_body, "id"))

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """The prediction read with our token (404: not ours, or no such
        one); made with the input the job sent, while Replicate still shows
        it (`confirms`)."""
        try:
            response = await read_call(self._http.reads, NAME, "GET", self._prediction_url(task_id),
                                       headers=self._headers(), secrets=self._secrets)
        except Rejected:
            return None
        prediction = json_object(response, NAME, Transient)
        sent_input = json.loads(json.dumps(dict(request.input)))
        return Submitted(task_id=task_id) if confirms(prediction, sent_input) else None

    async def aclose(self) -> None:
        await self._http.aclose()
