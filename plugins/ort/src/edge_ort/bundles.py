"""A tiny, complete ONNX artifact bundle: for tests of every ORT backend and for examples.

``y = relu(x + x)`` on a fixed ``[2, 3]`` float32 input, with its example inputs, the
expected outputs and a manifest written by :func:`edge_core.artifacts.create_manifest`.
Controller side only (needs the ``onnx`` package, imported when called).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["EXAMPLE_X", "write_add_relu_bundle", "write_add_relu_graph"]

#: The example input of the bundle.
EXAMPLE_X = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.25]], dtype=np.float32)


def write_add_relu_graph(directory: Path, shape: tuple[int | str, ...] = (2, 3)) -> Path:
    """Write ``model.onnx`` (nodes ``add0``, ``relu0``) into ``directory``; return its path.

    A string in ``shape`` makes that dimension symbolic (a dynamic batch, say).
    """
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    nodes = [helper.make_node("Add", ["x", "x"], ["t"], name="add0"),
             helper.make_node("Relu", ["t"], ["y"], name="relu0")]
    model = helper.make_model(helper.make_graph(nodes, "add_relu", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = directory / "model.onnx"
    onnx.save(model, str(path))
    return path


def write_add_relu_bundle(directory: Path, *, precision: str = "fp32") -> Path:
    """Create ``directory`` holding the complete bundle; return ``directory``."""
    from edge_core.artifacts import create_manifest

    directory.mkdir(parents=True)
    write_add_relu_graph(directory)
    np.savez(directory / "example_inputs.npz", x=EXAMPLE_X)
    np.savez(directory / "expected.npz", y=np.maximum(EXAMPLE_X + EXAMPLE_X, 0))
    create_manifest(directory, component="add-relu", example_inputs="example_inputs.npz",
                    expected_outputs="expected.npz", precision=precision,
                    exporter="onnx.helper")
    return directory
