"""Evidence per (stage, tried candidate): `edge profile` and `edge qualify` on real workers.

A stage that lists candidate backends yields one qualification record per candidate
tried, each with that candidate's device, so the matrix shows the refused cells with
their layer next to the one that served.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from edge_core.evidence.candidate_records import candidate_device, records_from_profile
from edge_core.evidence.records import load_record

from .conftest import build_scale_bundle, write_pipeline

QUICK = ["--requests", "2", "--warmup", "0", "--concurrency", "1", "--process-starts", "1",
         "--no-warm-restart"]
PLUGINS = "echo,ort-cpu,ort-directml"
GiB = 1024**3


def edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the `edge` command line in a child interpreter."""
    env = {**os.environ, "EDGE_PLUGINS": PLUGINS}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _ort(bundle: Path, **extra: Any) -> dict[str, Any]:
    return {"manifest": str(bundle / "edge-manifest.json"), "backend": {"name": "ort-cpu"},
            "placement": {"target": "CPUExecutionProvider"}, **extra}


def _cells(records_dir: Path) -> dict[tuple[str, str], tuple[str, str | None, str]]:
    """(model, configuration) → (status, failure layer, device) of every record written."""
    found = {}
    for path in sorted(records_dir.glob("*.json")):
        record = load_record(path)
        layer = record.failure.layer if record.failure is not None else None
        found[(record.cell.model, record.cell.configuration)] = (
            record.status.value, layer, record.cell.device)
    return found


def test_profile_and_qualify_write_one_record_per_stage_and_tried_candidate(
    tmp_path: Path,
) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    pipeline = write_pipeline(tmp_path, [{"id": "a", "candidates": [
        {"backend": {"name": "ort-directml"}},
        _ort(bundle, resources={"demands": {"machine:ram": 64 * 1024 * GiB}}),
        {"backend": {"name": "echo", "options": {"wrong_numerics": True}}},
        _ort(bundle),
        {"backend": {"name": "echo"}},
    ]}], name="cands", selection="first-passing")
    profiled = edge("profile", str(pipeline), *QUICK, "--out", "p.json",
                    "--records", "from-profile", "--json", cwd=tmp_path)
    assert profiled.returncode == 0, profiled.stderr
    assert len(json.loads(profiled.stdout)["records"]) == 4
    profile = json.loads((tmp_path / "p.json").read_text())
    assert [c["outcome"] for c in profile["candidates"]["a"]] == [
        "refused", "refused", "refused", "chosen"]
    assert {p["backend"] for p in profile["probes"]} >= {"ort-directml", "ort-cpu", "echo"}

    cells = _cells(tmp_path / "from-profile")
    assert {key: value[:2] for key, value in cells.items()} == {
        ("cands/a", "ort-directml (candidate 0)"): ("BLOCKED", "backend"),
        ("cands/a", "ort-cpu (candidate 1)"): ("BLOCKED", "admission"),
        ("cands/a", "echo (candidate 2)"): ("FAILED", "numerics"),
        ("cands/a", "ort-cpu (candidate 3)"): ("MET_AS_JUDGED", None),
    }
    # each cell's device is its candidate's: ort-cpu's probed CPU, echo's own backend
    assert cells[("cands/a", "ort-cpu (candidate 3)")][2].startswith("cpu ")
    assert " via ort-cpu on " in cells[("cands/a", "ort-cpu (candidate 3)")][2]
    assert cells[("cands/a", "echo (candidate 2)")][2].startswith("echo on ")

    qualified = edge("qualify", "--profile", "p.json", "--out-dir", "q", "--json",
                     cwd=tmp_path)
    assert qualified.returncode == 0, qualified.stderr
    answer = json.loads(qualified.stdout)
    assert [r["status"] for r in answer["records"]] == ["BLOCKED", "BLOCKED", "FAILED",
                                                         "MET_AS_JUDGED"]
    assert [(r["failure"] or {}).get("layer") for r in answer["records"]] == [
        "backend", "admission", "numerics", None]
    assert cells == _cells(tmp_path / "q")

    refused = edge("qualify", "--profile", "p.json", "--out", "one.json", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--out-dir" in refused.stderr and not (tmp_path / "one.json").exists()

    matrix = edge("matrix", "q", "--out-dir", "report", "--json", cwd=tmp_path)
    assert matrix.returncode == 0, matrix.stderr
    summary = json.loads(matrix.stdout)
    assert summary["cells"] == 4
    assert (summary["counts"]["BLOCKED"], summary["counts"]["FAILED"]) == (2, 1)
    text = (tmp_path / "report" / "matrix.md").read_text()
    assert "admission" in text and "numerics" in text


def test_a_profile_whose_every_candidate_was_refused_records_each_refusal(
    tmp_path: Path,
) -> None:
    pipeline = write_pipeline(tmp_path, [
        {"id": "a", "backend": {"name": "echo"}},
        {"id": "b", "input_transform": "edge_echo.transforms:passthrough", "candidates": [
            {"backend": {"name": "ort-directml"}},
            {"backend": {"name": "echo", "options": {"wrong_numerics": True}}}]}],
        name="none")
    import numpy as np

    # inputs for stage a, which bundles none (without them the profile is refused before
    # it opens: exit 2, edge run's refusal)
    np.savez(tmp_path / "in.npz", x=np.array([1.0], np.float32))
    profiled = edge("profile", str(pipeline), *QUICK, "--inputs", "in.npz", "--out", "p.json",
                    cwd=tmp_path)
    assert profiled.returncode == 1
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["outcome"]["error_type"] == "CandidatesRefused"
    records = records_from_profile(profile, profile_path="p.json")
    seen = {(r.cell.model, r.cell.configuration): (r.status.value, r.failure)
            for r in records}
    assert set(seen) == {("none/a", "echo (candidate 0)"),
                         ("none/b", "ort-directml (candidate 0)"),
                         ("none/b", "echo (candidate 1)")}
    assert seen[("none/b", "ort-directml (candidate 0)")][1].layer == "backend"
    assert seen[("none/b", "echo (candidate 1)")][1].layer == "numerics"
    # stage a's candidate passed its gate; the run then stopped at b: not a pass
    status, failure = seen[("none/a", "echo (candidate 0)")]
    assert status == "FAILED" and failure is not None
    assert len({r.record_id for r in records}) == 3


def test_a_profile_without_candidates_is_still_one_record(tmp_path: Path,
                                                         echo_inputs: Path) -> None:
    pipeline = write_pipeline(tmp_path, [{"id": "a", "backend": {"name": "echo"}}], name="one")
    profiled = edge("profile", str(pipeline), *QUICK, "--inputs", str(echo_inputs),
                    "--out", "p.json", cwd=tmp_path)
    assert profiled.returncode == 0, profiled.stderr
    profile = json.loads((tmp_path / "p.json").read_text())
    (record,) = records_from_profile(profile)
    assert record.cell.model == "one"


def test_the_device_of_a_candidate_is_what_its_probe_reported() -> None:
    profile = {"host": {"cpu_model": "Some CPU", "os": "Linux", "machine": "x86_64"},
               "probes": [{"backend": "qnn", "devices": [
                   {"kind": "npu", "name": "HTP simulator"}]}]}
    assert candidate_device("qnn", profile) == (
        "npu HTP simulator via qnn on Some CPU (Linux x86_64)")
    assert candidate_device("echo", profile) == "echo on Some CPU (Linux x86_64)"
