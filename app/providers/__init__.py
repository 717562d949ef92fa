"""Provider adapters, built from the settings.

Everything else talks to providers through `app.providers.base` and the
dict `build_providers` returns, keyed by provider name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.providers.base import Provider
from app.providers.base import provider_kind as provider_kind  # re-exported
from app.vocabulary import ProviderName

if TYPE_CHECKING:
    from app.config import Settings

KNOWN_PROVIDERS = tuple(ProviderName)


def build_providers(settings: Settings, *, timeout_s: float = 30.0,
                    spool_dir: str | None = None) -> dict[str, Provider]:
    """One adapter per configured provider, each with its own HTTP client
    (close them with `close_providers`). `sim` exists only when SIM_URL is
    set: a name that is not built is an unknown provider to the web tier.
    `spool_dir`: where adapters write outputs that came inline in an answer
    (the settler's download directory; None: the system's temp directory)."""
    # Imported here so that importing `app.providers.base` stays light.
    from app.providers.anthropic import AnthropicProvider
    from app.providers.elevenlabs import ElevenLabsProvider
    from app.providers.fal import FalProvider
    from app.providers.gateway import GatewayProvider
    from app.providers.gemini import GeminiProvider
    from app.providers.kie import KieProvider
    from app.providers.openai import OpenAIProvider
    from app.providers.replicate import ReplicateProvider
    from app.providers.sim import SimProvider

    # STALE_AFTER_S replaces each adapter's own lost-webhook check when set.
    stale: dict[str, Any] = {"stale_after_s": settings.stale_after_s} if settings.stale_after_s else {}
    providers: dict[str, Provider] = {}
    if settings.sim_url is not None:
        providers[ProviderName.SIM] = SimProvider(settings.sim_url, timeout_s=timeout_s, **stale)
    providers[ProviderName.REPLICATE] = ReplicateProvider(
        settings.replicate_base_url,
        settings.replicate_api_token,
        webhook_secret=settings.replicate_webhook_secret,
        timeout_s=timeout_s,
        **stale,
    )
    inline: dict[str, Any] = {"max_output_bytes": settings.max_output_bytes, "spool_dir": spool_dir}
    providers[ProviderName.FAL] = FalProvider(
        settings.fal_base_url, settings.fal_key, jwks_url=settings.fal_jwks_url, timeout_s=timeout_s,
        **inline, **stale,
    )
    providers[ProviderName.KIE] = KieProvider(
        settings.kie_base_url, settings.kie_api_key, secret_keys=settings.secret_keys,
        webhook_hmac_key=settings.kie_webhook_hmac_key, timeout_s=timeout_s, **stale,
    )
    providers[ProviderName.GATEWAY] = GatewayProvider(
        settings.ai_gateway_base_url, settings.ai_gateway_api_key, timeout_s=timeout_s, **inline, **stale)
    providers[ProviderName.GEMINI] = GeminiProvider(
        settings.gemini_base_url, settings.gemini_api_key, timeout_s=timeout_s, **inline, **stale)
    providers[ProviderName.ELEVENLABS] = ElevenLabsProvider(
        settings.elevenlabs_base_url, settings.elevenlabs_api_key, timeout_s=timeout_s, **inline, **stale)
    # Sync: STALE_AFTER_S is a lost-webhook check, not a lost-call threshold
    # (that one is per model: the models file's stale_after_s).
    providers[ProviderName.ANTHROPIC] = AnthropicProvider(
        settings.anthropic_base_url, settings.anthropic_api_key, timeout_s=timeout_s, **inline)
    providers[ProviderName.OPENAI] = OpenAIProvider(
        settings.openai_base_url, settings.openai_api_key, timeout_s=timeout_s, **inline)
    return providers


async def close_providers(providers: dict[str, Provider]) -> None:
    for provider in providers.values():
        try:
            await provider.aclose()
        except Exception:
            pass
