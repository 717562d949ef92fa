"""The benchmark's floor (proof/bench_baseline.py): by default its pool
resets each connection on release, as asyncpg's default pool does; with
`--no-pool-reset` (`pool_reset=False`) it does not, as longcall's own pools
(app/db.py). Seen from the server: a session setting left on a released
connection is gone, or kept."""
from __future__ import annotations

import asyncio

import pytest

from proof.bench_baseline import create_app


async def _setting_survives_release(database_url: str, pool_reset: bool) -> bool:
    app = create_app(database_url, "secret", pool_reset=pool_reset)
    async with app.router.lifespan_context(app):
        pool = app.state.pool
        async with pool.acquire() as conn:
            await conn.execute("set work_mem = '7MB'")
        # The pool's every connection at once: the released one is among them.
        held = [await pool.acquire() for _ in range(pool.get_size())]
        try:
            seen = await asyncio.gather(*[c.fetchval("show work_mem") for c in held])
        finally:
            for conn in held:
                await pool.release(conn)
    return "7MB" in seen


@pytest.mark.parametrize("pool_reset, survives", [(True, False), (False, True)])
async def test_the_floor_resets_released_connections_unless_told_not_to(database_url, pool_reset, survives):
    assert await _setting_survives_release(database_url, pool_reset) is survives
