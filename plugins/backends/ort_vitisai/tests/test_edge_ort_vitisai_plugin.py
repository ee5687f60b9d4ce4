"""The installed ort-vitisai plugin on this (Linux) machine: found, and unavailable for
reasons it states exactly."""

from __future__ import annotations

import sys

from edge_core.plugins import load_plugins
from edge_core.probe import probe_all
from edge_ort.vendor import clear_probe_cache


def test_edge_ort_vitisai_is_found_through_its_entry_point() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-vitisai"})
    record = plugins.record("ort-vitisai")
    assert record.error is None
    assert record.distribution == "edge-ort-vitisai"
    assert record.contract == "1.0"
    assert record.backends == ("ort-vitisai",)
    assert {"edge_probe", "edge_validate_stage", "edge_reserve", "edge_load",
            "edge_warmup_placement", "edge_call", "edge_cancel",
            "edge_retire"} <= set(record.hooks)


def test_the_probe_here_says_it_needs_windows_and_onnxruntime_vitisai() -> None:
    clear_probe_cache()
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-vitisai"})
    (row,) = probe_all(plugins)["backends"]
    assert row["backend"] == "ort-vitisai"
    assert row["available"] is False
    reason = str(row["reason"])
    assert reason.startswith("ort-vitisai runs only in the windows execution domain")
    assert "the route's domain is posix" in reason
    assert f"onnxruntime-vitisai is not installed in {sys.executable}" in reason
    assert "no NPU was listed" in reason
    assert any("EDGE_ORT_VITISAI_PYTHON" in note for note in row["notes"])
