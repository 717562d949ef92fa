"""`GET /v1/models`: the models file's entries as owners see them
(CONTRACT.md: HTTP API) — which models have their own price, give-up and
kind. Nothing secret is in an entry; the timings a support person would
ask about are there."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from app.config import Settings
from app.models_file import ModelEntry, entry_kind
from app.providers.base import Provider
from app.web.auth import require_owner


def entry_view(entry: ModelEntry, settings: Settings, providers: dict[str, Provider]) -> dict[str, Any]:
    """One entry as the API shows it (pure). `give_up_after_s` is the
    entry's, else what a job of that model gets by default."""
    give_up = entry.give_up_after_s
    if give_up is None:
        adapter = providers.get(entry.provider)
        model_default = adapter.facts_for(entry.model).give_up_after_s if adapter is not None else None
        give_up = settings.give_up_after(entry.provider, model_default)
    price = None
    if entry.price is not None:
        credits = entry.price.credits
        price = {"credits": int(credits) if credits == credits.to_integral_value() else float(credits),
                 "per": entry.price.per}
    return {"provider": entry.provider, "model": entry.model, "price": price, "give_up_after_s": give_up,
            "kind": entry_kind(entry.provider, entry.model).value}


async def list_models(request: Request) -> JSONResponse:
    await require_owner(request)
    settings: Settings = request.app.state.settings
    providers = request.app.state.providers
    return JSONResponse({"models": [entry_view(e, settings, providers) for e in settings.models.entries]})
