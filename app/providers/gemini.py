"""Google's Gemini API: Veo video through predictLongRunning (being written: #12)."""
from __future__ import annotations

import httpx

from app.providers.base import Provider, ProviderFacts
from app.providers.http import Clients, host_of
from app.vocabulary import ProviderName

NAME = ProviderName.GEMINI


class GeminiProvider(Provider):
    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, stale_after_s: float = 60.0,
                 max_output_bytes: int = 2 * 1024**3, spool_dir: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._http = Clients(timeout_s, client)
        self._max_output_bytes = max_output_bytes
        self._spool_dir = spool_dir
        self.facts = ProviderFacts(name=NAME, webhook_scheme="none", idempotent_submit=False, can_find=False,
                                   stale_after_s=stale_after_s, output_hosts=(host_of(self.base_url),),
                                   credential_hosts=(host_of(self.base_url),))

    def __repr__(self) -> str:
        return f"GeminiProvider({self.base_url!r})"

    async def aclose(self) -> None:
        await self._http.aclose()
