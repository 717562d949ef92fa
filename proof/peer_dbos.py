"""The benchmark's peer: longcall's end-to-end job written as a DBOS Transact
application, the way DBOS's documentation writes one (issue #19).

`python -m proof.peer_dbos --port P` with, in the environment, DATABASE_URL
(the application database), DBOS_SYSTEM_DATABASE_URL (DBOS's system
database), SIM_URL, PUBLIC_URL and PEER_STORAGE_DIR. One process: a FastAPI
app on uvicorn (the same settings as `longcall serve`), DBOS launched in
`main` before the server starts, as DBOS's programming guide does.

What a job does, as longcall's e2e row measures it:

- `POST /v1/jobs` authenticates the bearer key (one hash lookup), then starts
  the job's workflow `settle_job` once, under the job id as its workflow id
  (`SetWorkflowID` + `DBOS.start_workflow_async`). The workflow's first step is
  the admitting transaction: reserve the job's credits and take an active slot
  on the owner row (one guarded UPDATE) and insert the job, or refuse it. The
  workflow publishes the verdict with `DBOS.set_event_async` and the handler,
  waiting on `DBOS.get_event_async`, answers 202, 402 or 429. This is the
  widget store's checkout (the endpoint starts the workflow idempotently, the
  workflow's first transaction reserves inventory, an event tells the
  endpoint) and the transactional-outbox page's first pattern ("the durable
  workflow replaces the outbox entirely").
- Then the steps: submit to the simulator (a step, `Idempotency-Key` = the
  workflow id); save the task id and webhook secret (a transaction); wait for
  the webhook (`DBOS.recv_async(topic="webhook")`, its timeout the poll
  interval); re-ask the provider for the task's status (a step, after a
  webhook or a timeout alike); download and store each output (a step: temp
  file, sha256, fsync, rename, directory fsync, as longcall's file storage
  does); close (a transaction: succeeded, charge the measured cost, refund
  the rest, release the slot).
- `POST /webhooks/sim/{job_id}` reads the job's secret, verifies the t/v1
  signature over the raw body and forwards a marker to the workflow with
  `DBOS.send_async`. The body is not trusted for state: the workflow re-asks.

What create-then-start guarantees here. The application database and the
system database are two databases, so the job row and the workflow cannot
commit in one transaction (DBOS's "transactionally enqueue" pattern calls the
`dbos.enqueue_workflow` SQL function inside the application transaction,
which needs both in one database). Instead the workflow row comes first: once
`start_workflow_async` returns, the workflow runs to completion even if the
process dies, and its admitting transaction runs exactly once (a datasource
transaction commits its checkpoint with the job row). So a job row never
exists without its workflow; a workflow may exist whose job was refused (it
ends at once). If the process dies between the start and the event, the
client gets no answer, but the job is admitted or refused all the same.

Choices, each a documented one:
- Transactions are `AsyncSQLAlchemyDatasource` transactions
  (`run_tx_step_async`): DBOS 3 removed `@DBOS.transaction` and the
  application database setting (DBOSConfig rejects `application_database_url`),
  though the transaction tutorial still describes them as the legacy path.
- Isolation READ COMMITTED on every transaction instead of the default
  SERIALIZABLE: every create and every close updates the same owner row,
  and under SERIALIZABLE concurrent ones abort with serialization failures
  that DBOS retries with backoff (measured: 9 jobs/s and 115 application
  statements a job at 300 jobs, against 23 and 38). The guarded UPDATE is
  correct under READ COMMITTED (PostgreSQL re-checks the WHERE on the row it
  waited for), PostgreSQL's default and longcall's.
- Reads in the HTTP handlers (auth, the webhook's secret, GET /v1/jobs) run
  through the same datasource outside any workflow, as the widget store's
  endpoints do: a plain transaction, nothing recorded.
- The admitting transaction is one statement (a CTE: the guarded UPDATE and
  the INSERT), as longcall's create is: the owner row's lock is held until
  DBOS's checkpoint commits, so every round trip inside it serializes creates.
- The submit and status steps retry transient failures (429, 5xx, connection
  errors) with DBOS's step retries (`should_retry`); a submit that stays
  refused fails the job and refunds it, a status that stays down is asked
  again after the next wait.
- The wait is `recv_async` with a timeout of POLL_S: a webhook wakes it at
  once, a lost webhook costs one poll per POLL_S (longcall: a timer every few
  seconds). The status step records the time, so the deadline check is
  deterministic on replay (DBOS: reading the clock belongs in a step).
- One shared httpx.AsyncClient (httpx's default transport), DBOS's logs at
  WARNING, every DBOS pool at its default size.
- No capability token in the callback URL (longcall adds one, a pure HMAC
  check before any read): the peer checks the provider's signature only.

Docs followed (https://docs.dbos.dev):
- /python/programming-guide (FastAPI + uvicorn.run after DBOS.launch in main)
- /python/tutorials/workflow-tutorial (workflow IDs and idempotency:
  SetWorkflowID; coroutine workflows, start_workflow_async)
- /python/tutorials/step-tutorial (coroutine steps, configurable retries)
- /python/tutorials/transaction-tutorial and /python/reference/datasources
  (AsyncSQLAlchemyDatasource, run_tx_step_async, isolation_level)
- /python/tutorials/workflow-communication (send/recv, set_event/get_event)
- /python/examples/widget-store (start idempotently, reserve, event to endpoint)
- /python/examples/outbox (the workflow as the outbox; transactional enqueue)
- /python/reference/contexts and /python/reference/configuration
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import tempfile
import time
from typing import Annotated, Any

import httpx
import uvicorn
from dbos import DBOS, AsyncSQLAlchemyDatasource, DBOSConfig, SetWorkflowID
from dbos import error as dboserror
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy import text

from app.signing.webhooks import verify_tv1

POLL_S = 5.0  # the wait for a webhook before each status poll
DEADLINE_S = float(os.environ.get("PEER_DEADLINE_S", "7200"))
ADMISSION = "admission"  # the event the create handler waits on
WEBHOOK = "webhook"  # the topic webhooks are forwarded on
TERMINAL = ("succeeded", "failed", "cancelled", "expired")
RC = {"isolation_level": "READ COMMITTED"}
CHUNK = 1024 * 1024

SCHEMA = """
create table if not exists peer_owners (
    id text primary key,
    api_key_hash text not null unique,
    balance bigint not null,
    reserved bigint not null default 0,
    active integer not null default 0,
    max_active integer not null
);
create table if not exists peer_jobs (
    id text primary key,
    owner_id text not null references peer_owners (id),
    status text not null,
    input jsonb not null,
    task_id text,
    webhook_secret text,
    credits_reserved bigint not null,
    credits_charged bigint not null default 0,
    credits_refunded bigint not null default 0,
    created_at timestamptz not null default now(),
    finished_at timestamptz
);
create table if not exists peer_assets (
    job_id text not null references peer_jobs (id),
    index integer not null,
    path text not null,
    bytes bigint not null,
    sha256 text not null,
    primary key (job_id, index)
);
"""

# Set in main, before the server starts (the widget store's `ds`).
ds: AsyncSQLAlchemyDatasource
SIM_URL = os.environ.get("SIM_URL", "")
PUBLIC_URL = os.environ.get("PUBLIC_URL", "")
STORAGE_DIR = os.environ.get("PEER_STORAGE_DIR", "")

_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


def http() -> httpx.AsyncClient:
    # One client per event loop: a workflow DBOS recovers at launch may run on
    # DBOS's own loop, and an httpx client must stay on the loop it started on.
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(timeout=30)
    return client


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


# --- transactions (run with ds.run_tx_step_async) ---------------------------------

async def _owner_by_key(digest: str) -> str | None:
    row = (await ds.sql_session().execute(
        text("select id from peer_owners where api_key_hash = :h"), {"h": digest})).first()
    return row[0] if row else None


async def _admit(job_id: str, owner_id: str, task_input: dict, reserve: int) -> dict:
    session = ds.sql_session()
    # One statement takes the owner's row lock and inserts the job: every
    # create waits on that lock, so it is held for as few round trips as can be.
    created = (await session.execute(text("""
        with took as (
            update peer_owners set balance = balance - :r, reserved = reserved + :r, active = active + 1
            where id = :o and balance >= :r and active < max_active returning id)
        insert into peer_jobs (id, owner_id, status, input, credits_reserved)
        select :j, took.id, 'submitting', cast(:i as jsonb), :r from took
        returning extract(epoch from created_at)"""),
        {"j": job_id, "o": owner_id, "i": json.dumps(task_input), "r": reserve})).scalar_one_or_none()
    if created is None:
        row = (await session.execute(text("select balance from peer_owners where id = :o"),
                                     {"o": owner_id})).first()
        return {"verdict": "no_credit" if row is None or row[0] < reserve else "no_slot"}
    return {"verdict": "ok", "created_at": float(created)}


async def _save_task(job_id: str, task_id: str, secret: str) -> None:
    await ds.sql_session().execute(text("""
        update peer_jobs set status = 'running', task_id = :t, webhook_secret = :s
        where id = :j and status = 'submitting'"""), {"j": job_id, "t": task_id, "s": secret})


async def _close(job_id: str, status: str, cost: int | None, assets: list[dict]) -> None:
    session = ds.sql_session()
    row = (await session.execute(text("select owner_id, credits_reserved from peer_jobs where id = :j "
                                      "and status not in ('succeeded', 'failed') for update"),
                                 {"j": job_id})).first()
    if row is None:
        return
    owner_id, reserved = row
    charged = min(reserved, reserved if cost is None else max(0, cost)) if status == "succeeded" else 0
    refunded = reserved - charged
    for a in assets:
        await session.execute(text("insert into peer_assets (job_id, index, path, bytes, sha256) "
                                   "values (:j, :i, :p, :b, :s)"),
                              {"j": job_id, "i": a["index"], "p": a["path"], "b": a["bytes"], "s": a["sha256"]})
    await session.execute(text("""
        update peer_jobs set status = :st, finished_at = now(), credits_charged = :c, credits_refunded = :f
        where id = :j"""), {"j": job_id, "st": status, "c": charged, "f": refunded})
    await session.execute(text("""
        update peer_owners set balance = balance + :f, reserved = reserved - :r, active = active - 1
        where id = :o"""), {"o": owner_id, "f": refunded, "r": reserved})


async def _hook_target(job_id: str) -> tuple[str, str | None] | None:
    row = (await ds.sql_session().execute(
        text("select status, webhook_secret from peer_jobs where id = :j"), {"j": job_id})).first()
    return (row[0], row[1]) if row else None


async def _job_view(job_id: str, owner_id: str) -> dict | None:
    row = (await ds.sql_session().execute(text("""
        select id, status, task_id, credits_reserved, credits_charged, credits_refunded, created_at, finished_at
        from peer_jobs where id = :j and owner_id = :o"""), {"j": job_id, "o": owner_id})).mappings().first()
    if row is None:
        return None
    view = dict(row)
    for k in ("created_at", "finished_at"):
        view[k] = view[k].isoformat() if view[k] is not None else None
    return view


# --- steps ----------------------------------------------------------------------

class Retryable(Exception):
    """A busy or failing provider: the step tries again."""


def transient(exc: BaseException) -> bool:
    return isinstance(exc, (Retryable, httpx.TransportError))


@DBOS.step(retries_allowed=True, interval_seconds=1.0, max_attempts=10, backoff_rate=1.5, should_retry=transient)
async def submit(job_id: str, model: str, task_input: dict) -> dict:
    r = await http().post(f"{SIM_URL}/v1/tasks", headers={"idempotency-key": job_id}, json={
        "model": model, "input": task_input, "callback_url": f"{PUBLIC_URL}/webhooks/sim/{job_id}"})
    if r.status_code == 429 or r.status_code >= 500:
        raise Retryable(f"submit: HTTP {r.status_code}")
    r.raise_for_status()
    body = r.json()
    return {"id": body["id"], "webhook_secret": body["webhook_secret"]}


@DBOS.step(retries_allowed=True, interval_seconds=1.0, max_attempts=10, backoff_rate=1.5, should_retry=transient)
async def task_status(task_id: str) -> dict:
    r = await http().get(f"{SIM_URL}/v1/tasks/{task_id}")
    if r.status_code == 429 or r.status_code >= 500:
        raise Retryable(f"status: HTTP {r.status_code}")
    r.raise_for_status()
    return {"view": r.json(), "now": time.time()}


def _make_dirs(directory: str) -> list[str]:
    created = []
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
            created.append(path)
    return created


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit_file(fd: int, tmp: str, target: str, created: list[str]) -> None:
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, target)
    directory = os.path.dirname(target)
    for path in [directory, *(os.path.dirname(d) for d in created)]:
        _fsync_dir(path)


@DBOS.step(retries_allowed=True, interval_seconds=1.0, max_attempts=5)
async def store_outputs(owner_id: str, job_id: str, urls: list[str]) -> list[dict]:
    directory = os.path.join(STORAGE_DIR, "outputs", owner_id, job_id)
    created = await asyncio.to_thread(_make_dirs, directory)
    stored = []
    for index, url in enumerate(urls):
        target = os.path.join(directory, str(index))
        fd, tmp = tempfile.mkstemp(prefix=f".{index}.", suffix=".tmp", dir=directory)
        try:
            digest = hashlib.sha256()
            size = 0
            async with http().stream("GET", url) as r:
                r.raise_for_status()
                async for chunk in r.aiter_bytes(CHUNK):
                    digest.update(chunk)
                    os.write(fd, chunk)
                    size += len(chunk)
            await asyncio.to_thread(_commit_file, fd, tmp, target, created)
            fd = -1
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        created = []
        stored.append({"index": index, "path": target, "bytes": size, "sha256": digest.hexdigest()})
    return stored


# --- the workflow -----------------------------------------------------------------

@DBOS.workflow()
async def settle_job(job_id: str, owner_id: str, model: str, task_input: dict, reserve: int) -> str:
    admitted = await ds.run_tx_step_async({"name": "admit", **RC}, _admit, job_id, owner_id, task_input, reserve)
    await DBOS.set_event_async(ADMISSION, admitted["verdict"])
    if admitted["verdict"] != "ok":
        return admitted["verdict"]
    deadline = admitted["created_at"] + DEADLINE_S
    try:
        task = await submit(job_id, model, task_input)
    except (dboserror.DBOSMaxStepRetriesExceeded, httpx.HTTPStatusError):  # refused, or the provider stayed down
        await ds.run_tx_step_async({"name": "close", **RC}, _close, job_id, "failed", None, [])
        return "failed"
    await ds.run_tx_step_async({"name": "save_task", **RC}, _save_task, job_id, task["id"], task["webhook_secret"])
    while True:
        await DBOS.recv_async(WEBHOOK, timeout_seconds=POLL_S)  # a webhook, or the poll interval gone
        try:
            polled = await task_status(task["id"])
        except dboserror.DBOSMaxStepRetriesExceeded:
            continue  # the provider is down a while: ask again after the next wait
        view = polled["view"]
        if view["status"] in TERMINAL:
            break
        if polled["now"] > deadline:
            await ds.run_tx_step_async({"name": "close", **RC}, _close, job_id, "failed", None, [])
            return "failed"
    if view["status"] != "succeeded":
        await ds.run_tx_step_async({"name": "close", **RC}, _close, job_id, "failed", None, [])
        return "failed"
    assets = await store_outputs(owner_id, job_id, view["outputs"])
    await ds.run_tx_step_async({"name": "close", **RC}, _close, job_id, "succeeded", view.get("cost"), assets)
    return "succeeded"


# --- HTTP -------------------------------------------------------------------------

class CreateJob(BaseModel):
    provider: str
    model: str
    max_credits: int = 1
    input: dict[str, Any]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _authenticate(authorization: str | None) -> str | None:
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        return None
    return await ds.run_tx_step_async({"name": "auth", **RC}, _owner_by_key, key_hash(key.strip()))


app = FastAPI()


@app.post("/v1/jobs")
async def create_job(body: CreateJob, authorization: Annotated[str | None, Header()] = None) -> Response:
    owner_id = await _authenticate(authorization)
    if owner_id is None:
        return _error(401, "unauthenticated")
    if body.provider != "sim" or body.max_credits < 1:
        return _error(400, "provider must be sim and max_credits at least 1")
    job_id = "job_" + secrets.token_hex(12)
    with SetWorkflowID(job_id):
        await DBOS.start_workflow_async(settle_job, job_id, owner_id, body.model, body.input, body.max_credits)
    verdict = await DBOS.get_event_async(job_id, ADMISSION, timeout_seconds=30)
    if verdict == "ok":
        return JSONResponse({"id": job_id, "status": "submitting"}, status_code=202)
    if verdict == "no_credit":
        return _error(402, "not enough credits")
    if verdict == "no_slot":
        return _error(429, "too many active jobs")
    return _error(503, "the job was not admitted in time")


@app.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, authorization: Annotated[str | None, Header()] = None) -> Response:
    owner_id = await _authenticate(authorization)
    if owner_id is None:
        return _error(401, "unauthenticated")
    view = await ds.run_tx_step_async({"name": "job_view", **RC}, _job_view, job_id, owner_id)
    return _error(404, "no such job") if view is None else JSONResponse(view)


@app.post("/webhooks/sim/{job_id}")
async def receive_webhook(job_id: str, request: Request) -> Response:
    raw = await request.body()
    target = await ds.run_tx_step_async({"name": "hook_target", **RC}, _hook_target, job_id)
    if target is None:
        return _error(404, "no such job")
    status, secret = target
    if secret is None:
        return _error(409, "the job has no task yet")  # the provider retries
    if not verify_tv1(request.headers.get("x-signature"), raw, secret, time.time()):
        return _error(401, "webhook not accepted")
    if status not in TERMINAL:
        await DBOS.send_async(job_id, "webhook", topic=WEBHOOK)
    return Response(status_code=204)


# --- main -------------------------------------------------------------------------

async def _open_datasource(url: str) -> AsyncSQLAlchemyDatasource:
    source = await AsyncSQLAlchemyDatasource.create(url)
    async with source.engine.begin() as conn:
        for statement in filter(str.strip, SCHEMA.split(";")):
            await conn.execute(text(statement))
    return source


def main() -> int:
    global ds
    from app.logs import uvicorn_log_config

    parser = argparse.ArgumentParser(prog="peer_dbos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ds = asyncio.run(_open_datasource(os.environ["DATABASE_URL"]))
    config: DBOSConfig = {
        "name": "longcall-peer",
        "system_database_url": os.environ["DBOS_SYSTEM_DATABASE_URL"],
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        # The same uvicorn settings as `longcall serve` (app/cli.py).
        uvicorn.run(app, host=args.host, port=args.port, log_config=uvicorn_log_config(),
                    access_log=False, proxy_headers=True, lifespan="on")
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
