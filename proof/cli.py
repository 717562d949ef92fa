"""`longcall chaos` and `longcall bench`: the proof harness as commands of
`longcall`, which finds them through the `longcall.commands` entry points
(pyproject.toml) without importing anything of proof/ itself.

Every `longcall` run loads this module, to list the commands in its help, so
it imports nothing heavy. A command imports the harness when it runs — the
bench first checks the modules it needs from the `proof` extra, so that a
missing one is one line saying what to install, not a traceback from deep
inside a run. The chaos run needs `standardwebhooks` (its receivers verify
each notification with the scheme's reference library).
"""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable

from app.cli import MissingExtra, Subcommand
from proof import BENCH_GROUPS

INSTALL = "pip install 'longcall[proof]'"
# What the `proof` extra installs (pyproject.toml) and the bench imports:
# psutil for CPU and memory figures, procrastinate (on psycopg) and a DBOS
# Transact application (proof/peer_dbos.py, on FastAPI) as baselines.
BENCH_NEEDS = ("psutil", "procrastinate", "psycopg", "dbos", "fastapi")


def require_extra(command: str, modules: Iterable[str]) -> None:
    """Import `modules`, or raise MissingExtra naming the first that fails."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            # One line: some packages explain themselves over several (psycopg without its libpq).
            reason = (str(e).splitlines() or [module])[0]
            raise MissingExtra(f"{command} needs the proof extra ({reason}): {INSTALL}") from None


def _chaos_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=5000)


def _run_chaos(args: argparse.Namespace) -> int:
    require_extra("chaos", ("standardwebhooks",))
    from proof.chaos import main

    return main(jobs=args.jobs)


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny windows and data sets: a smoke test")
    p.add_argument("--only", action="append", metavar="ROW", choices=BENCH_GROUPS,
                   help="run only this row group (repeatable)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per figure (median); default 3, quick 1")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the results as JSON")


def _run_bench(args: argparse.Namespace) -> int:
    require_extra("bench", BENCH_NEEDS)
    from proof.bench import main

    return main(quick=args.quick, only=args.only, rounds=args.rounds, json_path=args.json_path)


chaos_command = Subcommand("the reliability run", _chaos_arguments, _run_chaos)
bench_command = Subcommand("the benchmarks", _bench_arguments, _run_bench)
