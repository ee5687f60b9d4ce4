"""Real graphs and bundles for the qnn backend tests (built here, on the fly)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool
from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def cpu_run(bundle: Path, x: np.ndarray) -> np.ndarray:
    """The bundle's graph run on ONNX Runtime's CPU provider: its output ``y`` for ``x``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], {"x": x})[0])


@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    """The qnn plugin alone (a module that needs others defines its own)."""
    return load_plugins(env={"EDGE_PLUGINS": "qnn"})


@pytest.fixture
def ledger() -> Iterator[ResourceLedger]:
    """An 8 GiB machine's RAM pool, empty again (nothing quarantined) once the test is done."""
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    yield ledger
    assert ledger.is_empty() and not ledger.quarantined()


@pytest.fixture(scope="session", autouse=True)
def _onnxruntime_initialised() -> None:
    """Create one CPU session before any leak snapshot.

    The first session in a process opens ONNX Runtime's process-wide usage database
    (``~/.cache/Microsoft/DeveloperTools/.onnxruntime/onnxruntime.db``) and keeps it open
    for the life of the process; that is not a leak of the test that happens to be first.
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "init", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

IN_SHAPE = (1, 3, 8, 8)


def build_conv_relu(path: Path, batch: int | str = 1, seed: int = 3) -> Path:
    """A float32 Conv(3→4, 3x3, pad 1) → Relu graph; ``batch`` may be symbolic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    bias = rng.standard_normal(4).astype(np.float32) * 0.1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c"], ["y"], name="relu0"),
    ]
    graph = helper.make_graph(nodes, "conv_relu", [x], [y], [
        numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def example_input(seed: int = 11) -> np.ndarray:
    """One deterministic example batch."""
    return np.random.default_rng(seed).random(IN_SHAPE, dtype=np.float32)


def quantize_qdq(source: Path, target: Path) -> Path:
    """QDQ-quantize ``source`` (uint8 activations and weights) with ORT's static quantizer."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches = iter([{"x": example_input(seed)} for seed in range(8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8)
    return target


def make_bundle(directory: Path, graph_builder: str = "static", expected: bool = True,
                seed: int = 3) -> Path:
    """A verified-ready bundle: graph, example input and (optionally) CPU-reference outputs."""
    import onnxruntime as ort

    from edge_core.artifacts import create_manifest

    directory.mkdir(parents=True)
    if graph_builder == "qdq":
        float_graph = build_conv_relu(directory.parent / f"{directory.name}-float.onnx",
                                      seed=seed)
        graph = quantize_qdq(float_graph, directory / "model.onnx")
        float_graph.unlink()
    else:
        graph = build_conv_relu(directory / "model.onnx",
                                batch="N" if graph_builder == "dynamic" else 1, seed=seed)
    x = example_input()
    np.savez(directory / "example.npz", x=x)
    reference = None
    if expected:
        cpu = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        np.savez(directory / "expected.npz", y=cpu.run(["y"], {"x": x})[0])
        reference = "expected.npz"
    create_manifest(directory, component=f"conv-relu-{graph_builder}",
                    example_inputs="example.npz", expected_outputs=reference,
                    precision="fp32", exporter="onnx.helper")
    return directory


@pytest.fixture
def static_bundle(tmp_path: Path) -> Path:
    """The static-shape fp32 conv-relu bundle."""
    return make_bundle(tmp_path / "static")


@pytest.fixture
def dynamic_bundle(tmp_path: Path) -> Path:
    """The same graph with a symbolic batch dimension."""
    return make_bundle(tmp_path / "dynamic", "dynamic")


@pytest.fixture
def qdq_bundle(tmp_path: Path) -> Path:
    """The graph QDQ-quantized, without expected outputs (the worker compares with CPU)."""
    return make_bundle(tmp_path / "qdq", "qdq", expected=False)
