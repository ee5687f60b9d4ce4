"""Evidence of a measured selection: the records carry the whole comparison.

``edge profile`` of the synthetic ``preferred-slower`` pipeline (real echo workers):
the losing candidate passed every gate, so its record is PROFILE_ONLY with its own
figures and why it lost; every candidate's record holds the comparison the choice was
made on; ``edge qualify`` keeps it, and the matrix shows the cell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edge_core.evidence.records import load_record
from edge_echo.synthetic import pipeline, write_workload


def _edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": "echo"}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_measured_losers_record_is_profile_only_with_the_comparison(tmp_path: Path) -> None:
    work = write_workload(tmp_path)
    document = pipeline("preferred-slower", workload=[str(work)],
                        measurement={"min_samples": 3, "max_samples": 6})
    (tmp_path / "p.json").write_text(json.dumps(document))
    profiled = _edge("profile", "p.json", "--inputs", str(work), "--requests", "2",
                     "--warmup", "0", "--concurrency", "1", "--process-starts", "1",
                     "--no-warm-restart", "--out", "profile.json", "--records", "records",
                     "--json", cwd=tmp_path)
    assert profiled.returncode == 0, profiled.stderr
    records = {(r.cell.model, r.cell.configuration): r
               for r in map(load_record, sorted((tmp_path / "records").glob("*.json")))}
    loser = records[("preferred-slower/b", "echo (candidate 0)")]
    winner = records[("preferred-slower/b", "echo (candidate 1)")]
    assert loser.status.value == "PROFILE_ONLY" and loser.failure is None
    assert loser.performance["candidate"]["relative"] > 0.05
    assert "not chosen" in loser.notes[0]
    for record in (loser, winner):
        compared = record.performance["comparison"]
        assert compared["objective"] == "latency"
        assert compared["decision"] in ("measured", "reused")
        assert [c["outcome"] for c in compared["candidates"]] == ["passed", "chosen"]
        assert all(c["measured"]["p50_s"] > 0 for c in compared["candidates"])
    qualified = _edge("qualify", "--profile", "profile.json", "--out-dir", "q", "--json",
                      cwd=tmp_path)
    assert qualified.returncode == 0, qualified.stderr
    again = {(r.cell.model, r.cell.configuration): r
             for r in map(load_record, sorted((tmp_path / "q").glob("*.json")))}
    assert again[("preferred-slower/b", "echo (candidate 0)")].status.value == "PROFILE_ONLY"
    assert again[("preferred-slower/b", "echo (candidate 0)")].performance["comparison"] == \
        loser.performance["comparison"]
    matrix = _edge("matrix", "q", "--out-dir", "report", "--json", cwd=tmp_path)
    assert matrix.returncode == 0, matrix.stderr
