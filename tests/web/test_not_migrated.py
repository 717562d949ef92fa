"""A web tier started on a database `longcall migrate` has not run on: not
ready, and every request that reaches our tables a 503 `unavailable`, never
a 500 (`internal` is for bugs)."""
from __future__ import annotations

from app.migrate import migrate

JOB = {"provider": "sim", "model": "m", "input": {}, "max_credits": 5}


async def test_an_unmigrated_database_is_not_ready_and_requests_are_503(web, empty_db):
    server = await web(DATABASE_URL=empty_db)
    async with server.client("lc_" + "x" * 40) as c:
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json() == {"ok": False, "database": "not migrated (run longcall migrate)"}
        for r in (await c.get("/v1/account"), await c.post("/v1/jobs", json=JOB), await c.get("/v1/jobs")):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "unavailable" and r.headers["retry-after"] == "5"
        await migrate(empty_db)
        assert (await c.get("/readyz")).json() == {"ok": True}
        assert (await c.get("/v1/account")).status_code == 401  # served: the key is simply unknown


async def test_a_database_behind_the_code_is_not_ready(web, db):
    server = await web()
    async with server.client() as c:
        assert (await c.get("/readyz")).status_code == 200
        latest = await db.fetchval("select max(version) from schema_migrations")
        await db.execute("delete from schema_migrations where version = $1", latest)
        try:
            r = await c.get("/readyz")
            assert r.status_code == 503 and r.json()["database"] == "not migrated (run longcall migrate)"
        finally:
            await db.execute("insert into schema_migrations (version, name) values ($1, 'restored')", latest)
        assert (await c.get("/readyz")).status_code == 200
