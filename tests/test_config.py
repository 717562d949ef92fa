"""Settings: which origins each provider may fetch outputs from over plain
http, SIM_URL being optional, STORAGE_URL checked once, the download limits."""
from __future__ import annotations

import os

import pytest

from app.config import ConfigError, is_utf8, load_settings
from app.providers import build_providers, close_providers
from app.storage import FileLocation, S3Location, StorageUrlError, parse_storage_url

BASE = {"SECRET_KEY": "test-secret-key-0123456789", "STORAGE_URL": "file:///tmp/longcall-test-objects"}
SIM = "http://127.0.0.1:8787"


def settings(**env: str):
    return load_settings({**BASE, **env}, require_database=False)


# ----------------------------------------------------------------- plain http, per provider

NOTHING: dict[str, str] = {}
ONLY_SIM = {"SIM_URL": SIM}
DEV_LIKE = {"SIM_URL": SIM, "REPLICATE_BASE_URL": f"{SIM}/replicate", "FAL_BASE_URL": f"{SIM}/fal",
            "KIE_BASE_URL": f"{SIM}/kie"}
EACH_ITS_OWN = {"SIM_URL": "http://127.0.0.1:9001", "REPLICATE_BASE_URL": "http://127.0.0.1:9002",
                "FAL_BASE_URL": "http://localhost:9003/fal", "KIE_BASE_URL": "https://127.0.0.1:9004"}
NOT_LOOPBACK = {"SIM_URL": "http://10.0.0.5:8787", "REPLICATE_BASE_URL": "http://replicate-proxy.internal:8080",
                "FAL_BASE_URL": "http://0.0.0.0:9003"}
DEFAULT_PORT_AND_IPV6 = {"SIM_URL": "http://localhost", "KIE_BASE_URL": "http://[::1]:9004/kie"}


@pytest.mark.parametrize("env, expected", [
    # Nothing configured: nothing over plain http, for anyone (the old
    # default SIM_URL made 127.0.0.1:8787 plain-http-able for every provider).
    (NOTHING, {"sim": set(), "replicate": set(), "fal": set(), "kie": set()}),
    # The simulator's origin is the simulator's, not the other providers'.
    (ONLY_SIM, {"sim": {"http://127.0.0.1:8787"}, "replicate": set(), "fal": set(), "kie": set()}),
    # A provider pointed at the simulator through its own *_BASE_URL gets that origin.
    (DEV_LIKE, {"sim": {"http://127.0.0.1:8787"}, "replicate": {"http://127.0.0.1:8787"},
                "fal": {"http://127.0.0.1:8787"}, "kie": {"http://127.0.0.1:8787"}}),
    # Each its own, never pooled; an https base URL is no plain http origin.
    (EACH_ITS_OWN, {"sim": {"http://127.0.0.1:9001"}, "replicate": {"http://127.0.0.1:9002"},
                    "fal": {"http://localhost:9003"}, "kie": set()}),
    # Plain http only on loopback, whatever is configured.
    (NOT_LOOPBACK, {"sim": set(), "replicate": set(), "fal": set(), "kie": set()}),
    (DEFAULT_PORT_AND_IPV6, {"sim": {"http://localhost:80"}, "replicate": set(), "fal": set(),
                             "kie": {"http://[::1]:9004"}}),
])
def test_plain_http_origins_per_provider(env, expected):
    configured = settings(**env)
    assert {p: set(configured.plain_http_origins(p)) for p in expected} == expected


def test_a_provider_without_an_adapter_has_no_plain_http_origin():
    assert settings(**DEV_LIKE).plain_http_origins("gateway") == frozenset()


# ----------------------------------------------------------------- SIM_URL is optional

def test_sim_url_is_unset_unless_configured():
    assert settings().sim_url is None
    assert settings(SIM_URL="").sim_url is None
    assert settings(SIM_URL="http://127.0.0.1:8787/").sim_url == "http://127.0.0.1:8787"
    assert load_settings({}, dev=True, require_database=False).sim_url is None  # `dev` sets it in the environment


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8787", "127.0.0.1:8787", "http://", "http://127.0.0.1:0",
                                 "http://127.0.0.1:99999"])
def test_a_bad_sim_url_is_a_config_error(url):
    with pytest.raises(ConfigError, match="SIM_URL must be an http"):
        settings(SIM_URL=url)


async def test_sim_is_built_only_with_sim_url():
    without = build_providers(settings(), timeout_s=1)
    with_sim = build_providers(settings(SIM_URL=SIM), timeout_s=1)
    try:
        assert set(without) == {"replicate", "fal", "kie", "gateway", "gemini", "elevenlabs",
                                "anthropic", "openai"}
        assert set(with_sim) == {"sim", *without}
        assert with_sim["sim"].facts.output_hosts == ("127.0.0.1",)
    finally:
        await close_providers(without)
        await close_providers(with_sim)


def test_dev_sets_sim_url_and_points_keyless_providers_at_it(monkeypatch, tmp_path):
    from app import dev

    monkeypatch.chdir(tmp_path)
    for name in ("SIM_URL", "REPLICATE_API_TOKEN", "FAL_KEY", "KIE_API_KEY", "STORAGE_URL",
                 "REPLICATE_BASE_URL", "FAL_BASE_URL", "FAL_JWKS_URL", "KIE_BASE_URL",
                 "AI_GATEWAY_API_KEY", "AI_GATEWAY_BASE_URL", "GEMINI_API_KEY", "GEMINI_BASE_URL",
                 "ELEVENLABS_API_KEY", "ELEVENLABS_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                 "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.setenv(name, "")  # recorded, so what dev writes is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")  # no embedded server started
    monkeypatch.setenv("SECRET_KEY", "test-secret-key-0123456789")
    monkeypatch.setenv("SIM_URL", "")  # set but empty counts as unset
    assert dev._prepare_environment() is None
    assert os.environ["SIM_URL"] == dev.DEV_SIM_URL == "http://127.0.0.1:8787"
    assert os.environ["REPLICATE_BASE_URL"] == "http://127.0.0.1:8787/replicate"
    assert os.environ["AI_GATEWAY_BASE_URL"] == "http://127.0.0.1:8787/gateway/v4/ai"
    assert os.environ["GEMINI_BASE_URL"] == "http://127.0.0.1:8787/gemini"
    assert os.environ["ELEVENLABS_BASE_URL"] == "http://127.0.0.1:8787/elevenlabs"
    assert os.environ["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8787/anthropic"
    assert os.environ["OPENAI_BASE_URL"] == "http://127.0.0.1:8787/openai/v1"
    assert load_settings(dev=True).plain_http_origins("replicate") == frozenset({"http://127.0.0.1:8787"})


async def test_sim_without_sim_url_is_an_unknown_provider(web, make_owner):
    server = await web(SIM_URL="")
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c:
        r = await c.post("/v1/jobs", json={"provider": "sim", "model": "m", "input": {}, "max_credits": 5})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_provider"
        ok = await c.post("/v1/jobs", json={"provider": "replicate", "model": "acme/model", "input": {},
                                            "max_credits": 5})
        assert ok.status_code == 202
        assert (await c.get("/v1/account")).json()["credits"]["reserved"] == 5  # the refused one reserved nothing


# ----------------------------------------------------------------- downloads

def test_download_limits_default_and_validate():
    default = settings()
    assert (default.download_stall_timeout_s, default.downloads_per_host) == (15.0, 4)
    tuned = settings(DOWNLOAD_STALL_TIMEOUT_S="2.5", DOWNLOADS_PER_HOST="8")
    assert (tuned.download_stall_timeout_s, tuned.downloads_per_host) == (2.5, 8)
    with pytest.raises(ConfigError, match="DOWNLOADS_PER_HOST must be at least 1"):
        settings(DOWNLOADS_PER_HOST="0")
    with pytest.raises(ConfigError, match="DOWNLOADS_PER_HOST must be a whole number"):
        settings(DOWNLOADS_PER_HOST="many")
    with pytest.raises(ConfigError, match="DOWNLOAD_STALL_TIMEOUT_S must be a number of seconds from 0.1 to"):
        settings(DOWNLOAD_STALL_TIMEOUT_S="0")


# ----------------------------------------------------------------- durations, caps, origins

DURATIONS = ("READ_RECHECK_AFTER_S", "SWEEP_INTERVAL_S", "GIVE_UP_AFTER_S", "GIVE_UP_AFTER_S_SIM",
             "PROVIDER_TIMEOUT_S", "SETTLER_LEASE_S", "STALE_AFTER_S", "DOWNLOAD_STALL_TIMEOUT_S")


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e300", "1e13", "2592001"])
def test_a_duration_is_finite_and_at_most_a_month(name, value):
    """Each passed a start before, then failed every statement that added it
    to a timestamp (a 500 on every create, a settler that never claimed)."""
    with pytest.raises(ConfigError, match=f"{name} must be a number of seconds from .* to 2592000"):
        settings(**{name: value})


@pytest.mark.parametrize("name", DURATIONS)
def test_a_month_is_still_a_duration(name):
    assert settings(**{name: "2592000"})


def test_the_sweep_may_still_be_turned_off():
    assert settings(SWEEP_INTERVAL_S="0").sweep_interval_s == 0


def test_a_capacity_fits_the_statements_that_count_it():
    assert settings(MAX_IN_FLIGHT_SIM=str(2**31 - 1)).max_in_flight_by_provider == {"sim": 2**31 - 1}
    for value in (str(2**31), "99999999999999999999999"):
        with pytest.raises(ConfigError, match="MAX_IN_FLIGHT_SIM must be at most 2147483647"):
            settings(MAX_IN_FLIGHT_SIM=value)


@pytest.mark.parametrize("url", [
    "https://[bad", "https://user:pw@example.com", "https://:pw@example.com", "https://example.com:abc",
    "https://example.com:99999", "https://example.com:0", "https://exa mple.com", "https://example.com#frag",
    "https://example.com/#", "https://example.com/path", "https://example.com?q=1",
])
def test_public_url_is_an_origin_and_nothing_more(url):
    with pytest.raises(ConfigError, match="PUBLIC_URL must be an origin") as caught:
        settings(PUBLIC_URL=url)
    assert "pw" not in str(caught.value)


def test_public_url_may_have_a_port_and_a_trailing_slash():
    assert settings(PUBLIC_URL="https://example.com:8443/").public_url == "https://example.com:8443"


@pytest.mark.parametrize("value", ["http://[bad", "http://127.0.0.1:9000#x", "http://127.0.0.1:0",
                                   "http://u@127.0.0.1:9000"])
def test_notify_allowed_origins_are_origins(value):
    with pytest.raises(ConfigError, match="NOTIFY_ALLOWED_ORIGINS must be comma-separated origins"):
        settings(NOTIFY_ALLOWED_ORIGINS=value)


@pytest.mark.parametrize("url", ["postgresql://u:p%40x@h1:5432,h2:5433/db", "postgresql://h1,h2/db",
                                 "postgresql:///db?host=/var/run/postgresql", "postgres://[::1]:5432/db"])
def test_database_urls_libpq_takes_are_still_taken(url):
    assert load_settings({**BASE, "DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize("url", ["postgresql://[bad", "postgresql://u:pw@127.0.0.1:notaport/x",
                                 "postgresql://u:pw@127.0.0.1:0/x", "postgresql://u:pw@127.0.0.1:70000/x",
                                 "postgresql://u:pw@h1:5432,h2:nope/x"])
def test_a_database_url_that_cannot_parse_is_refused_at_start(url):
    with pytest.raises(ConfigError, match="DATABASE_URL must be a postgresql:// URL") as caught:
        load_settings({**BASE, "DATABASE_URL": url})
    assert "pw" not in str(caught.value)


# ----------------------------------------------------------------- STORAGE_URL, checked once

@pytest.mark.parametrize("url, location", [
    ("file:///var/lib/longcall", FileLocation("/var/lib/longcall")),
    ("file://localhost/var/lib/longcall", FileLocation("/var/lib/longcall")),
    ("file:///var/lib/long%20call", FileLocation("/var/lib/long call")),
    ("file:///var/lib/a%23b%3Fc", FileLocation("/var/lib/a#b?c")),
    ("s3://my-bucket", S3Location("my-bucket", "")),
    ("s3://my-bucket/some/prefix/", S3Location("my-bucket", "some/prefix")),
])
def test_parse_storage_url(url, location):
    assert parse_storage_url(url) == location


@pytest.mark.parametrize("url, message", [
    ("file://relative/path", "STORAGE_URL file:// needs an absolute path, like file:///var/lib/longcall"),
    ("file:", "STORAGE_URL file:// needs an absolute path, like file:///var/lib/longcall"),
    ("s3://", "STORAGE_URL s3:// needs a bucket, like s3://bucket/prefix"),
    ("s3:///prefix", "STORAGE_URL s3:// needs a bucket, like s3://bucket/prefix"),
    ("s3://UPPER/x", "STORAGE_URL s3:// bucket names are 3-63 lowercase letters, digits, '.' or '-'"),
    ("s3://user@bucket/x", "STORAGE_URL s3:// bucket names are 3-63 lowercase letters, digits, '.' or '-'"),
    ("http://x/y", "STORAGE_URL must be file:// or s3://"),
    ("file:///tmp/x?y=1", "STORAGE_URL takes no query or fragment (in a path, '?' is %3F and '#' is %23)"),
    ("file:///tmp/x#frag", "STORAGE_URL takes no query or fragment (in a path, '?' is %3F and '#' is %23)"),
    ("file:///tmp/x?", "STORAGE_URL takes no query or fragment (in a path, '?' is %3F and '#' is %23)"),
    ("s3://my-bucket/p?versionId=1", "STORAGE_URL takes no query or fragment (in a path, '?' is %3F and '#' is %23)"),
    ("/abs", "STORAGE_URL must be file:// or s3://"),
])
def test_config_and_storage_refuse_a_storage_url_alike(url, message):
    with pytest.raises(StorageUrlError) as parsed:
        parse_storage_url(url)
    with pytest.raises(ConfigError) as configured:
        settings(STORAGE_URL=url)
    assert str(parsed.value) == str(configured.value) == message


def test_the_default_storage_url_survives_an_odd_working_directory(monkeypatch, tmp_path):
    odd = tmp_path / "a dir#with %odd?chars"
    odd.mkdir()
    monkeypatch.chdir(odd)
    configured = load_settings({"SECRET_KEY": BASE["SECRET_KEY"]}, require_database=False)
    assert parse_storage_url(configured.storage_url) == FileLocation(str(odd / ".longcall" / "objects"))


@pytest.mark.parametrize(("text", "utf8"), [
    ("", True), ("plain", True), ("café ✓ 😀", True),
    ("caf\udce9", False),  # a Latin-1 é in the environment or argv: a lone surrogate
    ("\udcff\udcfe", False), ("\ud83d", False),
])
def test_what_came_from_valid_utf8(text, utf8):
    assert is_utf8(text) is utf8


def test_a_setting_not_utf8_is_refused_by_name_only_when_read():
    base = {"DATABASE_URL": "postgresql://x/y", "SECRET_KEY": "k" * 32}
    with pytest.raises(ConfigError) as caught:
        load_settings({**base, "ADMIN_TOKEN": "s3cr3t\udce9"})
    assert str(caught.value) == "ADMIN_TOKEN is not valid UTF-8"
    assert load_settings({**base, "SOMETHING_ELSE": "\udce9"}).admin_token is None  # never read, never refused
