from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edge_core.plugins import load_plugins
from edge_core.probe import probe_all


def test_edge_ort_cpu_is_found_through_its_entry_point() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    record = plugins.record("ort-cpu")
    assert record.error is None
    assert record.distribution == "edge-ort-cpu"
    assert record.contract == "1.0"
    assert record.backends == ("ort-cpu",)
    assert {"edge_load", "edge_call", "edge_retire"} <= set(record.hooks)


def test_probe_reports_the_cpu_device_and_onnxruntime_version() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    (row,) = probe_all(plugins)["backends"]
    assert row["available"] is True
    assert row["devices"][0]["kind"] == "cpu"
    assert "onnxruntime" in row["runtime"]
    assert row["notes"] == []


def test_probe_warns_when_several_onnxruntime_distributions_are_installed(
    tmp_path: Path,
) -> None:
    info = tmp_path / "onnxruntime_qnn-2.7.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-qnn\n"
                                   "Version: 2.7.0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "EDGE_PLUGINS": "ort-cpu"}
    result = subprocess.run([sys.executable, "-m", "edge_core.cli", "probe", "--json"],
                            capture_output=True, text=True, env=env, timeout=60, check=True)
    (row,) = json.loads(result.stdout)["backends"]
    (note,) = row["notes"]
    assert "several onnxruntime distributions" in note
    assert "onnxruntime-qnn 2.7.0" in note and "onnxruntime 1." in note


def test_workers_do_not_spin_their_intra_op_threads_unless_a_stage_asks() -> None:
    from edge_ort.options import CPU, OrtOptions, base_load_config

    assert base_load_config(CPU, OrtOptions())["session_config"] == {
        "session.intra_op.allow_spinning": "0"}
    asked = OrtOptions(session_config={"session.intra_op.allow_spinning": "1",
                                       "session.disable_prepacking": "1"})
    assert base_load_config(CPU, asked)["session_config"] == {
        "session.intra_op.allow_spinning": "1", "session.disable_prepacking": "1"}
