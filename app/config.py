"""Settings, from the environment only, validated at start.

Every problem is reported as one clear line (ConfigError); the command line
prints it and exits 2. Secrets are never part of a message.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

OFFICIAL_URLS = {
    "replicate": "https://api.replicate.com",
    "fal": "https://queue.fal.run",
    "fal_jwks": "https://rest.alpha.fal.ai/.well-known/jwks.json",
    "kie": "https://api.kie.ai",
}
DEFAULT_SIM_URL = "http://127.0.0.1:8787"
PROVIDERS = ("sim", "replicate", "fal", "kie")


class ConfigError(Exception):
    """One line that says what is wrong with the configuration."""


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def origin_of(url: str) -> str:
    """scheme://host:port with the default port made explicit."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum:g}")
    return value


def _url(env: Mapping[str, str], name: str, default: str) -> str:
    value = (env.get(name) or default).rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name} must be an http(s) URL")
    return value


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    secret_keys: tuple[bytes, ...]  # first signs/encrypts; all are accepted (rotation)
    public_url: str | None
    storage_url: str
    s3_endpoint_url: str | None
    admin_token: str | None
    port: int
    max_output_bytes: int
    sim_url: str
    replicate_api_token: str | None
    replicate_base_url: str
    replicate_webhook_secret: str | None
    fal_key: str | None
    fal_base_url: str
    fal_jwks_url: str
    kie_api_key: str | None
    kie_base_url: str
    read_recheck_after_s: float
    sweep_interval_s: float
    give_up_after_s: float
    give_up_after_s_by_provider: Mapping[str, float] = field(default_factory=dict)
    log_level: str = "INFO"
    provider_timeout_s: float = 30.0
    # STALE_AFTER_S: overrides every provider's lost-webhook check (seconds
    # after submit to ask the provider anyway when a webhook is registered).
    stale_after_s: float | None = None
    settler_lease_s: float = 60.0

    def give_up_after(self, provider: str) -> float:
        return self.give_up_after_s_by_provider.get(provider, self.give_up_after_s)

    @property
    def secret_key(self) -> bytes:
        return self.secret_keys[0]

    def plain_http_origins(self) -> frozenset[str]:
        """Origins that outputs may be fetched from over plain http: the
        simulator's and any provider base URL pointed at a loopback server."""
        origins = set()
        for url in (self.sim_url, self.replicate_base_url, self.fal_base_url, self.kie_base_url):
            parts = urlsplit(url)
            if parts.scheme == "http" and is_loopback_host(parts.hostname):
                origins.add(origin_of(url))
        return frozenset(origins)

    def callback_url(self, provider: str, job_id: str) -> str | None:
        if not self.public_url:
            return None
        return f"{self.public_url}/webhooks/{provider}/{job_id}"


def load_settings(env: Mapping[str, str] | None = None, *, dev: bool = False,
                  require_database: bool = True) -> Settings:
    """Read and check the settings. `dev` makes up what a local run may lack
    (a SECRET_KEY, the embedded database); elsewhere they are required."""
    env = os.environ if env is None else env

    database_url = env.get("DATABASE_URL") or None
    if database_url is None and require_database and not dev:
        raise ConfigError("DATABASE_URL is required (only longcall dev starts an embedded PostgreSQL)")
    if database_url is not None and not database_url.startswith(("postgres://", "postgresql://")):
        raise ConfigError("DATABASE_URL must be a postgresql:// URL")

    raw_secret = env.get("SECRET_KEY") or ""
    keys = tuple(k.strip().encode() for k in raw_secret.split(",") if k.strip())
    if not keys:
        if not dev:
            raise ConfigError("SECRET_KEY is required (only longcall dev makes one up)")
        keys = (b"longcall-dev-secret-key-not-for-production",)
    for k in keys:
        if len(k) < 16:
            raise ConfigError("SECRET_KEY must be at least 16 characters (each, when rotating: NEW,OLD)")

    public_url = (env.get("PUBLIC_URL") or "").rstrip("/") or None
    if public_url is not None:
        parts = urlsplit(public_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
            raise ConfigError("PUBLIC_URL must be an origin like https://longcall.example.com")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
            raise ConfigError("PUBLIC_URL must be https (plain http only for a loopback address)")

    storage_url = env.get("STORAGE_URL") or "file://" + os.path.abspath(".longcall/objects")
    parts = urlsplit(storage_url)
    if parts.scheme == "file":
        if not parts.path.startswith("/"):
            raise ConfigError("STORAGE_URL file:// needs an absolute path, like file:///var/lib/longcall")
    elif parts.scheme == "s3":
        if not parts.netloc:
            raise ConfigError("STORAGE_URL s3:// needs a bucket, like s3://bucket/prefix")
    else:
        raise ConfigError("STORAGE_URL must be file:// or s3://")

    level = (env.get("LOG_LEVEL") or "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError("LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")

    by_provider = {}
    for p in PROVIDERS:
        name = f"GIVE_UP_AFTER_S_{p.upper()}"
        if env.get(name):
            by_provider[p] = _float(env, name, 7200.0, minimum=1.0)

    return Settings(
        database_url=database_url,
        secret_keys=keys,
        public_url=public_url,
        storage_url=storage_url,
        s3_endpoint_url=env.get("S3_ENDPOINT_URL") or None,
        admin_token=env.get("ADMIN_TOKEN") or None,
        port=_int(env, "PORT", 8000, minimum=1),
        max_output_bytes=_int(env, "MAX_OUTPUT_BYTES", 2 * 1024**3, minimum=1),
        sim_url=_url(env, "SIM_URL", DEFAULT_SIM_URL),
        replicate_api_token=env.get("REPLICATE_API_TOKEN") or None,
        replicate_base_url=_url(env, "REPLICATE_BASE_URL", OFFICIAL_URLS["replicate"]),
        replicate_webhook_secret=env.get("REPLICATE_WEBHOOK_SECRET") or None,
        fal_key=env.get("FAL_KEY") or None,
        fal_base_url=_url(env, "FAL_BASE_URL", OFFICIAL_URLS["fal"]),
        fal_jwks_url=_url(env, "FAL_JWKS_URL", OFFICIAL_URLS["fal_jwks"]),
        kie_api_key=env.get("KIE_API_KEY") or None,
        kie_base_url=_url(env, "KIE_BASE_URL", OFFICIAL_URLS["kie"]),
        read_recheck_after_s=_float(env, "READ_RECHECK_AFTER_S", 15.0),
        sweep_interval_s=_float(env, "SWEEP_INTERVAL_S", 300.0),
        give_up_after_s=_float(env, "GIVE_UP_AFTER_S", 7200.0, minimum=1.0),
        give_up_after_s_by_provider=by_provider,
        log_level=level,
        provider_timeout_s=_float(env, "PROVIDER_TIMEOUT_S", 30.0, minimum=0.1),
        settler_lease_s=_float(env, "SETTLER_LEASE_S", 60.0, minimum=1.0),
        stale_after_s=_float(env, "STALE_AFTER_S", 0.0, minimum=1.0) if env.get("STALE_AFTER_S") else None,
    )
