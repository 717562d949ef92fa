"""What the LLM sync adapters share (app/providers/anthropic.py,
app/providers/openai.py): a JSON body (the job's input plus `model`), the
one call with its file removed on any error, a plain answer streamed to its
file and its usage read back, a streamed answer assembled by the adapter's
own assembler, and the facts of a provider whose every model is one sync
call. Written for the Anthropic adapter first; the OpenAI-compatible one
reads the same way.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx

from app.providers.base import (
    JSON_CONTENT_TYPE,
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
    Uncertain,
    Usage,
    UsageUnit,
    WebhookRequest,
)
from app.providers.http import Clients, Secrets, answer_error, sync_call
from app.providers.inline import write_answer, write_json_output
from app.providers.sse import Event, StreamError, aiter_events

# A plain answer's usage is read back from its file up to this size.
MAX_READ_BACK = 16 * 1024 * 1024


def sync_facts(name: str) -> ProviderFacts:
    """The facts of a provider whose every model is one sync call, with no
    webhooks, no look-up and no cancel."""
    return ProviderFacts(name=name, webhook_scheme="none", idempotent_submit=False, can_find=False,
                         stale_after_s=SYNC_CALL_TIMEOUT_S + LOST_CALL_MARGIN_S, can_cancel=False,
                         kind=ProviderKind.SYNC, call_timeout_s=SYNC_CALL_TIMEOUT_S)


def call_body(provider: str, model: str, job_input: Mapping[str, Any], **extra: Any) -> bytes:
    """The call's JSON body (pure): the job's input with `model` (and
    `extra`, fields the adapter sets) added. Rejected, before anything is
    sent, when the input carries its own `model` or is not JSON."""
    if "model" in job_input:
        raise Rejected(f"{provider}: input.model is not allowed: the model is the job's own")
    body = {"model": model, **job_input, **extra}
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError):
        raise Rejected(f"{provider}: input is not a JSON object") from None


def wants_stream(job_input: Mapping[str, Any]) -> bool:
    return job_input.get("stream") is True


def is_json(response: httpx.Response) -> bool:
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def token_count(value: Any) -> int | None:
    """A token count as a provider reports it (a whole number, at least 0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 0 else None


def token_usage(input_tokens: Any, output_tokens: Any, *extra_input: Any) -> tuple[Usage, ...]:
    """INPUT_TOKENS and OUTPUT_TOKENS (pure), or none unless both counts
    are whole numbers; `extra_input` (cache counts) are added to the input,
    each absent (None) as 0 and any other non-count refusing the usage."""
    counted_in, counted_out = token_count(input_tokens), token_count(output_tokens)
    if counted_in is None or counted_out is None:
        return ()
    for value in extra_input:
        if value is None:
            continue
        more = token_count(value)
        if more is None:
            return ()
        counted_in += more
    return (Usage(UsageUnit.INPUT_TOKENS, float(counted_in)), Usage(UsageUnit.OUTPUT_TOKENS, float(counted_out)))


class NotAnAnswer(ValueError):
    """A 2xx body that is not the answer the protocol documents; `detail` is
    the provider's own words, if any (masked before use)."""

    def __init__(self, message: str, detail: Any = None):
        super().__init__(message)
        self.detail = detail


class Assembler(Protocol):
    """A stream's events made into the answer (MessageStream, openai.CompletionStream)."""

    def add(self, event: Event) -> bool: ...

    def result(self) -> dict[str, Any]: ...


def stream_failure(provider: str, exc: StreamError, secrets: Secrets) -> Uncertain:
    reason = secrets.reason(exc.detail)
    return Uncertain(f"{provider}: {exc}: {reason}" if reason else f"{provider}: {exc}")


async def read_stream(response: httpx.Response, provider: str, assembler: Assembler, *, max_bytes: int,
                      secrets: Secrets, end: str) -> dict[str, Any]:
    """The answer a stream assembles, read until the assembler says it is
    whole (`end` names that event); a stream that stops before, an error
    in it, or a read that breaks is Uncertain."""
    try:
        async with contextlib.aclosing(aiter_events(response.aiter_bytes(), max_bytes=max_bytes)) as events:
            async for event in events:
                if assembler.add(event):
                    return assembler.result()
    except httpx.HTTPError as exc:
        raise answer_error(provider, exc) from None
    except StreamError as exc:
        raise stream_failure(provider, exc, secrets) from None
    raise Uncertain(f"{provider}: the stream ended before {end}")


def _load_json(path: str) -> Any:
    with open(path, "rb") as file:
        return json.loads(file.read())


async def read_plain(response: httpx.Response, provider: str, read: Callable[[Any], tuple[Usage, ...]], *,
                     directory: str | None, max_bytes: int, secrets: Secrets) -> tuple[OutputFile, tuple[Usage, ...]]:
    """A plain answer streamed to its file (write_answer), then, when it is
    at most MAX_READ_BACK bytes, parsed back for `read` to check it and say
    its usage; not JSON, or NotAnAnswer, is Uncertain. The file is removed
    on any error."""
    file = await write_answer(response, provider, directory=directory, max_bytes=max_bytes,
                              content_type=JSON_CONTENT_TYPE)
    try:
        if file.bytes > MAX_READ_BACK:
            return file, ()
        try:
            value = await asyncio.to_thread(_load_json, file.path)
        except (ValueError, RecursionError):
            raise Uncertain(f"{provider}: the answer is not JSON (HTTP {response.status_code})") from None
        try:
            return file, read(value)
        except NotAnAnswer as exc:
            reason = secrets.reason(exc.detail)
            raise Uncertain(f"{provider}: {exc}: {reason}" if reason else f"{provider}: {exc}") from None
    except BaseException:
        os.unlink(file.path)
        raise


async def json_call(client: httpx.AsyncClient, provider: str, url: str, *, body: bytes, headers: dict[str, str],
                    secrets: Secrets, timeout_s: float, assembler: Assembler | None, end: str,
                    read: Callable[[Any], tuple[Usage, ...]], usage_of: Callable[[Any], tuple[Usage, ...]],
                    request_id_header: str, directory: str | None, max_bytes: int) -> Observation:
    """One JSON sync call, its answer output 0: assembled from the stream
    by `assembler` (None: a plain call), or a plain body as it came (also
    when a stream was asked for and JSON answered). No file is left behind
    on any error, cancellation included; our own disk failing is Uncertain."""
    output: OutputFile | None = None
    try:
        async with sync_call(client, provider, "POST", url, secrets=secrets, timeout_s=timeout_s, content=body,
                             headers={"content-type": JSON_CONTENT_TYPE, **headers}) as response:
            request_id = secrets.clean_id(response.headers.get(request_id_header))
            if assembler is not None and not is_json(response):
                answer = await read_stream(response, provider, assembler, max_bytes=max_bytes, secrets=secrets,
                                           end=end)
                # Not in a thread: a cancellation while one wrote the file would leave it behind.
                output = write_json_output(answer, directory=directory, max_bytes=max_bytes)
                usage = usage_of(answer)
            else:
                output, usage = await read_plain(response, provider, read, directory=directory,
                                                 max_bytes=max_bytes, secrets=secrets)
    except BaseException as exc:
        if output is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(output.path)
        if isinstance(exc, OSError):  # our disk (full, gone, read-only): the call was made, its answer lost
            raise Uncertain(f"{provider}: could not keep the answer ({exc.strerror or type(exc).__name__})") from None
        raise
    return Observation(state=TaskState.SUCCEEDED, files=(output,), usage=usage, request_id=request_id)


class SyncJsonProvider(Provider):
    """What the JSON sync adapters share besides the call: no submit, no
    status, no cancel, no webhooks."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, max_output_bytes: int = 2 * 1024**3,
                 spool_dir: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._http = Clients(timeout_s, client)
        self._max_output_bytes = max_output_bytes
        self._spool_dir = spool_dir

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._key)

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        raise Rejected(f"{self.name}: every model is a sync call: it is called, never submitted")

    async def status(self, task: Task) -> Observation:
        raise Rejected(f"{self.name}: a sync call has no task to read")

    async def cancel(self, task: Task) -> None:
        return None  # nothing to cancel (can_cancel is False)

    async def verify(self, webhook: WebhookRequest) -> bool:
        return False  # no webhook is ever registered: nothing can be ours

    async def aclose(self) -> None:
        await self._http.aclose()

