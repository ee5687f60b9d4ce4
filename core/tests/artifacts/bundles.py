"""Real ONNX graphs (built with the onnx package) written into artifact bundles."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.artifacts import create_manifest


def matmul_model(size: int = 64) -> onnx.ModelProto:
    """y = x @ W with a constant weight W of ``size`` x ``size`` float32."""
    weight = numpy_helper.from_array(np.eye(size, dtype=np.float32) * 2, "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])],
        [weight],
    )
    return helper.make_model(graph)


def if_model(size: int = 64) -> onnx.ModelProto:
    """An ``If`` whose then-branch subgraph has its own initializer (TW)."""
    then_weight = numpy_helper.from_array(np.full((size,), 3, np.float32), "TW")
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "TW"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [size])], [then_weight],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [size])],
    )
    cond = numpy_helper.from_array(np.array(True), "cond")
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph,
                          else_branch=else_graph)],
        "iff",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])],
        [cond],
    )
    return helper.make_model(graph)


def constant_model(size: int = 64) -> onnx.ModelProto:
    """A ``Constant`` node whose value is an attribute tensor (not an initializer)."""
    value = numpy_helper.from_array(np.full((size,), 5, np.float32), "C")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=value),
         helper.make_node("Add", ["x", "c"], ["y"])],
        "constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])],
    )
    return helper.make_model(graph)


def passthrough_model() -> onnx.ModelProto:
    """A graph without nodes whose input is its output: valid ONNX that ONNX Runtime runs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    return helper.make_model(helper.make_graph([], "passthrough", [x], [x]))


def _graph_bytes(*, inputs: bool, outputs: bool) -> bytes:
    """A model whose graph has a node, without its inputs and/or outputs declared."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "partial",
                              [x] if inputs else [], [y] if outputs else [])
    return bytes(helper.make_model(graph).SerializeToString())


NOT_ONNX_GRAPHS = [
    pytest.param(b"", "the file is empty (0 bytes)", id="empty"),
    pytest.param(b"\xff\xfe not protobuf", "not a readable ONNX model (unexpected wire type 7",
                 id="garbage"),
    pytest.param(b"hi", "it holds no graph", id="text-that-parses"),  # field 13 = 105
    pytest.param(b"\x08\x09", "it holds no graph", id="ir-version-only"),
    pytest.param(_graph_bytes(inputs=False, outputs=False),
                 "its graph has no input and no output", id="no-inputs-or-outputs"),
    pytest.param(_graph_bytes(inputs=True, outputs=False), "its graph has no output",
                 id="no-outputs"),
]
"""``(bytes, what is missing)`` of graph files named ``.onnx`` that are refused."""


def write_bundle(
    directory: Path,
    *,
    external: bool = True,
    model: onnx.ModelProto | None = None,
    graph_name: str = "model.onnx",
    create: bool = True,
) -> Path:
    """A bundle: a graph (weights in ``weights.bin`` when ``external``), example inputs,
    expected outputs, and (with ``create``) its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    model = matmul_model() if model is None else model
    target = directory / graph_name
    target.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save_model(model, target, save_as_external_data=True,
                        all_tensors_to_one_file=True, location="weights.bin",
                        size_threshold=0, convert_attribute=True)
    else:
        onnx.save_model(model, target)
    np.savez(directory / "inputs.npz", x=np.ones((1, 64), np.float32))
    np.savez(directory / "expected.npz", y=np.full((1, 64), 2, np.float32))
    if create:
        create_manifest(directory, graph=graph_name, example_inputs="inputs.npz",
                        expected_outputs="expected.npz", precision="float32")
    return directory


def edit_manifest(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the manifest's JSON data and write it back (by hand, unchecked)."""
    path = directory / MANIFEST_FILENAME
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def sha256_of(path: Path) -> str:
    """The sha256 hex digest of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
