"""Server-Sent Events, parsed as the WHATWG HTML standard's "event stream
interpretation" says (https://html.spec.whatwg.org/multipage/server-sent-events.html,
section "Interpreting an event stream"), for the streamed answers of sync
calls (Anthropic's Messages events, OpenAI's chat completion chunks).

The rules followed:
- a line ends at CRLF, LF or CR, whichever comes (a CR that ends one chunk
  and an LF that starts the next are one line end);
- an empty line dispatches the event being built; a line starting with `:`
  is a comment; otherwise the field name is what precedes the first colon
  and the value what follows it, less one leading space; a line with no
  colon is a field of that name with an empty value;
- `data` appends its value and an LF to the data buffer, `event` sets the
  event type, `id` the last event id (unless it holds a NUL), `retry` the
  reconnection time (ASCII digits only); other fields are ignored;
- at dispatch, an event whose data buffer is empty is not dispatched (its
  type is reset); otherwise the data loses its final LF, and the type is
  `message` when none was given. The last event id persists across events;
- the bytes are UTF-8, decoded with replacement (the standard's "UTF-8
  decode"), one leading byte order mark ignored; an event still open when
  the stream ends is discarded.

Chunks may split a line or a UTF-8 character anywhere: lines are cut on the
bytes (CR and LF never occur inside a UTF-8 sequence) and decoded whole.
What is buffered — the unfinished line and the event being built — is
capped by the caller (`max_bytes`): past it, OutputTooLarge, as the answer
it belongs to is then larger than the output cap too.

Pure (no I/O): `SSEParser.feed` takes bytes and returns the events they
complete; `aiter_events` runs one over an async stream of bytes (an httpx
response's `aiter_bytes()`), whose own errors it lets through.
"""
from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass

from app.download_errors import OutputTooLarge

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
_CR, _LF = 0x0D, 0x0A


@dataclass(frozen=True)
class Event:
    """One dispatched event: its type (`message` by default), its data
    (the `data` lines joined by LF) and the last event id seen."""

    event: str = "message"
    data: str = ""
    id: str = ""


class SSEParser:
    """An event stream read incrementally: `feed` each chunk as it comes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.retry_ms: int | None = None  # the stream's last `retry` field, if any
        self._line = bytearray()  # the unfinished line
        self._data: list[str] = []
        self._event_type = ""
        self._event_bytes = 0  # bytes of the lines making up the event being built
        self._last_id = ""
        self._after_cr = False  # the last chunk ended in CR: an LF starting the next one is its pair
        self._start = bytearray()  # the first bytes, until they are known not to be (or to be) a BOM
        self._started = False

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished line and the event being built."""
        return len(self._line) + self._event_bytes + len(self._start)

    def feed(self, chunk: bytes) -> list[Event]:
        if not self._started:
            self._start += chunk
            if len(self._start) < len(_BOM) and _BOM.startswith(bytes(self._start)):
                return []  # too short to tell
            data = bytes(self._start)
            self._start.clear()
            self._started = True
            chunk = data[len(_BOM):] if data.startswith(_BOM) else data
        if self._after_cr and chunk:
            self._after_cr = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
        events: list[Event] = []
        start = 0
        for match in _EOL.finditer(chunk):
            piece = chunk[start:match.start()]
            if self._line:
                self._line += piece
                line, self._line = bytes(self._line), bytearray()
            else:
                line = piece
            event = self._take_line(line)
            if event is not None:
                events.append(event)
            start = match.end()
            if match.end() == len(chunk) and chunk[-1] == _CR:
                self._after_cr = True
        self._line += chunk[start:]
        self._check()
        return events

    def _check(self) -> None:
        if self.buffered > self.max_bytes:
            raise OutputTooLarge(f"output is larger than the {self.max_bytes} byte cap (one streamed event)")

    def _take_line(self, raw: bytes) -> Event | None:
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return None  # a comment
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._event_bytes += len(raw)
        elif name == "event":
            self._event_type = value
            self._event_bytes += len(raw)
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value
        elif name == "retry":
            if value and value.isascii() and value.isdigit():
                self.retry_ms = int(value)
        self._check()
        return None

    def _dispatch(self) -> Event | None:
        data, event_type = self._data, self._event_type
        self._data, self._event_type, self._event_bytes = [], "", 0
        if not data:
            return None
        return Event(event=event_type or "message", data="\n".join(data), id=self._last_id)


async def aiter_events(chunks: AsyncIterable[bytes], *, max_bytes: int) -> AsyncGenerator[Event, None]:
    """The events of a stream of bytes, in order, each as soon as its blank
    line arrives; an event left open at the end is dropped. The stream's
    own errors (an httpx read error) go to the caller unchanged."""
    parser = SSEParser(max_bytes)
    async for chunk in chunks:
        for event in parser.feed(chunk):
            yield event


class StreamError(ValueError):
    """A stream whose events do not say what its protocol documents (not
    JSON, out of order), or that carried an error: the answer is lost.
    `detail` is the provider's own words, if any (to be masked before use)."""

    def __init__(self, message: str, detail: object = None):
        super().__init__(message)
        self.detail = detail
