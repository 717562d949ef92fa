"""The API while the database is away: 503 `unavailable` with Retry-After,
never a 500, and nothing half-written."""
from __future__ import annotations

import asyncio
import logging
import time

JOB = {"provider": "sim", "model": "m", "input": {}, "max_credits": 5}


async def _backend_waiting_on_a_lock(db, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        pid = await db.fetchval("select pid from pg_stat_activity where application_name = 'longcall-web' "
                                "and wait_event_type = 'Lock'")
        if pid is not None:
            return pid
        assert time.monotonic() < deadline, "the create never reached the owner row"
        await asyncio.sleep(0.02)


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


async def test_a_connection_lost_in_the_middle_of_a_create_is_503_and_writes_nothing(web, make_owner, db):
    server = await web()  # (uvicorn's logging setup clears this logger's handlers: add ours after)
    server_errors = Records()  # uvicorn logs here when an exception escapes the app
    logging.getLogger("uvicorn.error").addHandler(server_errors)
    owner = await make_owner(credits=100)
    async with server.client(owner.api_key) as c, db.acquire() as blocker:
        # Hold the owner row so the create's statement waits inside PostgreSQL;
        # then cut that connection, as a database restart would.
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("select 1 from owners where id = $1 for update", owner.owner_id)
        create = asyncio.create_task(c.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k1"}))
        pid = await _backend_waiting_on_a_lock(db)
        assert await db.fetchval("select pg_terminate_backend($1)", pid)
        r = await create
        await tx.rollback()
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "unavailable" and r.headers["retry-after"] == "1"
        logging.getLogger("uvicorn.error").removeHandler(server_errors)
        assert [x.getMessage() for x in server_errors.records if x.levelno >= logging.ERROR] == []
        assert await db.fetchval("select count(*) from jobs") == 0
        assert await db.fetchval("select balance from owners where id = $1", owner.owner_id) == 100
        # The same request, sent again, is served on a fresh connection.
        again = await c.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k1"})
        assert again.status_code == 202
    assert await db.fetchval("select count(*) from jobs") == 1
