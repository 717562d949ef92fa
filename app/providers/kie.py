"""KIE: its Market API and its own families (Veo 3.1, Runway, Flux Kontext, Suno).

The model decides where a job goes. `veo/<model>`, `runway/<model>`,
`flux-kontext/<model>` and `suno/<model>` use that family's own endpoints;
every other model is a Market model id:

- Market: `POST /api/v1/jobs/createTask` `{model, input, callBackUrl}`, then
  `GET /api/v1/jobs/recordInfo`; the model is the whole id.
- Veo 3.1: `POST /api/v1/veo/generate`, `GET /api/v1/veo/record-info`; the
  model after `veo/` is the body's `model` (`veo3`, `veo3_fast`).
- Runway: `POST /api/v1/runway/generate`, `GET /api/v1/runway/record-detail`;
  no model field: only `runway/generate`.
- Flux Kontext: `POST /api/v1/flux/kontext/generate`,
  `GET /api/v1/flux/kontext/record-info`; the body's `model`
  (`flux-kontext-pro`, `flux-kontext-max`).
- Suno: `POST /api/v1/generate`, `GET /api/v1/generate/record-info`; the
  body's `model` (`V3_5`, `V4`, `V4_5`, `V4_5PLUS`, `V5`).

Sources (docs.kie.ai): /market/common/get-task-detail; /veo3-api/generate-veo-3-video,
/veo3-api/get-veo-3-video-details, /veo3-api/generate-veo-3-video-callbacks;
/runway-api/generate-ai-video, /runway-api/get-ai-video-details,
/runway-api/generate-ai-video-callbacks; /flux-kontext-api/generate-or-edit-image,
/flux-kontext-api/get-image-details, /flux-kontext-api/generate-or-edit-image-callbacks;
/suno-api/generate-music, /suno-api/get-music-details, /suno-api/generate-music-callbacks;
/common-api/webhook-verification.

KIE answers HTTP 200 with its own `code` in the body; that code decides, by
one table for every KIE API (`submit_outcome`, `record_outcome`). The
envelope's text is `msg` on most pages and `message` on the current Get Task
Details page: both are read. A family's job input is that family's whole
top-level body; the model and the callback URL are ours to set in it.

Callbacks: the callback URL we hand KIE carries our own capability token,
and `verify` checks it (every callback URL carries one:
Settings.callback_url). KIE's optional signature (`X-Webhook-Timestamp`,
`X-Webhook-Signature` = base64 HMAC-SHA256 of `taskId.timestamp` under the
account's `webhookHmacKey`) covers no body, so it is an extra check only,
made when the adapter is given that key. The body is never trusted for
state: a delivery only asks for a settle, and the settle step asks the
status endpoint, which KIE calls the final authority. There is no cancel
endpoint (`can_cancel` False), no idempotency key and no look-up, so a
submit whose answer is lost leaves the job `uncertain` until the task's own
callback names it (`webhook_task_id`) and the status endpoint confirms it.

Choices where the documents are silent or disagree:
- Codes: 409, 413 and 451 (Suno's conflict, a prompt too long, an input
  file KIE could not fetch) are refusals, like 401/402/404/422/505; 430
  (Suno's "call frequency too high") is "not now", like 429 and 455; 500,
  400 (whose only words on a generate page, Veo's, belong to its 1080P
  call) and unknown codes say nothing about whether a task exists
  (Uncertain at submit). On a status read, 404 is "no such task", 501 (a
  failed generation) and 422 (a validation error in the original request)
  a failed task, anything else a read to try again.
- A success with no output is a failure (nothing to store, nothing to
  charge): "parse resultJson to get the resultUrls array" is all Get Task
  Details says a success holds, and the families say the same of theirs.
- Veo: `response.resultUrls` are the outputs; `originUrls` (the uncropped
  originals, "only when aspectRatio is not 16:9") are not. successFlag 2 and
  3 are both failures.
- Runway: the generate body has no model field (its schema: prompt, imageUrl,
  duration, quality, aspectRatio, waterMark, callBackUrl; the page's example
  still shows a legacy `model`), so the one model is `runway/generate`,
  named for the endpoint; anything else is refused before any call.
  `videoInfo.videoUrl` is the output; `imageUrl` is a thumbnail, not an
  output. `expireFlag` 1 ("the video has expired") is a success whose output
  is gone (`output_removed`).
- Flux Kontext: `resultImageUrl` is the output; `originImageUrl` is KIE's copy
  of the input image (valid 10 minutes), not an output.
- Suno: several tracks per task (usually two), each track's `audioUrl` an
  output labelled with the track's `id` (KIE's audioId: the name every other
  Suno call takes), in KIE's order; `imageUrl` (cover art) and
  `streamAudioUrl` (a stream of the same audio) are not outputs. Usage is
  the sum of the tracks' `duration` in seconds, when every track gives one.
  `PENDING`, `TEXT_SUCCESS` and `FIRST_SUCCESS` are still running.
  `CALLBACK_EXCEPTION` is a failure of KIE's own callback, not of the music:
  the tracks are read, and the task succeeds with those that have audio (it
  fails only when none has). `callBackUrl` is required by the generate
  page's schema, so a Suno job without one (PUBLIC_URL unset) is refused
  before any call. Stage callbacks (`callbackType` `text`, `first`) are
  accepted without a settle (`is_final_webhook`); `complete` and `error` ask
  for one.
- The model after a family's prefix is sent as the body's `model` as it is:
  KIE refuses one it does not offer (code 422: Rejected), and its pages
  disagree on the list (the Chinese Veo page names a Veo 3.1 Lite the
  English enum lacks). A job's input may not carry `callBackUrl` (ours),
  nor a `model` other than the one its model names.
- Output hosts: the families share the Market's list; their pages' examples
  show only placeholder hosts (example.com, file.com, example.cn).
- Confirming a task named by a callback (`confirm_task`): the status endpoint
  must know it, with our key; where the record echoes the create request
  (recordInfo `param`, Veo and Flux `paramJson`, Suno `param`) its
  `callBackUrl`, compared without its query (the token), must be this
  job's, else its `model`; Runway echoes neither, so knowing the task is
  enough.
- Timings (`facts_for`): Veo and Runway 25 minutes to the lost-webhook check,
  Suno 30, Flux Kontext 10 (the project's seed table); polls of 10–30 s for
  Veo and Suno, 5–30 s for Runway, 2–10 s for Flux. Market models whose id
  names a lip-sync or talking avatar (`lip-sync`, `lipsync`, `avatar`,
  `infinitalk`, `omnihuman`, `speech-to-video`: KIE's `infinitalk/from-audio`,
  `kling/ai-avatar-pro`, `wan/2-2-a14b-speech-to-video-turbo`...) run for up
  to an hour: 75 minutes to the check, a 3 h give-up. Runway and Flux
  results are kept 14 days (their pages); Veo and Suno say nothing, so the
  Market's day stands.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.providers.base import (
    Observation,
    Provider,
    ProviderFacts,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    Usage,
    UsageUnit,
    WebhookRequest,
    claimed_id,
    webhook_field,
)
from app.providers.http import (
    Clients,
    Secrets,
    ended,
    host_of,
    json_object,
    read_call,
    submit_call,
)
from app.signing.tokens import check_capability_token
from app.signing.webhooks import TOLERANCE_S
from app.vocabulary import ProviderName

NAME = ProviderName.KIE

# ------------------------------------------------------------------ the code table (every KIE API)

# Refused for good, nothing created: 401 unauthorized, 402 insufficient
# credits, 404 not found, 409 conflict (Suno), 413 prompt too long (Suno), 422
# validation error, 451 an input file KIE could not fetch, 505 feature
# disabled. 501 "generation failed": KIE's word that this
# request ended without a result, so the job fails (uncharged) rather than
# waiting on a task that will not deliver.
_REJECTED_CODES = {401, 402, 404, 409, 413, 422, 451, 501, 505}
# 429 rate limited, 430 call frequency too high (Suno), 455 "service
# unavailable (maintenance)": refused for now, nothing taken; ask again later.
_TRANSIENT_CODES = {429, 430, 455}
# 500 "server error", 400 (on Veo's generate page it reads "1080P is
# processing", a later call's words) and any code KIE does not document stay
# Uncertain: such an answer says nothing about whether the task was created,
# and a paid task must not be created twice.

NO_OUTPUT = "the provider reported success but gave no output"


def whole_number(value: Any) -> int | None:
    """An integer field as KIE writes it: a JSON integer or a string of
    digits; a boolean is not one (pure)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def body_code(body: Mapping[str, Any]) -> int | None:
    return whole_number(body.get("code"))


def _message(body: Mapping[str, Any], secrets: Secrets) -> str:
    return secrets.reason(body.get("msg") or body.get("message")) or ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def submit_outcome(body: Mapping[str, Any], secrets: Secrets) -> str:
    """The task id from a create answer (every family's: `data.taskId`), or
    the error its `code` means (pure): see _REJECTED_CODES and
    _TRANSIENT_CODES; else Uncertain."""
    code = body_code(body)
    detail = _message(body, secrets)
    suffix = f": {detail}" if detail else ""
    if code == 200:
        task_id = _mapping(body.get("data")).get("taskId")
        if isinstance(task_id, str) and task_id:
            return task_id
        raise Uncertain(f"{NAME}: submit answer has no task id")
    if code in _TRANSIENT_CODES:
        raise Transient(f"{NAME}: submit refused (code {code}){suffix}")
    if code in _REJECTED_CODES:
        raise Rejected(f"{NAME}: submit rejected (code {code}){suffix}")
    raise Uncertain(f"{NAME}: submit answered code {code}{suffix}")


def http_urls(values: Any) -> tuple[str, ...]:
    """The http(s) URL strings of a list (or of one string), in order (pure)."""
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        return ()
    return tuple(u for u in values if isinstance(u, str) and u.startswith(("https://", "http://")))


def succeeded(urls: tuple[str, ...], *, labels: tuple[str | None, ...] = (), usage: tuple[Usage, ...] = (),
              removed: bool = False) -> Observation:
    """A task KIE reports done: its outputs, or a failure when it gave none
    (pure). `removed`: KIE says the outputs expired (the job fails
    `output_expired`, refunded)."""
    if removed:
        return Observation(state=TaskState.SUCCEEDED, output_removed=True)
    if not urls:
        return Observation(state=TaskState.FAILED, error=NO_OUTPUT)
    return Observation(state=TaskState.SUCCEEDED, output_urls=urls, url_labels=labels, usage=usage)


def _unknown_state(what: str, value: Any, secrets: Secrets) -> Transient:
    return Transient(f"{NAME}: unknown task {what} {secrets.mask(str(value), 40)!r}")


# ------------------------------------------------------------------ Market: recordInfo

# Get Task Details' `state`, all five of them.
_STATES = {
    "waiting": TaskState.RUNNING,
    "queuing": TaskState.RUNNING,
    "generating": TaskState.RUNNING,
    "success": TaskState.SUCCEEDED,
    "fail": TaskState.FAILED,
}


def result_urls(result_json: Any) -> tuple[str, ...]:
    """`resultUrls` from `resultJson` (a JSON string, or already an object)."""
    if isinstance(result_json, str):
        try:
            result_json = json.loads(result_json)
        except ValueError:
            return ()
    return http_urls(_mapping(result_json).get("resultUrls"))


def observation_from_record(data: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A recordInfo `data` object as an Observation (pure)."""
    state = _STATES.get(data.get("state"))  # type: ignore[arg-type]
    if state is None:
        raise _unknown_state("state", data.get("state"), secrets)
    if state is TaskState.SUCCEEDED:
        return succeeded(result_urls(data.get("resultJson")))
    if state is TaskState.FAILED:
        return ended(state, secrets, data.get("failMsg"), data.get("failCode"), fallback="the task failed")
    return Observation(state=state)


def record_outcome(body: Mapping[str, Any], secrets: Secrets,
                   observe: Callable[[Mapping[str, Any], Secrets], Observation] = observation_from_record,
                   ) -> Observation:
    """A whole status answer (any family's: `observe` reads its `data`) as an
    Observation, or the error its `code` means (pure): 404 is "no such task"
    (Rejected); 501 is "generation failed" and 422 "validation error in the
    original request" (both "check failMsg"): the task failed; any other
    code but 200 is a read that did not work (Transient), waited out until
    the job's deadline (outbox/decide.after_read_error)."""
    code = body_code(body)
    if code == 404:
        raise Rejected(f"{NAME}: no such task (code 404)")
    if code in (422, 501):
        record = _mapping(body.get("data"))
        return ended(TaskState.FAILED, secrets, record.get("failMsg"), record.get("errorMessage"),
                     body.get("message"), body.get("msg"), record.get("failCode"), record.get("errorCode"),
                     fallback=f"the generation failed (code {code})")
    if code != 200:
        detail = _message(body, secrets)
        raise Transient(f"{NAME}: status answered code {code}" + (f": {detail}" if detail else ""))
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise Transient(f"{NAME}: status answer has no data")
    return observe(data, secrets)


def made_for(record: Mapping[str, Any], request: SubmitRequest) -> bool:
    """Whether a recordInfo `data` object is the task `request` made (pure):
    `param` echoes the create request, so its callBackUrl (our job's URL,
    compared without its query string, the token) or, echoing none, its
    model must be the job's."""
    echoed = _json_object(record.get("param")).get("callBackUrl")
    if isinstance(echoed, str) and request.callback_url:
        return without_query(echoed) == without_query(request.callback_url)
    return record.get("model") == request.model


def without_query(url: str) -> str:
    return url.partition("?")[0]


def _json_object(text: Any) -> Mapping[str, Any]:
    """A JSON object carried as a string (`param`, `paramJson`), or {}."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return _mapping(value)


# ------------------------------------------------------------------ the families

_FLAG_STATES = {0: TaskState.RUNNING, 1: TaskState.SUCCEEDED, 2: TaskState.FAILED, 3: TaskState.FAILED}


def _flag_state(data: Mapping[str, Any], secrets: Secrets) -> TaskState:
    state = _FLAG_STATES.get(whole_number(data.get("successFlag")))  # type: ignore[arg-type]
    if state is None:
        raise _unknown_state("successFlag", data.get("successFlag"), secrets)
    return state


def _flag_failure(data: Mapping[str, Any], secrets: Secrets, names: Mapping[int, str]) -> Observation:
    flag = whole_number(data.get("successFlag"))
    return ended(TaskState.FAILED, secrets, data.get("errorMessage"), data.get("errorCode"),
                 fallback=names.get(flag or 0, "the task failed"))


def observation_from_veo(data: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A Veo record-info `data` object as an Observation (pure):
    successFlag 0 generating, 1 success, 2 failed, 3 generation failed."""
    state = _flag_state(data, secrets)
    if state is TaskState.SUCCEEDED:
        return succeeded(http_urls(_mapping(data.get("response")).get("resultUrls")))
    if state is TaskState.FAILED:
        return _flag_failure(data, secrets, {2: "the task failed", 3: "the generation failed"})
    return Observation(state=state)


def observation_from_flux(data: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A Flux Kontext record-info `data` object as an Observation (pure):
    successFlag 0 generating, 1 success, 2 create failed, 3 generate failed."""
    state = _flag_state(data, secrets)
    if state is TaskState.SUCCEEDED:
        return succeeded(http_urls(_mapping(data.get("response")).get("resultImageUrl")))
    if state is TaskState.FAILED:
        return _flag_failure(data, secrets, {2: "CREATE_TASK_FAILED", 3: "GENERATE_FAILED"})
    return Observation(state=state)


# Get AI Video Details' `state`, all five of them (not the Market's spellings).
_RUNWAY_STATES = {
    "wait": TaskState.RUNNING,
    "queueing": TaskState.RUNNING,
    "generating": TaskState.RUNNING,
    "success": TaskState.SUCCEEDED,
    "fail": TaskState.FAILED,
}


def observation_from_runway(data: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A Runway record-detail `data` object as an Observation (pure)."""
    state = _RUNWAY_STATES.get(data.get("state"))  # type: ignore[arg-type]
    if state is None:
        raise _unknown_state("state", data.get("state"), secrets)
    if state is TaskState.SUCCEEDED:
        return succeeded(http_urls(_mapping(data.get("videoInfo")).get("videoUrl")),
                         removed=whole_number(data.get("expireFlag")) == 1)
    if state is TaskState.FAILED:
        return ended(state, secrets, data.get("failMsg"), data.get("failCode"), fallback="the task failed")
    return Observation(state=state)


_SUNO_RUNNING = {"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"}
_SUNO_FAILED = {"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "SENSITIVE_WORD_ERROR"}
_SUNO_CALLBACK_FAILED = "CALLBACK_EXCEPTION"
_MAX_LABEL = 200  # assets.label


def suno_tracks(tracks: Any) -> Observation:
    """The tracks of a finished Suno task (`response.sunoData`) as outputs
    (pure): each `audioUrl` labelled with the track's `id`, and the summed
    `duration` as usage when every track gives one."""
    urls: list[str] = []
    labels: list[str | None] = []
    seconds: list[float] = []
    for item in tracks if isinstance(tracks, list) else ():
        track = _mapping(item)
        audio = http_urls(track.get("audioUrl"))
        if not audio:
            continue  # a track without its audio (yet) is no output
        track_id = track.get("id")
        urls.append(audio[0])
        labels.append(track_id if isinstance(track_id, str) and 0 < len(track_id) <= _MAX_LABEL else None)
        duration = track.get("duration")
        if isinstance(duration, int | float) and not isinstance(duration, bool) and duration >= 0:
            seconds.append(float(duration))
    usage = (Usage(UsageUnit.SECONDS, sum(seconds)),) if urls and len(seconds) == len(urls) else ()
    return succeeded(tuple(urls), labels=tuple(labels), usage=usage)


def observation_from_suno(data: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A Suno record-info `data` object as an Observation (pure)."""
    status = data.get("status")
    if status in _SUNO_RUNNING:
        return Observation(state=TaskState.RUNNING)
    tracks = _mapping(data.get("response")).get("sunoData")
    if status == "SUCCESS":
        return suno_tracks(tracks)
    if status == _SUNO_CALLBACK_FAILED:
        # KIE could not deliver its callback: the music may well be there.
        seen = suno_tracks(tracks)
        if seen.state is TaskState.SUCCEEDED:
            return seen
        return ended(TaskState.FAILED, secrets, data.get("errorMessage"), data.get("errorCode"), status)
    if status in _SUNO_FAILED:
        return ended(TaskState.FAILED, secrets, data.get("errorMessage"), data.get("errorCode"), status)
    raise _unknown_state("status", status, secrets)


def _echo_param_json(data: Mapping[str, Any]) -> Mapping[str, Any]:
    return _json_object(data.get("paramJson"))


def _echo_param(data: Mapping[str, Any]) -> Mapping[str, Any]:
    return _json_object(data.get("param"))


def _echo_none(data: Mapping[str, Any]) -> Mapping[str, Any]:
    return {}


# The lost-webhook check and poll schedule of each family (the seed's table).
_MINUTE = 60.0
_DAY = 24 * 3600.0
VEO_TIMINGS: dict[str, Any] = {"stale_after_s": 25 * _MINUTE, "poll_delays_s": (10.0, 15.0, 20.0, 30.0)}
RUNWAY_TIMINGS: dict[str, Any] = {"stale_after_s": 25 * _MINUTE, "poll_delays_s": (5.0, 10.0, 15.0, 30.0),
                                  "output_ttl_s": 14 * _DAY}
FLUX_TIMINGS: dict[str, Any] = {"stale_after_s": 10 * _MINUTE, "poll_delays_s": (2.0, 3.0, 5.0, 10.0),
                                "output_ttl_s": 14 * _DAY}
SUNO_TIMINGS: dict[str, Any] = {"stale_after_s": 30 * _MINUTE, "poll_delays_s": (10.0, 15.0, 20.0, 30.0)}
LIP_SYNC_TIMINGS: dict[str, Any] = {"stale_after_s": 75 * _MINUTE, "poll_delays_s": (15.0, 30.0, 60.0),
                                    "give_up_after_s": 3 * 3600.0}
# Words in a Market model id that name a lip-sync or talking-avatar model.
LIP_SYNC_WORDS = ("lip-sync", "lipsync", "avatar", "infinitalk", "omnihuman", "speech-to-video")


@dataclass(frozen=True)
class Family:
    """One of KIE's own APIs beside the Market."""

    name: str  # the model prefix, before the "/"
    generate_path: str
    record_path: str
    observe: Callable[[Mapping[str, Any], Secrets], Observation]
    # The create request a status record echoes ({} when it echoes none).
    echo: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    timings: Mapping[str, Any] = field(default_factory=dict)
    # The family's body has no model field: the one model it accepts.
    fixed_model: str | None = None
    # Its generate page requires `callBackUrl`.
    needs_callback: bool = False


VEO = Family("veo", "/api/v1/veo/generate", "/api/v1/veo/record-info", observation_from_veo,
             _echo_param_json, VEO_TIMINGS)
RUNWAY = Family("runway", "/api/v1/runway/generate", "/api/v1/runway/record-detail", observation_from_runway,
                _echo_none, RUNWAY_TIMINGS, fixed_model="generate")
FLUX_KONTEXT = Family("flux-kontext", "/api/v1/flux/kontext/generate", "/api/v1/flux/kontext/record-info",
                      observation_from_flux, _echo_param_json, FLUX_TIMINGS)
SUNO = Family("suno", "/api/v1/generate", "/api/v1/generate/record-info", observation_from_suno, _echo_param,
              SUNO_TIMINGS, needs_callback=True)
FAMILIES = {f.name: f for f in (VEO, RUNWAY, FLUX_KONTEXT, SUNO)}

MARKET_CREATE = "/api/v1/jobs/createTask"
MARKET_RECORD = "/api/v1/jobs/recordInfo"


def family_of(model: str | None) -> tuple[Family | None, str]:
    """The family a model names and the family's own model after the
    prefix; (None, model) for a Market model (pure)."""
    prefix, slash, rest = (model or "").partition("/")
    family = FAMILIES.get(prefix) if slash else None
    return (family, rest) if family is not None else (None, model or "")


def is_lip_sync(model: str) -> bool:
    """Whether a Market model id names a lip-sync or talking-avatar model (pure)."""
    lowered = model.lower()
    return any(word in lowered for word in LIP_SYNC_WORDS)


def timings_for(model: str) -> Mapping[str, Any]:
    """The facts `model`'s jobs have besides the provider's defaults (pure)."""
    family, _ = family_of(model)
    if family is not None:
        return family.timings
    return LIP_SYNC_TIMINGS if is_lip_sync(model) else {}


def family_body(family: Family, model: str, input: Mapping[str, Any], callback_url: str | None) -> dict[str, Any]:
    """The generate body of a family job (pure): the job's input as the
    top-level body, the model and our callback URL set in it. Refuses
    (Rejected, before any call) a model the family cannot take, an input
    that sets either of them otherwise, and a Suno job without a callback."""
    where = f"{NAME}: {family.name}"
    if family.fixed_model is not None:
        if model != family.fixed_model:
            raise Rejected(f"{where} has no model field: the model must be {family.name}/{family.fixed_model}")
    elif not model:
        raise Rejected(f"{where} needs its model after '{family.name}/'")
    if "callBackUrl" in input:
        raise Rejected(f"{where}: input.callBackUrl is set by longcall (PUBLIC_URL), not by the job")
    body = dict(input)
    if family.fixed_model is None:
        if "model" in body and body["model"] != model:
            raise Rejected(f"{where}: input.model differs from the job's model")
        body["model"] = model
    if callback_url:
        body["callBackUrl"] = callback_url
    elif family.needs_callback:
        raise Rejected(f"{where} requires a callBackUrl: set PUBLIC_URL so KIE can call back")
    return body


def echo_matches(echo: Mapping[str, Any], sent: Mapping[str, Any], callback_url: str | None) -> bool:
    """Whether the create request a record echoes can be the one `sent`
    (pure): its callBackUrl, without the query (the token), when it echoes
    one; else its model when it echoes one; a record that echoes neither
    contradicts nothing."""
    echoed = echo.get("callBackUrl")
    if isinstance(echoed, str) and callback_url:
        return without_query(echoed) == without_query(callback_url)
    if "model" in echo and "model" in sent:
        return echo["model"] == sent["model"]
    return True


# ------------------------------------------------------------------ webhooks (pure)


_TASK_ID_FIELDS = (("data", "taskId"), ("data", "task_id"), ("taskId",))


def callback_task_id(raw_body: bytes) -> str | None:
    """The task a callback names: `data.taskId` (Market, Veo, Flux Kontext),
    `data.task_id` (Runway, Suno) or a top-level `taskId` (pure)."""
    for path in _TASK_ID_FIELDS:
        task_id = claimed_id(webhook_field(raw_body, *path))
        if task_id is not None:
            return task_id
    return None


# Suno's stage reports: the end comes in a later callback.
STAGE_CALLBACKS = ("text", "first")


def is_stage_callback(raw_body: bytes) -> bool:
    return webhook_field(raw_body, "data", "callbackType") in STAGE_CALLBACKS


def kie_signature(key: str, task_id: str, timestamp: int) -> str:
    """KIE's X-Webhook-Signature: base64(HMAC-SHA256(key, "{taskId}.{timestamp}"))."""
    digest = hmac.new(key.encode("utf-8"), f"{task_id}.{timestamp}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_ok(key: str, headers: Mapping[str, str], raw_body: bytes, now: float) -> bool:
    """KIE's optional signature (pure): `X-Webhook-Timestamp` (unix seconds,
    within TOLERANCE_S of `now`, either way) and `X-Webhook-Signature` over
    the task id the body names. Never raises."""
    stamp, given = headers.get("x-webhook-timestamp"), headers.get("x-webhook-signature")
    task_id = callback_task_id(raw_body)
    if not (isinstance(stamp, str) and stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        return False
    if not isinstance(given, str) or task_id is None or abs(now - int(stamp)) > TOLERANCE_S:
        return False
    return hmac.compare_digest(given.encode("ascii", "replace"), kie_signature(key, task_id, int(stamp)).encode())


# ------------------------------------------------------------------ the adapter


class KieProvider(Provider):
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        secret_keys: Sequence[bytes],
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
        stale_after_s: float | None = None,
        webhook_hmac_key: str | None = None,
    ):
        """`stale_after_s`: when given (STALE_AFTER_S), every model's
        lost-webhook check; else each family's own. `webhook_hmac_key`: the
        account's `webhookHmacKey`, when enabled there: callbacks must then
        carry KIE's signature too."""
        if not secret_keys:
            raise ValueError("KieProvider needs at least one server secret key")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._secret_keys = tuple(secret_keys)
        self._hmac_key = webhook_hmac_key or None
        self._stale_override = stale_after_s
        self._http = Clients(timeout_s, client)
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="capability-url",
            idempotent_submit=False,
            can_find=False,
            # No cancel endpoint on any KIE API: a cancelled job is refunded
            # here while KIE may run (and bill) the task.
            can_cancel=False,
            stale_after_s=60.0 if stale_after_s is None else stale_after_s,
            output_hosts=(
                "tempfile.aiquickdraw.com",
                ".aiquickdraw.com",
                "tempfile.redpandaai.co",
                ".redpandaai.co",
                ".kie.ai",
                host_of(self.base_url),
            ),
            # KIE keeps generated files for about a day; we copy them at once.
            output_ttl_s=24 * 3600.0,
        )

    def __repr__(self) -> str:
        return f"KieProvider({self.base_url!r})"

    def facts_for(self, model: str) -> ProviderFacts:
        timings = dict(timings_for(model))
        if timings and self._stale_override is not None:
            timings["stale_after_s"] = self._stale_override
        return dataclasses.replace(self.facts, **timings) if timings else self.facts

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._api_key, self._hmac_key)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        # The callback URL carries our capability token already (Settings.callback_url).
        secrets = self._secrets.plus_callback(request.callback_url)
        family, model = family_of(request.model)
        if family is None:
            body: dict[str, Any] = {"model": request.model, "input": dict(request.input)}
            if request.callback_url:
                body["callBackUrl"] = request.callback_url
            path = MARKET_CREATE
        else:
            body, path = family_body(family, model, request.input, request.callback_url), family.generate_path
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}{path}",
            json=body, headers=self._headers(), secrets=secrets,
        )
        data = json_object(response, NAME, Uncertain)
        return Submitted(task_id=submit_outcome(data, secrets))

    async def _record(self, task_id: str, model: str | None) -> tuple[Family | None, dict]:
        family, _ = family_of(model)
        path = family.record_path if family is not None else MARKET_RECORD
        response = await read_call(
            self._http.reads, NAME, "GET", f"{self.base_url}{path}",
            params={"taskId": task_id}, headers=self._headers(), secrets=self._secrets,
            not_found=None,  # KIE says "no such task" with body code 404, not HTTP 404
        )
        return family, json_object(response, NAME, Transient)

    async def status(self, task: Task) -> Observation:
        family, body = await self._record(task.task_id, task.model)
        return record_outcome(body, self._secrets, family.observe if family else observation_from_record)

    async def cancel(self, task: Task) -> None:
        return None  # KIE has no cancel endpoint (facts.can_cancel is False): the task runs out on its own

    async def find(self, request: SubmitRequest) -> Submitted | None:
        return None

    async def verify(self, webhook: WebhookRequest) -> bool:
        # Our capability token first. KIE's X-Webhook-Signature, when the
        # account enables it (and we hold its key), signs `taskId.timestamp`
        # and not the body, so it proves less than the token does; nor is
        # the body trusted for state: status() asks the status endpoint.
        try:
            if not check_capability_token(webhook.query.get("token"), NAME, webhook.job_id, self._secret_keys):
                return False
            return self._hmac_key is None or signature_ok(self._hmac_key, webhook.headers, webhook.raw_body,
                                                          time.time())
        except Exception:
            return False

    def webhook_task_id(self, webhook: WebhookRequest) -> str | None:
        return callback_task_id(webhook.raw_body)

    def is_final_webhook(self, webhook: WebhookRequest) -> bool:
        # Suno reports `text` and `first` before the tracks are done.
        return not is_stage_callback(webhook.raw_body)

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """The status endpoint with our key (code 404: KIE does not know the
        task), and the create request the task echoes must be this job's."""
        family, body = await self._record(task_id, request.model)
        try:
            record_outcome(body, self._secrets, family.observe if family else observation_from_record)
        except Rejected:
            return None
        data = body.get("data")
        if not isinstance(data, Mapping) or data.get("taskId") not in (None, task_id):
            return None
        if family is None:
            return Submitted(task_id=task_id) if made_for(data, request) else None
        try:
            sent = family_body(family, family_of(request.model)[1], request.input, request.callback_url)
        except Rejected:
            return None  # this job could not have sent a task
        return Submitted(task_id=task_id) if echo_matches(family.echo(data), sent, request.callback_url) else None

    async def aclose(self) -> None:
        await self._http.aclose()
