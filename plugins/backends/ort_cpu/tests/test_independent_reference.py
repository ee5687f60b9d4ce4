"""``complete-model`` from an independent runtime: ort-cpu as the reference of an echo stage.

Real workers on both sides: the stage runs on the echo test backend (numpy, ``x * scale``)
and core starts an ort-cpu worker for the reference, through the ordinary hooks, on a
bundle whose graph passes ``x`` through. The bundle has no expected outputs, so the label
can only come from that run. Every test also checks that the reference's reservation was
released, its worker retired verifiably, and that nothing is left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline
from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import Pipeline
from edge_core.runtime.evidence import BACKEND_EXECUTION, COMPLETE_MODEL
from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)



@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    return load_plugins(env={"EDGE_PLUGINS": "echo,ort-cpu"})


@pytest.fixture
def passthrough(tmp_path: Path) -> Path:
    """A bundle whose graph returns its input ``x`` (2x2 float32); no expected outputs."""
    root = tmp_path / "passthrough"
    root.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    model = helper.make_model(helper.make_graph([], "passthrough", [x], [x]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, root / "model.onnx")
    np.savez(root / "example.npz", x=np.array([[1.5, -2.0], [0.25, 3.0]], np.float32))
    create_manifest(root, graph="model.onnx", example_inputs="example.npz")
    return root


def _open(plugins: PluginSet, ledger: ResourceLedger, bundle: Path, scale: float,
          reference: str = "ort-cpu") -> Iterator[Pipeline]:
    config = load_pipeline({"name": "ref", "stages": [{
        "id": "s", "manifest": str(bundle), "reference_backend": reference,
        "backend": {"name": "echo", "options": {"scale": scale, "example_shape": [2, 2]}}}]})
    pipeline = Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)
    try:
        yield pipeline
    finally:
        summary = pipeline.close()
        assert summary["s"]["retire"]["verified"] is True
        assert ledger.is_empty(), ledger.snapshot()


def _stage_plan(pipeline: Pipeline) -> dict[str, Any]:
    (stage,) = pipeline.execution_plan()["stages"]
    return dict(stage)


def test_matching_outputs_on_an_independent_runtime_earn_complete_model(
    plugins: PluginSet, ledger: ResourceLedger, passthrough: Path,
) -> None:
    for pipeline in _open(plugins, ledger, passthrough, scale=1.0):
        stage = _stage_plan(pipeline)
        run = stage["reference_run"]
        assert run["reference"] == "independent-run:ort-cpu", run
        assert run["passed"] is True, run.get("reason")
        assert run["outputs"] == ["x"] and run["max_abs_error"] == 0.0
        assert run["retire"]["verified"] is True and run["release"] == "released"
        assert stage["evidence"] == COMPLETE_MODEL
        assert "independent-run:ort-cpu" in stage["evidence_basis"]
        # the reference's reservation is released: only the stage is charged while it serves
        owners = [r["owner"] for r in ledger.snapshot()["reservations"]]
        assert owners == ["ref/s"], owners


def test_outputs_that_differ_from_the_reference_are_refused_with_the_reason(
    plugins: PluginSet, ledger: ResourceLedger, passthrough: Path,
) -> None:
    for pipeline in _open(plugins, ledger, passthrough, scale=2.0):
        stage = _stage_plan(pipeline)
        run = stage["reference_run"]
        assert run["passed"] is False and run["max_abs_error"] == 3.0, run
        assert "outputs.x: beyond the bound" in run["reason"]
        assert run["retire"]["verified"] is True and run["release"] == "released"
        assert stage["evidence"] == BACKEND_EXECUTION
        assert "independent-run:ort-cpu: not compared or no match" in stage["evidence_basis"]


def test_a_reference_that_cannot_start_is_no_comparison_and_charges_nothing(
    plugins: PluginSet, ledger: ResourceLedger, passthrough: Path,
) -> None:
    # ort-directml is not loaded here: the reference is refused at its probe; the stage
    # serves, without the label.
    for pipeline in _open(plugins, ledger, passthrough, scale=1.0, reference="ort-directml"):
        stage = _stage_plan(pipeline)
        run = stage["reference_run"]
        assert run["passed"] is False and "the reference run failed" in run["reason"], run
        assert "retire" not in run
        assert stage["evidence"] == BACKEND_EXECUTION
        result = pipeline.stage("s").submit({"x": np.ones((2, 2), np.float32)}).result()
        result.ack()


def test_a_bundle_without_example_inputs_is_not_compared(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    root = tmp_path / "bare"
    root.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    onnx.save(helper.make_model(helper.make_graph([], "g", [x], [x]),
                                opset_imports=[helper.make_opsetid("", 17)]), root / "m.onnx")
    create_manifest(root, graph="m.onnx")
    for pipeline in _open(plugins, ledger, root, scale=1.0):
        stage = _stage_plan(pipeline)
        assert "no example inputs" in stage["reference_run"]["reason"]
        assert stage["evidence"] == BACKEND_EXECUTION


def test_reference_backend_is_checked_as_a_name() -> None:
    with pytest.raises(ConfigError) as caught:
        load_pipeline({"name": "p", "stages": [{"id": "s", "reference_backend": "ort cpu",
                                                "backend": {"name": "echo"}}]})
    assert "reference_backend" in str(caught.value)
