"""What the settler's steps share: settings, database pool, providers,
storage, the secret box, metrics. Opened once per settler process."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

import asyncpg

from app import db
from app.capacity import capped_providers
from app.config import Settings
from app.delivery import Sender
from app.download import DownloadClients, DownloadPolicy, HostLimiter
from app.metrics import Metrics
from app.providers import build_providers, close_providers
from app.providers.base import Provider, ProviderFacts
from app.signing.secretbox import SecretBox
from app.storage import Storage, open_storage

log = logging.getLogger("longcall.settler")


@dataclass
class Context:
    settings: Settings
    pool: asyncpg.Pool
    providers: dict[str, Provider]
    storage: Storage
    secretbox: SecretBox
    metrics: Metrics
    download_dir: str
    # Every download of this settler process shares them: the per-origin
    # limit, and keep-alive connections to the providers' file hosts.
    host_limiter: HostLimiter
    download_clients: DownloadClients
    # Notification deliveries: the guarded sender, and places per endpoint id.
    sender: Sender
    endpoint_places: HostLimiter

    @classmethod
    async def open(cls, settings: Settings, *, pool_size: int = 10, provider_timeout_s: float | None = None,
                   connect_all: bool = False) -> Context:
        """`connect_all`: open the whole pool now rather than on demand, so the
        first jobs after a start do not each wait on a new connection (a fresh
        settler's first jobs are the slowest it settles: `longcall bench`, the
        e2e latency notes). They are opened, not kept: as before, one idle for
        five minutes (asyncpg's default) closes, down to one. Best effort: a
        server that refuses some (`max_connections`, a role's connection
        limit) leaves them to be opened on demand, as without `connect_all`;
        only the first connection is required."""
        pool = await db.create_pool(settings.dsn, role="settler", min_size=1, max_size=pool_size)
        if connect_all:
            opened = await asyncio.gather(*(pool.acquire() for _ in range(pool_size)), return_exceptions=True)
            refused = [c for c in opened if isinstance(c, BaseException)]
            for conn in opened:
                if not isinstance(conn, BaseException):
                    await pool.release(conn)
            if refused:
                # Class names only: a driver's message is not ours to vouch for.
                log.warning("could not open the whole pool at start; the rest open on demand",
                            extra={"opened": pool_size - len(refused), "size": pool_size,
                                   "error": ", ".join(sorted({type(e).__name__ for e in refused}))})
        _remove_orphaned_download_dirs()
        download_dir = os.path.join(tempfile.gettempdir(), f"{DOWNLOAD_DIR_PREFIX}{os.getpid()}")
        os.makedirs(download_dir, exist_ok=True)
        providers = build_providers(settings, timeout_s=provider_timeout_s or settings.provider_timeout_s,
                                    spool_dir=download_dir)
        return cls(settings=settings, pool=pool, providers=providers,
                   storage=open_storage(settings.storage_url, s3_endpoint_url=settings.s3_endpoint_url),
                   secretbox=SecretBox(settings.secret_keys), metrics=Metrics(),
                   download_dir=download_dir, host_limiter=HostLimiter(settings.downloads_per_host),
                   download_clients=DownloadClients(per_origin=settings.downloads_per_host),
                   sender=Sender(settings.notify_allowed_origins),
                   endpoint_places=HostLimiter(PLACES_PER_ENDPOINT))

    @functools.cached_property
    def capacity_limited(self) -> bool:
        """Whether any provider has a cap (then a submit reads its job's caps first)."""
        return bool(capped_providers(self.settings))

    def facts_for(self, provider: Provider, model: str) -> ProviderFacts:
        """The facts of `model`'s jobs: the adapter's, with the models file's timings over them."""
        return self.settings.models.apply(provider.name, model, provider.facts_for(model))

    def download_policy(self, provider: Provider) -> DownloadPolicy:
        """How `provider`'s outputs may be fetched: https from its own output
        hosts at public addresses; plain http (and loopback) only from that
        provider's own configured loopback origin, never another's."""
        return DownloadPolicy(allowed_hosts=tuple(provider.facts.output_hosts),
                              plain_http_origins=self.settings.plain_http_origins(provider.name),
                              max_bytes=self.settings.max_output_bytes,
                              stall_timeout_s=self.settings.download_stall_timeout_s,
                              host_limiter=self.host_limiter, clients=self.download_clients,
                              credential_hosts=provider.facts.credential_hosts,
                              credentials=provider.download_credentials(),
                              any_host=provider.facts.outputs_from_any_host)

    async def close(self) -> None:
        await close_providers(self.providers)
        await self.storage.aclose()
        await self.download_clients.aclose()
        await self.sender.aclose()
        await self.pool.close()
        shutil.rmtree(self.download_dir, ignore_errors=True)


DOWNLOAD_DIR_PREFIX = "longcall-downloads-"
PLACES_PER_ENDPOINT = 4  # notification attempts at once to one endpoint, per settler


def _remove_orphaned_download_dirs() -> None:
    """Partial downloads of settlers that were killed (their pid is gone)."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        if not name.startswith(DOWNLOAD_DIR_PREFIX):
            continue
        try:
            pid = int(name[len(DOWNLOAD_DIR_PREFIX):])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except (ValueError, PermissionError):
            continue
