"""An OpenAI-compatible Chat Completions endpoint as a sync call (OpenAI,
KIE's LLM API, OpenRouter, vLLM, ...): one `POST {base_url}/chat/completions`,
whose answer is the job's result (output 0, `application/json`: the
`chat.completion`).

Sources:
- OpenAI's API reference (openai/openai-openapi `openapi.yaml`:
  `createChatCompletion`, `CreateChatCompletionResponse`,
  `CreateChatCompletionStreamResponse`, `ChatCompletionStreamOptions`:
  "If set, an additional chunk will be streamed before the `data: [DONE]`
  message. The `usage` field on this chunk shows the token usage statistics
  for the entire request, and the `choices` field will always be an empty
  array. All other chunks will also include a `usage` field, but with a null
  value"), the overview's "Debugging requests" (`x-request-id`);
- the official client openai-python 3.57: `_client.py` (`Authorization:
  Bearer`), `_streaming.py` (a `data: [DONE]` ends the stream; a chunk
  carrying `error` is raised), `lib/streaming/chat/_completions.py`
  `ChatCompletionStreamState` and `lib/streaming/_deltas.py`
  `accumulate_delta` (how chunks become the final completion: the first
  chunk is the snapshot, minus `obfuscation`, its `object`
  `chat.completion`; per choice index, each delta merged into the message —
  strings appended, objects merged, lists of indexed entries merged by their
  `index`, `index` and `type` replaced; `finish_reason` set when given;
  `logprobs` content and refusal lists extended; `usage`,
  `system_fingerprint` and `moderation` from the chunks; a chunk whose
  `object` is not `chat.completion.chunk`, Azure's asynchronous filter
  events, skipped), `types/chat/chat_completion*.py`, `completion_usage.py`;
- OpenRouter's streaming page (https://openrouter.ai/docs/api-reference/streaming:
  `: OPENROUTER PROCESSING` comments; errors mid-generation arrive as `data:`
  events with an `error` field).

The call: the body is the job's input plus `model` (an input carrying its
own `model` is refused before anything is sent). With `"stream": true`,
`stream_options.include_usage` is set to true (the user's other
stream_options kept): the usage is what the job is charged by. 429, 503
(and 529) are a retry (http.sync_call), other 4xx Rejected, anything else
once sent Uncertain. Usage: prompt_tokens is INPUT_TOKENS (cached tokens
are a part of it), completion_tokens OUTPUT_TOKENS (reasoning tokens are a
part of it).

Where the documents are silent, the choices here (besides those shared with
app/providers/anthropic.py, whose plain-answer and stream plumbing this
uses):
- a user's `include_usage: false` is overridden (the charge needs the
  usage); `stream_options` that is not an object (or null) is refused;
- a stream that ends without `data: [DONE]`, a chunk carrying a truthy
  `error` (OpenAI, OpenRouter, SGLang), one whose `object` is `error`
  (vLLM's error shape), an SSE event named `error`, or a chunk that is not a
  JSON object is Uncertain; an event with empty data is skipped (a
  keep-alive) where the SDK would fail on it;
- a chunk without `object` is taken (a compatible server may omit it); one
  whose `object` is another string is skipped, as the SDK skips them;
- unlike `accumulate_delta`, a message's `role` and a tool call's `id`,
  `type` and `function.name` keep their first value instead of being
  appended to (OpenRouter repeats `role: "assistant"` in every chunk; the
  SDK would make it "assistantassistant…"), and so do booleans (which it
  would add as numbers); a choice's `logprobs` from its
  first chunk are taken once (the SDK adds a later-starting choice's first
  logprobs twice); choices are ordered by their `index`, whatever order
  they start in;
- `id`, `created`, `model`, `service_tier` are the first chunk's (or the
  first chunk that has them); `system_fingerprint`, `usage` and
  `moderation` the last non-null ones (the usage chunk comes last, and a
  server that sends usage on an earlier chunk keeps it); a choice never
  given a role is the assistant's, and `content`/`refusal` never sent are
  null, as in a plain answer;
- a plain answer that is not a JSON object with a `choices` list is
  Uncertain (an `error` object on HTTP 200 included: its message is kept,
  masked); `object` is not required to be `chat.completion`;
- usage is reported only when both prompt_tokens and completion_tokens are
  whole numbers; otherwise none, and the job is charged its reservation;
- `request_id` is the `x-request-id` header when it looks like an id.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from app.download_errors import OutputTooLarge
from app.providers.base import Observation, Rejected, SubmitRequest, Usage
from app.providers.llm import (
    NotAnAnswer,
    SyncJsonProvider,
    call_body,
    json_call,
    sync_facts,
    token_usage,
    wants_stream,
)
from app.providers.sse import Event, StreamError
from app.vocabulary import ProviderName

NAME = ProviderName.OPENAI.value
COMPLETIONS_PATH = "/chat/completions"
REQUEST_ID_HEADER = "x-request-id"
CHUNK_OBJECT = "chat.completion.chunk"
DONE = "[DONE]"
# Keys of a message (and of a tool call and its function) that name it rather than grow.
_FIRST_VALUE_KEYS = frozenset({"role", "id", "type", "name"})


# ------------------------------------------------------------------ pure: the request


def stream_options(job_input: Mapping[str, Any]) -> dict[str, Any]:
    """The stream_options a streamed call sends (pure): the user's, with
    include_usage on. Rejected when the input's are not an object."""
    given = job_input.get("stream_options")
    if given is not None and not isinstance(given, Mapping):
        raise Rejected(f"{NAME}: input.stream_options must be an object")
    return {**(given or {}), "include_usage": True}


def request_body(model: str, job_input: Mapping[str, Any]) -> bytes:
    """The call's body (pure): see the module docstring."""
    if wants_stream(job_input):
        if "model" in job_input:
            return call_body(NAME, model, job_input)  # refused, for the right reason
        return call_body(NAME, model, job_input, stream_options=stream_options(job_input))
    return call_body(NAME, model, job_input)


# ------------------------------------------------------------------ pure: the answer


def completion_usage(completion: Any) -> tuple[Usage, ...]:
    usage = completion.get("usage") if isinstance(completion, Mapping) else None
    if not isinstance(usage, Mapping):
        return ()
    return token_usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))


def read_completion(value: Any) -> tuple[Usage, ...]:
    """A plain answer's usage (pure); NotAnAnswer unless it is a completion."""
    if not isinstance(value, Mapping) or not isinstance(value.get("choices"), list):
        detail = value.get("error") if isinstance(value, Mapping) else None
        raise NotAnAnswer("the answer is not a chat completion", detail)
    return completion_usage(value)


def _has_indexed_entries(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(entry, dict) and "index" in entry for entry in value)


class CompletionStream:
    """Chat completion chunks assembled into the final `chat.completion`, as
    openai-python's ChatCompletionStreamState does, with the module
    docstring's exceptions (pure). `add` each event; True at `[DONE]`, and
    `result()` is then the answer. StreamError for a chunk that cannot be
    read or carries an error; OutputTooLarge once the text assembled is over
    `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._top: dict[str, Any] | None = None
        self._choices: dict[int, dict[str, Any]] = {}
        self._last: dict[str, Any] = {}  # system_fingerprint, usage, moderation: the last non-null
        self._size = 0

    def _grow(self, piece: str) -> None:
        self._size += len(piece)
        if self._size > self.max_bytes:
            raise OutputTooLarge(f"output is larger than the {self.max_bytes} byte cap")

    def add(self, event: Event) -> bool:
        if event.data.startswith(DONE):  # as the SDK tests it
            return True
        if event.event == "error":
            detail: Any = event.data
            with contextlib.suppress(ValueError):
                detail = json.loads(event.data)
            raise StreamError("the stream carried an error",
                              detail.get("error", detail) if isinstance(detail, dict) else detail)
        if not event.data:
            return False
        try:
            chunk = json.loads(event.data)
        except (ValueError, RecursionError):
            raise StreamError("a chunk that is not JSON") from None
        if not isinstance(chunk, dict):
            raise StreamError("a chunk that is not a JSON object")
        if chunk.get("error"):
            raise StreamError("the stream carried an error", chunk["error"])
        kind = chunk.get("object")
        if kind is None:
            kind = CHUNK_OBJECT  # left out (or null): taken; Azure's filter events say ""
        if kind == "error":
            raise StreamError("the stream carried an error", chunk)
        if kind != CHUNK_OBJECT:
            return False
        self._take(chunk)
        return False

    def _take(self, chunk: dict[str, Any]) -> None:
        choices = chunk.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise StreamError("a chunk whose choices are not a list")
        if self._top is None:
            self._top = {k: v for k, v in chunk.items() if k not in ("obfuscation", "choices")}
        else:
            for key in ("id", "created", "model", "service_tier"):
                if self._top.get(key) is None and chunk.get(key) is not None:
                    self._top[key] = chunk[key]
        for key in ("system_fingerprint", "usage", "moderation"):
            if chunk.get(key) is not None:
                self._last[key] = chunk[key]
        for choice in choices:
            self._choice(choice)

    def _choice(self, choice: Any) -> None:
        if not isinstance(choice, dict):
            raise StreamError("a choice that is not an object")
        index = choice.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise StreamError("a choice without an index")
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        if not isinstance(delta, dict):
            raise StreamError("a choice whose delta is not an object")
        snapshot = self._choices.get(index)
        logprobs = choice.get("logprobs")
        if snapshot is None:
            # The choice's first chunk: its fields as sent (logprobs included), its delta the message.
            snapshot = {k: v for k, v in choice.items() if k != "delta"}
            snapshot["message"] = {}
            self._choices[index] = snapshot
        elif logprobs is not None:
            self._logprobs(snapshot, logprobs)
        snapshot["message"] = self._merge(snapshot["message"], delta)
        if choice.get("finish_reason"):
            snapshot["finish_reason"] = choice["finish_reason"]

    @staticmethod
    def _logprobs(snapshot: dict[str, Any], logprobs: Any) -> None:
        if not isinstance(logprobs, dict):
            raise StreamError("logprobs that are not an object")
        have = snapshot.get("logprobs")
        if not isinstance(have, dict):
            snapshot["logprobs"] = {"content": logprobs.get("content"), "refusal": logprobs.get("refusal")}
            return
        for key in ("content", "refusal"):
            more = logprobs.get(key)
            if more:
                if not isinstance(more, list):
                    raise StreamError(f"logprobs.{key} that is not a list")
                if not isinstance(have.get(key), list):
                    have[key] = []
                have[key].extend(more)

    def _merge(self, acc: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
        """accumulate_delta, but for _FIRST_VALUE_KEYS and booleans (pure but for the size count)."""
        for key, value in delta.items():
            have = acc.get(key)
            if have is None:
                acc[key] = self._merge_list([], value) if _has_indexed_entries(value) else value
                if isinstance(value, str):
                    self._grow(value)
            elif key == "index":
                acc[key] = value
            elif key in _FIRST_VALUE_KEYS and have != "":
                continue  # a name, not a piece of text: the first one stays
            elif isinstance(have, str) and isinstance(value, str):
                self._grow(value)
                acc[key] = have + value
            elif isinstance(have, bool) or isinstance(value, bool):
                continue  # accumulate_delta would add them as numbers; the first one stays
            elif isinstance(have, (int, float)) and isinstance(value, (int, float)):
                acc[key] = have + value
            elif isinstance(have, dict) and isinstance(value, dict):
                acc[key] = self._merge(have, value)
            elif isinstance(have, list) and isinstance(value, list):
                acc[key] = self._merge_list(have, value)
        return acc

    def _merge_list(self, have: list[Any], value: list[Any]) -> list[Any]:
        if all(isinstance(x, (str, int, float)) for x in have) and (have or not _has_indexed_entries(value)):
            have.extend(value)
            return have
        for entry in value:
            if not isinstance(entry, dict):
                raise StreamError("a list delta entry that is not an object")
            index = entry.get("index")
            if isinstance(index, bool) or not isinstance(index, int):
                raise StreamError("a list delta entry without an integer index")
            for position, existing in enumerate(have):
                if isinstance(existing, dict) and existing.get("index") == index:
                    have[position] = self._merge(existing, entry)
                    break
            else:
                have.append(self._merge({}, entry))
                have.sort(key=lambda e: e.get("index", 0) if isinstance(e, dict) else 0)
        return have

    def result(self) -> dict[str, Any]:
        if self._top is None:
            raise StreamError("no chunk before [DONE]")
        choices = []
        for index in sorted(self._choices):
            choice = self._choices[index]
            message = {"role": "assistant", "content": None, "refusal": None, **choice["message"]}
            choices.append({"index": index, "finish_reason": None, "logprobs": None, **choice,
                            "message": message})
        completion = {**self._top, "object": "chat.completion", "choices": choices,
                      "system_fingerprint": self._last.get("system_fingerprint"),
                      "usage": self._last.get("usage")}
        if "moderation" in self._last:
            completion["moderation"] = self._last["moderation"]
        return completion


# ------------------------------------------------------------------ the adapter


class OpenAIProvider(SyncJsonProvider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, max_output_bytes: int = 2 * 1024**3,
                 spool_dir: str | None = None):
        super().__init__(base_url, api_key, timeout_s=timeout_s, client=client, max_output_bytes=max_output_bytes,
                         spool_dir=spool_dir)
        self.facts = sync_facts(NAME)

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._key}"} if self._key else {}

    async def call(self, request: SubmitRequest) -> Observation:
        body = request_body(request.model, request.input)
        stream = wants_stream(request.input)
        return await json_call(
            self._http.submits, NAME, f"{self.base_url}{COMPLETIONS_PATH}", body=body, headers=self._headers(),
            secrets=self._secrets, timeout_s=request.call_timeout_s,
            assembler=CompletionStream(self._max_output_bytes) if stream else None, end="data: [DONE]",
            read=read_completion, usage_of=completion_usage, request_id_header=REQUEST_ID_HEADER,
            directory=self._spool_dir, max_bytes=self._max_output_bytes,
        )
