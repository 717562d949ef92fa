"""Provider capacity: how many of a model's jobs may be submitted and not
yet closed at once, across all settlers (CONTRACT.md: MAX_IN_FLIGHT_<PROVIDER>
and a models-file entry's `max_in_flight`; both caps apply). Pure: which caps
hold for a job. The counting is one guarded statement in app/domain/jobs.py
(`begin_submit`), serialized per provider by a transaction-scoped advisory
lock; the statement that closes a job of a capped provider wakes a job
waiting for its place (`jobs.close(wake_capacity=True)`); a provider's own
429 pauses its submits (app/domain/pauses.py)."""
from __future__ import annotations

from dataclasses import dataclass

from app.config import Settings

# A job over its cap waits to be woken when a place frees; if that wake is
# lost (its waker died between the close and the wake), it looks again
# after this long: a safety net, not a poll.
CAPACITY_BACKSTOP_S = 60.0


@dataclass(frozen=True)
class Caps:
    provider_cap: int | None = None  # MAX_IN_FLIGHT_<PROVIDER>
    entry: str | None = None  # the models-file entry's model glob, when it caps the job
    entry_cap: int | None = None

    @property
    def capped(self) -> bool:
        return self.provider_cap is not None or self.entry_cap is not None


NO_CAPS = Caps()


def caps_for(settings: Settings, provider: str, model: str) -> Caps:
    """The caps a job of `model` is submitted under (pure)."""
    provider_cap = settings.max_in_flight_by_provider.get(provider)
    entry = settings.models.match(provider, model)
    if entry is None or entry.max_in_flight is None:
        return Caps(provider_cap=provider_cap)
    return Caps(provider_cap=provider_cap, entry=entry.model, entry_cap=entry.max_in_flight)


def capped_providers(settings: Settings) -> dict[str, int | None]:
    """Every provider some cap applies to, with its MAX_IN_FLIGHT_<PROVIDER>
    (None when only models-file entries cap it): what `longcall status`
    and the metrics show."""
    found: dict[str, int | None] = {p: None for p in sorted({e.provider for e in settings.models.entries
                                                              if e.max_in_flight is not None})}
    found.update(settings.max_in_flight_by_provider)
    return found


def is_capped(settings: Settings, provider: str) -> bool:
    """Whether a cap applies to some of `provider`'s jobs (then a closing job wakes a waiting one)."""
    return provider in settings.max_in_flight_by_provider or any(
        e.provider == provider and e.max_in_flight is not None for e in settings.models.entries)
