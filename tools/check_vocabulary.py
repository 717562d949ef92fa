"""`make check`: no job status, intent kind, ledger kind or provider name is
written out as a literal in app/ or outbox/ outside app/vocabulary.py.

A string constant that *is* one of those words, or a SQL literal of one
(`'queued'`) inside a longer string, is a finding. Docstrings are prose and
are skipped. Out of scope, as the issue that asked for this says: the
simulator (it speaks the providers' wire words), the provider adapters' maps
of their provider's own status words, and migrations/. Any other exception
stands in ALLOWED below with its reason.

Usage: python tools/check_vocabulary.py [ROOT]; exits 1 with one line per finding.
"""
from __future__ import annotations

import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

from app.vocabulary import ALL_STATUSES, IntentKind, LedgerKind, ProviderName, TaskState  # noqa: E402

STATUS_WORDS = {str(s) for s in ALL_STATUSES} | {str(s) for s in TaskState}
KIND_WORDS = {str(k) for k in IntentKind} | {str(k) for k in LedgerKind}
PROVIDER_WORDS = {str(p) for p in ProviderName}

SCANNED = ("app", "outbox")
SKIPPED = ("app/vocabulary.py", "app/simulator/")
# Adapters: their maps of the provider's own status words are the wire, not our vocabulary.
ADAPTERS = ("app/providers/sim.py", "app/providers/replicate.py", "app/providers/fal.py", "app/providers/kie.py",
            "app/providers/gateway.py", "app/providers/gemini.py", "app/providers/elevenlabs.py",
            "app/providers/anthropic.py", "app/providers/openai.py")

# (path, word): why this literal is not ours to replace. Keep it short and reviewed.
ALLOWED: dict[tuple[str, str], str] = {
    ("app/cli.py", "sim"): "the name of the `longcall sim` command",
    ("app/cli.py", "grant"): "the name of the `longcall owners grant` command",
    ("app/dev.py", "failed"): "the demo's simulator input control `outcome: failed`",
    ("app/providers/gateway.py", "gateway"): "the wire key providerMetadata.gateway",
}

SQL_LITERAL = re.compile(r"'([a-z_]+)'")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def findings(path: pathlib.Path, rel: str) -> list[str]:
    tree = ast.parse(path.read_text(), filename=rel)
    docstrings = _docstring_nodes(tree)
    words = KIND_WORDS | PROVIDER_WORDS
    if not rel.startswith(ADAPTERS):
        words |= STATUS_WORDS
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        found = {node.value} & words if node.value in words else set()
        found |= {w for w in SQL_LITERAL.findall(node.value) if w in words}
        for word in sorted(found):
            if (rel, word) not in ALLOWED:
                out.append(f"{rel}:{node.lineno}: literal {word!r}: use app/vocabulary.py")
    return out


def main() -> int:
    problems: list[str] = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIPPED):
                continue
            problems.extend(findings(path, rel))
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} vocabulary literal(s) outside app/vocabulary.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
