"""The pure checks: which URLs may be fetched, which addresses are public."""
from __future__ import annotations

import ipaddress

import pytest

from app.download import DownloadPolicy, Refused, check_url, host_allowed, is_public_address

POLICY = DownloadPolicy(
    allowed_hosts=("replicate.delivery", ".fal.media", "203.0.113.9"),
    plain_http_origins=frozenset({"http://127.0.0.1:8787", "http://localhost:9000"}),
    max_bytes=1024,
)


@pytest.mark.parametrize("url", [
    "https://replicate.delivery/xezq/abc/out-0.png",
    "https://REPLICATE.delivery/x",
    "https://replicate.delivery:8443/x",
    "https://v3.fal.media/files/x.png",
    "https://a.b.fal.media/x",
    "https://203.0.113.9/x",  # an allowed IP literal passes the URL check (the address check still runs)
    "http://127.0.0.1:8787/outputs/1?token=x",
    "http://localhost:9000/o",
])
def test_allowed(url):
    check_url(url, POLICY)


@pytest.mark.parametrize("url, why", [
    ("ftp://replicate.delivery/x", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("gopher://replicate.delivery/", "scheme"),
    ("http://replicate.delivery/x", "plain http"),
    ("http://127.0.0.1:8788/x", "plain http"),  # loopback, but not the configured origin
    ("http://127.0.0.1/x", "plain http"),
    ("http://169.254.169.254/latest/meta-data/", "plain http"),
    ("https://127.0.0.1:8787/x", "allowlist"),  # the plain origin is http only
    ("https://evil.example/x", "allowlist"),
    ("https://fal.media/x", "allowlist"),  # ".fal.media" means subdomains only
    ("https://evilfal.media/x", "allowlist"),
    ("https://replicate.delivery.evil.example/x", "allowlist"),
    ("https://169.254.169.254/x", "allowlist"),
    ("https://user:pw@replicate.delivery/x", "credentials"),
    ("https://user@replicate.delivery/x", "credentials"),
    ("https://replicate.delivery:0/x", "port"),
    ("https://replicate.delivery:99999/x", "port"),
    ("https:///x", "host"),
    ("https://replica\\te.delivery/x", "host"),
    ("https://replicate.delivery\x00/x", "valid URL"),
    ("not a url", "scheme"),
    ("", "scheme"),
])
def test_refused(url, why):
    with pytest.raises(Refused, match=why):
        check_url(url, POLICY)


def test_refusal_message_has_no_query_or_path():
    with pytest.raises(Refused) as info:
        check_url("http://evil.example/secret-path?token=SECRET123", POLICY)
    assert "SECRET123" not in str(info.value)
    assert "secret-path" not in str(info.value)


@pytest.mark.parametrize("host, allowed", [
    ("replicate.delivery", True),
    ("x.replicate.delivery", False),
    ("a.fal.media", True),
    ("fal.media", False),
    ("xfal.media", False),
])
def test_host_allowed(host, allowed):
    assert host_allowed(host, ("replicate.delivery", ".fal.media")) is allowed


@pytest.mark.parametrize("address, public", [
    ("8.8.8.8", True),
    ("1.1.1.1", True),
    ("2606:4700:4700::1111", True),
    ("::ffff:8.8.8.8", True),
    ("127.0.0.1", False),
    ("127.1.2.3", False),
    ("10.0.0.1", False),
    ("172.16.5.4", False),
    ("192.168.0.1", False),
    ("169.254.169.254", False),  # cloud metadata
    ("100.64.0.1", False),  # carrier-grade NAT
    ("0.0.0.0", False),
    ("224.0.0.1", False),
    ("239.255.255.250", False),
    ("255.255.255.255", False),
    ("240.0.0.1", False),
    ("192.0.2.1", False),
    ("198.18.0.1", False),
    ("::1", False),
    ("::", False),
    ("fe80::1", False),
    ("fc00::1", False),
    ("fd00:ec2::254", False),  # AWS metadata over IPv6
    ("fec0::1", False),
    ("ff02::1", False),
    ("ff0e::1", False),
    ("::ffff:127.0.0.1", False),
    ("::ffff:10.0.0.1", False),
    ("::ffff:169.254.169.254", False),
    ("::127.0.0.1", False),  # IPv4-compatible
    ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::", False),  # 6to4 of 169.254.169.254
    ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
    ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
    ("2001:db8::1", False),
    ("100::1", False),
])
def test_is_public_address(address, public):
    assert is_public_address(ipaddress.ip_address(address)) is public


# Any public https host (the Gateway's outputs are on whichever upstream
# served the job): the allowlist is not consulted, every other check holds.
ANY_HOST = DownloadPolicy(allowed_hosts=(), plain_http_origins=frozenset(), max_bytes=1024, any_host=True)


@pytest.mark.parametrize("url", ["https://cdn.example.com/v.mp4", "https://storage.googleapis.com/b/o?sig=1",
                                 "https://93.184.216.34/x"])
def test_any_host_allows_any_https_host(url):
    check_url(url, ANY_HOST)


@pytest.mark.parametrize("url, why", [
    ("http://cdn.example.com/v.mp4", "plain http"),
    ("https://user:pw@cdn.example.com/x", "credentials"),
    ("ftp://cdn.example.com/x", "scheme"),
    ("https://exa mple.com/x", "valid"),
])
def test_any_host_keeps_every_other_check(url, why):
    with pytest.raises(Refused, match=why):
        check_url(url, ANY_HOST)
