"""KIE under /kie: its Market jobs API and its own families (Veo 3.1,
Runway, Flux Kontext, Suno), each answering only the fields its page
documents (docs.kie.ai: /market/common/get-task-detail; /veo3-api/...,
/runway-api/..., /flux-kontext-api/..., /suno-api/...: the generate,
details and callbacks pages of each).

KIE answers HTTP 200 and puts the outcome in the body's `code` (200 ok,
401 unauthorized, 404 not found, 422 validation...); only a real server
failure (the simulated 500 faults) and the throttle's 429 are non-2xx HTTP
statuses. KIE has no cancel endpoint and reports no cost.

Market: states go waiting -> queuing -> generating -> success | fail;
`param` and `resultJson` are JSON *strings*, times epoch milliseconds. The
envelope's text key differs by page in KIE's docs: createTask's examples say
`msg`, the current Get Task Details page says `message`; each route here
answers its own page's form. The Market callback has no page of its own; it
is sent as the recordInfo answer for the task at that moment.
`output_text` is ignored here and in the families: their documented
answers carry file URLs only (`resultUrls`, `videoUrl`, audio URLs).

The families (every page's envelope says `msg`; the `input` controls ride in
the top-level body, beside the family's own fields):
- Veo 3.1 (`POST /api/v1/veo/generate`, `GET /api/v1/veo/record-info`):
  `successFlag` 0 generating, 1 success, 3 generation failed; `response`
  `{taskId, resultUrls, originUrls, resolution}`; times "YYYY-MM-DD hh:mm:ss".
  Callback `{code, msg, data: {taskId, info: {resultUrls, originUrls,
  resolution}, fallbackFlag}}`, code 501 without `info` on failure.
- Runway (`POST /api/v1/runway/generate`, `GET /api/v1/runway/record-detail`):
  `state` wait, queueing, generating, success, fail; `videoInfo` `{videoId,
  taskId, videoUrl, imageUrl}`, integer `failCode` 400, `expireFlag` 1 once
  the output lifetime (`output_ttl_s`) is over. Callback `{code, msg, data:
  {task_id, video_id, video_url, image_url}}` (snake_case), code 400 on
  failure. One video per task.
- Flux Kontext (`POST /api/v1/flux/kontext/generate`,
  `GET /api/v1/flux/kontext/record-info`): `successFlag` 0, 1, 3; `response`
  `{originImageUrl, resultImageUrl}`; ISO times. Callback `{code, msg, data:
  {taskId, info: {originImageUrl, resultImageUrl}}}`, 501 without `info` on
  failure. One image per task, JPEG unless `outputFormat` is `png`.
- Suno (`POST /api/v1/generate`, `GET /api/v1/generate/record-info`):
  `status` PENDING -> TEXT_SUCCESS -> FIRST_SUCCESS -> SUCCESS, or
  GENERATE_AUDIO_FAILED; `response.sunoData[]` the tracks done so far (two
  by default: the `outputs` control is the number of tracks). Staged
  callbacks `{code, msg, data: {callbackType, task_id, data}}`: `text` at a
  third of the run, `first` at two thirds, `complete` at the end, or one
  `error` (code 501, `data: null`) for a failure; tracks in callbacks are
  snake_case (`audio_url`...). Audio is `audio/mpeg`.

With `output_duration_s` an output is a real media file of that many
seconds (app/simulator/media.py): an MP4 for Veo and Runway (`video/mp4`),
a WAV (`audio/wav`) for the Market, Flux Kontext and Suno unless
`content_type` names a video type.

Each family refuses (code 422) what its generate page marks required and a
`model` outside its page's enum: Veo `prompt`, `model` veo3 | veo3_fast |
veo3_lite (the Chinese page names Veo 3.1 Lite; the English enum has the
first two); Runway `prompt`, `duration`, `quality` (no model field); Flux
`prompt`, `model` flux-kontext-pro | flux-kontext-max; Suno `model` V3_5 |
V4 | V4_5 | V4_5PLUS | V5, `callBackUrl`, `customMode`, `instrumental`, and
`style` and `title` in custom mode, `prompt` unless custom and instrumental.

Where the pages are silent, the simulator's choices: failures are
`successFlag` 3 (Veo, Flux: created, then generation failed) with `errorCode`
501; records of unfinished tasks have `response`/`videoInfo` null and empty
times; `originUrls` is empty (16:9 is the default), `resolution` "720p";
Flux's `originImageUrl` echoes `inputImage` ("" without one); Runway's
`generateParam` echoes `prompt` and `imageUrl`, `expandPrompt` false, and
its thumbnail `imageUrl` is ""; Suno tracks have ids derived from the task
id, `streamAudioUrl` the same file as `audioUrl`, no cover (`imageUrl` ""),
a `duration` of 30 s each (or `output_duration_s`: then each track is a
real WAV of that length, `audio/wav` unless `content_type` says), `modelName` "chirp-" + the model in lower case
(V3_5 -> chirp-v3-5, the pages' example), a failed task reports no stage
before its `error`, and a `text` callback carries no track (`data: []`);
times are UTC. Echoes of the create request (`paramJson`, Suno `param`)
are the request body as sent, callBackUrl included (as the Luma Modify
page's example shows).

Callbacks are unsigned unless a `webhookHmacKey` is set (KIE's account
setting; here `PUT /_sim/kie/webhook-hmac-key`): then they carry KIE's
`X-Webhook-Timestamp` and `X-Webhook-Signature`
(https://docs.kie.ai/common-api/webhook-verification), which sign only
`taskId.timestamp`, never the body, with the task id of every family.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.simulator.controls import ControlError, Controls, parse_controls, with_default_type
from app.simulator.engine import Simulator
from app.simulator.state import QUEUED_SHARE, Phase, Task
from app.simulator.webhooks import OutgoingWebhook
from app.simulator.wire import (
    THROTTLE_RETRY_AFTER_S,
    BadBody,
    HoldThenDrop,
    auth_token,
    dumps,
    is_http_url,
    read_json,
    server_base,
)

PROTOCOL = "kie"
PREFIX = "/kie"
# The failCode of a failed task: the code KIE's docs give "Generation Failed".
GENERATION_FAILED = "501"
UNAUTHORIZED = "You do not have access permissions"
# The code table's name for 429.
RATE_LIMITED = "Rate Limited"
MARKET = "market"


class Invalid(ValueError):
    """A create body the family refuses (code 422, nothing created)."""


def _envelope(text_key: str, code: int, text: str, data: Any = None) -> dict[str, Any]:
    return {"code": code, text_key: text, "data": data}


def _answer(text_key: str, code: int, text: str, data: Any = None, http_status: int = 200) -> JSONResponse:
    response = JSONResponse(_envelope(text_key, code, text, data), status_code=http_status)
    if http_status == 429:
        response.headers["retry-after"] = str(THROTTLE_RETRY_AFTER_S)
    return response


def _ms(ts: float) -> int:
    return int(ts * 1000)


def _clock(ts: float) -> str:
    """"2025-06-06 10:30:00" (Veo, Runway, Suno), UTC."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _iso(ts: float) -> str:
    """"2024-03-20T10:30:00Z" (Flux Kontext)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _queued_word(task: Task, now: float, first: str, second: str) -> tuple[str, float]:
    """A queued task's word: `first` for the first half of its wait, then `second`."""
    turns_at = task.created_at + QUEUED_SHARE * task.controls.duration_s / 2
    return (first, task.created_at) if now < turns_at else (second, turns_at)


# ------------------------------------------------------------------ Market


def record_view(task: Task, now: float) -> dict[str, Any]:
    """The task as Get Task Details' `data`: exactly the fields that page lists."""
    phase = task.phase(now)
    if phase is Phase.QUEUED:
        state, updated = _queued_word(task, now, "waiting", "queuing")
    elif phase is Phase.RUNNING:
        state, updated = "generating", task.started_at
    elif phase is Phase.SUCCEEDED:
        state, updated = "success", task.finished_at
    else:
        state, updated = "fail", task.finished_at
    failed = state == "fail"
    return {
        "taskId": task.id,
        "model": task.model,
        "state": state,
        "param": task.extra["param"],
        "resultJson": json.dumps({"resultUrls": task.output_urls()}) if state == "success" else "",
        "failCode": GENERATION_FAILED if failed else "",
        "failMsg": task.error(now) if failed else "",
        "completeTime": _ms(task.finished_at) if phase.terminal else None,
        "createTime": _ms(task.created_at),
        "updateTime": _ms(updated),
    }


def request_param(model: str, callback_url: str | None, task_input: dict[str, Any]) -> str:
    """`param`: the create request as KIE echoes it, a JSON string."""
    request: dict[str, Any] = {"model": model}
    if callback_url is not None:
        request["callBackUrl"] = callback_url
    request["input"] = task_input
    return json.dumps(request)


def _market_callback(task: Task, event: str, now: float) -> dict[str, Any] | None:
    return _envelope("message", 200, "success", record_view(task, now)) if event == "completed" else None


# ------------------------------------------------------------------ Veo 3.1


def _done(task: Task, now: float) -> tuple[Phase, bool, bool]:
    phase = task.phase(now)
    return phase, phase is Phase.SUCCEEDED, phase in (Phase.FAILED, Phase.CANCELLED)


def veo_view(task: Task, now: float) -> dict[str, Any]:
    """The task as Get Veo3.1 Video Details' `data`."""
    phase, done, failed = _done(task, now)
    return {
        "taskId": task.id,
        "paramJson": task.extra["param"],
        "completeTime": _clock(task.finished_at) if phase.terminal else None,
        "response": {"taskId": task.id, "resultUrls": task.output_urls(), "originUrls": [],
                     "resolution": "720p"} if done else None,
        "successFlag": 1 if done else 3 if failed else 0,
        "errorCode": int(GENERATION_FAILED) if failed else None,
        "errorMessage": task.error(now) if failed else "",
        "createTime": _clock(task.created_at),
        "fallbackFlag": False,
    }


def _veo_callback(task: Task, event: str, now: float) -> dict[str, Any] | None:
    if event != "completed":
        return None
    view = veo_view(task, now)
    if view["successFlag"] == 1:
        info = {k: view["response"][k] for k in ("resultUrls", "originUrls", "resolution")}
        return _envelope("msg", 200, "Veo3.1 video generated successfully.",
                         {"taskId": task.id, "info": info, "fallbackFlag": False})
    return _envelope("msg", 501, view["errorMessage"], {"taskId": task.id, "fallbackFlag": False})


# ------------------------------------------------------------------ Runway


def _runway_video_id(task: Task) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kie-runway/{task.id}"))


def runway_view(task: Task, now: float) -> dict[str, Any]:
    """The task as Get AI Video Details' `data`."""
    phase, done, failed = _done(task, now)
    if phase is Phase.QUEUED:
        state, _ = _queued_word(task, now, "wait", "queueing")
    else:
        state = {Phase.RUNNING: "generating", Phase.SUCCEEDED: "success"}.get(phase, "fail")
    body = task.extra["body"]
    urls = task.output_urls()
    return {
        "taskId": task.id,
        "parentTaskId": "",
        "generateParam": {"prompt": body.get("prompt", ""), "imageUrl": body.get("imageUrl", ""),
                          "expandPrompt": False},
        "state": state,
        "generateTime": _clock(task.finished_at) if phase.terminal else "",
        "videoInfo": {"videoId": _runway_video_id(task), "taskId": task.id, "videoUrl": urls[0] if urls else "",
                      "imageUrl": ""} if done else None,
        "failCode": 400 if failed else None,
        "failMsg": task.error(now) if failed else "",
        "expireFlag": 1 if done and now >= task.outputs_expire_at else 0,
    }


def _runway_callback(task: Task, event: str, now: float) -> dict[str, Any] | None:
    if event != "completed":
        return None
    view = runway_view(task, now)
    video = view["videoInfo"] or {}
    data = {"task_id": task.id, "video_id": video.get("videoId", ""), "video_url": video.get("videoUrl", ""),
            "image_url": video.get("imageUrl", "")}
    if view["state"] == "success":
        return _envelope("msg", 200, "All generated successfully.", data)
    return _envelope("msg", 400, view["failMsg"], data)


# ------------------------------------------------------------------ Flux Kontext


def flux_view(task: Task, now: float) -> dict[str, Any]:
    """The task as Get Image Details' `data`."""
    phase, done, failed = _done(task, now)
    urls = task.output_urls()
    origin = task.extra["body"].get("inputImage")
    return {
        "taskId": task.id,
        "paramJson": task.extra["param"],
        "completeTime": _iso(task.finished_at) if phase.terminal else None,
        "response": {"originImageUrl": origin if isinstance(origin, str) else "",
                     "resultImageUrl": urls[0] if urls else ""} if done else None,
        "successFlag": 1 if done else 3 if failed else 0,
        "errorCode": int(GENERATION_FAILED) if failed else None,
        "errorMessage": task.error(now) if failed else "",
        "createTime": _iso(task.created_at),
    }


def _flux_callback(task: Task, event: str, now: float) -> dict[str, Any] | None:
    if event != "completed":
        return None
    view = flux_view(task, now)
    if view["successFlag"] == 1:
        return _envelope("msg", 200, "BFL image generated successfully.",
                         {"taskId": task.id, "info": view["response"]})
    return _envelope("msg", 501, view["errorMessage"], {"taskId": task.id})


# ------------------------------------------------------------------ Suno

SUNO_TRACK_SECONDS = 30.0
SUNO_TRACKS = 2  # "usually two" per task: the default of the `outputs` control here
TEXT, FIRST = "text", "first"


def suno_stage_at(task: Task, stage: str) -> float:
    """When a Suno task's lyrics (`text`) or first track (`first`) are done."""
    share = 1 / 3 if stage == TEXT else 2 / 3
    return task.started_at + share * (task.done_at - task.started_at)


def _suno_track(task: Task, index: int, url: str) -> dict[str, Any]:
    body = task.extra["body"]
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kie-suno/{task.id}/{index}")),
        "audioUrl": url,
        "streamAudioUrl": url,
        "imageUrl": "",
        "prompt": body.get("prompt", ""),
        "modelName": "chirp-" + str(body.get("model", "")).lower().replace("_", "-"),
        "title": body.get("title", ""),
        "tags": body.get("style", ""),
        "createTime": _clock(task.created_at),
        "duration": task.controls.output_duration_s or SUNO_TRACK_SECONDS,
    }


def _suno_tracks(task: Task, count: int | None = None) -> list[dict[str, Any]]:
    urls = task.output_urls()[:count]
    return [_suno_track(task, index, url) for index, url in enumerate(urls)]


def _suno_status(task: Task, now: float) -> str:
    phase, done, failed = _done(task, now)
    if done:
        return "SUCCESS"
    if failed:
        return "GENERATE_AUDIO_FAILED"
    if task.controls.outcome == "succeeded" and now >= suno_stage_at(task, FIRST):
        return "FIRST_SUCCESS"
    if task.controls.outcome == "succeeded" and now >= suno_stage_at(task, TEXT):
        return "TEXT_SUCCESS"
    return "PENDING"


def suno_view(task: Task, now: float) -> dict[str, Any]:
    """The task as Get Music Task Details' `data`."""
    status = _suno_status(task, now)
    tracks = {"SUCCESS": None, "FIRST_SUCCESS": 1}.get(status, 0)
    failed = status == "GENERATE_AUDIO_FAILED"
    return {
        "taskId": task.id,
        "parentMusicId": "",
        "param": task.extra["param"],
        "response": {"taskId": task.id, "sunoData": _suno_tracks(task, tracks)},
        "status": status,
        "type": "GENERATE",
        "errorCode": int(GENERATION_FAILED) if failed else None,
        "errorMessage": task.error(now) if failed else None,
    }


def _snake_track(track: Mapping[str, Any]) -> dict[str, Any]:
    """A track as Suno's callbacks write it."""
    names = {"audioUrl": "audio_url", "streamAudioUrl": "stream_audio_url", "imageUrl": "image_url",
             "modelName": "model_name"}
    return {names.get(key, key): value for key, value in track.items()}


def _suno_callback(task: Task, event: str, now: float) -> dict[str, Any] | None:
    if event == TEXT:
        return _envelope("msg", 200, "Text generation completed.",
                         {"callbackType": TEXT, "task_id": task.id, "data": []})
    if event == FIRST:
        return _envelope("msg", 200, "First track generated successfully.",
                         {"callbackType": FIRST, "task_id": task.id,
                          "data": [_snake_track(t) for t in _suno_tracks(task, 1)]})
    if event != "completed":
        return None
    if task.phase(now) is Phase.SUCCEEDED:
        return _envelope("msg", 200, "All generated successfully.",
                         {"callbackType": "complete", "task_id": task.id,
                          "data": [_snake_track(t) for t in _suno_tracks(task)]})
    return _envelope("msg", 501, "Audio generation failed", {"callbackType": "error", "task_id": task.id,
                                                            "data": None})


# ------------------------------------------------------------------ the families' create bodies


def _required(body: Mapping[str, Any], *names: str) -> None:
    for name in names:
        if body.get(name) in (None, ""):
            raise Invalid(f"{name} is required")


def _enum(body: Mapping[str, Any], name: str, allowed: tuple[str, ...], *, required: bool = False) -> None:
    if name not in body and not required:
        return
    if body.get(name) not in allowed:
        raise Invalid(f"{name} must be one of {', '.join(allowed)}")


def _boolean(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if not isinstance(value, bool):
        raise Invalid(f"{name} is required (true or false)")
    return value


def _check_veo(body: Mapping[str, Any]) -> None:
    _required(body, "prompt")
    _enum(body, "model", ("veo3", "veo3_fast", "veo3_lite"))


def _check_runway(body: Mapping[str, Any]) -> None:
    _required(body, "prompt", "duration", "quality")
    if isinstance(body["duration"], bool) or not isinstance(body["duration"], int | float):
        raise Invalid("duration must be a number of seconds")


def _check_flux(body: Mapping[str, Any]) -> None:
    _required(body, "prompt")
    _enum(body, "model", ("flux-kontext-pro", "flux-kontext-max"))


def _check_suno(body: Mapping[str, Any]) -> None:
    _enum(body, "model", ("V3_5", "V4", "V4_5", "V4_5PLUS", "V5"), required=True)
    _required(body, "callBackUrl")
    custom, instrumental = _boolean(body, "customMode"), _boolean(body, "instrumental")
    if custom:
        _required(body, "style", "title")
    if not (custom and instrumental):
        _required(body, "prompt")


def _same(controls: Controls, body: Mapping[str, Any]) -> Controls:
    return controls


def _video(controls: Controls, body: Mapping[str, Any]) -> Controls:
    return with_default_type(controls, body, "video/mp4")


def _one_video(controls: Controls, body: Mapping[str, Any]) -> Controls:
    return dataclasses.replace(_video(controls, body), outputs=min(controls.outputs, 1))


def _one_image(controls: Controls, body: Mapping[str, Any]) -> Controls:
    kind = "image/png" if body.get("outputFormat") == "png" else "image/jpeg"
    return dataclasses.replace(with_default_type(controls, body, kind), outputs=min(controls.outputs, 1))


def _tracks(controls: Controls, body: Mapping[str, Any]) -> Controls:
    return dataclasses.replace(with_default_type(controls, body, "audio/mpeg"),
                               outputs=controls.outputs if "outputs" in body else SUNO_TRACKS)


def _hex_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Family:
    name: str
    generate_path: str
    record_path: str
    check: Callable[[Mapping[str, Any]], None]
    controls: Callable[[Controls, Mapping[str, Any]], Controls]
    new_id: Callable[[], str]
    view: Callable[[Task, float], dict[str, Any]]
    callback: Callable[[Task, str, float], dict[str, Any] | None]
    default_model: str


FAMILIES = (
    Family("veo", "/api/v1/veo/generate", "/api/v1/veo/record-info", _check_veo, _video,
           lambda: "veo_task_" + secrets.token_hex(12), veo_view, _veo_callback, "veo3_fast"),
    Family("runway", "/api/v1/runway/generate", "/api/v1/runway/record-detail", _check_runway, _one_video,
           lambda: str(uuid.uuid4()), runway_view, _runway_callback, "runway"),
    Family("flux-kontext", "/api/v1/flux/kontext/generate", "/api/v1/flux/kontext/record-info", _check_flux,
           _one_image, _hex_id, flux_view, _flux_callback, "flux-kontext-pro"),
    Family("suno", "/api/v1/generate", "/api/v1/generate/record-info", _check_suno, _tracks, _hex_id,
           suno_view, _suno_callback, "V3_5"),
)
_BY_NAME = {f.name: f for f in FAMILIES}


def _family_of(task: Task) -> str:
    return task.extra.get("family", MARKET)


# ------------------------------------------------------------------ routes


def _rate_limited(text_key: str) -> Response:
    """The protocol's documented 429 (the throttle fault's, and `max_concurrent`'s)."""
    return _answer(text_key, 429, RATE_LIMITED, http_status=429)


def _throttled(sim: Simulator, text_key: str) -> Response | None:
    """The protocol's documented 429 instead of the work, when the throttle fault says so."""
    return _rate_limited(text_key) if sim.fault("throttle") else None


async def _create(request: Request, family: Family | None) -> Response:
    """createTask (`family` None) or a family's generate route."""
    sim: Simulator = request.app.state.sim
    if auth_token(request, "Bearer") is None:
        return _answer("msg", 401, UNAUTHORIZED)
    throttled = _throttled(sim, "msg")
    if throttled is not None:
        return throttled
    if sim.fault("submit_error"):
        return _answer("msg", 500, "simulated server error", http_status=500)
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise Invalid("body must be a JSON object")
        callback_url = body.get("callBackUrl")
        if callback_url is not None and not is_http_url(callback_url):
            raise Invalid("callBackUrl must be an http(s) URL")
        if family is None:
            model, task_input = body.get("model"), body.get("input")
            if not isinstance(model, str) or not model.strip():
                raise Invalid("model is required")
            if not isinstance(task_input, dict):
                raise Invalid("input is required (an object)")
            controls = parse_controls(task_input)
            extra: dict[str, Any] = {"family": MARKET, "param": request_param(model, callback_url, task_input)}
        else:
            family.check(body)
            model, task_input = body.get("model") or family.default_model, body
            controls = family.controls(parse_controls(body), body)
            extra = {"family": family.name, "body": body, "param": json.dumps(body)}
    except (BadBody, Invalid, ControlError) as exc:
        return _answer("msg", 422, str(exc))
    if sim.busy(PREFIX):
        return _rate_limited("msg")
    task = sim.create_task(
        task_id="task_" + secrets.token_hex(16) if family is None else family.new_id(),  # "task_12345678"
        protocol=PROTOCOL,
        model=model,
        input=task_input,
        controls=controls,
        base_url=server_base(request),
        callback_url=callback_url,
        extra=extra,
    )
    if family is not None and family.name == "suno" and callback_url is not None \
            and controls.outcome == "succeeded":
        for stage in (TEXT, FIRST):
            sim.schedule_event(task, stage, suno_stage_at(task, stage))
    if sim.fault("submit_timeout_after_create"):
        return HoldThenDrop(sim.hold_s)
    return _answer("msg", 200, "success", {"taskId": task.id})


async def _record(request: Request, family: Family | None) -> Response:
    """recordInfo (`family` None: its page says `message`) or a family's details route."""
    sim: Simulator = request.app.state.sim
    text_key = "message" if family is None else "msg"
    if auth_token(request, "Bearer") is None:
        return _answer(text_key, 401, UNAUTHORIZED)
    sim.store.stats.status_calls += 1
    throttled = _throttled(sim, text_key)
    if throttled is not None:
        return throttled
    if sim.fault("status_error"):
        return _answer(text_key, 500, "simulated server error", http_status=500)
    task_id = request.query_params.get("taskId")
    if not task_id:
        return _answer(text_key, 422, "taskId is required")
    task = sim.store.get(task_id, PROTOCOL)
    if task is None or _family_of(task) != (MARKET if family is None else family.name):
        return _answer(text_key, 404, "task not found")
    now = time.time()
    return _answer(text_key, 200, "success", record_view(task, now) if family is None else family.view(task, now))


async def create_task(request: Request) -> Response:
    return await _create(request, None)


async def record_info(request: Request) -> Response:
    return await _record(request, None)


def _family_routes(family: Family) -> list[Route]:
    async def generate(request: Request) -> Response:
        return await _create(request, family)

    async def details(request: Request) -> Response:
        return await _record(request, family)

    return [Route(f"{PREFIX}{family.generate_path}", generate, methods=["POST"]),
            Route(f"{PREFIX}{family.record_path}", details, methods=["GET"])]


# ------------------------------------------------------------------ callbacks


def webhook_signature(key: str, task_id: str, timestamp: int) -> str:
    """KIE's X-Webhook-Signature: base64(HMAC-SHA256(key, "{taskId}.{timestamp}"))."""
    digest = hmac.new(key.encode("utf-8"), f"{task_id}.{timestamp}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    if task.callback_url is None:
        return None
    family = _BY_NAME.get(_family_of(task))
    body = family.callback(task, event, now) if family is not None else _market_callback(task, event, now)
    if body is None:
        return None
    key = sim.kie_webhook_hmac_key

    def sign(raw: bytes, t: int) -> dict[str, str]:
        if key is None:
            return {}
        return {"X-Webhook-Timestamp": str(t), "X-Webhook-Signature": webhook_signature(key, task.id, t)}

    return OutgoingWebhook(url=task.callback_url, body=dumps(body), sign=sign)


async def get_hmac_key(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse({"key": sim.kie_webhook_hmac_key})


async def set_hmac_key(request: Request) -> Response:
    """Turn KIE's optional callback signature on for callbacks sent from now."""
    sim: Simulator = request.app.state.sim
    try:
        body = await read_json(request)
    except BadBody as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str) or not key:
        return JSONResponse({"error": 'body must be {"key": "<a non-empty string>"}'}, status_code=400)
    sim.kie_webhook_hmac_key = key
    return JSONResponse({"key": key})


async def clear_hmac_key(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    sim.kie_webhook_hmac_key = None
    return JSONResponse({"key": None})


routes = [
    Route(f"{PREFIX}/api/v1/jobs/createTask", create_task, methods=["POST"]),
    Route(f"{PREFIX}/api/v1/jobs/recordInfo", record_info, methods=["GET"]),
    *(route for family in FAMILIES for route in _family_routes(family)),
    Route("/_sim/kie/webhook-hmac-key", get_hmac_key, methods=["GET"]),
    Route("/_sim/kie/webhook-hmac-key", set_hmac_key, methods=["PUT"]),
    Route("/_sim/kie/webhook-hmac-key", clear_hmac_key, methods=["DELETE"]),
]
