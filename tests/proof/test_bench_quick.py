"""`longcall bench --quick` end to end, so the benchmark cannot rot: every
row is measured (real processes, its own embedded PostgreSQL) and printed
with a positive figure beside each baseline. The figures themselves are not
judged here: quick mode is a smoke test, not a measurement."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from proof.bench import GROUPS, fmt

REPO_ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {"ingest", "ingest_latency", "create", "reads", "reads_latency", "drain", "e2e", "e2e_owners",
            "e2e_cpu", "e2e_statements", "e2e_configured", "e2e_latency", "e2e_latency_low", "idle", "sweep",
            "rss", "http"}
# Baselines that may honestly read zero in a 2-second window: an idle
# procrastinate worker polls every 5 s.
MAY_BE_ZERO = {("idle", "procrastinate idle worker")}


def test_quick_bench_prints_every_row(tmp_path):
    out_json = tmp_path / "bench.json"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "app", "bench", "--quick", "--json", str(out_json)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=170)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert not report["failed"]
    rows = {r["key"]: r for r in report["rows"]}
    assert set(rows) == ROW_KEYS
    assert {r["group"] for r in report["rows"]} == set(GROUPS)
    for key, row in rows.items():
        assert row["ours"] > 0 or (key == "rss" and row["ours"] >= 0), row
        assert row["baselines"], row
        for base in row["baselines"]:
            if (key, base["name"]) in MAY_BE_ZERO:
                assert base["value"] >= 0, row
            else:
                assert base["value"] > 0, row
        if row["unit"] == "ms" and key != "sweep":
            assert 0 < row["ours_p50"] <= row["ours"], row
        # The printed table carries the row with its figure.
        printed = [line for line in done.stdout.splitlines() if line.startswith(row["label"])]
        assert len(printed) == 1, (row["label"], done.stdout)
        assert fmt(row["ours"], row["unit"], row["ours_p50"]) in printed[0]
        assert all(not math.isnan(x) for x in row["ratios"] if row["baselines"][0]["value"]), row
    # What limits the ingest row is measured beside it: our webhook's write
    # alone, as written, waiting for the WAL flush, and without its NOTIFY.
    probe = [n for n in rows["ingest"]["notes"] if n.startswith("our webhook write alone")]
    labels = ("as written", "waiting for the flush", "without its NOTIFY")
    assert len(probe) == 1 and all(label in probe[0] for label in labels), rows["ingest"]
    # Both floors beside the goal's: with asyncpg's default pool reset, and without it.
    assert [b["name"] for b in rows["ingest"]["baselines"]] == [
        "minimal endpoint", "raw asyncpg upsert", "minimal endpoint without pool reset"]
    assert [b["name"] for b in rows["e2e_cpu"]["baselines"]] == [
        "minimal endpoint (server + PostgreSQL)", "the same without pool reset"]
    # Each ingest round's ratio, and PostgreSQL's CPU per e2e job by the
    # process it ran in, with our two tiers' connections named.
    assert any(n.startswith("each round's ratio") and n.count("×") == 1 for n in rows["ingest"]["notes"])
    by_process = [n for n in rows["e2e_cpu"]["notes"] if n.startswith("round 1:")]
    assert len(by_process) == 1 and all(name in by_process[0] for name in ("longcall-web", "longcall-settler")), \
        rows["e2e_cpu"]
    # Where the latency row's tail goes, by phase, from the jobs' timelines.
    phases = [n for n in rows["e2e_latency"]["notes"] if n.startswith("round 1: medians by phase")]
    assert len(phases) == 1 and "slowest 1% submit" in phases[0], rows["e2e_latency"]
    assert "nproc" in done.stdout or "CPUs" in done.stdout
    # Quick mode must stay quick: it runs in the default suite. (About 70 s
    # on a 2-core box; the bound catches a quick mode grown to full windows,
    # not a loaded machine.)
    assert took < 180, f"bench --quick took {took:.0f} s"
