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


@pytest.fixture
def add_relu_bundle(tmp_path: Path) -> dict[str, Path]:
    graph = build_add_relu(tmp_path)
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.25]], dtype=np.float32)
    np.savez(tmp_path / "example_inputs.npz", x=x)
    np.savez(tmp_path / "expected.npz", y=np.maximum(x + x, 0))
    return {"dir": tmp_path, "graph": graph, "example": tmp_path / "example_inputs.npz",
            "expected": tmp_path / "expected.npz"}
