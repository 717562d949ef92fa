"""app/origins.py: the one way longcall says which server a URL talks to."""
from __future__ import annotations

import pytest

from app.origins import format_origin, host_of, host_port, is_loopback_host, origin_of, same_origin


@pytest.mark.parametrize("url, origin", [
    ("http://127.0.0.1:8787", "http://127.0.0.1:8787"),
    ("http://127.0.0.1:8787/replicate/v1?x=1#f", "http://127.0.0.1:8787"),
    ("http://127.0.0.1", "http://127.0.0.1:80"),  # the default port made explicit
    ("https://api.replicate.com", "https://api.replicate.com:443"),
    ("https://api.replicate.com:443/v1", "https://api.replicate.com:443"),
    ("https://api.replicate.com:8443/v1", "https://api.replicate.com:8443"),
    ("HTTPS://API.Replicate.COM/v1", "https://api.replicate.com:443"),  # scheme and host lower-cased
    ("http://[::1]:9000/x", "http://[::1]:9000"),  # IPv6 bracketed
    ("http://[::1]/x", "http://[::1]:80"),
    ("http://[FE80::1]:1/", "http://[fe80::1]:1"),
    ("http://localhost:65535", "http://localhost:65535"),
    ("http://user:pw@host.test:81/x", "http://host.test:81"),  # userinfo is not part of an origin
])
def test_origin_of(url, origin):
    assert origin_of(url) == origin


@pytest.mark.parametrize("url", [
    "",
    "not a url",
    "/relative/path",
    "ftp://host.test/x",
    "file:///etc/passwd",
    "s3://bucket/prefix",
    "http://",
    "http:///path",
    "http://host.test:0/",
    "http://host.test:65536/",
    "http://host.test:abc/",
    "http://[::1/",
])
def test_origin_of_refuses(url):
    with pytest.raises(ValueError):
        origin_of(url)


def test_origin_errors_do_not_quote_the_url():
    with pytest.raises(ValueError) as info:
        origin_of("ftp://host.test/secret-path?token=SECRET123")
    assert "SECRET123" not in str(info.value) and "secret-path" not in str(info.value)


@pytest.mark.parametrize("scheme, host, port, origin", [
    ("http", "127.0.0.1", None, "http://127.0.0.1:80"),
    ("HTTPS", "Example.COM", None, "https://example.com:443"),
    ("http", "::1", 8080, "http://[::1]:8080"),
    ("http", "[::1]", 8080, "http://[::1]:8080"),  # httpx's raw_host may come bracketed or not
])
def test_format_origin(scheme, host, port, origin):
    assert format_origin(scheme, host, port) == origin


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8787", ("127.0.0.1", 8787)),
    ("http://localhost", ("localhost", 80)),
    ("https://Example.com/x", ("example.com", 443)),
    ("http://[::1]:9/", ("::1", 9)),
])
def test_host_port(url, expected):
    assert host_port(url) == expected


@pytest.mark.parametrize("url, host", [
    ("https://Replicate.Delivery/x", "replicate.delivery"),
    ("http://[::1]:9000/x", "::1"),
    ("http://127.0.0.1:8787", "127.0.0.1"),
    ("not a url", ""),
    ("http://[::1", ""),
])
def test_host_of(url, host):
    assert host_of(url) == host


@pytest.mark.parametrize("a, b, same", [
    ("http://127.0.0.1:9000/fal/x", "http://127.0.0.1:9000/fal", True),
    ("http://127.0.0.1:80/x", "http://127.0.0.1", True),  # explicit default port
    ("https://QUEUE.fal.run/a", "https://queue.fal.run:443", True),
    ("http://[::1]:9000/a", "http://[0:0::1]:9000/b", False),  # compared as written, not as addresses
    ("http://127.0.0.1:9001/fal/x", "http://127.0.0.1:9000/fal", False),  # port
    ("https://127.0.0.1:9000/fal/x", "http://127.0.0.1:9000/fal", False),  # scheme
    ("http://localhost:9000/x", "http://127.0.0.1:9000", False),  # host names are not resolved
    ("http://user:pw@127.0.0.1:9000/x", "http://127.0.0.1:9000", False),  # credentials: never trusted
    ("http://user@127.0.0.1:9000/x", "http://127.0.0.1:9000", False),
    ("http://:pw@127.0.0.1:9000/x", "http://127.0.0.1:9000", False),
    ("ftp://127.0.0.1:9000/x", "ftp://127.0.0.1:9000", False),
    ("/relative", "http://127.0.0.1:9000", False),
    (None, "http://127.0.0.1:9000", False),
    (42, "http://127.0.0.1:9000", False),
    ("http://127.0.0.1:9000", None, False),
    ("http://127.0.0.1:99999/x", "http://127.0.0.1:9000", False),
])
def test_same_origin(a, b, same):
    assert same_origin(a, b) is same


@pytest.mark.parametrize("host, loopback", [
    ("localhost", True),
    ("LOCALHOST", True),
    ("localhost.", True),
    ("127.0.0.1", True),
    ("127.8.9.10", True),
    ("::1", True),
    ("[::1]", True),
    ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False),
    ("10.0.0.1", False),
    ("169.254.169.254", False),
    ("::", False),
    ("localhost.example.com", False),
    ("127.0.0.1.nip.io", False),  # only names, nothing resolved
    ("sim.test", False),
    ("", False),
    (None, False),
])
def test_is_loopback_host(host, loopback):
    assert is_loopback_host(host) is loopback
