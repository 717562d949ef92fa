"""Commands from the `longcall.commands` entry points: chaos and bench come
from proof/ as plug-ins, are listed without their heavy dependencies, and
say in one line what to install when those are missing; a broken plug-in
costs only its own command."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = "pip install 'longcall[proof]'"

# Made importable first by PYTHONPATH, Python runs it at start-up: from then
# on, importing the named top-level modules fails as if they were not installed.
BLOCKER = """\
import sys

BLOCKED = {blocked!r}


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


def longcall(*args: str, path: list[Path] = ()) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def blocking(tmp_path: Path, *modules: str) -> Path:
    directory = tmp_path / "blocker"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(modules)))
    return directory


def plugin_distribution(tmp_path: Path, entry_points: str) -> Path:
    """A directory holding an installed distribution's metadata, with these entry points."""
    dist = tmp_path / "plugins" / "someone_elses_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: someone-elses-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[longcall.commands]\n{entry_points}")
    return dist.parent


def test_help_lists_chaos_and_bench_with_their_flags():
    p = longcall("--help")
    assert p.returncode == 0, p.stderr
    listed = {line.split()[0] for line in p.stdout.splitlines() if line.startswith("    ")}
    assert {"chaos", "bench", "serve", "settler"} <= listed
    assert "the reliability run" in p.stdout and "the benchmarks" in p.stdout

    chaos = longcall("chaos", "--help")
    assert chaos.returncode == 0 and "--jobs" in chaos.stdout, chaos.stderr
    bench = longcall("bench", "--help")
    assert bench.returncode == 0, bench.stderr
    for flag in ("--quick", "--only ROW", "--rounds", "--json PATH"):
        assert flag in bench.stdout
    p = longcall("bench", "--only", "nonsense")
    assert p.returncode == 2 and "invalid choice" in p.stderr and p.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("missing", ["psutil", "procrastinate", "psycopg"])
def test_bench_without_the_proof_extra_says_what_to_install(tmp_path, missing):
    blocker = blocking(tmp_path, missing)
    p = longcall("bench", "--quick", path=[blocker])
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr == f"longcall: bench needs the proof extra (No module named '{missing}'): {INSTALL}\n"
    assert p.stdout == ""

    # The commands are listed all the same: their entry point imports none of it.
    p = longcall("--help", path=[blocker])
    assert p.returncode == 0 and "bench" in p.stdout and "chaos" in p.stdout, p.stderr


def test_a_broken_plugin_costs_only_its_own_command(tmp_path):
    plugins = plugin_distribution(tmp_path, "broken = nowhere_to_be_found.cli:command\n"
                                            "serve = nowhere_to_be_found.cli:command\n")
    p = longcall("--help", path=[plugins])
    assert p.returncode == 0, p.stderr
    help_text = " ".join(p.stdout.split())  # as argparse wrapped it
    assert "broken unavailable: cannot load nowhere_to_be_found.cli:command" in help_text
    assert "serve the web tier" in help_text  # a plug-in cannot replace a built-in command

    for args in (("broken",), ("broken", "--some-flag", "-h")):
        p = longcall(*args, path=[plugins])
        assert p.returncode == 2, (p.stdout, p.stderr)
        assert p.stderr == ("longcall: broken is unavailable: cannot load nowhere_to_be_found.cli:command "
                            "(ModuleNotFoundError: No module named 'nowhere_to_be_found')\n")
    p = longcall("serve", "--help", path=[plugins])
    assert p.returncode == 0 and "--workers" in p.stdout, p.stderr
