"""The event stream parser, held to the WHATWG HTML standard's "Interpreting
an event stream" (https://html.spec.whatwg.org/multipage/server-sent-events.html)
and its worked examples (the `data`/`id` streams, the `test` stream that
dispatches "", "\\n" and "test", a field without a colon)."""
from __future__ import annotations

import pytest

from app.download_errors import OutputTooLarge
from app.providers.sse import Event, SSEParser, aiter_events

BIG = 1 << 20


def parse(stream: bytes, max_bytes: int = BIG) -> list[Event]:
    parser = SSEParser(max_bytes)
    return parser.feed(stream)


def feed_in_pieces(stream: bytes, cuts: list[int], max_bytes: int = BIG) -> list[Event]:
    parser = SSEParser(max_bytes)
    events: list[Event] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        events += parser.feed(stream[start:cut])
        start = cut
    return events


@pytest.mark.parametrize(("stream", "expected"), [
    # The standard's first example: a message of two data lines.
    (b"data: YHOO\ndata: +2\ndata: 10\n\n", [Event(data="YHOO\n+2\n10")]),
    # Its second: comments, ids (the last one persists), a data-only event.
    (b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n",
     [Event(data="first event", id="1"), Event(data="second event", id=""), Event(data=" third event", id="")]),
    # Its third: `data` without a colon is a data line with an empty value, so
    # one such line dispatches "", two dispatch "\n"; the last block, never
    # followed by a blank line, is discarded.
    (b"data\n\ndata\ndata\n\ndata:\n", [Event(data=""), Event(data="\n")]),
    # Its fourth: one leading space is removed, and only one.
    (b"data:test\n\ndata: test\n\n", [Event(data="test"), Event(data="test")]),
    # A named event; the type is reset after dispatch.
    (b"event: message_stop\ndata: {}\n\ndata: x\n\n", [Event("message_stop", "{}"), Event(data="x")]),
    # An event without data is not dispatched, and its type does not carry over.
    (b"event: ping\n\ndata: y\n\n", [Event(data="y")]),
    (b"event\ndata: z\n\n", [Event(data="z")]),  # an empty type is `message`
    # CR, LF and CRLF all end lines, mixed in one stream.
    (b"data: a\rdata: b\r\ndata: c\n\r\n", [Event(data="a\nb\nc")]),
    (b"event: e\r\rdata: after\r\r", [Event(data="after")]),
    # Unknown fields are ignored; so is a colon in the value's rest.
    (b"foo: bar\ndata: k: v\nretry: x\n\n", [Event(data="k: v")]),
    # An id holding NUL is ignored; the earlier one stays.
    (b"id: 7\ndata: a\n\nid: 8\x00\ndata: b\n\n", [Event(data="a", id="7"), Event(data="b", id="7")]),
    # An event still open when the stream ends is discarded.
    (b"data: whole\n\ndata: cut", [Event(data="whole")]),
    (b"data: cut\n", []),
    # One leading byte order mark is ignored; a second is not (it is part of the field name).
    (b"\xef\xbb\xbfdata: a\n\n", [Event(data="a")]),
    (b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n", []),
    # UTF-8, decoded with replacement.
    ("data: héllo ✓\n\n".encode(), [Event(data="héllo ✓")]),
    (b"data: \xff\xfe\n\n", [Event(data="\ufffd\ufffd")]),
])
def test_a_stream_gives_these_events(stream, expected):
    assert parse(stream) == expected


def test_retry_sets_the_reconnection_time_when_it_is_digits():
    parser = SSEParser(BIG)
    parser.feed(b"retry: 1500\n\n")
    assert parser.retry_ms == 1500
    parser.feed(b"retry: 15x\n\nretry:\n\n")
    assert parser.retry_ms == 1500


STREAM = ("\xef\xbb\xbf: comment\r\nevent: content_block_delta\r\ndata: {\"text\": \"é✓\"}\r\n\r\n"
          "data: line one\rdata: line two\r\rid: 3\ndata: x\n\n").encode()
EXPECTED = [Event("content_block_delta", '{"text": "é✓"}'), Event(data="line one\nline two"), Event(data="x", id="3")]


def test_the_sample_stream_in_one_chunk():
    assert parse(STREAM) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_a_chunk_may_end_anywhere(cut):
    # Inside the BOM, inside a UTF-8 character, between the CR and LF of a
    # CRLF (which must not become two line ends), between lines.
    assert feed_in_pieces(STREAM, [cut]) == EXPECTED


def test_byte_by_byte():
    assert feed_in_pieces(STREAM, list(range(1, len(STREAM)))) == EXPECTED


def test_a_cr_ending_a_chunk_pairs_with_an_lf_starting_the_next():
    # "data: a\r" + "\n" + "data: b\r\n\r\n": one event; were the CR and LF two
    # line ends, the empty line between would dispatch "a" alone.
    assert feed_in_pieces(b"data: a\r\ndata: b\r\n\r\n", [8]) == [Event(data="a\nb")]
    # An empty chunk between them changes nothing.
    assert feed_in_pieces(b"data: a\r\ndata: b\r\n\r\n", [8, 8]) == [Event(data="a\nb")]
    # A CR then a CR is a line end then an empty line.
    assert feed_in_pieces(b"data: a\r\r", [8]) == [Event(data="a")]


def test_an_unfinished_line_over_the_cap_is_too_large():
    parser = SSEParser(100)
    parser.feed(b"data: " + b"x" * 94)  # 100 bytes held: at the cap
    assert parser.buffered == 100
    with pytest.raises(OutputTooLarge):
        parser.feed(b"x")


def test_an_event_over_the_cap_is_too_large_even_line_by_line():
    parser = SSEParser(100)
    with pytest.raises(OutputTooLarge):
        for _ in range(20):
            parser.feed(b"data: 0123456789\n")


def test_dispatched_events_and_comments_do_not_count():
    parser = SSEParser(100)
    for _ in range(100):
        assert parser.feed(b": keep-alive comment, ignored\ndata: 0123456789\n\n") == [Event(data="0123456789")]
    assert parser.buffered == 0


async def test_aiter_events_yields_each_event_as_its_blank_line_arrives():
    seen: list[str] = []

    async def chunks():
        for piece in (b"data: o", b"ne\n", b"\ndata: two\n\nda", b"ta: open"):
            seen.append(piece.decode())
            yield piece

    events = []
    async for event in aiter_events(chunks(), max_bytes=BIG):
        events.append((event.data, len(seen)))
    assert events == [("one", 3), ("two", 3)]


async def test_aiter_events_lets_the_streams_own_errors_through():
    async def chunks():
        yield b"data: one\n\n"
        raise ConnectionResetError("gone")

    got = []
    with pytest.raises(ConnectionResetError):
        async for event in aiter_events(chunks(), max_bytes=BIG):
            got.append(event.data)
    assert got == ["one"]
