"""ElevenLabs dubbing (https://elevenlabs.io/docs/api-reference/dubbing/create;
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

Only the `dubbing` model exists here; the sync models
(`text-to-speech/<voice_id>`, `sound-generation`) are refused at submit.

Where the documents are silent, the choices here: the list is asked for
`order_by=created_at&order_direction=DESCENDING` explicitly (its default
order is not documented); a dubbed dub with no target language at all is a
failure (nothing to fetch); `media_metadata.duration` is reported as the
usage in seconds (the dub's media length, as ElevenLabs bills dubbing by
the minute); an unknown `status` is a read to repeat (Transient).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

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
)
from app.providers.http import Clients, Secrets, ended, host_of, json_object, read_call, submit_call
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
    """Only the asynchronous `dubbing` exists here (pure)."""
    if model != MODEL:
        raise Rejected(f"{NAME}: model must be {MODEL}; text-to-speech/<voice_id> and sound-generation "
                       "are not supported yet")


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


class ElevenLabsProvider(Provider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, stale_after_s: float = 60.0,
                 find_max_pages: int = 5, find_max_age_s: float = 6 * 3600.0):
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._http = Clients(timeout_s, client)
        self._find_max_pages = find_max_pages
        self._find_max_age = timedelta(seconds=find_max_age_s)
        api_host = host_of(self.base_url)
        # No webhooks: `stale_after_s` (the lost-webhook check) never applies.
        self.facts = ProviderFacts(name=NAME, webhook_scheme="none", idempotent_submit=False, can_find=True,
                                   stale_after_s=stale_after_s, poll_delays_s=POLL_DELAYS_S,
                                   output_hosts=(api_host,), credential_hosts=(api_host,), can_cancel=False)

    def __repr__(self) -> str:
        return f"ElevenLabsProvider({self.base_url!r})"

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

    async def aclose(self) -> None:
        await self._http.aclose()
