"""The models file (`MODELS_FILE`, CONTRACT.md: The models file): per-model
timings, prices and capacity, in TOML.

Read and checked once at start (`serve`, `settler`, `dev`): a bad file is
one line (ModelsFileError) and exit 2. Every rule here is pure: `load`
parses text, `ModelsFile.match` finds the first entry whose provider matches
and whose model glob (fnmatchcase) matches, `apply` lays its timings over a
provider's facts for that model.

Where each field applies: the timings (`stale_after_s`, `poll_every_s`,
`give_up_after_s`, `timeout_s`) in `apply`, over the adapter's facts;
`price` in app/pricing.py when a job succeeds; `max_in_flight` in
app/capacity.py when a job is claimed.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fnmatch import fnmatchcase
from typing import Any

from app.providers.base import (
    ELEVENLABS_SOUND_MODEL,
    ELEVENLABS_SPEECH_PREFIX,
    LOST_CALL_MARGIN_S,
    SYNC_CALL_TIMEOUT_S,
    ProviderFacts,
    provider_kind,
)
from app.vocabulary import ProviderKind, ProviderName

PRICE_UNITS = ("job", "output", "second", "1k_tokens", "1k_characters", "provider")
ENTRY_KEYS = ("provider", "model", "stale_after_s", "poll_every_s", "give_up_after_s", "timeout_s",
              "max_in_flight", "price")
PRICE_KEYS = ("credits", "per")
MAX_SECONDS = 30 * 24 * 3600.0  # a month: anything longer is a typo
MAX_IN_FLIGHT = 2**31 - 1  # the capacity statements count in PostgreSQL's integer


class ModelsFileError(ValueError):
    """One line that says what is wrong with the models file."""


@dataclass(frozen=True)
class Price:
    credits: Decimal
    per: str


@dataclass(frozen=True)
class ModelEntry:
    provider: str
    model: str  # a glob
    stale_after_s: float | None = None
    poll_every_s: tuple[float, ...] | None = None
    give_up_after_s: float | None = None
    timeout_s: float | None = None
    max_in_flight: int | None = None
    price: Price | None = None

    def matches(self, provider: str, model: str) -> bool:
        return provider == self.provider and fnmatchcase(model, self.model)


@dataclass(frozen=True)
class ModelsFile:
    entries: tuple[ModelEntry, ...]

    def match(self, provider: str, model: str) -> ModelEntry | None:
        """The first entry for this provider whose glob matches the model."""
        for entry in self.entries:
            if entry.matches(provider, model):
                return entry
        return None

    def apply(self, provider: str, model: str, facts: ProviderFacts) -> ProviderFacts:
        """`facts` (the provider's for this model) with the matching entry's
        timings laid over them; a sync model's lost-call threshold is its
        timeout plus the margin unless the entry sets it."""
        entry = self.match(provider, model)
        changes: dict[str, Any] = {}
        if entry is not None:
            if entry.stale_after_s is not None:
                changes["stale_after_s"] = entry.stale_after_s
            if entry.poll_every_s is not None:
                changes["poll_delays_s"] = entry.poll_every_s
            if entry.give_up_after_s is not None:
                changes["give_up_after_s"] = entry.give_up_after_s
            if entry.timeout_s is not None and facts.kind is ProviderKind.SYNC:
                changes["call_timeout_s"] = entry.timeout_s
        if facts.kind is ProviderKind.SYNC and "stale_after_s" not in changes and "call_timeout_s" in changes:
            changes["stale_after_s"] = changes["call_timeout_s"] + LOST_CALL_MARGIN_S
        return dataclasses.replace(facts, **changes) if changes else facts


NO_MODELS = ModelsFile(())


def load_models_file(path: str | None) -> ModelsFile:
    """The file at `path` (None: no file, every provider's defaults)."""
    if path is None:
        return NO_MODELS
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ModelsFileError(f"MODELS_FILE {path!r} cannot be read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelsFileError(f"MODELS_FILE {path!r} is not UTF-8") from None
    return parse(text, source=f"MODELS_FILE {path!r}")


def parse(text: str, *, source: str = "the models file") -> ModelsFile:
    try:
        doc = tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as e:
        raise ModelsFileError(f"{source} is not valid TOML ({e})") from None
    unknown = sorted(set(doc) - {"models"})
    if unknown:
        raise ModelsFileError(f"{source}: unknown top-level key {unknown[0]!r} (only [[models]] entries)")
    models = doc.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise ModelsFileError(f"{source}: `models` must be an array of tables ([[models]])")
    return ModelsFile(tuple(_entry(m, f"{source}: models[{i}]") for i, m in enumerate(models)))


def _entry(table: Mapping[str, Any], where: str) -> ModelEntry:
    unknown = sorted(set(table) - set(ENTRY_KEYS))
    if unknown:
        raise ModelsFileError(f"{where}: unknown key {unknown[0]!r}")
    provider = table.get("provider")
    if provider not in tuple(ProviderName):
        raise ModelsFileError(f"{where}: provider must be one of {', '.join(ProviderName)}, not {provider!r}")
    model = table.get("model")
    if not isinstance(model, str):
        raise ModelsFileError(f"{where}: model must be a string (a model id or a glob)")
    problem = glob_problem(model)
    if problem:
        raise ModelsFileError(f"{where}: model {model!r} {problem}")
    where = f"{where} ({provider} {model})"
    entry = ModelEntry(
        provider=provider, model=model,
        stale_after_s=_seconds(table, "stale_after_s", where),
        poll_every_s=_schedule(table, where),
        give_up_after_s=_seconds(table, "give_up_after_s", where),
        timeout_s=_seconds(table, "timeout_s", where),
        max_in_flight=_count(table, "max_in_flight", where),
        price=_price(table, where))
    # timeout_s on an entry no sync model matches is accepted and has no
    # effect (only a sync call is a call of its own to time out): the
    # contract's own example sets it on KIE's async veo/*.
    if may_be_sync(provider, model) and entry.stale_after_s is not None:
        timeout = entry.timeout_s if entry.timeout_s is not None else SYNC_CALL_TIMEOUT_S
        if entry.stale_after_s < timeout:
            raise ModelsFileError(f"{where}: stale_after_s {entry.stale_after_s:g} is shorter than the call's "
                                  f"timeout_s {timeout:g}")
    return entry


def glob_problem(glob: str) -> str | None:
    """Why `glob` is not a model glob (pure): empty, blank characters, or an
    unclosed `[` (fnmatch would read it as a literal, matching nothing the
    writer meant). None when it is one."""
    if not glob:
        return "is empty"
    if any(c.isspace() or not c.isprintable() for c in glob):
        return "has blank or control characters"
    i = 0
    while i < len(glob):
        if glob[i] != "[":
            i += 1
            continue
        j = i + 1
        if glob[j:j + 1] == "!":
            j += 1
        if glob[j:j + 1] == "]":  # a `]` first in a set is one of its characters
            j += 1
        end = glob.find("]", j)
        if end < 0:
            return "has a `[` that is never closed"
        i = end + 1
    return None


def may_be_sync(provider: str, glob: str) -> bool:
    """Whether an entry can match a sync model (pure): every model of a
    sync provider; ElevenLabs' when the glob matches `sound-generation` or
    may match a `text-to-speech/…` (its literal start is not another
    word's: any model it matches begins with that start)."""
    if provider != ProviderName.ELEVENLABS:
        return provider_kind(provider, glob) is ProviderKind.SYNC
    if fnmatchcase(ELEVENLABS_SOUND_MODEL, glob):
        return True
    start = glob[:min((i for i, c in enumerate(glob) if c in "*?["), default=len(glob))]
    return ELEVENLABS_SPEECH_PREFIX.startswith(start) or start.startswith(ELEVENLABS_SPEECH_PREFIX)


def entry_kind(provider: str, glob: str) -> ProviderKind:
    """What an entry's models are, for `GET /v1/models` (pure): async when
    no sync model can match it (ElevenLabs' `dub*`), else as its glob is
    read as a model."""
    return provider_kind(provider, glob) if may_be_sync(provider, glob) else ProviderKind.ASYNC


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _seconds(table: Mapping[str, Any], key: str, where: str) -> float | None:
    if key not in table:
        return None
    number = _number(table[key])
    if number is None or not 0 < number <= MAX_SECONDS:
        raise ModelsFileError(f"{where}: {key} must be a number of seconds above 0 and at most {MAX_SECONDS:g}")
    return number


def _schedule(table: Mapping[str, Any], where: str) -> tuple[float, ...] | None:
    if "poll_every_s" not in table:
        return None
    value = table["poll_every_s"]
    numbers: Sequence[float | None] = [_number(v) for v in value] if isinstance(value, list) else []
    if not numbers or any(n is None or not 0 < n <= MAX_SECONDS for n in numbers):
        raise ModelsFileError(f"{where}: poll_every_s must be a non-empty list of seconds, each above 0")
    return tuple(n for n in numbers if n is not None)


def _count(table: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_IN_FLIGHT:
        raise ModelsFileError(f"{where}: {key} must be a whole number from 1 to {MAX_IN_FLIGHT}")
    return value


def _price(table: Mapping[str, Any], where: str) -> Price | None:
    if "price" not in table:
        return None
    price = table["price"]
    if not isinstance(price, dict):
        raise ModelsFileError(f"{where}: price must be a table: {{ credits = 3, per = \"second\" }}")
    unknown = sorted(set(price) - set(PRICE_KEYS))
    if unknown:
        raise ModelsFileError(f"{where}: unknown price key {unknown[0]!r}")
    per = price.get("per")
    if per not in PRICE_UNITS:
        raise ModelsFileError(f"{where}: price.per must be one of {', '.join(PRICE_UNITS)}, not {per!r}")
    credits = price.get("credits")
    if isinstance(credits, bool) or not isinstance(credits, int | Decimal):
        raise ModelsFileError(f"{where}: price.credits must be a number")
    try:
        amount = Decimal(credits)
    except InvalidOperation:
        raise ModelsFileError(f"{where}: price.credits must be a number") from None
    if not amount.is_finite() or amount < 0 or amount > 10**12:
        raise ModelsFileError(f"{where}: price.credits must be at least 0 and at most 10^12")
    return Price(amount, per)
