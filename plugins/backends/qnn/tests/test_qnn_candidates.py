"""Candidate backends with qnn on the QNN HTP simulator first and ort-cpu after it.

Real sessions on both: the dynamic-batch graph falls wholly to the CPU under QNN, so the
real placement gate refuses the qnn candidate and ort-cpu serves; the static graph runs
wholly on QNN, so qnn is chosen and ort-cpu is never tried. These pipelines select
``first-passing``: what is checked here is each candidate's gate, not which is faster
(measured selection with the simulator is checked by the OCR example and the placement
benchmark).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import Pipeline

from .conftest import example_input

QNN = "QNNExecutionProvider"


@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    return load_plugins(env={"EDGE_PLUGINS": "qnn,ort-cpu"})


def _open(plugins: PluginSet, ledger: ResourceLedger, bundle: Path, cache: Path) -> Pipeline:
    config = load_pipeline({"name": "p", "selection": "first-passing", "stages": [{
        "id": "s", "manifest": str(bundle), "candidates": [
            {"backend": {"name": "qnn", "options": {"context_cache_dir": str(cache),
                                                    "session_per_bucket": False}}},
            {"backend": {"name": "ort-cpu"}},
        ]}]})
    return Pipeline.open(config, plugins, ledger)


def _tried(pipeline: Pipeline) -> list[tuple[str, str, str | None]]:
    tried = pipeline.execution_plan()["stages"][0]["candidates"]
    return [(c["backend"], c["outcome"], c["layer"]) for c in tried]


def test_qnn_refused_at_placement_falls_back_to_ort_cpu(
    plugins: PluginSet, ledger: ResourceLedger, dynamic_bundle: Path, tmp_path: Path
) -> None:
    with _open(plugins, ledger, dynamic_bundle, tmp_path / "cache") as pipeline:
        assert _tried(pipeline) == [("qnn", "refused", "placement"),
                                    ("ort-cpu", "chosen", None)]
        reason = pipeline.execution_plan()["stages"][0]["candidates"][0]["reason"]
        assert "CPUExecutionProvider ran 2 node(s)" in reason
        assert [t.owner for t in ledger.holdings()] == ["p/s"]
        x = example_input(5)
        with pipeline.run({"x": x}) as result:
            assert np.isfinite(result.outputs["y"]).all()


def test_qnn_is_chosen_when_the_simulator_places_the_whole_graph(
    plugins: PluginSet, ledger: ResourceLedger, static_bundle: Path, tmp_path: Path
) -> None:
    with _open(plugins, ledger, static_bundle, tmp_path / "cache") as pipeline:
        assert _tried(pipeline) == [("qnn", "chosen", None)]
        assert pipeline.execution_plan()["stages"][0]["placement"]["target"] == QNN


def _open_derived(plugins: PluginSet, ledger: ResourceLedger, derived: Path, fallback: Path,
                  cache: Path, gate_timeout_s: float) -> Pipeline:
    config = load_pipeline({"name": "p", "selection": "first-passing", "stages": [{
        "id": "s", "manifest": str(fallback), "candidates": [
            {"manifest": str(derived),
             "backend": {"name": "qnn", "options": {"context_cache_dir": str(cache),
                                                    "gate_timeout_s": gate_timeout_s}}},
            {"backend": {"name": "ort-cpu"}},
        ]}]})
    return Pipeline.open(config, plugins, ledger)


def test_a_derived_static_bundle_puts_the_dynamic_graph_wholly_on_qnn(
    plugins: PluginSet, ledger: ResourceLedger, dynamic_bundle: Path, tmp_path: Path
) -> None:
    from edge_ort.derive.build import derive_bundle
    from edge_ort.derive.specs import parse_bucket

    derived = tmp_path / "static"
    derive_bundle(dynamic_bundle, derived, [parse_bucket("1x3x8x8", 0)])
    with _open_derived(plugins, ledger, derived, dynamic_bundle, tmp_path / "cache",
                       120.0) as pipeline:
        assert _tried(pipeline) == [("qnn", "chosen", None)]
        plan = pipeline.execution_plan()["stages"][0]
        assert set(plan["buckets"][0]["placement"]) == {QNN}  # nothing on the CPU
        assert plan["buckets"][0]["fraction_on_target"] == 1.0
        x = example_input(5)
        with pipeline.run({"x": x}) as result:
            assert np.isfinite(result.outputs["y"]).all()


def test_a_qnn_candidate_past_its_gate_timeout_is_refused_and_ort_cpu_serves(
    plugins: PluginSet, ledger: ResourceLedger, dynamic_bundle: Path, tmp_path: Path
) -> None:
    from edge_ort.derive.build import derive_bundle
    from edge_ort.derive.specs import parse_bucket

    derived = tmp_path / "static"
    derive_bundle(dynamic_bundle, derived, [parse_bucket("1x3x8x8", 0)])
    with _open_derived(plugins, ledger, derived, dynamic_bundle, tmp_path / "cache",
                       0.001) as pipeline:
        tried = pipeline.execution_plan()["stages"][0]["candidates"]
        assert [(c["backend"], c["outcome"]) for c in tried] == [("qnn", "refused"),
                                                                 ("ort-cpu", "chosen")]
        # Reported as it happened: the load did not answer within the bound.
        reason = tried[0]["reason"]
        assert reason.startswith("DeadlineExceeded") and "0.001" in reason
        assert tried[0]["layer"] == "runtime"
        assert [t.owner for t in ledger.holdings()] == ["p/s"]
