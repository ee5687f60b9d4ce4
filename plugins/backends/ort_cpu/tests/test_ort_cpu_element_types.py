"""Graph tensor types the ort-cpu stage does not carry, and mistyped examples: refused by name.

``bfloat16`` and the ``float8`` types reached ONNX Runtime's own messages before (``Numpy_type
256 can't be converted``, ``Unexpected input data type``) or, for a float8 output, would
have come back as ``uint8`` values; an example of the wrong dtype failed the warm-up with
ONNX Runtime's ``INVALID_ARGUMENT``. Real graphs built here, real workers; after each
refusal the ledger is empty and the test left no process, segment or staged directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline
from edge_core.host.errors import RemoteError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.element_types import ElementTypeRefused

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

X = np.array([[1.0, -2.5, 3.140625], [0.0, 65280.0, -0.001]], np.float32)


def one_node_bundle(root: Path, op: str, x_type: int, y_type: int, example: np.ndarray,
                    **attributes: Any) -> Path:
    """A bundle whose graph is the one node ``op`` from ``x`` ([2, 3]) to ``y`` ([2, 3])."""
    root.mkdir()
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attributes)], "one",
        [helper.make_tensor_value_info("x", x_type, [2, 3])],
        [helper.make_tensor_value_info("y", y_type, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
              root / "model.onnx")
    np.savez(root / "example.npz", x=example)
    create_manifest(root, graph="model.onnx", example_inputs="example.npz")
    return root


def open_stage(plugins: PluginSet, ledger: ResourceLedger, bundle: Path) -> Pipeline:
    config = load_pipeline({"name": "t", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle)}]})
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)


def refused_at_open(plugins: PluginSet, ledger: ResourceLedger,
                    bundle: Path) -> ElementTypeRefused:
    """The stage's refusal; a stage that opens instead is closed and the test fails."""
    try:
        pipeline = open_stage(plugins, ledger, bundle)
    except ElementTypeRefused as refused:
        return refused
    pipeline.close()
    pytest.fail("the stage opened (its load and warm-up passed): not refused")


FLOAT8 = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
          TensorProto.FLOAT8E5M2FNUZ]


@pytest.mark.parametrize(("x_type", "example"), [
    # its raw bits (the float32s' high halves) in a uint16 example: what a bundle can
    # hold (an .npz keeps no bfloat16)
    (TensorProto.BFLOAT16, X.view(np.uint16)[:, 1::2]),
    *((code, np.zeros((2, 3), np.uint8)) for code in FLOAT8),
], ids=["bfloat16", *(TensorProto.DataType.Name(code).lower() for code in FLOAT8)])
def test_a_graph_input_of_a_type_the_stage_does_not_carry_is_refused_at_load_by_name(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, x_type: int,
    example: np.ndarray,
) -> None:
    bundle = one_node_bundle(tmp_path / "b", "Cast", x_type, TensorProto.FLOAT,
                             np.ascontiguousarray(example), to=TensorProto.FLOAT)
    kind = f"tensor({TensorProto.DataType.Name(x_type).lower()})"
    refused = refused_at_open(plugins, ledger, bundle)
    assert refused.field == "stages[s].manifest.metadata.graph.inputs.x"
    assert refused.value == kind
    assert "an ONNX Runtime stage carries bool, int8" in refused.reason
    assert isinstance(refused.__cause__, RemoteError)  # the worker's, by its fields
    assert ledger.is_empty()


@pytest.mark.parametrize("y_type", [TensorProto.BFLOAT16, *FLOAT8],
                         ids=lambda code: TensorProto.DataType.Name(code).lower())
def test_a_graph_output_of_a_type_the_stage_does_not_carry_is_refused_at_load_by_name(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, y_type: int
) -> None:
    # ONNX Runtime gives a float8 output back as uint8 bits: it would have been sent as
    # uint8 values; a bfloat16 one fails every run with its own message
    bundle = one_node_bundle(tmp_path / "b", "Cast", TensorProto.FLOAT, y_type, X, to=y_type)
    refused = refused_at_open(plugins, ledger, bundle)
    assert refused.field == "stages[s].manifest.metadata.graph.outputs.y"
    assert refused.value == f"tensor({TensorProto.DataType.Name(y_type).lower()})"
    if y_type == TensorProto.BFLOAT16:
        assert refused.reason.startswith(
            "ONNX Runtime's NumPy binding neither takes nor gives bfloat16 arrays")
    else:
        assert refused.reason.startswith("the wire has no float8 dtype")
    assert ledger.is_empty()


@pytest.mark.parametrize(("x_type", "example", "wanted"), [
    (TensorProto.FLOAT, X.astype(np.float64), "float32"),
    (TensorProto.INT64, X.astype(np.int32), "int64"),
    (TensorProto.FLOAT16, X, "float16"),
])
def test_an_example_whose_dtype_is_not_the_graph_inputs_is_refused_at_warm_up_by_name(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path, x_type: int,
    example: np.ndarray, wanted: str,
) -> None:
    bundle = one_node_bundle(tmp_path / "b", "Identity", x_type, x_type, example)
    refused = refused_at_open(plugins, ledger, bundle)
    got = str(example.dtype)
    assert str(refused) == (
        f"stages[s].manifest.metadata.example_inputs.x: the graph's input x is "
        f"tensor({TensorProto.DataType.Name(x_type).lower()}): its example (example.npz) "
        f"must be {wanted}: {got!r}")
    assert ledger.is_empty()


def test_a_declared_cases_example_of_another_dtype_than_the_graph_input_is_refused_by_name(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    # the shape set declares float64 and its examples agree with it (the manifest checks
    # that); the graph takes float: the case's own example is named where the manifest
    # declares it (validation.shapes[0].examples[0], as the manifest's checks name it)
    bundle = one_node_bundle(tmp_path / "b", "Identity", TensorProto.FLOAT,
                             TensorProto.FLOAT, X)
    np.savez(bundle / "wide.npz", x=X.astype(np.float64))
    (bundle / "edge-manifest.json").unlink()
    create_manifest(bundle, graph="model.onnx", example_inputs="example.npz", validation={
        "shapes": [{"name": "wide", "inputs": {"x": {"dtype": "float64", "dims": [2, 3]}},
                    "examples": [{"example_inputs": "wide.npz"}]}]})
    refused = refused_at_open(plugins, ledger, bundle)
    assert str(refused) == (
        "stages[s].manifest.metadata.validation.shapes[0].examples[0].example_inputs.x: the "
        "graph's input x is tensor(float): its example (wide.npz) must be float32: 'float64'")
    assert ledger.is_empty()


def test_an_example_of_the_graph_inputs_dtype_still_opens_and_serves(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    bundle = one_node_bundle(tmp_path / "b", "Identity", TensorProto.FLOAT16,
                             TensorProto.FLOAT16, X.astype(np.float16))
    with open_stage(plugins, ledger, bundle) as pipeline, \
            pipeline.run({"x": X.astype(np.float16)}) as result:
        assert result.outputs["y"].dtype == np.float16
        assert np.array_equal(result.outputs["y"], X.astype(np.float16))
    assert ledger.is_empty()
