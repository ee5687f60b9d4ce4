from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def build_add_relu(directory: Path, shape: tuple[int | str, ...] = (2, 3)) -> Path:
    """A two-node float32 graph y = relu(x + x), saved as model.onnx."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    nodes = [
        helper.make_node("Add", ["x", "x"], ["t"], name="add0"),
        helper.make_node("Relu", ["t"], ["y"], name="relu0"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "add_relu", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = directory / "model.onnx"
    onnx.save(model, str(path))
    return path


EXAMPLE_X = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.25]], dtype=np.float32)


@pytest.fixture
def add_relu_bundle(tmp_path: Path) -> dict[str, Path]:
    """A complete bundle directory (graph, example, expected outputs, manifest)."""
    from edge_core.artifacts import create_manifest

    bundle = tmp_path / "add_relu"
    bundle.mkdir()
    graph = build_add_relu(bundle)
    np.savez(bundle / "example_inputs.npz", x=EXAMPLE_X)
    np.savez(bundle / "expected.npz", y=np.maximum(EXAMPLE_X + EXAMPLE_X, 0))
    create_manifest(bundle, component="add-relu", example_inputs="example_inputs.npz",
                    expected_outputs="expected.npz", precision="fp32", exporter="onnx.helper")
    return {"dir": bundle, "graph": graph, "example": bundle / "example_inputs.npz",
            "expected": bundle / "expected.npz"}
