"""A real PARTIAL: a QDQ graph on the QNN HTP simulator splits between QNN and CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_core.evidence.profiling import ProfileSettings, run_profile
from edge_core.evidence.qualify import record_from_profile
from edge_core.evidence.status import Status

from .conftest import write_pipeline

pytest.importorskip("onnxruntime_qnn")
pytest.importorskip("edge_qnn")

_BUILD = r"""
import sys
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from edge_core.artifacts import create_manifest
from pathlib import Path

directory = Path(sys.argv[1])
directory.mkdir(parents=True)
rng = np.random.default_rng(7)
weight = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
graph = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
     helper.make_node("Relu", ["c"], ["y"], name="relu")],
    "conv_relu", [x], [y], [numpy_helper.from_array(weight, "w")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 9
float_path = directory.parent / "float.onnx"
onnx.save(model, str(float_path))

class Reader(CalibrationDataReader):
    def __init__(self):
        self.batches = iter([{"x": np.random.default_rng(s).random((1, 3, 8, 8),
                                                                  dtype=np.float32)}
                             for s in range(6)])
    def get_next(self):
        return next(self.batches, None)

quantize_static(str(float_path), str(directory / "model.onnx"), Reader(),
                quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                weight_type=QuantType.QUInt8)
example = np.random.default_rng(99).random((1, 3, 8, 8), dtype=np.float32)
np.savez(directory / "example.npz", x=example)
# The reference the bundle carries (hashed in its manifest): the QDQ graph on ORT's CPU
# provider, run here, outside the backend's worker.
session = ort.InferenceSession(str(directory / "model.onnx"),
                               providers=["CPUExecutionProvider"])
np.savez(directory / "expected.npz", y=session.run(["y"], {"x": example})[0])
create_manifest(directory, component="conv-relu-qdq", example_inputs="example.npz",
                expected_outputs="expected.npz", precision="uint8-qdq",
                exporter="onnx.helper+quantize_static")
"""


@pytest.mark.qnn
@pytest.mark.slow
def test_a_qdq_graph_split_between_qnn_and_cpu_is_partial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "qdq"
    # Built in a child: ONNX Runtime keeps a process-wide file open after its first session.
    subprocess.run([sys.executable, "-c", _BUILD, str(bundle)], check=True, timeout=300)
    monkeypatch.setenv("EDGE_PLUGINS", "qnn")
    stage = {"id": "conv", "manifest": str(bundle / "edge-manifest.json"),
             "backend": {"name": "qnn", "options": {
                 "numerics_bound": {"max_abs_error": 0.05, "normalised_error": 0.02},
                 "context_cache_dir": str(tmp_path / "cache")}},
             "placement": {"target": "QNNExecutionProvider", "min_fraction_on_target": 0.3,
                           "allowed_providers": ["CPUExecutionProvider"]}}
    path = write_pipeline(tmp_path, [stage], name="conv-relu-qdq")
    settings = ProfileSettings(requests=3, warmup_requests=1, concurrency=(1,),
                               process_start_repeats=1, warm_restart=False)
    profile = run_profile(path, settings=settings)
    assert profile["outcome"] == {"ok": True}, profile["outcome"]
    record = record_from_profile(profile)
    split = record.functional["stages"]["conv"]["providers"]
    assert split["QNNExecutionProvider"] > 0 and split["CPUExecutionProvider"] > 0
    assert record.functional["stages"]["conv"]["numerics"]["passed"] is True
    assert record.status is Status.PARTIAL
    assert record.cell.configuration == "qnn / QNNExecutionProvider"
