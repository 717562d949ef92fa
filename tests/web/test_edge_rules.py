"""The pure rules of the HTTP edge, as tables: what a body, a query value,
an Idempotency-Key, an output index and a cursor may be; how an output is
served; which methods a path allows; which labels a request is counted
under; the serve limits."""
from __future__ import annotations

import base64
import json

import pytest
from starlette.routing import Route

from app.config import ConfigError
from app.web import ROUTES, allowed_methods
from app.web.access_log import method_label, route_label
from app.web.body import (
    MAX_JSON_DEPTH,
    json_problem,
    parse_idempotency_key,
    parse_json_object,
    parse_output_index,
)
from app.web.errors import ApiError
from app.web.jobs import decode_cursor
from app.web.outputs import disposition, served_type
from app.web.server import serve_limits

JOB_ID = "job_0123456789abcdef01234567"


def nested(depth: int, leaf: object = 1) -> object:
    """A value `depth` containers deep (a list counts as one level)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value,problem", [
    ({"input": {"prompt": "a cat"}}, None),
    ({"input": {"emoji": "\U0001F600", "bom": "\ufeff", "max": 1e308, "tiny": -0.0}}, None),
    ({"input": {"prompt": "a\x00b"}}, "input.prompt must not contain NUL characters"),
    ({"model": "\x00"}, "model must not contain NUL characters"),
    ({"input": {"a\x00": 1}}, "a field name in input must not contain NUL characters"),
    ({"input": {"x": "\ud800"}}, "input.x must not contain lone UTF-16 surrogates"),
    ({"input": {"x": "ok\udfff"}}, "input.x must not contain lone UTF-16 surrogates"),
    ({"\udc00": 1}, "a field name in the request body must not contain lone UTF-16 surrogates"),
    ({"input": {"x": [1, 2, float("inf")]}}, "input.x[2] must be a finite number"),
    ({"input": {"x": float("-inf")}}, "input.x must be a finite number"),
    ({"input": {"x": float("nan")}}, "input.x must be a finite number"),
    ({"input": {"odd key": {"y": "\x00"}}}, 'input["odd key"].y must not contain NUL characters'),
    # The body is level 1, `input` level 2: 62 more lists make 64, one more is too deep.
    ({"input": {"x": nested(MAX_JSON_DEPTH - 2)}}, None),
    ({"input": {"x": nested(MAX_JSON_DEPTH - 1)}},
     ("input.x" + "[0]" * 62)[:117] + f"... nests deeper than {MAX_JSON_DEPTH} levels"),  # a long path is cut
    ({"input": {"a": {"b": nested(MAX_JSON_DEPTH - 4, {"c": {}})}}},
     ("input.a.b" + "[0]" * 60 + ".c")[:117] + f"... nests deeper than {MAX_JSON_DEPTH} levels"),
])
def test_json_problem(value, problem):
    assert json_problem(value) == problem


def test_json_problem_is_iterative_and_messages_are_ascii():
    deep = {"input": nested(100_000)}  # far past Python's recursion limit
    assert "nests deeper than 64 levels" in json_problem(deep)
    odd = {"input": {"\u00e9\U0001F600 key": "\x00"}}
    message = json_problem(odd)
    assert message.isascii() and "must not contain NUL" in message


def test_the_limits_kept_twice_agree():
    """Pure modules (the console's forms) cannot import the domain's, so these are written twice."""
    from app.domain import owners, recovery
    from app.web import body

    assert body.MAX_PROVIDER_TASK_ID == recovery.MAX_PROVIDER_TASK_ID
    assert body.MAX_CREDITS == owners.MAX_GRANT  # the console's grant form is bounded by MAX_CREDITS


@pytest.mark.parametrize("raw,expected", [
    (b'{"a": 1}', {"a": 1}),
    (b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001F600"}),  # a pair is one character: fine
    (b'{"a": "\\u0000"}', "a must not contain NUL characters"),
    (b'{"a": "\\ud800"}', "a must not contain lone UTF-16 surrogates"),
    (b'{"a": 1e999}', "a must be a finite number"),
    (b'{"a": -1e999}', "a must be a finite number"),
    (b'{"a": NaN}', "not valid JSON"),
    (b'{"a": Infinity}', "not valid JSON"),
    (b'{"a": "\x00"}', "not valid JSON"),        # a raw control character in a string
    (b'{"a": "\xed\xa0\x80"}', "not UTF-8"),      # a surrogate encoded as UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64 levels"),
    (b'{"a":' * 2000 + b"1" + b"}" * 2000, "nests deeper than 64 levels"),
    (b"[1]", "must be a JSON object"),
    (b"", "not valid JSON"),
    (b'{"a": ' + b"9" * 5000 + b"}", "an integer with too many digits"),  # valid JSON, past Python's 4,300
])
def test_parse_json_object(raw, expected):
    if isinstance(expected, dict):
        assert parse_json_object(raw) == expected
        return
    with pytest.raises(ApiError) as caught:
        parse_json_object(raw)
    assert caught.value.code == "invalid_request" and caught.value.status == 400
    assert expected in caught.value.message


@pytest.mark.parametrize("raw,key", [
    (None, None),
    ("k", "k"),
    ("  k  ", "k"),
    ("\tk\t", "k"),
    ("a b", "a b"),
    ("x" * 255, "x" * 255),
    ("  " + "x" * 255 + " ", "x" * 255),
    ("~!@#$%^&*()", "~!@#$%^&*()"),
    ("", ApiError), ("   ", ApiError), ("x" * 256, ApiError), ("caf\u00e9", ApiError),
    ("a\x00b", ApiError), ("a\tb", ApiError), ("a\x7f", ApiError),
])
def test_idempotency_key(raw, key):
    if key is ApiError:
        with pytest.raises(ApiError):
            parse_idempotency_key(raw)
    else:
        assert parse_idempotency_key(raw) == key


@pytest.mark.parametrize("raw,index", [
    ("0", 0), ("1", 1), ("10", 10), ("123456789", 123456789),
    ("+0", None), ("-0", None), ("01", None), ("00", None), ("1_0", None), (" 1", None), ("1 ", None),
    ("\u0661", None), ("\uff11", None), ("0x1", None), ("", None), ("1234567890", None), ("1e3", None),
])
def test_output_index(raw, index):
    assert parse_output_index(raw) == index


def cursor_of(*parts: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


def test_cursor_round_trip_and_bounds():
    at, job_id = decode_cursor(cursor_of("2024-05-01T12:00:00.123456+02:00", JOB_ID))
    assert at.isoformat() == "2024-05-01T10:00:00.123456+00:00" and job_id == JOB_ID
    for bad in (cursor_of("0001-01-01T00:00:00+14:00", JOB_ID),   # overflows when made UTC
                cursor_of("9999-12-31T23:59:59-14:00", JOB_ID),
                cursor_of("0001-01-01T00:00:00+00:00", JOB_ID),   # representable, but no job of ours
                cursor_of("9999-06-01T00:00:00+00:00", JOB_ID),
                cursor_of("2024-05-01T12:00:00", JOB_ID),         # no offset
                cursor_of("2024-05-01T12:00:00Z", "job_x"),
                cursor_of("2024-05-01T12:00:00Z"),
                cursor_of(1, 2),
                base64.urlsafe_b64encode(b"[" * 5000).decode(),
                "zzz", "\u00e9", "a" * 201):
        with pytest.raises(ApiError):
            decode_cursor(bad)


@pytest.mark.parametrize("content_type,served,kind", [
    ("image/png", "image/png", 'inline; filename="s.png"'),
    ("IMAGE/JPEG", "IMAGE/JPEG", 'inline; filename="s.jpg"'),
    ("video/mp4", "video/mp4", 'inline; filename="s.mp4"'),
    ("audio/mpeg", "audio/mpeg", 'inline; filename="s.mp3"'),
    ("audio/wav", "audio/wav", 'inline; filename="s.wav"'),
    ("audio/ogg; codecs=opus", "audio/ogg; codecs=opus", 'inline; filename="s.ogg"'),
    ("image/svg+xml", "image/svg+xml", 'attachment; filename="s"'),
    ("text/html", "text/html", 'attachment; filename="s"'),
    ("text/html; charset=utf-8", "text/html; charset=utf-8", 'attachment; filename="s"'),
    ("application/xhtml+xml", "application/xhtml+xml", 'attachment; filename="s"'),
    ("application/pdf", "application/pdf", 'attachment; filename="s"'),
    ("text/plain; charset=utf-8", "text/plain; charset=utf-8", 'attachment; filename="s.txt"'),
    ("application/json", "application/json", 'attachment; filename="s.json"'),
    (None, "application/octet-stream", 'attachment; filename="s"'),
    ("", "application/octet-stream", 'attachment; filename="s"'),
    ("image/png\r\nSet-Cookie: a=b", "application/octet-stream", 'attachment; filename="s"'),
    ("image/png, text/html", "application/octet-stream", 'attachment; filename="s"'),
    ("nonsense", "application/octet-stream", 'attachment; filename="s"'),
])
def test_output_type_and_disposition(content_type, served, kind):
    assert served_type(content_type) == served
    assert disposition(content_type, "s") == kind


def test_allowed_methods_cover_every_route_on_a_path():
    assert allowed_methods(ROUTES, "/v1/jobs") == "GET, HEAD, POST"
    assert allowed_methods(ROUTES, f"/v1/jobs/{JOB_ID}") == "GET, HEAD, OPTIONS"
    assert allowed_methods(ROUTES, f"/v1/jobs/{JOB_ID}/cancel") == "POST"
    assert allowed_methods(ROUTES, "/v1/account") == "GET, HEAD"


def test_metric_labels_are_bounded():
    route = Route("/v1/jobs/{job_id}", lambda r: None)
    assert route_label({"route": route}) == "/v1/jobs/{job_id}"
    assert route_label({"path": "/v1/anything/at/all"}) == "other"
    assert [method_label(m) for m in ("GET", "POST", "OPTIONS", "BREW", "get")] == \
        ["GET", "POST", "OPTIONS", "other", "other"]


@pytest.mark.parametrize("flag_timeout,flag_limit,env,expected", [
    (None, None, {}, (10.0, 1000)),
    ("2.5", "50", {}, (2.5, 50)),
    (None, None, {"HEADER_TIMEOUT_S": "3", "LIMIT_CONCURRENCY": "7"}, (3.0, 7)),
    ("4", "8", {"HEADER_TIMEOUT_S": "3", "LIMIT_CONCURRENCY": "7"}, (4.0, 8)),
    (None, None, {"HEADER_TIMEOUT_S": ""}, (10.0, 1000)),
    ("0", None, {}, "--header-timeout"), ("-1", None, {}, "--header-timeout"),
    ("nan", None, {}, "--header-timeout"), ("inf", None, {}, "--header-timeout"),
    ("x", None, {}, "--header-timeout"), (None, None, {"HEADER_TIMEOUT_S": "soon"}, "HEADER_TIMEOUT_S"),
    (None, "0", {}, "--limit-concurrency"), (None, "1.5", {}, "--limit-concurrency"),
    (None, None, {"LIMIT_CONCURRENCY": "-3"}, "LIMIT_CONCURRENCY"),
])
def test_serve_limits(flag_timeout, flag_limit, env, expected):
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            serve_limits(flag_timeout, flag_limit, env)
    else:
        assert serve_limits(flag_timeout, flag_limit, env) == expected
