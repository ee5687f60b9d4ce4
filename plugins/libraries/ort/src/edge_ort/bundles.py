"""A tiny, complete ONNX artifact bundle: for tests of every ORT backend and for examples.

``y = relu(x + x)`` on a fixed ``[2, 3]`` float32 input, with its example inputs, the
expected outputs and a manifest written by :func:`edge_core.artifacts.create_manifest`.
The graph is package data (``edge_ort/graphs/add_relu.onnx``, written by
``plugins/libraries/ort/tools/make_graphs.py``), so nothing here needs the ``onnx`` package.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

__all__ = ["ADD_RELU_SHAPES", "EXAMPLE_X", "graph_bytes", "write_add_relu_bundle",
           "write_add_relu_graph"]

#: The example input of the bundle.
EXAMPLE_X = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.25]], dtype=np.float32)


def graph_bytes(name: str) -> bytes:
    """The bytes of the packaged graph ``name`` (``add_relu.onnx``, ``loop_add_relu.onnx``)."""
    return resources.files("edge_ort").joinpath("graphs", name).read_bytes()


#: The shapes of the packaged ``add_relu`` graphs (a string dimension is symbolic).
ADD_RELU_SHAPES: dict[tuple[int | str, ...], str] = {(2, 3): "add_relu.onnx",
                                                     ("n", 3): "add_relu_n3.onnx"}


def write_add_relu_graph(directory: Path, shape: tuple[int | str, ...] = (2, 3)) -> Path:
    """Write ``model.onnx`` (``y = relu(x + x)``, nodes ``add0``, ``relu0``); return its path.

    ``shape`` is one of :data:`ADD_RELU_SHAPES`; other shapes:
    ``plugins/libraries/ort/tools/make_graphs.py --add-relu SHAPE OUT`` (needs ``onnx``).
    """
    name = ADD_RELU_SHAPES.get(tuple(shape))
    if name is None:
        raise ValueError(f"shape: no packaged add_relu graph (packaged: "
                         f"{sorted(map(str, ADD_RELU_SHAPES))}): {shape!r}")
    path = directory / "model.onnx"
    path.write_bytes(graph_bytes(name))
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
