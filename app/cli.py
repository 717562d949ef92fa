"""The `longcall` command (also `python -m app`).

Every expected failure — bad arguments, bad configuration, an unreachable
database — is one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import NamedTuple

import asyncpg

from app.config import ConfigError, Settings, is_utf8, load_settings, port_argument


class CommandError(Exception):
    """One line for the user; exit 1."""


class MissingExtra(Exception):
    """A command's optional dependencies are not installed. The message is one
    line saying what to install; exit 2."""


class Subcommand(NamedTuple):
    """What an entry point of the `longcall.commands` group names: a command
    another package adds to `longcall` (pyproject.toml: chaos and bench, from
    proof/cli.py). Every `longcall` run loads it, to list it in the help, so
    it must import little: what the command needs, `run` imports."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


PLUGIN_GROUP = "longcall.commands"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"longcall: {message} (see longcall --help)\n")


def _parser(plugins: Mapping[str, Subcommand | str] | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="longcall", description="Durable, paid calls to external AI providers.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("dev", help="run everything locally: embedded PostgreSQL, simulator, web, settler, demo")
    sub.add_parser("migrate", help="apply pending migrations (safe concurrently)")

    s = sub.add_parser("serve", help="the web tier (Procfile: web)")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=port_argument, default=None)
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--header-timeout", metavar="SECONDS", default=None,
                   help="close a connection whose request headers are not complete this long after it "
                        "opens or after its last response (env HEADER_TIMEOUT_S; default 10)")
    s.add_argument("--limit-concurrency", metavar="N", default=None,
                   help="answer 503 above this many open connections or running requests per worker "
                        "(env LIMIT_CONCURRENCY; default 1000)")

    s = sub.add_parser("settler", help="drain the outbox, run timers and the sweep (Procfile: settler)")
    s.add_argument("--concurrency", type=int, default=16)
    s.add_argument("--metrics-port", type=port_argument, default=None)

    s = sub.add_parser("sweep", help="one backstop sweep pass")
    s.add_argument("--once", action="store_true", required=True)

    s = sub.add_parser("sim", help="the provider simulator")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=port_argument, default=8787)

    owners = sub.add_parser("owners", help="owners and credits").add_subparsers(
        dest="action", required=True, parser_class=_Parser)
    s = owners.add_parser("create", help="create an owner and print its first API key")
    s.add_argument("name")
    s.add_argument("--credits", type=int, default=0)
    s.add_argument("--max-active", type=int, default=10)
    s.add_argument("--platform", action="store_true",
                   help="a platform owner: its keys create owners under it, grant them credits "
                        "and act for them (Longcall-Owner)")
    s.add_argument("--json", action="store_true")
    s = owners.add_parser("grant", help="add credits to an owner")
    s.add_argument("owner_id")
    s.add_argument("amount", type=int)

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True,
                                                                   parser_class=_Parser)
    s = keys.add_parser("create", help="another API key for an owner")
    s.add_argument("owner_id")
    s.add_argument("--json", action="store_true")
    s = keys.add_parser("revoke", help="revoke a key by its first characters")
    s.add_argument("key_prefix")

    sub.add_parser("status", help="one screen from the database")

    jobs = sub.add_parser("jobs", help="job recovery").add_subparsers(dest="action", required=True,
                                                                      parser_class=_Parser)
    s = jobs.add_parser("resolve", help="resolve an uncertain job")
    s.add_argument("job_id")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--task-id")
    g.add_argument("--failed", action="store_true")

    for name, command in (plugins or {}).items():
        if isinstance(command, Subcommand):
            command.add_arguments(sub.add_parser(name, help=command.help))
        else:
            # It takes any arguments as plain words (no prefix makes an option,
            # not even -h), so running it, however, says why it is unavailable.
            s = sub.add_parser(name, help=f"unavailable: {command}", add_help=False, prefix_chars="\0")
            s.add_argument("args", nargs="*")
    return p


def _plugins() -> dict[str, Subcommand | str]:
    """The commands the `longcall.commands` entry points name, by name. One
    that cannot be loaded maps to why, in one line: a broken plug-in costs
    only its own command, never `longcall serve` or `longcall --help`."""
    found: dict[str, Subcommand | str] = {}
    for point in entry_points(group=PLUGIN_GROUP):
        if point.name in COMMANDS or point.name in found:
            continue  # the built-in commands win, then the first plug-in of a name
        try:
            command = point.load()
        except Exception as e:
            found[point.name] = f"cannot load {point.value} ({type(e).__name__}: {_first_line(e)})"
            continue
        found[point.name] = (command if isinstance(command, Subcommand)
                             else f"{point.value} is not a longcall Subcommand")
    return found


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0]


async def _connect(settings: Settings):
    from app import db

    try:
        return await asyncio.wait_for(db.connect(settings.dsn, role="cli"), 10)
    except (TimeoutError, OSError) as e:
        raise CommandError(f"cannot reach the database: {type(e).__name__}") from None
    except Exception as e:  # asyncpg's own errors: bad password, no database...
        raise CommandError(f"cannot connect to the database: {type(e).__name__}") from None


async def _with_conn(settings: Settings, fn):
    conn = await _connect(settings)
    try:
        return await fn(conn)
    finally:
        await conn.close()


async def _check_reachable(settings: Settings) -> None:
    """Connect once and close: CommandError (one line) when that fails."""
    conn = await _connect(settings)
    await conn.close()


def _db_settings() -> Settings:
    """Commands that only need the database (no SECRET_KEY)."""
    settings = load_settings(dev=True)
    if not settings.database_url:
        # Next to a `longcall dev` checkout, use its embedded database.
        port_file = os.path.join(".longcall", "pg", "longcall.port")
        if os.path.exists(port_file) and "DATABASE_URL" not in os.environ:
            with open(port_file) as f:
                url = f"postgresql://postgres@127.0.0.1:{int(f.read())}/postgres"
            return load_settings({**os.environ, "DATABASE_URL": url}, dev=True)
        raise ConfigError("DATABASE_URL is required")
    return settings


def _cmd_migrate(args) -> int:
    from app.migrate import migrate

    settings = _db_settings()

    async def run():
        try:
            return await asyncio.wait_for(migrate(settings.database_url), 300)
        except (TimeoutError, OSError) as e:
            raise CommandError(f"cannot reach the database: {type(e).__name__}") from None

    applied = asyncio.run(run())
    print(f"applied {len(applied)} migration(s)" + "".join(f"\n  {m.version:03d}_{m.name}" for m in applied))
    return 0


def _cmd_owners(args) -> int:
    from app.domain import owners

    settings = _db_settings()
    if args.action == "create":
        try:
            new = asyncio.run(_with_conn(settings, lambda c: owners.create_owner(
                c, args.name, args.credits, args.max_active, platform=args.platform)))
        except ValueError as e:
            raise CommandError(str(e)) from None
        if args.json:
            print(json.dumps({"owner_id": new.owner_id, "api_key": new.api_key}))
        else:
            print(f"owner_id: {new.owner_id}\napi_key:  {new.api_key}\n"
                  "(the key is shown once; store it now)")
        return 0
    try:
        asyncio.run(_with_conn(settings, lambda c: owners.grant(c, args.owner_id, args.amount)))
    except (ValueError, owners.NotFound) as e:
        raise CommandError(str(e)) from None
    print(f"granted {args.amount} credits to {args.owner_id}")
    return 0


def _cmd_keys(args) -> int:
    from app.domain import owners

    settings = _db_settings()
    try:
        if args.action == "create":
            key = asyncio.run(_with_conn(settings, lambda c: owners.create_key(c, args.owner_id)))
            print(json.dumps({"owner_id": args.owner_id, "api_key": key}) if args.json
                  else f"api_key: {key}\n(the key is shown once; store it now)")
        else:
            owner = asyncio.run(_with_conn(settings, lambda c: owners.revoke_key(c, args.key_prefix)))
            print(f"revoked key {args.key_prefix[:12]}… of {owner}")
    except owners.NotFound as e:
        raise CommandError(str(e)) from None
    return 0


def _cmd_jobs(args) -> int:
    from app import ids
    from app.domain import recovery

    settings = _db_settings()
    if not ids.is_job_id(args.job_id):
        raise CommandError(f"not a job id: {args.job_id!r}")

    async def run(conn):
        if args.failed:
            await recovery.resolve_failed(conn, args.job_id, settings)
            return "failed (refunded)"
        await recovery.resolve_with_task(conn, args.job_id, args.task_id)
        return f"running with provider task {args.task_id}"

    try:
        outcome = asyncio.run(_with_conn(settings, run))
    except LookupError:
        raise CommandError(f"no job {args.job_id}") from None
    except recovery.InvalidState as e:
        raise CommandError(f"only an uncertain job can be resolved; {args.job_id} is {e}") from None
    except ValueError as e:
        raise CommandError(str(e)) from None
    print(f"{args.job_id}: {outcome}")
    return 0


def _cmd_serve(args) -> int:
    import uvicorn

    from app.logs import configure_logging, uvicorn_log_config
    from app.web import create_app, server

    if args.workers < 1:
        raise CommandError("--workers must be at least 1")
    settings = load_settings()  # checked here, before any worker starts
    header_timeout_s, limit_concurrency = server.serve_limits(args.header_timeout, args.limit_concurrency,
                                                              os.environ)
    port = args.port if args.port is not None else settings.port
    # A database out of reach at start is the one line every command gives
    # (CONTRACT), not the traceback uvicorn logs when the app's start fails.
    asyncio.run(_check_reachable(settings))
    problem = server.listen_problem(args.host, port)
    if problem:
        raise CommandError(problem)
    configure_logging(settings.log_level)
    options = dict(host=args.host, port=port, log_config=uvicorn_log_config(), access_log=False,
                   proxy_headers=True, lifespan="on", limit_concurrency=limit_concurrency)
    if args.workers > 1:
        # Each worker imports the protocol by name and reads its deadline here.
        os.environ[server.HEADER_TIMEOUT_ENV] = str(header_timeout_s)
        uvicorn.run("app.web:create_app_from_env", factory=True, workers=args.workers,
                    http=server.WORKER_PROTOCOL, **options)
    else:
        uvicorn.run(create_app(settings), http=server.protocol_with_header_timeout(header_timeout_s), **options)
    return 0


def _cmd_settler(args) -> int:
    # A deploy may stop a settler that is still importing: that is a clean
    # stop too (nothing is claimed yet), so the signal is only noted here
    # until the settler's event loop takes SIGTERM and SIGINT over.
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stops.append(signum))
    from outbox.settler import run_settler

    if args.concurrency < 1:
        raise CommandError("--concurrency must be at least 1")
    settings = load_settings()
    from app.logs import configure_logging

    configure_logging(settings.log_level)
    return run_event_loop(run_settler(settings, concurrency=args.concurrency, metrics_port=args.metrics_port,
                                      stopped_before_start=lambda: bool(stops)))


def run_event_loop(main) -> int:
    """Run a long-lived service coroutine on uvloop, as uvicorn runs the web
    tier (uvicorn[standard] installs it): `make bench` measured the settler's
    CPU per job lower on it (README, Reliability and benchmarks). Plain
    asyncio where uvloop is missing."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _cmd_sweep(args) -> int:
    from outbox.roads.sweep import sweep_once_command

    settings = _db_settings()
    return asyncio.run(sweep_once_command(settings))


def _cmd_sim(args) -> int:
    from app.simulator import main as sim_main

    return sim_main(["--host", args.host, "--port", str(args.port)])


def _cmd_status(args) -> int:
    from app.status import status_command

    settings = _db_settings()
    return asyncio.run(status_command(settings))


def _cmd_dev(args) -> int:
    from app.dev import run_dev

    return run_dev()


COMMANDS = {
    "dev": _cmd_dev, "migrate": _cmd_migrate, "serve": _cmd_serve, "settler": _cmd_settler,
    "sweep": _cmd_sweep, "sim": _cmd_sim, "owners": _cmd_owners, "keys": _cmd_keys,
    "status": _cmd_status, "jobs": _cmd_jobs,
}


def main(argv: Sequence[str] | None = None) -> int:
    plugins = _plugins()
    argv = sys.argv[1:] if argv is None else argv
    if any(not is_utf8(arg) for arg in argv):
        # Refused here, never echoed (config.is_utf8).
        print("longcall: an argument is not valid UTF-8", file=sys.stderr)
        return 2
    args = _parser(plugins).parse_args(argv)
    try:
        if args.command in COMMANDS:
            return COMMANDS[args.command](args) or 0
        command = plugins[args.command]
        if not isinstance(command, Subcommand):
            print(f"longcall: {args.command} is unavailable: {command}", file=sys.stderr)
            return 2
        return command.run(args) or 0
    except MissingExtra as e:
        print(f"longcall: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"longcall: {e}", file=sys.stderr)
        return 2
    except CommandError as e:
        print(f"longcall: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except (TimeoutError, OSError) as e:
        # Raised by any command that reaches for the database and cannot.
        print(f"longcall: cannot reach the database ({type(e).__name__})", file=sys.stderr)
        return 1
    except asyncpg.ClientConfigurationError as e:
        # A DATABASE_URL parameter asyncpg refuses (sslmode=...); never echoed: it may hold a password.
        print(f"longcall: cannot connect to the database: DATABASE_URL has a parameter asyncpg refuses "
              f"({type(e).__name__})", file=sys.stderr)
        return 1
    except asyncpg.UndefinedTableError:
        print("longcall: the database has no longcall tables yet: run longcall migrate", file=sys.stderr)
        return 1
    except asyncpg.PostgresError as e:
        print(f"longcall: database error: {type(e).__name__}", file=sys.stderr)
        return 1
