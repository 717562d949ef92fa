"""Table tests for what the console's forms and queries may carry
(app/web/console/forms.py) and the session helpers' pure parts."""
from __future__ import annotations

import pytest

from app.web.body import MAX_CREDITS
from app.web.console import forms
from app.web.console.session import admin_token_matches, cookie_options, decode_nonce, encode_nonce

FORM = "application/x-www-form-urlencoded"
JOB = "job_0123456789abcdef01234567"
OWNER = "own_0123456789abcdef01234567"


def check(parse, value, expected) -> None:
    """`parse(value)` is `expected`, or raises it when it is FormError."""
    if expected is forms.FormError:
        with pytest.raises(forms.FormError):
            parse(value)
    else:
        assert parse(value) == expected


@pytest.mark.parametrize(
    "content_type,raw,expected",
    [
        pytest.param(FORM, b"a=1&b=two", {"a": "1", "b": "two"}, id="plain"),
        pytest.param(FORM + "; charset=UTF-8", b"a=%C3%A9", {"a": "é"}, id="charset-param"),
        pytest.param(FORM, b"", {}, id="empty"),
        pytest.param(FORM, b"a=", {"a": ""}, id="blank-value"),
        pytest.param(FORM, b"q=a+b", {"q": "a b"}, id="plus-is-space"),
        pytest.param("APPLICATION/X-WWW-FORM-URLENCODED", b"a=1", {"a": "1"}, id="type-case"),
        pytest.param("multipart/form-data; boundary=x", b"a=1", forms.FormError, id="multipart"),
        pytest.param("application/json", b'{"a": 1}', forms.FormError, id="json"),
        pytest.param(None, b"a=1", forms.FormError, id="no-type"),
        pytest.param(None, b"", {}, id="no-body-at-all"),
        pytest.param(FORM, b"a=1&a=2", forms.FormError, id="field-twice"),
        pytest.param(FORM, b"a=%ff", forms.FormError, id="not-utf8-escape"),
        pytest.param(FORM, b"a=\xff", forms.FormError, id="not-utf8-byte"),
        pytest.param(FORM, b"a=%00", forms.FormError, id="nul"),
        pytest.param(FORM, b"a", forms.FormError, id="no-equals"),
        pytest.param(FORM, "&".join(f"f{i}=1" for i in range(17)).encode(), forms.FormError, id="too-many-fields"),
        pytest.param(FORM, b"a=" + b"x" * forms.MAX_FORM_BYTES, forms.FormError, id="too-large"),
    ],
)
def test_parse_form(content_type, raw, expected) -> None:
    check(lambda body: forms.parse_form(content_type, body), raw, expected)


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("/console", "/console"),
        ("/console/needs-a-human", "/console/needs-a-human"),
        (f"/console/jobs/{JOB}", f"/console/jobs/{JOB}"),
        ("/console/search?q=abc", "/console/search?q=abc"),
        ("/console/owners?cursor=abc%3D", "/console/owners?cursor=abc%3D"),
        (None, "/console"),
        ("", "/console"),
        ("//evil.example/console", "/console"),
        ("https://evil.example/console", "/console"),
        ("/console//evil.example", "/console"),
        ("/console/\\evil.example", "/console"),
        ("/consoleevil", "/console"),
        ("/v1/jobs", "/console"),
        ("/console/../v1/admin", "/console"),
        ("/console/x\r\nSet-Cookie: a=b", "/console"),
        ("/console/" + "a" * 600, "/console"),
    ],
)
def test_safe_next_only_returns_to_a_console_page(raw, expected) -> None:
    assert forms.safe_next(raw) == expected


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"outcome": "failed"}, forms.Resolution(None)),
        ({"outcome": "task", "task_id": "abc123"}, forms.Resolution("abc123")),
        ({"outcome": "task", "task_id": "  abc123 "}, forms.Resolution("abc123")),
        ({"task_id": "abc123"}, forms.Resolution("abc123")),
        ({"outcome": "task", "task_id": "x" * 500}, forms.Resolution("x" * 500)),
        ({"outcome": "task", "task_id": "x" * 501}, forms.FormError),
        ({"outcome": "task", "task_id": ""}, forms.FormError),
        ({"outcome": "task", "task_id": "a\nb"}, forms.FormError),
        ({"outcome": "failed", "task_id": "abc"}, forms.FormError),  # both: ambiguous, refused
        ({"outcome": "succeeded"}, forms.FormError),
        ({}, forms.FormError),
    ],
)
def test_parse_resolution(fields, expected) -> None:
    check(forms.parse_resolution, fields, expected)


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"credits": "100", "reason": "ticket 42"}, forms.Grant(100, "ticket 42")),
        ({"credits": " 7 "}, forms.Grant(7, "granted in the console")),
        ({"credits": "1", "reason": "  a \n b  "}, forms.Grant(1, "a b")),
        ({"credits": str(MAX_CREDITS)}, forms.Grant(MAX_CREDITS, "granted in the console")),
        ({"credits": str(MAX_CREDITS + 1)}, forms.FormError),
        ({"credits": "0"}, forms.FormError),
        ({"credits": "-5"}, forms.FormError),
        ({"credits": "+5"}, forms.FormError),
        ({"credits": "05"}, forms.FormError),
        ({"credits": "1.5"}, forms.FormError),
        ({"credits": "1e3"}, forms.FormError),
        ({"credits": "١٢"}, forms.FormError),  # Arabic-Indic digits: int() would take them
        ({"credits": ""}, forms.FormError),
        ({}, forms.FormError),
        ({"credits": "1", "reason": "x" * 501}, forms.FormError),
    ],
)
def test_parse_grant(fields, expected) -> None:
    check(forms.parse_grant, fields, expected)


@pytest.mark.parametrize(
    "raw,ok",
    [
        ("console-" + "0" * 32, True),
        ("console-" + "a1" * 16, True),
        ("console-" + "A" * 32, False),
        ("console-" + "0" * 31, False),
        ("0" * 32, False),
        ("", False),
        (None, False),
    ],
)
def test_parse_grant_key(raw, ok) -> None:
    if ok:
        assert forms.parse_grant_key(raw) == raw
    else:
        with pytest.raises(forms.FormError):
            forms.parse_grant_key(raw)


@pytest.mark.parametrize(
    "raw,expected",
    [
        (JOB, forms.Search("job", JOB)),
        (f"  {JOB} ", forms.Search("job", JOB)),
        (OWNER, forms.Search("owner", OWNER)),
        ("evt_" + "0123456789abcdef" * 2, forms.Search("notification", "evt_" + "0123456789abcdef" * 2)),
        ("r8-prediction-id", forms.Search("task", "r8-prediction-id")),
        ("job_not-an-id", forms.Search("task", "job_not-an-id")),
        ("", None),
        ("   ", None),
        (None, None),
        ("x" * 501, forms.FormError),
        ("task\x00id", forms.FormError),
        ("task\nid", forms.FormError),
    ],
)
def test_parse_search(raw, expected) -> None:
    check(forms.parse_search, raw, expected)


@pytest.mark.parametrize(
    "given,ok",
    [
        ("the-admin-token", True),
        ("the-admin-token ", False),
        ("the-admin-toke", False),
        ("THE-ADMIN-TOKEN", False),
        ("", False),
        ("\udcff", False),  # a lone surrogate is compared, not a crash
    ],
)
def test_admin_token_matches(given, ok) -> None:
    assert admin_token_matches(given, "the-admin-token") is ok


def test_nonce_round_trip_and_refusals() -> None:
    nonce = bytes(range(16))
    assert decode_nonce(encode_nonce(nonce)) == nonce
    for bad in (None, "", "abc", encode_nonce(nonce) + "A", encode_nonce(nonce)[:-1], "💥" * 22, "A" * 100):
        assert decode_nonce(bad) is None


@pytest.mark.parametrize("secure", [False, True])
def test_cookie_options(secure) -> None:
    assert cookie_options(secure=secure, max_age=60) == {
        "max_age": 60, "path": "/console", "secure": secure, "httponly": True, "samesite": "strict"}
