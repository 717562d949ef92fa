"""Settings, from the environment only, validated at start.

Every problem is reported as one clear line (ConfigError); the command line
prints it and exits 2. Secrets are never part of a message.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import SplitResult, quote, urlencode, urlsplit

from app.models_file import MAX_IN_FLIGHT, MAX_SECONDS, ModelsFile, ModelsFileError, load_models_file
from app.origins import is_loopback_host, origin_of
from app.signing.tokens import make_capability_token
from app.storage import StorageUrlError, parse_storage_url
from app.vocabulary import ProviderName

# The providers' official endpoints, the defaults of their *_BASE_URL settings.
REPLICATE_URL = "https://api.replicate.com"
FAL_QUEUE_URL = "https://queue.fal.run"
FAL_JWKS_URL = "https://rest.alpha.fal.ai/.well-known/jwks.json"
KIE_URL = "https://api.kie.ai"
AI_GATEWAY_URL = "https://ai-gateway.vercel.sh/v4/ai"
GEMINI_URL = "https://generativelanguage.googleapis.com"
ELEVENLABS_URL = "https://api.elevenlabs.io"
ANTHROPIC_URL = "https://api.anthropic.com"
OPENAI_URL = "https://api.openai.com/v1"
PROVIDERS = tuple(ProviderName)  # every provider longcall has an adapter for
# The query parameter of a callback URL that carries our capability token.
CALLBACK_TOKEN = "token"


class ConfigError(Exception):
    """One line that says what is wrong with the configuration."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}")
    return value


MAX_PORT = 65535


def port_argument(value: str) -> int:
    """A command line's TCP port (argparse `type`): 1 to 65535, refused
    before anything starts."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 1 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"port must be between 1 and {MAX_PORT}, not {port}")
    return port


def _seconds(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    """A duration setting: a finite number of seconds from `minimum` to a
    month (the models file's own bound). NaN, infinity or 1e300 would pass
    a start and then fail every statement that adds it to a timestamp."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
    if not minimum <= value <= MAX_SECONDS:  # NaN fails this too
        raise ConfigError(f"{name} must be a number of seconds from {minimum:g} to {MAX_SECONDS:.0f} (a month)")
    return value


def _url(env: Mapping[str, str], name: str, default: str) -> str:
    value = (env.get(name) or default).rstrip("/")
    try:
        origin_of(value)
    except ValueError:
        raise ConfigError(f"{name} must be an http(s) URL") from None
    return value


def _optional_url(env: Mapping[str, str], name: str) -> str | None:
    return _url(env, name, "") if env.get(name) else None


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
    sim_url: str | None  # unset outside `dev`: provider `sim` is then not built
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
    # MAX_IN_FLIGHT_<PROVIDER>: at most this many of its jobs submitted and not closed.
    max_in_flight_by_provider: Mapping[str, int] = field(default_factory=dict)
    log_level: str = "INFO"
    provider_timeout_s: float = 30.0
    # STALE_AFTER_S: overrides every provider's lost-webhook check (seconds
    # after submit to ask the provider anyway when a webhook is registered).
    stale_after_s: float | None = None
    settler_lease_s: float = 60.0
    ai_gateway_api_key: str | None = None
    ai_gateway_base_url: str = AI_GATEWAY_URL
    gemini_api_key: str | None = None
    gemini_base_url: str = GEMINI_URL
    elevenlabs_api_key: str | None = None
    elevenlabs_base_url: str = ELEVENLABS_URL
    anthropic_api_key: str | None = None
    anthropic_base_url: str = ANTHROPIC_URL
    openai_api_key: str | None = None
    openai_base_url: str = OPENAI_URL
    # MODELS_FILE: per-model timings (and, with #14, prices and capacity).
    models: ModelsFile = field(default_factory=lambda: ModelsFile(()))
    # KIE's optional webhook signature (its account settings' webhookHmacKey):
    # when set, a KIE callback must carry it too, besides our capability token.
    kie_webhook_hmac_key: str | None = None
    # A download that receives no byte for this long (waiting for the answer
    # or between two chunks) fails and is retried later; the total stays capped.
    download_stall_timeout_s: float = 15.0
    # At most this many downloads at once from one origin, per settler
    # process: a stalled output host cannot take every settler slot.
    downloads_per_host: int = 4
    # NOTIFY_ALLOWED_ORIGINS: exact origins notification endpoints may use
    # although loopback or private (and over plain http): development, tests.
    notify_allowed_origins: frozenset[str] = frozenset()
    # NOTIFY_RETRY_S: seconds between delivery attempts, the last repeating until 24 h.
    notify_retry_s: tuple[float, ...] = (5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)

    @property
    def dsn(self) -> str:
        """DATABASE_URL, for the commands that need a database (load_settings
        makes it optional only for those that do not)."""
        if self.database_url is None:
            raise ConfigError("DATABASE_URL is required")
        return self.database_url

    def give_up_after(self, provider: str, model_default: float | None = None, *, model: str | None = None) -> float:
        """A new job's give-up, in seconds: the models file's entry for the
        model when it sets one, else GIVE_UP_AFTER_S_<PROVIDER> when set,
        else the adapter's default for the model, else GIVE_UP_AFTER_S."""
        entry = self.models.match(provider, model) if model is not None else None
        if entry is not None and entry.give_up_after_s is not None:
            return entry.give_up_after_s
        chosen = self.give_up_after_s_by_provider.get(provider)
        if chosen is None:
            chosen = model_default if model_default is not None else self.give_up_after_s
        return chosen

    @property
    def secret_key(self) -> bytes:
        return self.secret_keys[0]

    def base_url(self, provider: str) -> str | None:
        """Where this configuration sends `provider`'s API calls; None for the
        simulator when SIM_URL is unset (provider `sim` is then not built)."""
        urls: dict[str, str | None] = {
            ProviderName.SIM: self.sim_url, ProviderName.REPLICATE: self.replicate_base_url,
            ProviderName.FAL: self.fal_base_url, ProviderName.KIE: self.kie_base_url,
            ProviderName.GATEWAY: self.ai_gateway_base_url, ProviderName.GEMINI: self.gemini_base_url,
            ProviderName.ELEVENLABS: self.elevenlabs_base_url, ProviderName.ANTHROPIC: self.anthropic_base_url,
            ProviderName.OPENAI: self.openai_base_url}
        return urls.get(provider)

    def plain_http_origins(self, provider: str) -> frozenset[str]:
        """Origins `provider`'s outputs may be fetched from over plain http
        (and on a loopback address): only the origin of that provider's own
        base URL, when it is plain http on loopback — the simulator, or a
        provider pointed at it through its own *_BASE_URL. Never another
        provider's, never a default: with nothing configured it is empty."""
        url = self.base_url(provider)
        if url is None:
            return frozenset()
        parts = urlsplit(url)
        if parts.scheme != "http" or not is_loopback_host(parts.hostname):
            return frozenset()
        return frozenset({origin_of(url)})

    def callback_url(self, provider: str, job_id: str) -> str | None:
        """The URL a provider calls back for this job: it names the job and
        carries our capability token for (provider, job), so a delivery must
        pass our check as well as the provider's own signature (and KIE's,
        which signs no body, rests on it). None without PUBLIC_URL."""
        if not self.public_url:
            return None
        token = make_capability_token(provider, job_id, self.secret_key)
        return f"{self.public_url}/webhooks/{provider}/{job_id}?{urlencode({CALLBACK_TOKEN: token})}"


def _is_postgres_url(url: str) -> bool:
    """A postgres(ql):// URL whose hosts parse and whose ports, if any, are
    numbers from 1 to 65535 (asyncpg raises a bare ValueError on either only
    when it connects). Several hosts (`h1:5432,h2:5433`, as libpq and asyncpg
    take them) are each checked. Never echoed: it may hold a password."""
    try:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2].split(",")
        ports = [urlsplit("//" + host).port for host in hosts]
    except ValueError:
        return False
    return parts.scheme in ("postgres", "postgresql") and 0 not in ports


def _origin_parts(url: str) -> SplitResult | None:
    """The parts of an http(s) origin (a trailing `/` allowed) with a host
    and, if any, a port from 1 to 65535; None for anything more or less."""
    try:
        parts = urlsplit(url)
        origin_of(url)  # ValueError: not http(s), or a port that is not one
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0 \
            or parts.path not in ("", "/") or parts.query or parts.fragment or "#" in url \
            or parts.username is not None or any(c.isspace() for c in url):
        return None
    return parts


def _origins(env: Mapping[str, str], name: str) -> frozenset[str]:
    origins = set()
    for raw in (env.get(name) or "").split(","):
        if not raw.strip():
            continue
        if _origin_parts(raw.strip()) is None:
            raise ConfigError(f"{name} must be comma-separated origins like http://127.0.0.1:9000")
        origins.add(origin_of(raw.strip()))
    return frozenset(origins)


def _schedule(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    raw = env.get(name)
    if not raw:
        return default
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if not values or not all(0 < v <= 86400 for v in values):  # NaN fails this too
        raise ConfigError(f"{name} must be comma-separated seconds, each above 0 and at most 86400")
    return values


def _models_file(env: Mapping[str, str]) -> ModelsFile:
    try:
        return load_models_file(env.get("MODELS_FILE") or None)
    except ModelsFileError as e:
        raise ConfigError(str(e)) from None


def is_utf8(text: str) -> bool:
    """Whether `text` came from valid UTF-8: Python hands an argument's or a
    variable's undecodable bytes over as lone surrogates, which fail later
    deep in an encode(). Pure."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class Utf8Settings(Mapping[str, str]):
    """The environment as load_settings reads it: a value that is not valid
    UTF-8 is refused by name when read, and never quoted: it may be a
    secret. Variables never read are not looked at."""

    def __init__(self, env: Mapping[str, str]):
        self._env = env

    def __getitem__(self, name: str) -> str:
        value = self._env[name]
        if not is_utf8(value):
            raise ConfigError(f"{name} is not valid UTF-8")
        return value

    def __iter__(self):
        return iter(self._env)

    def __len__(self) -> int:
        return len(self._env)


def load_settings(env: Mapping[str, str] | None = None, *, dev: bool = False,
                  require_database: bool = True) -> Settings:
    """Read and check the settings. `dev` makes up what a local run may lack
    (a SECRET_KEY, the embedded database); elsewhere they are required."""
    env = Utf8Settings(os.environ if env is None else env)

    database_url = env.get("DATABASE_URL") or None
    if database_url is None and require_database and not dev:
        raise ConfigError("DATABASE_URL is required (only longcall dev starts an embedded PostgreSQL)")
    if database_url is not None and not _is_postgres_url(database_url):
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
        # Callback URLs are this origin plus a path: nothing else may ride
        # along (user info, a fragment, a space) and its port must be real.
        parts = _origin_parts(public_url)
        if parts is None:
            raise ConfigError("PUBLIC_URL must be an origin like https://longcall.example.com")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
            raise ConfigError("PUBLIC_URL must be https (plain http only for a loopback address)")

    # quote(): a working directory with a space, '%' or '#' in it is still one path.
    storage_url = env.get("STORAGE_URL") or "file://" + quote(os.path.abspath(".longcall/objects"))
    try:
        parse_storage_url(storage_url)
    except StorageUrlError as e:
        raise ConfigError(str(e)) from None

    level = (env.get("LOG_LEVEL") or "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError("LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")

    per_provider = ("GIVE_UP_AFTER_S_", "MAX_IN_FLIGHT_")
    known = {prefix + p.upper() for prefix in per_provider for p in PROVIDERS}
    for name in sorted(env):
        # A mistyped provider would otherwise be a setting that never applies.
        if name.startswith(per_provider) and name not in known:
            raise ConfigError(f"{name} names no provider (the providers: "
                              f"{', '.join(p.upper() for p in PROVIDERS)})")

    by_provider: dict[str, float] = {}
    for p in PROVIDERS:
        name = f"GIVE_UP_AFTER_S_{p.upper()}"
        if env.get(name):
            by_provider[p] = _seconds(env, name, 7200.0, minimum=1.0)

    max_in_flight: dict[str, int] = {}
    for p in PROVIDERS:
        name = f"MAX_IN_FLIGHT_{p.upper()}"
        if env.get(name):
            max_in_flight[p] = _int(env, name, 0, minimum=1, maximum=MAX_IN_FLIGHT)

    return Settings(
        database_url=database_url,
        secret_keys=keys,
        public_url=public_url,
        storage_url=storage_url,
        s3_endpoint_url=_optional_url(env, "S3_ENDPOINT_URL"),
        admin_token=env.get("ADMIN_TOKEN") or None,
        port=_int(env, "PORT", 8000, minimum=1, maximum=MAX_PORT),
        max_output_bytes=_int(env, "MAX_OUTPUT_BYTES", 2 * 1024**3, minimum=1),
        sim_url=_optional_url(env, "SIM_URL"),
        replicate_api_token=env.get("REPLICATE_API_TOKEN") or None,
        replicate_base_url=_url(env, "REPLICATE_BASE_URL", REPLICATE_URL),
        replicate_webhook_secret=env.get("REPLICATE_WEBHOOK_SECRET") or None,
        fal_key=env.get("FAL_KEY") or None,
        fal_base_url=_url(env, "FAL_BASE_URL", FAL_QUEUE_URL),
        fal_jwks_url=_url(env, "FAL_JWKS_URL", FAL_JWKS_URL),
        kie_api_key=env.get("KIE_API_KEY") or None,
        kie_base_url=_url(env, "KIE_BASE_URL", KIE_URL),
        read_recheck_after_s=_seconds(env, "READ_RECHECK_AFTER_S", 15.0),
        sweep_interval_s=_seconds(env, "SWEEP_INTERVAL_S", 300.0),
        give_up_after_s=_seconds(env, "GIVE_UP_AFTER_S", 7200.0, minimum=1.0),
        give_up_after_s_by_provider=by_provider,
        max_in_flight_by_provider=max_in_flight,
        log_level=level,
        provider_timeout_s=_seconds(env, "PROVIDER_TIMEOUT_S", 30.0, minimum=0.1),
        settler_lease_s=_seconds(env, "SETTLER_LEASE_S", 60.0, minimum=1.0),
        stale_after_s=_seconds(env, "STALE_AFTER_S", 0.0, minimum=1.0) if env.get("STALE_AFTER_S") else None,
        download_stall_timeout_s=_seconds(env, "DOWNLOAD_STALL_TIMEOUT_S", 15.0, minimum=0.1),
        downloads_per_host=_int(env, "DOWNLOADS_PER_HOST", 4, minimum=1),
        ai_gateway_api_key=env.get("AI_GATEWAY_API_KEY") or None,
        ai_gateway_base_url=_url(env, "AI_GATEWAY_BASE_URL", AI_GATEWAY_URL),
        gemini_api_key=env.get("GEMINI_API_KEY") or None,
        gemini_base_url=_url(env, "GEMINI_BASE_URL", GEMINI_URL),
        elevenlabs_api_key=env.get("ELEVENLABS_API_KEY") or None,
        elevenlabs_base_url=_url(env, "ELEVENLABS_BASE_URL", ELEVENLABS_URL),
        anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
        anthropic_base_url=_url(env, "ANTHROPIC_BASE_URL", ANTHROPIC_URL),
        openai_api_key=env.get("OPENAI_API_KEY") or None,
        openai_base_url=_url(env, "OPENAI_BASE_URL", OPENAI_URL),
        kie_webhook_hmac_key=env.get("KIE_WEBHOOK_HMAC_KEY") or None,
        models=_models_file(env),
        notify_allowed_origins=_origins(env, "NOTIFY_ALLOWED_ORIGINS"),
        notify_retry_s=_schedule(env, "NOTIFY_RETRY_S", (5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)),
    )
