"""The settler does not pull in the web edge: no module of outbox/ imports
app.web, even indirectly (the settler's /metrics comes from app.metrics)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROGRAM = """
import importlib, pkgutil, sys
import outbox
for module in pkgutil.walk_packages(outbox.__path__, "outbox."):
    importlib.import_module(module.name)
print(" ".join(sorted(m for m in sys.modules if m == "app.web" or m.startswith("app.web."))))
"""


def test_no_outbox_module_imports_the_web_edge() -> None:
    # A fresh interpreter: this test process has imported app.web already.
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
