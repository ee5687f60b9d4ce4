"""Evidence tests run real pipelines (edge-echo and edge-ort-cpu workers) end to end.

Every test fails if it leaks a process, a shared-memory segment or a descriptor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

PLUGINS = "echo,ort-cpu"
X = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.5]], dtype=np.float32)


@pytest.fixture(autouse=True)
def only_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load only the echo and ort-cpu plugins (in this process and in `edge` children)."""
    monkeypatch.setenv("EDGE_PLUGINS", PLUGINS)
    monkeypatch.setenv("EDGE_PROGRESS", "0")


def write_pipeline(directory: Path, stages: list[dict[str, Any]], *, admission: int = 1,
                   name: str = "t", **keys: Any) -> Path:
    """A pipeline file (JSON) in ``directory``; ``keys`` are more top-level keys."""
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"name": name, "admission": admission, "stages": stages,
                                **keys}), encoding="utf-8")
    return path


def echo_stage(stage_id: str, *, chained: bool = False, **options: Any) -> dict[str, Any]:
    """An echo stage with the given options (``chained``: takes the previous outputs)."""
    stage: dict[str, Any] = {"id": stage_id, "backend": {"name": "echo", "options": options}}
    if chained:
        stage["input_transform"] = "edge_echo.transforms:passthrough"
    return stage


@pytest.fixture
def echo_inputs(tmp_path: Path) -> Path:
    """First-stage inputs for echo pipelines, as an .npz."""
    path = tmp_path / "x.npz"
    np.savez(path, x=X)
    return path


def build_scale_bundle(directory: Path, *, expected: bool = True, source: str = "x",
                       target: str = "y") -> Path:
    """A real ONNX bundle target = source * 3 (one Mul node), example inputs, a manifest."""
    import onnx
    from onnx import TensorProto, helper

    from edge_core.artifacts import create_manifest

    directory.mkdir(parents=True)
    three = helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", [source, "three"], [target], name="scale")], "scale",
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(target, TensorProto.FLOAT, [2, 3])], [three])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(directory / "model.onnx"))
    inputs: dict[str, Any] = {source: X}
    np.savez(directory / "example_inputs.npz", **inputs)
    extra: dict[str, Any] = {}
    if expected:
        outputs: dict[str, Any] = {target: X * 3}
        np.savez(directory / "expected.npz", **outputs)
        extra["expected_outputs"] = "expected.npz"
    create_manifest(directory, component="scale", example_inputs="example_inputs.npz",
                    precision="fp32", exporter="onnx.helper", **extra)
    return directory


def ort_stage(stage_id: str, bundle: Path, *, chained: bool = False) -> dict[str, Any]:
    """An ort-cpu stage on ``bundle`` with the CPU placement target."""
    stage: dict[str, Any] = {
        "id": stage_id, "manifest": str(bundle / "edge-manifest.json"),
        "backend": {"name": "ort-cpu"},
        "placement": {"target": "CPUExecutionProvider", "min_fraction_on_target": 1.0}}
    if chained:
        stage["input_transform"] = "edge_echo.transforms:passthrough"
    return stage
