"""ElevenLabs: dubbing, an async task, and the sync calls speech and sound
effects (below).

Dubbing (https://elevenlabs.io/docs/api-reference/dubbing/create;
the official client elevenlabs-python: `dubbing/raw_client.py`,
`dubbing/audio/raw_client.py`, `types/do_dubbing_response.py`,
`types/dubbing_metadata_response.py`).

A dub is an asynchronous task polled to its end: `POST /v1/dubbing` (a
multipart form) answers `{dubbing_id, expected_duration_sec}`; `GET
/v1/dubbing/{id}` says `queued`, `preparing` or `dubbing` (running), `dubbed`
or `failed`; each target language is then one output, `GET
/v1/dubbing/{id}/audio/{language_code}`, which needs our key (`xi-api-key`,
sent by the download to the API's own host only, on the first hop only).
No dubbing webhook exists (polled) and there is no cancel: `DELETE` deletes a
dub, which is not a cancel, and is never called.

The job's input is the form: its fields as they are (`source_url`,
`target_lang`, `source_lang`, `num_speakers`, `watermark`, ...), numbers and
booleans written as the official client writes them (`3`, `true`). The
media comes by URL only: an input without `source_url`, or with a file
field, is refused before anything is sent. `name` is ours: the job id, so a
submit whose answer was lost is found again by listing the account's dubs
(`find`): newest first, back to the job's first submit call (less a margin
for clock skew), a bounded number of pages. A dub is made for one target
language (`target_lang` takes one code); the dub's `target_languages` are its
outputs, each labelled with its code, and the requested language is kept
in the task's operation for a dub that lists none.

Where the documents are silent, the choices here: the list is asked for
`order_by=created_at&order_direction=DESCENDING` explicitly (its default
order is not documented); a dubbed dub with no target language at all is a
failure (nothing to fetch); `media_metadata.duration` is reported as the
usage in seconds (the dub's media length, as ElevenLabs bills dubbing by
the minute); an unknown `status` is a read to repeat (Transient).

Sync models (https://elevenlabs.io/docs/api-reference/text-to-speech/convert,
.../text-to-sound-effects/convert, .../history/list, .../history/get-audio;
the official client's `text_to_speech/raw_client.py`,
`text_to_sound_effects/raw_client.py`, `history/raw_client.py`,
`types/speech_history_item_response.py`; the API's OpenAPI in
elevenlabs-docs `fern/apis/api/openapi.json`). They are called, never
submitted (`submit` refuses them; `call` refuses `dubbing`):
- `text-to-speech/<voice_id>`: `POST /v1/text-to-speech/{voice_id}` (the
  voice id URL-quoted; an empty one, one with a `/`, `.` or `..` is refused:
  a dot segment would be resolved away by the URL, sending the call
  elsewhere);
- `sound-generation`: `POST /v1/sound-generation`.
The job's input is the endpoint's JSON body, except the endpoint's query
parameters, which the official client sends as the query and which are
taken out of the input for it: `output_format`, `enable_logging` and
`optimize_streaming_latency` for speech, `output_format` alone for sound
effects (the client and the OpenAPI declare no other query there: any other
key, `enable_logging` included, stays in the body as written; sound effects
are never in the history anyway). A query value is written as the client
writes it (`true`/`false`, `3`); null leaves it out; a value of another
type than the documented one (a string, a boolean, an integer) is refused
before sending, as is an input without a non-empty string `text`. The
answer is the audio, streamed to a file of ours (output 0, of the answer's
`Content-Type`); its usage is CHARACTERS: the length of the `text` sent
(not the `character-cost` header, ElevenLabs' credits for the call); its
`request_id` the `request-id` header. A 2xx answer
with no byte of audio is a call whose answer we cannot use (Uncertain).

A lost speech call is recovered from the speech history ("Music and SFX
generations are not included": sound effects cannot be): the voice's `TTS`
items are listed newest first (`voice_id`, `source=TTS`, `page_size`,
`sort_direction=desc`, then `start_after_history_item_id`), a bounded
number of pages (`find_max_pages`), back to the call's start less the
clock-skew margin (`date_unix`, by ElevenLabs' clock). Only an item that is
unambiguously this call's is adopted: source `TTS`, the same voice id, the
same `model_id` (the input's, or the documented default
`eleven_multilingual_v2`, the OpenAPI's default of the body's field), the
same text exactly, made at or after that time. One such item: its audio
(`GET /v1/history/{id}/audio`) is the answer, with the characters of `text`
as usage (the audio read has no `character-cost`) and the item's
`request_id`. Several: Rejected (ambiguous, never adopted); none: None. A
window holding more pages than the bound is Rejected too (an older match
could make the one found ambiguous). The model id is matched here rather
than sent as the list's filter (the client describes that filter as a
"search term", which says nothing exact). `enable_logging=false` ("zero
retention mode ... history features are unavailable") means no item will
exist: None at once, nothing asked. Without the call's start time there is
no window to tell this call's item from another's: None. A history read
that fails, or whose audio breaks off, is Transient (a read to repeat).
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx

from app.providers.base import (
    ELEVENLABS_SOUND_MODEL,
    ELEVENLABS_SPEECH_PREFIX,
    LOST_CALL_MARGIN_S,
    SYNC_CALL_TIMEOUT_S,
    Observation,
    OutputFile,
    Provider,
    ProviderFacts,
    ProviderKind,
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
)
from app.providers.http import (
    Clients,
    Secrets,
    ended,
    host_of,
    json_object,
    read_call,
    read_error_body,
    streamed_read,
    submit_call,
    sync_call,
)
from app.providers.inline import write_answer
from app.vocabulary import ProviderName

NAME = ProviderName.ELEVENLABS
MODEL = "dubbing"

# `status` of a dub: the list filter's five values
# (types DubbingListRequestDubbingStatusesItem); only dubbed and failed end.
_STATES = {
    "queued": TaskState.RUNNING,
    "preparing": TaskState.RUNNING,
    "dubbing": TaskState.RUNNING,
    "dubbed": TaskState.SUCCEEDED,
    "failed": TaskState.FAILED,
}
# The create form's file fields: never sent (the media comes by URL).
UPLOAD_FIELDS = ("file", "csv_file", "foreground_audio_file", "background_audio_file")
# Dubbing takes minutes: a first look after 10 s, then every 15-30 s.
POLL_DELAYS_S = (10.0, 15.0, 20.0, 30.0)
# ElevenLabs stamps `created_at` by its clock, our first submit time is by
# the database's: look this much further back than that time.
FIND_CLOCK_SKEW_S = 60.0
FIND_PAGE_SIZE = 100  # the list's default; at most 200
# The list order `find` relies on: newest first.
FIND_ORDER = {"order_by": "created_at", "order_direction": "DESCENDING"}


def check_model(model: str) -> None:
    """Only the asynchronous `dubbing` is submitted (pure)."""
    if model != MODEL:
        raise Rejected(f"{NAME}: model must be {MODEL}; text-to-speech/<voice_id> and sound-generation "
                       "are sync models, called and never submitted")


def form_value(value: Any) -> str | None:
    """A JSON input value as a form field's text, as the official client
    (httpx) writes it (pure): strings as they are, booleans `true`/`false`,
    numbers in their shortest form. None for a value no form field holds
    (an object, a list, a number that is not finite)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def form_fields(job_input: Mapping[str, Any], job_id: str) -> list[tuple[str, str]]:
    """The create form for a job's input (pure): `name` = the job id, then
    each input field (null ones left out, as the official client leaves
    them). Rejected, before anything is sent, for what cannot be a dub of a
    URL: no `source_url`, a file field, a `name` of the user's (ours finds
    the dub again), a value no form field holds."""
    for key in UPLOAD_FIELDS:
        if key in job_input:
            raise Rejected(f"{NAME}: input.{key}: file uploads are not supported; give the media as source_url")
    source_url = job_input.get("source_url")
    if not isinstance(source_url, str) or not source_url.strip():
        raise Rejected(f"{NAME}: input.source_url is required: the URL of the video or audio to dub")
    if "name" in job_input:
        raise Rejected(f"{NAME}: input.name is set by longcall (the job id, by which a lost submit is found)")
    fields = [("name", job_id)]
    for key, value in job_input.items():
        if value is None:
            continue
        text = form_value(value)
        if text is None:
            raise Rejected(f"{NAME}: input.{key} must be a string, a number or a boolean")
        fields.append((key, text))
    return fields


def requested_languages(job_input: Mapping[str, Any]) -> list[str]:
    """The target languages a job asks for (pure): its `target_lang`."""
    target = job_input.get("target_lang")
    return [target] if isinstance(target, str) and target else []


def operation_for(job_input: Mapping[str, Any]) -> dict[str, Any] | None:
    languages = requested_languages(job_input)
    return {"target_languages": languages} if languages else None


def submitted_from(body: Mapping[str, Any], operation: Mapping[str, Any] | None) -> Submitted:
    """A create answer `{dubbing_id, expected_duration_sec}` as the task (pure)."""
    dubbing_id = claimed_id(body.get("dubbing_id"))
    if dubbing_id is None:
        raise Uncertain(f"{NAME}: submit answer has no dubbing_id")
    return Submitted(task_id=dubbing_id, operation=operation)


def languages_of(value: Any) -> tuple[str, ...]:
    """Language codes from a JSON list, without blanks or duplicates (pure)."""
    if not isinstance(value, list):
        return ()
    return tuple(dict.fromkeys(v for v in value if isinstance(v, str) and v.strip()))


def audio_url(base_url: str, dubbing_id: str, language: str) -> str:
    return f"{base_url}/v1/dubbing/{quote(dubbing_id, safe='')}/audio/{quote(language, safe='')}"


def observation_from_dub(body: Mapping[str, Any], task: Task, base_url: str, secrets: Secrets) -> Observation:
    """A `DubbingMetadataResponse` as an Observation (pure): a dubbed dub's
    outputs are its target languages' audio (the languages the answer lists;
    the requested ones, kept in the operation, if it lists none), each
    labelled with its code."""
    state = _STATES.get(body.get("status"))  # type: ignore[arg-type]
    if state is None:
        raise Transient(f"{NAME}: unknown dub status {secrets.mask(str(body.get('status')), 40)!r}")
    if state is TaskState.FAILED:
        return ended(state, secrets, body.get("error"), fallback="the dub failed")
    if state is TaskState.RUNNING:
        return Observation(state=state)
    operation = task.operation or {}
    languages = languages_of(body.get("target_languages")) or languages_of(operation.get("target_languages"))
    if not languages:
        return Observation(state=TaskState.FAILED, error="the dub succeeded with no target language to fetch")
    return Observation(
        state=state,
        output_urls=tuple(audio_url(base_url, task.task_id, language) for language in languages),
        url_labels=languages,
        usage=_usage(body.get("media_metadata")),
    )


def _usage(media: Any) -> tuple[Usage, ...]:
    duration = media.get("duration") if isinstance(media, Mapping) else None
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not 0 <= duration < math.inf:
        return ()
    return (Usage(UsageUnit.SECONDS, float(duration)),)


def created_at(dub: Mapping[str, Any]) -> datetime | None:
    value = dub.get("created_at")
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)  # the documented "2024-01-15T09:30:00Z" (Python 3.11 reads the Z)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def page_matches(dubs: Sequence[Any], job_id: str) -> list[str]:
    """The ids of a list page's dubs named after `job_id` (pure)."""
    found = []
    for dub in dubs:
        if isinstance(dub, Mapping) and dub.get("name") == job_id:
            dubbing_id = claimed_id(dub.get("dubbing_id"))
            if dubbing_id is not None:
                found.append(dubbing_id)
    return found


def reaches_back_to(dubs: Sequence[Any], since: datetime) -> bool:
    """Whether a newest-first page holds a dub made before `since` (pure):
    no later page can hold one of this job's."""
    for dub in dubs:
        made = created_at(dub) if isinstance(dub, Mapping) else None
        if made is not None and made < since:
            return True
    return False


# ------------------------------------------------------------------ sync calls: speech and sound effects

SPEECH_PREFIX = ELEVENLABS_SPEECH_PREFIX
SOUND_MODEL = ELEVENLABS_SOUND_MODEL
# The body's `model_id` when none is given (the OpenAPI's default of
# Body_Text_to_speech_v1_text_to_speech__voice_id__post.model_id).
DEFAULT_SPEECH_MODEL_ID = "eleven_multilingual_v2"
# The query parameters each endpoint declares (the official client's
# `params=`); every other input key is the JSON body's.
SPEECH_QUERY = ("output_format", "enable_logging", "optimize_streaming_latency")
SOUND_QUERY = ("output_format",)
# Each query parameter's documented type: its JSON type and how it is written.
_QUERY_TYPES: dict[str, tuple[str, Any]] = {
    "output_format": ("a string", lambda v: v if isinstance(v, str) else None),
    "enable_logging": ("a boolean", lambda v: ("true" if v else "false") if isinstance(v, bool) else None),
    "optimize_streaming_latency": ("an integer",
                                   lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else None),
}
# The speech history: the list's `source` of speech, its page size (the
# default; at most 1000).
SPEECH_SOURCE = "TTS"
HISTORY_PAGE_SIZE = 100
HISTORY_ORDER = {"sort_direction": "desc"}  # newest first, said explicitly


@dataclass(frozen=True)
class SyncEndpoint:
    """Where a sync model's call goes (pure data): the path under the base
    URL, the query parameters it declares, and for speech its voice (the
    only kind of call the history can recover)."""

    path: str
    query: tuple[str, ...]
    voice_id: str | None = None

    @property
    def can_recover(self) -> bool:
        return self.voice_id is not None


def sync_endpoint(model: str) -> SyncEndpoint:
    """The endpoint of a sync model (pure); Rejected for `dubbing` (an
    async model: submitted) and for any other model."""
    if model == MODEL:
        raise Rejected(f"{NAME}: {MODEL} is an async model: it is submitted, never called")
    if model == SOUND_MODEL:
        return SyncEndpoint("/v1/sound-generation", SOUND_QUERY)
    if model.startswith(SPEECH_PREFIX):
        voice_id = model[len(SPEECH_PREFIX):]
        # A dot segment would be resolved away by the URL: the call would go elsewhere.
        if not voice_id or "/" in voice_id or voice_id in (".", ".."):
            raise Rejected(f"{NAME}: model must be text-to-speech/<voice_id> with a voice id (no '/'): "
                           f"{model[:100]!r}")
        return SyncEndpoint(f"/v1/text-to-speech/{quote(voice_id, safe='')}", SPEECH_QUERY, voice_id)
    raise Rejected(f"{NAME}: model must be text-to-speech/<voice_id>, {SOUND_MODEL} or {MODEL}")


def call_text(job_input: Mapping[str, Any]) -> str:
    """The input's `text` (pure): Rejected, before anything is sent, unless
    it is a non-empty string."""
    text = job_input.get("text")
    if not isinstance(text, str) or not text:
        raise Rejected(f"{NAME}: input.text is required: a non-empty string (the text to speak or the sound to make)")
    return text


def call_parts(job_input: Mapping[str, Any], endpoint: SyncEndpoint) -> tuple[dict[str, Any], dict[str, str]]:
    """The JSON body and the query of a call (pure): the endpoint's query
    parameters taken out of the input and written as the official client
    writes them (null ones left out), the rest the body as it is. Rejected
    for a query value of another type than the documented one."""
    body: dict[str, Any] = {}
    query: dict[str, str] = {}
    for key, value in job_input.items():
        if key not in endpoint.query:
            body[key] = value
            continue
        if value is None:
            continue
        expected, write = _QUERY_TYPES[key]
        text = write(value)
        if text is None:
            raise Rejected(f"{NAME}: input.{key} must be {expected} (it is sent as the query parameter {key})")
        query[key] = text
    return body, query


def characters_used(text: str) -> float:
    """The characters a call is measured by (pure): those of the text sent,
    CONTRACT.md's `1k_characters`. Not the `character-cost` header: that is
    ElevenLabs' own credits for the call (a sound effect's by its length, a
    model's own rate per character), which a price per character must not
    follow."""
    return float(len(text))


def is_audio(content_type: str | None) -> bool:
    """Whether a sync answer is the audio (pure): `audio/*` (the documented
    `audio/mpeg`, or WAV, Opus... by output format) or a bare byte stream."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind.startswith("audio/") or kind in ("", "application/octet-stream")


async def _read_small(response: httpx.Response) -> httpx.Response:
    """At most MAX_ERROR_BODY bytes of a response, as a response to read its reason from."""
    try:
        return await read_error_body(response)
    except httpx.HTTPError:
        return httpx.Response(response.status_code,
                              headers={"content-type": response.headers.get("content-type", "")})


def answered(file: OutputFile, characters: float, request_id: Any, secrets: Secrets) -> Observation:
    """A sync call's answer as its Observation (pure): the audio is output 0;
    its request id kept only when it is an id that holds no secret."""
    return Observation(state=TaskState.SUCCEEDED, files=(file,), usage=(Usage(UsageUnit.CHARACTERS, characters),),
                       request_id=secrets.clean_id(request_id))


def _date_unix(item: Mapping[str, Any]) -> int | None:
    value = item.get("date_unix")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def history_item_matches(item: Any, *, voice_id: str, model_id: Any, text: str, since_unix: int) -> bool:
    """Whether a history item is the generation of this call (pure): a
    speech item (`source` TTS) of the same voice, model and text exactly,
    made at or after `since_unix`, with an id its audio can be read by."""
    if not isinstance(item, Mapping):
        return False
    made = _date_unix(item)
    return (item.get("source") == SPEECH_SOURCE and item.get("voice_id") == voice_id
            and item.get("model_id") == model_id and item.get("text") == text
            and made is not None and made >= since_unix and claimed_id(item.get("history_item_id")) is not None)


def history_matches(items: Sequence[Any], *, voice_id: str, model_id: Any, text: str,
                    since_unix: int) -> list[Mapping[str, Any]]:
    """The items of a history page that may be this call's (pure)."""
    return [item for item in items
            if history_item_matches(item, voice_id=voice_id, model_id=model_id, text=text, since_unix=since_unix)]


def history_reaches_back(items: Sequence[Any], since_unix: int) -> bool:
    """Whether a newest-first page holds an item made before `since_unix`
    (pure): no later page can hold this call's."""
    for item in items:
        made = _date_unix(item) if isinstance(item, Mapping) else None
        if made is not None and made < since_unix:
            return True
    return False


def history_cursor(page: Mapping[str, Any]) -> str | None:
    """Where the next history page starts (pure): after the page's last
    item, when `has_more` says there is one."""
    if page.get("has_more") is not True:
        return None
    after = page.get("last_history_item_id")
    if not isinstance(after, str) or not after:
        items = page.get("history")
        last = items[-1] if isinstance(items, list) and items else None
        after = last.get("history_item_id") if isinstance(last, Mapping) else None
    return after if isinstance(after, str) and after else None


def recovery_since(first_attempt_at: datetime) -> int:
    """The earliest `date_unix` this call's item can have (pure): its start
    by our database's clock less the margin for ElevenLabs' clock."""
    return math.floor((first_attempt_at - timedelta(seconds=FIND_CLOCK_SKEW_S)).timestamp())


class ElevenLabsProvider(Provider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, stale_after_s: float = 60.0,
                 find_max_pages: int = 5, find_max_age_s: float = 6 * 3600.0,
                 max_output_bytes: int = 2 * 1024**3, spool_dir: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._http = Clients(timeout_s, client)
        # Bounds both the dub list (`find`) and the speech history (`recover`).
        self._find_max_pages = find_max_pages
        self._max_output_bytes = max_output_bytes
        self._spool_dir = spool_dir
        self._find_max_age = timedelta(seconds=find_max_age_s)
        api_host = host_of(self.base_url)
        # No webhooks: `stale_after_s` (the lost-webhook check) never applies.
        self.facts = ProviderFacts(name=NAME, webhook_scheme="none", idempotent_submit=False, can_find=True,
                                   stale_after_s=stale_after_s, poll_delays_s=POLL_DELAYS_S,
                                   output_hosts=(api_host,), credential_hosts=(api_host,), can_cancel=False)

    def __repr__(self) -> str:
        return f"ElevenLabsProvider({self.base_url!r})"

    def facts_for(self, model: str) -> ProviderFacts:
        """`dubbing`'s are the provider's; every other model is a sync call
        (an unknown one is refused by `call`), recoverable from the speech
        history when it is speech."""
        if model == MODEL:
            return self.facts
        try:
            can_recover = sync_endpoint(model).can_recover
        except Rejected:
            can_recover = False
        return dataclasses.replace(self.facts, kind=ProviderKind.SYNC, call_timeout_s=SYNC_CALL_TIMEOUT_S,
                                   stale_after_s=SYNC_CALL_TIMEOUT_S + LOST_CALL_MARGIN_S, can_recover=can_recover,
                                   can_find=False)

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._key)

    def _headers(self) -> dict[str, str]:
        return {"xi-api-key": self._key} if self._key else {}

    def download_credentials(self) -> dict[str, str]:
        return self._headers()

    def _dub_url(self, dubbing_id: str) -> str:
        return f"{self.base_url}/v1/dubbing/{quote(dubbing_id, safe='')}"

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        check_model(request.model)
        fields = form_fields(request.input, request.job_id)
        # httpx writes multipart only with files: each field goes as a part
        # without a filename, which is a plain form field (RFC 7578).
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}/v1/dubbing",
            files=[(key, (None, value)) for key, value in fields], headers=self._headers(), secrets=self._secrets,
        )
        return submitted_from(json_object(response, NAME, Uncertain), operation_for(request.input))

    async def _read_dub(self, dubbing_id: str) -> dict:
        response = await read_call(self._http.reads, NAME, "GET", self._dub_url(dubbing_id),
                                   headers=self._headers(), secrets=self._secrets, not_found="no such dub")
        return json_object(response, NAME, Transient)

    async def status(self, task: Task) -> Observation:
        return observation_from_dub(await self._read_dub(task.task_id), task, self.base_url, self._secrets)

    async def cancel(self, task: Task) -> None:
        return None  # no cancel exists (facts.can_cancel is False); DELETE would delete the dub

    async def find(self, request: SubmitRequest) -> Submitted | None:
        candidates = await self.find_candidates(request)
        return candidates[0] if len(candidates) == 1 else None

    async def find_candidates(self, request: SubmitRequest) -> tuple[Submitted, ...]:
        """The dubs named after this job, made since its first submit call
        (less the clock-skew margin; without that time, within
        `find_max_age_s`). None seen if that window holds more than
        `find_max_pages` pages: a dub of ours further back could make the
        ones found ambiguous."""
        since = (request.first_attempt_at or datetime.now(UTC) - self._find_max_age) \
            - timedelta(seconds=FIND_CLOCK_SKEW_S)
        operation = operation_for(request.input)
        params: dict[str, Any] = {"page_size": FIND_PAGE_SIZE, **FIND_ORDER}
        found: list[str] = []
        for _ in range(self._find_max_pages):
            response = await read_call(self._http.reads, NAME, "GET", f"{self.base_url}/v1/dubbing", params=params,
                                       headers=self._headers(), secrets=self._secrets, not_found=None)
            page = json_object(response, NAME, Transient)
            dubs = page.get("dubs")
            if not isinstance(dubs, list):
                raise Transient(f"{NAME}: dub list has no dubs")
            found += page_matches(dubs, request.job_id)
            cursor = page.get("next_cursor")
            if reaches_back_to(dubs, since) or page.get("has_more") is not True or not isinstance(cursor, str):
                return tuple(Submitted(task_id=i, operation=operation) for i in dict.fromkeys(found))
            params = {**params, "cursor": cursor}
        return ()

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """The dub read with our key (404: not ours, or no such dub); ours
        when it carries this job's name."""
        try:
            dub = await self._read_dub(task_id)
        except Rejected:
            return None
        if dub.get("name") != request.job_id:
            return None
        return Submitted(task_id=task_id, operation=operation_for(request.input))

    async def verify(self, webhook: WebhookRequest) -> bool:
        return False  # ElevenLabs sends no dubbing webhook: none is ours

    # -------------------------------------------------------------- sync calls

    async def call(self, request: SubmitRequest) -> Observation:
        endpoint = sync_endpoint(request.model)
        text = call_text(request.input)
        body, query = call_parts(request.input, endpoint)
        file: OutputFile | None = None
        try:
            async with sync_call(self._http.submits, NAME, "POST", f"{self.base_url}{endpoint.path}",
                                 secrets=self._secrets, timeout_s=request.call_timeout_s, json=body, params=query,
                                 headers=self._headers()) as response:
                if not is_audio(response.headers.get("content-type")):
                    # Not audio (an error object on 200, a proxy's page): the
                    # call was made and its answer is not one we can store.
                    detail = self._secrets.detail(await _read_small(response))
                    raise Uncertain(f"{NAME}: the call answered {response.headers.get('content-type')!r}, "
                                    f"not audio" + (f": {detail}" if detail else ""))
                file = await write_answer(response, NAME, directory=self._spool_dir,
                                          max_bytes=self._max_output_bytes,
                                          content_type=response.headers.get("content-type"))
                if file.bytes == 0:
                    raise Uncertain(f"{NAME}: the call answered HTTP {response.status_code} with no audio")
                return answered(file, characters_used(text),
                                response.headers.get("request-id"), self._secrets)
        except BaseException:
            _remove(file)
            raise

    async def recover(self, request: SubmitRequest) -> Observation | None:
        """The lost speech call's item in the speech history (module
        docstring): its audio as `call` would have answered it."""
        endpoint = sync_endpoint(request.model)
        if endpoint.voice_id is None:
            return None  # sound effects are not in the history
        text = call_text(request.input)
        _, query = call_parts(request.input, endpoint)
        if query.get("enable_logging") == "false" or request.first_attempt_at is None:
            return None
        model_id = request.input.get("model_id") or DEFAULT_SPEECH_MODEL_ID
        item = await self._history_item(endpoint.voice_id, model_id, text, recovery_since(request.first_attempt_at))
        if item is None:
            return None
        item_id: str = item["history_item_id"]
        file: OutputFile | None = None
        try:
            async with streamed_read(self._http.reads, NAME, "GET",
                                     f"{self.base_url}/v1/history/{quote(item_id, safe='')}/audio",
                                     secrets=self._secrets, not_found=None, headers=self._headers()) as response:
                declared = item.get("content_type")
                content_type = response.headers.get("content-type") or (declared if isinstance(declared, str)
                                                                        else None)
                try:
                    file = await write_answer(response, NAME, directory=self._spool_dir,
                                              max_bytes=self._max_output_bytes, content_type=content_type)
                except Uncertain:
                    # A read, not the paid call: the audio is asked for again.
                    raise Transient(f"{NAME}: the history audio broke off while it was read") from None
            if file.bytes == 0:
                raise Transient(f"{NAME}: the history item's audio is empty")
            return answered(file, float(len(text)), item.get("request_id"), self._secrets)
        except BaseException:
            _remove(file)
            raise

    async def _history_item(self, voice_id: str, model_id: Any, text: str,
                            since_unix: int) -> Mapping[str, Any] | None:
        """The one history item that is this call's; None when there is
        none; Rejected when several are, or the window is longer than the
        page bound (an older one could be another match)."""
        params: dict[str, Any] = {"voice_id": voice_id, "source": SPEECH_SOURCE, "page_size": HISTORY_PAGE_SIZE,
                                  **HISTORY_ORDER}
        found: dict[str, Mapping[str, Any]] = {}
        for _ in range(self._find_max_pages):
            response = await read_call(self._http.reads, NAME, "GET", f"{self.base_url}/v1/history", params=params,
                                       headers=self._headers(), secrets=self._secrets, not_found=None)
            page = json_object(response, NAME, Transient)
            items = page.get("history")
            if not isinstance(items, list):
                raise Transient(f"{NAME}: history answer has no history")
            for item in history_matches(items, voice_id=voice_id, model_id=model_id, text=text,
                                        since_unix=since_unix):
                found.setdefault(item["history_item_id"], item)
            after = history_cursor(page)
            if history_reaches_back(items, since_unix) or after is None:
                break
            params = {**params, "start_after_history_item_id": after}
        else:
            raise Rejected(f"{NAME}: the speech history since the call's start is longer than "
                           f"{self._find_max_pages} pages: the call's item cannot be told apart")
        if len(found) > 1:
            raise Rejected(f"{NAME}: {len(found)} history items have this call's voice, model and text since its "
                           "start: ambiguous, none is adopted")
        return next(iter(found.values()), None)

    async def aclose(self) -> None:
        await self._http.aclose()


def _remove(file: OutputFile | None) -> None:
    """An answer's file that will not be handed over (an error after it was written)."""
    if file is not None:
        try:
            os.unlink(file.path)
        except FileNotFoundError:
            pass
