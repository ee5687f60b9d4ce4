"""The installed ort-directml plugin on this (Linux) machine: found, and unavailable for
reasons it states exactly."""

from __future__ import annotations

import sys

from edge_core.plugins import load_plugins
from edge_core.probe import probe_all
from edge_ort.vendor import clear_probe_cache


def test_edge_ort_directml_is_found_through_its_entry_point() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-directml"})
    record = plugins.record("ort-directml")
    assert record.error is None
    assert record.distribution == "edge-ort-directml"
    assert record.contract == "1.0"
    assert record.backends == ("ort-directml",)
    assert {"edge_probe", "edge_reserve", "edge_load", "edge_warmup_placement",
            "edge_call", "edge_cancel", "edge_retire"} <= set(record.hooks)


def test_the_probe_here_says_it_needs_windows_and_onnxruntime_directml() -> None:
    clear_probe_cache()
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-directml"})
    (row,) = probe_all(plugins)["backends"]
    assert row["backend"] == "ort-directml"
    assert row["available"] is False
    reason = str(row["reason"])
    assert reason.startswith("ort-directml runs only in the windows execution domain")
    assert "the route's domain is posix" in reason
    assert f"onnxruntime-directml is not installed in {sys.executable}" in reason
    assert any("EDGE_ORT_DIRECTML_PYTHON" in note for note in row["notes"])
    assert row["devices"] == [] and row["pool_totals"] == {}
