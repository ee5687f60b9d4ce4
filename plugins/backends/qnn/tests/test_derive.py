"""``edge derive qnn-static|qnn-qdq``: derived bundles from a small dynamic ONNX graph.

Everything real: the ``edge`` command in a child process, ONNX Runtime's own shape-fixing
and quantisation functions, CPU sessions to check what was written, and the derived
bundle served by ort-cpu through a pipeline (each bucket from its own static graph).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.shapesets import ShapeRefused
from edge_core.artifacts import verify_bundle
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline

from .conftest import make_bundle

CPU = "CPUExecutionProvider"


def edge_derive(args: list[str]) -> tuple[int, dict[str, Any]]:
    """Run ``edge derive ... --json`` in a child process; its exit code and JSON."""
    env = {**os.environ, "EDGE_PLUGINS": "qnn"}
    done = subprocess.run([sys.executable, "-m", "edge_core.cli", "derive", *args, "--json"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    return done.returncode, json.loads(done.stdout)


def session(graph: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(graph), providers=[CPU])


def leftovers(parent: Path) -> list[str]:
    """Private staging directories a derivation left beside its output."""
    return sorted(p.name for p in parent.iterdir() if ".derive-" in p.name)


@pytest.fixture
def dynamic(tmp_path: Path) -> Path:
    return make_bundle(tmp_path / "dynamic", "dynamic")


def test_static_copies_have_fixed_shapes_and_the_dynamic_graphs_outputs(
    dynamic: Path, tmp_path: Path
) -> None:
    import onnx

    out = tmp_path / "static"
    code, answer = edge_derive(["qnn-static", str(dynamic), "--bucket", "one:1x3x8x8",
                                "--bucket", "x=3x3x8x8", "--out", str(out)])
    assert code == 0, answer
    assert [b["name"] for b in answer["buckets"]] == ["one", "b_x3x3x8x8"]
    bundle = verify_bundle(out, stage=False)  # verified like any bundle
    validation = bundle.manifest.metadata.validation or {}
    assert validation["bucket_graphs"] == {"one": "buckets/one.onnx",
                                           "b_x3x3x8x8": "buckets/b_x3x3x8x8.onnx"}
    assert bundle.shapes is not None and all(e.static for e in bundle.shapes.entries)
    source = session(dynamic / "model.onnx")
    for name, batch in (("one", 1), ("b_x3x3x8x8", 3)):
        graph = out / "buckets" / f"{name}.onnx"
        model = onnx.load(str(graph))
        for value in [*model.graph.input, *model.graph.output]:
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
            assert dims[0] == batch and all(d > 0 for d in dims), (value.name, dims)
        static = session(graph)
        assert [tuple(i.shape) for i in static.get_inputs()] == [(batch, 3, 8, 8)]
        x = np.random.default_rng(batch).random((batch, 3, 8, 8), dtype=np.float32)
        np.testing.assert_array_equal(static.run(None, {"x": x})[0],
                                      source.run(None, {"x": x})[0])
        with np.load(out / "examples" / f"{name}.expected.npz") as expected, \
                np.load(out / "examples" / f"{name}.npz") as example:
            np.testing.assert_array_equal(expected["y"],
                                          source.run(None, {"x": example["x"]})[0])


def test_ort_cpu_serves_each_bucket_from_its_own_static_graph(
    dynamic: Path, tmp_path: Path
) -> None:
    out = tmp_path / "static"
    code, _ = edge_derive(["qnn-static", str(dynamic), "--bucket", "1x3x8x8",
                           "--bucket", "3x3x8x8", "--out", str(out)])
    assert code == 0
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    config = load_pipeline({"name": "p", "stages": [{
        "id": "s", "manifest": str(out), "backend": {"name": "ort-cpu"}}]})
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    source = session(dynamic / "model.onnx")
    with Pipeline.open(config, plugins, ledger) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        sessions = plan["warmup"]["bucket_sessions"]
        assert {n: s["graph"] for n, s in sessions.items()} == {
            "b1x3x8x8": "b1x3x8x8.onnx", "b3x3x8x8": "b3x3x8x8.onnx"}
        for batch in (1, 3):
            x = np.random.default_rng(batch).random((batch, 3, 8, 8), dtype=np.float32)
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"],
                                              source.run(None, {"x": x})[0])
        with pytest.raises(ShapeRefused):
            pipeline.run({"x": np.zeros((2, 3, 8, 8), np.float32)})
    assert ledger.is_empty()


def test_qdq_copy_is_quantised_and_within_its_recorded_bound(
    dynamic: Path, tmp_path: Path
) -> None:
    import onnx

    calibration = tmp_path / "calibration"
    calibration.mkdir()
    rng = np.random.default_rng(5)
    for number in range(4):
        np.savez(calibration / f"c{number}.npz",
                 x=rng.random((2, 3, 8, 8), dtype=np.float32))
    out = tmp_path / "qdq"
    code, answer = edge_derive(["qnn-qdq", str(dynamic), "--bucket", "1x3x8x8",
                                "--calibration", str(calibration), "--out", str(out)])
    assert code == 0, answer
    bundle = verify_bundle(out, stage=False)
    metadata = bundle.manifest.metadata
    bound = (metadata.validation or {})["bound"]
    assert bound == answer["bound"] and bound["max_abs_error"] >= 1e-3
    assert metadata.calibration is not None and metadata.calibration["batches"] == 4
    graph = out / "buckets" / "b1x3x8x8.onnx"
    ops = {node.op_type for node in onnx.load(str(graph)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    with np.load(out / "examples" / "b1x3x8x8.npz") as example, \
            np.load(out / "examples" / "b1x3x8x8.expected.npz") as expected:
        got = session(graph).run(None, {"x": example["x"]})[0]
        reference = session(dynamic / "model.onnx").run(None, {"x": example["x"]})[0]
        np.testing.assert_array_equal(expected["y"], reference)  # the fp32 reference
    error = float(np.abs(got - reference).max())
    assert 0 < error <= bound["max_abs_error"]
    measured = answer["buckets"][0]["qdq_vs_fp32"]["max_abs_error"]
    assert error == pytest.approx(measured)


@pytest.mark.parametrize(("bucket", "field"), [
    ("1x3x0x8", "--bucket[0]"),          # a zero dimension
    ("1x3x8", "--bucket[0].x"),          # wrong rank
    ("1x4x8x8", "--bucket[0].x[1]"),     # the graph fixes 3 channels
    ("y=1x3x8x8", "--bucket[0]"),        # no such input
])
def test_a_bad_bucket_is_refused_naming_it_and_nothing_is_written(
    dynamic: Path, tmp_path: Path, bucket: str, field: str
) -> None:
    out = tmp_path / "out"
    code, answer = edge_derive(["qnn-static", str(dynamic), "--bucket", bucket,
                                "--out", str(out)])
    assert code == 2 and answer["ok"] is False
    assert answer["error"].startswith(f"DeriveInputError: {field}:"), answer["error"]
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_missing_bundle_or_an_existing_out_is_refused(dynamic: Path, tmp_path: Path) -> None:
    code, answer = edge_derive(["qnn-static", str(tmp_path / "absent"), "--bucket",
                                "1x3x8x8", "--out", str(tmp_path / "out")])
    assert code == 2 and "absent" in answer["error"]
    assert not (tmp_path / "out").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    code, answer = edge_derive(["qnn-static", str(dynamic), "--bucket", "1x3x8x8",
                                "--out", str(existing)])
    assert code == 2 and answer["error"].startswith("DeriveInputError: --out:")
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("graph", "data", "reason"), [
    ("weights.bin", b"\xff\xfe not protobuf", "not an ONNX model, which edge derive needs ("),
    # named otherwise than .onnx: a valid bundle (one named .onnx must be an ONNX model)
    ("empty.bin", b"", "not an ONNX model with a graph and its inputs"),
])
def test_a_bundle_whose_graph_is_not_onnx_is_refused_naming_it(
    tmp_path: Path, graph: str, data: bytes, reason: str
) -> None:
    from edge_core.artifacts import create_manifest

    bundle = tmp_path / "other"
    bundle.mkdir()
    (bundle / graph).write_bytes(data)
    np.savez(bundle / "example.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    create_manifest(bundle, graph=graph, example_inputs="example.npz")  # a valid bundle
    out = tmp_path / "out"
    code, answer = edge_derive(["qnn-static", str(bundle), "--bucket", "1x3x8x8",
                                "--out", str(out)])
    assert code == 2 and answer["ok"] is False
    assert answer["error"].startswith(f"DeriveInputError: BUNDLE: metadata.graph: {reason}")
    assert answer["error"].endswith(f": {str(bundle / graph)!r}")
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_qdq_copy_outside_the_given_bound_is_refused_and_nothing_is_left(
    dynamic: Path, tmp_path: Path
) -> None:
    out = tmp_path / "qdq"
    code, answer = edge_derive(["qnn-qdq", str(dynamic), "--bucket", "1x3x8x8",
                                "--bound", "max_abs_error=1e-9", "--out", str(out)])
    assert code == 1 and answer["error"].startswith("DeriveFailed: bucket b1x3x8x8:")
    assert "exceeds the bound" in answer["error"]
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_bad_bound_is_refused_before_anything_runs(dynamic: Path, tmp_path: Path) -> None:
    code, answer = edge_derive(["qnn-qdq", str(dynamic), "--bucket", "1x3x8x8",
                                "--bound", "max_abs_error=-1", "--out", str(tmp_path / "o")])
    assert code == 2 and answer["error"].startswith(
        "DeriveInputError: --bound.max_abs_error:")

