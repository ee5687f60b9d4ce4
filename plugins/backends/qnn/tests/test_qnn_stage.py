"""The qnn backend on the QNN HTP simulator: real sessions, real placement, real cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.placement import PlacementRefusal
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline

from .conftest import cpu_run, example_input, make_bundle

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"


def open_qnn(plugins: PluginSet, ledger: ResourceLedger, bundle: Path, cache: Path,
             options: dict[str, Any] | None = None, **stage: Any) -> Pipeline:
    config = load_pipeline({"name": "p", "stages": [{
        "id": "s", "manifest": str(bundle),
        "backend": {"name": "qnn",
                    "options": {"context_cache_dir": str(cache), **(options or {})}},
        **stage,
    }]})
    return Pipeline.open(config, plugins, ledger)


def test_a_static_fp32_graph_runs_wholly_on_qnn_and_matches_cpu(
    plugins: PluginSet, ledger: ResourceLedger, static_bundle: Path, tmp_path: Path
) -> None:
    with open_qnn(plugins, ledger, static_bundle, tmp_path / "cache") as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        placement = plan["placement"]
        assert placement["target"] == QNN
        assert placement["fraction_on_target"] == 1.0
        assert set(placement["providers"]) == {QNN}
        assert placement["method"] == "graph-assignment-info"
        assert plan["numerics"]["reference"] == "expected-outputs"
        assert plan["numerics"]["passed"] is True
        assert plan["worker"]["load"]["registered_libraries"] == [QNN]
        for seed in range(3):
            x = example_input(seed + 100)
            with pipeline.run({"x": x}) as result:
                np.testing.assert_allclose(result.outputs["y"], cpu_run(static_bundle, x),
                                           atol=1e-4, rtol=1e-4)


def test_a_dynamic_batch_falls_back_to_cpu_and_the_gate_names_the_cpu_nodes(
    plugins: PluginSet, ledger: ResourceLedger, dynamic_bundle: Path, tmp_path: Path
) -> None:
    # One session for every shape: the symbolic batch stays symbolic and QNN declines it.
    with pytest.raises(PlacementRefusal) as info:
        open_qnn(plugins, ledger, dynamic_bundle, tmp_path / "cache",
                 options={"session_per_bucket": False})
    message = str(info.value)
    assert "CPUExecutionProvider ran 2 node(s)" in message
    assert "conv0" in message and "relu0" in message
    report = info.value.report
    assert report.providers[CPU].nodes == 2
    assert QNN not in report.providers


def test_a_qdq_graph_splits_and_is_refused_at_the_default_minimum(
    plugins: PluginSet, ledger: ResourceLedger, qdq_bundle: Path, tmp_path: Path
) -> None:
    with pytest.raises(PlacementRefusal) as info:
        open_qnn(plugins, ledger, qdq_bundle, tmp_path / "cache")
    report = info.value.report
    assert report.providers[QNN].nodes > 0
    assert report.providers[CPU].nodes > 0
    assert "QuantizeLinear" in report.providers[CPU].op_types


def test_a_qdq_split_is_accepted_when_the_stage_lowers_the_minimum_and_allows_cpu(
    plugins: PluginSet, ledger: ResourceLedger, qdq_bundle: Path, tmp_path: Path
) -> None:
    bound = {"max_abs_error": 0.05, "normalised_error": 0.02}
    with open_qnn(plugins, ledger, qdq_bundle, tmp_path / "cache",
                  options={"numerics_bound": bound},
                  placement={"min_fraction_on_target": 0.5,
                             "allowed_providers": [CPU]}) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        placement = plan["placement"]
        on_qnn = placement["providers"][QNN]["nodes"]
        on_cpu = placement["providers"][CPU]["nodes"]
        assert on_qnn > 0 and on_cpu > 0
        assert placement["fraction_on_target"] == pytest.approx(on_qnn / (on_qnn + on_cpu))
        assert 0.5 <= placement["fraction_on_target"] < 1.0
        numerics = plan["numerics"]
        assert numerics["reference"] == "cpu-run"
        assert numerics["passed"] is True
        assert numerics["bound"]["max_abs_error"] == 0.05
        x = example_input(200)
        with pipeline.run({"x": x}) as result:
            error = np.abs(result.outputs["y"] - cpu_run(qdq_bundle, x)).max()
        assert error <= 0.05


def test_the_gpu_backend_cannot_initialise_on_the_simulator_and_the_gate_refuses(
    plugins: PluginSet, ledger: ResourceLedger, static_bundle: Path, tmp_path: Path
) -> None:
    with pytest.raises(PlacementRefusal) as info:
        open_qnn(plugins, ledger, static_bundle, tmp_path / "cache",
                 options={"backend_type": "gpu"})
    report = info.value.report
    assert set(report.providers) == {CPU}


def _context(plan: dict[str, Any]) -> dict[str, Any]:
    context: dict[str, Any] = plan["worker"]["load"]["ep_context"]
    return context


def test_a_second_load_reuses_the_compiled_context_and_a_changed_key_recompiles(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    bundle = make_bundle(tmp_path / "a")
    x = example_input(5)

    def load(bundle: Path, **options: Any) -> tuple[dict[str, Any], np.ndarray]:
        with open_qnn(plugins, ledger, bundle, cache, options=options) as pipeline:
            plan = pipeline.execution_plan()["stages"][0]
            with pipeline.run({"x": x}) as result:
                return _context(plan), np.array(result.outputs["y"])

    first, y1 = load(bundle)
    assert (first["reused"], first["written"]) == (False, True)
    second, y2 = load(bundle)
    assert (second["reused"], second["key"]) == (True, first["key"])
    np.testing.assert_array_equal(y1, y2)
    burst, _ = load(bundle, performance_mode="burst")
    assert burst["key"] != first["key"] and burst["written"] is True
    changed, _ = load(make_bundle(tmp_path / "b", seed=4))
    assert changed["key"] not in {first["key"], burst["key"]}
    assert changed["written"] is True
    entries = sorted(p.name for p in cache.iterdir())
    assert entries == sorted({first["key"], burst["key"], changed["key"]})


def test_without_the_cache_nothing_is_written(
    plugins: PluginSet, ledger: ResourceLedger, static_bundle: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with open_qnn(plugins, ledger, static_bundle, cache,
                  options={"context_cache": False}) as pipeline:
        assert "ep_context" not in pipeline.execution_plan()["stages"][0]["worker"]["load"]
    assert not cache.exists()


def _read_bytes(pid: int) -> int:
    """Bytes the process has read through read() and its kin (``/proc/PID/io``'s rchar)."""
    with open(f"/proc/{pid}/io") as counters:
        return next(int(line.split()[1]) for line in counters if line.startswith("rchar:"))


@pytest.mark.parametrize("stage_bundle", [True, False], ids=["staged", "in-place"])
def test_the_context_key_reads_no_verified_byte_and_a_changed_file_changes_it(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, stage_bundle: bool
) -> None:
    """The key takes each file's sha256 from the verified manifest: a worker's load reads
    none of the bundle's bytes for it (a 32 MiB listed file is never read: the worker's
    reads total a few MiB, its imports). Before, the worker hashed the graph's whole
    folder again for every entry of a load, after the controller had hashed it to verify
    it. A listed file rewritten (its manifest made again) still gives another key."""
    from edge_core.artifacts import create_manifest

    padding = 32 << 20
    bundle = make_bundle(tmp_path / "a")

    def deploy(fill: bytes) -> None:
        (bundle / "padding.bin").write_bytes(fill * padding)
        create_manifest(bundle, overwrite=True, component="conv-relu-static",
                        example_inputs="example.npz", expected_outputs="expected.npz")

    def load() -> dict[str, Any]:
        with open_qnn(plugins, ledger, bundle, tmp_path / "cache",
                      options={"stage_bundle": stage_bundle}) as pipeline:
            pid = int(str(pipeline.stage("s").loaded.describe()["pid"]))
            assert _read_bytes(pid) < padding, "the worker read the bundle's bytes"
            return _context(pipeline.execution_plan()["stages"][0])

    deploy(b"\1")
    first = load()
    assert (first["reused"], first["written"]) == (False, True)
    again = load()
    assert (again["reused"], again["key"]) == (True, first["key"])
    deploy(b"\2")  # same size, other bytes: another manifest, another key
    changed = load()
    assert changed["key"] != first["key"] and changed["written"] is True
