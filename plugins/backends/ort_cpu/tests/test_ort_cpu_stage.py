"""The ort-cpu backend end to end: real bundles, real workers, real onnxruntime sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import ManifestInvalid, PlacementRefused
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.bucket import BucketMismatch
from edge_ort.plugin_base import OrtPlugin

from .conftest import EXAMPLE_X

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def open_stage(plugins: PluginSet, ledger: ResourceLedger, bundle: Path, **stage: Any) -> Pipeline:
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": stage.pop("backend", "ort-cpu"),
                                "options": stage.pop("options", {})},
         "manifest": str(bundle), **stage},
    ]})
    return Pipeline.open(config, plugins, ledger)


def test_twenty_sequential_requests_equal_a_direct_session_exactly(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    direct = ort.InferenceSession(str(add_relu_bundle["graph"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    with open_stage(plugins, ledger, add_relu_bundle["dir"]) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        assert plan["placement"]["providers"]["CPUExecutionProvider"]["nodes"] == 2
        assert plan["placement"]["method"] == "graph-assignment-info"
        assert plan["numerics"]["reference"] == "expected-outputs"
        assert plan["numerics"]["passed"] is True
        assert plan["evidence"] == "complete-model"
        assert plan["worker"]["manifest"]["component"] == "add-relu"
        assert plan["worker"]["runtime"]["onnxruntime_distribution"] == "onnxruntime"
        for _ in range(20):
            x = rng.standard_normal((2, 3)).astype(np.float32)
            (expected,) = direct.run(["y"], {"x": x})
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"], expected)
    assert ledger.is_empty()


def test_inputs_outside_the_example_bucket_get_a_typed_error(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open_stage(plugins, ledger, add_relu_bundle["dir"]) as pipeline:
        for bad, field in [({"x": np.zeros((4, 3), np.float32)}, "inputs.x"),
                           ({"x": np.zeros((2, 3), np.float64)}, "inputs.x"),
                           ({"z": EXAMPLE_X}, "inputs")]:
            with pytest.raises(BucketMismatch) as info:
                pipeline.run(bad)
            assert info.value.field == field
        with pipeline.run({"x": EXAMPLE_X}) as result:  # the stage still serves
            assert result.outputs["y"].shape == (2, 3)


def test_a_tampered_file_is_refused_before_any_worker_starts(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open(add_relu_bundle["graph"], "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ManifestInvalid, match=r"model\.onnx"):
        open_stage(plugins, ledger, add_relu_bundle["dir"])
    assert ledger.is_empty()


def test_a_manifest_path_with_traversal_is_refused(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    manifest = add_relu_bundle["dir"] / "edge-manifest.json"
    data = json.loads(manifest.read_text())
    data["files"]["../outside.onnx"] = data["files"].pop("model.onnx")
    data["metadata"]["graph"] = "../outside.onnx"
    manifest.write_text(json.dumps(data))
    with pytest.raises(ManifestInvalid, match=r"\.\./outside\.onnx"):
        open_stage(plugins, ledger, add_relu_bundle["dir"])
    assert ledger.is_empty()


def test_a_symlink_escaping_the_bundle_is_refused(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path],
    tmp_path: Path,
) -> None:
    outside = tmp_path / "elsewhere.onnx"
    add_relu_bundle["graph"].rename(outside)
    os.symlink(outside, add_relu_bundle["graph"])
    with pytest.raises(ManifestInvalid, match=r"model\.onnx"):
        open_stage(plugins, ledger, add_relu_bundle["dir"])
    assert ledger.is_empty()


def test_an_absent_provider_is_refused_not_silently_run_on_cpu(
    ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    dml = OrtPlugin(backend="dml-here", target="DmlExecutionProvider",
                    description="asks for DirectML on a CPU-only build", distribution="test")
    plugins = load_plugins(objects={"dml-here": dml}, env={"EDGE_PLUGINS": ""})
    with pytest.raises(PlacementRefused) as info:
        open_stage(plugins, ledger, add_relu_bundle["dir"], backend="dml-here")
    assert "'DmlExecutionProvider' is not available" in str(info.value)
    assert "CPUExecutionProvider" in str(info.value)
    assert ledger.is_empty()


def test_a_bundle_without_example_inputs_is_refused_saying_how_to_give_them(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    from edge_core.artifacts import create_manifest
    from edge_core.errors import ManifestInvalid

    create_manifest(add_relu_bundle["dir"], overwrite=True)  # no --example-inputs
    with pytest.raises(ManifestInvalid) as info:
        open_stage(plugins, ledger, add_relu_bundle["dir"])
    assert str(info.value) == (
        "stages[s].manifest.metadata.example_inputs: the bundle names no example inputs, "
        "which the warm-up gate runs (give them: edge manifest create DIR --example-inputs "
        "FILE --force): None")
    assert ledger.is_empty()


def test_a_cpu_stage_refuses_a_target_other_than_cpu(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with pytest.raises(Exception, match="QNNExecutionProvider"):
        open_stage(plugins, ledger, add_relu_bundle["dir"],
                   placement={"target": "QNNExecutionProvider"})
    assert ledger.is_empty()


def test_profiling_fallback_reports_the_same_split(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    with open_stage(plugins, ledger, add_relu_bundle["dir"],
                    options={"placement_method": "profiling"}) as pipeline:
        placement = pipeline.execution_plan()["stages"][0]["placement"]
    assert placement["method"] == "profiling"
    assert placement["providers"]["CPUExecutionProvider"]["op_types"] == {"Add": 1, "Relu": 1}


def test_unknown_backend_options_are_refused_with_their_path(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path]
) -> None:
    from edge_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"stages\[0\]\.backend\.options"):
        open_stage(plugins, ledger, add_relu_bundle["dir"], options={"threads": 2})


@pytest.mark.parametrize(("shape", "in_place"), [((512, 1024), True), (("n", 1024), False)])
def test_large_outputs_are_exact_and_arrive_without_a_copy(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
    shape: tuple[int | str, ...], in_place: bool,
) -> None:
    from edge_core.artifacts import create_manifest

    bundle = tmp_path / "big"
    bundle.mkdir()
    graph = bundle / "model.onnx"
    tool = Path(__file__).resolve().parents[3] / "libraries/ort/tools/make_graphs.py"
    dims = ",".join(str(d) for d in shape)
    subprocess.run([sys.executable, str(tool), "--add-relu", dims, str(graph)], check=True,
                   timeout=120)
    rng = np.random.default_rng(3)
    np.savez(bundle / "example.npz", x=rng.standard_normal((512, 1024)).astype(np.float32))
    create_manifest(bundle, example_inputs="example.npz")
    direct = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    with open_stage(plugins, ledger, bundle) as pipeline:
        load = pipeline.execution_plan()["stages"][0]["worker"]["load"]
        assert load["outputs_in_place"] is in_place  # static shapes: written in place
        for _ in range(5):  # 2 MiB outputs: through shared memory either way
            x = rng.standard_normal((512, 1024)).astype(np.float32)
            (expected,) = direct.run(["y"], {"x": x})
            with pipeline.run({"x": x}) as result:
                y = result.outputs["y"]
                np.testing.assert_array_equal(y, expected)
                assert not y.flags.writeable and not y.flags.owndata  # a view, not a copy
                del y
    assert ledger.is_empty()


def test_outputs_written_in_place_stay_exact_when_their_segments_change(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    """The handler keeps each session's output binding and binds an output again only
    when its buffer moved: outputs kept past their acknowledgement (the worker must then
    write the next ones elsewhere) alternate with outputs given back (their segment comes
    back from the pool), inputs come from two input buffers and plain arrays in turn:
    every output equals a direct session's, bit for bit, and no kept one is overwritten."""
    from edge_core.artifacts import create_manifest

    bundle = tmp_path / "static"
    bundle.mkdir()
    graph = bundle / "model.onnx"  # 1 MiB outputs of a static shape: written in place
    tool = Path(__file__).resolve().parents[3] / "libraries/ort/tools/make_graphs.py"
    subprocess.run([sys.executable, str(tool), "--add-relu", "256,1024", str(graph)],
                   check=True, timeout=120)
    rng = np.random.default_rng(11)
    np.savez(bundle / "example.npz", x=rng.standard_normal((256, 1024)).astype(np.float32))
    create_manifest(bundle, example_inputs="example.npz")
    direct = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    with open_stage(plugins, ledger, bundle) as pipeline:
        load = pipeline.execution_plan()["stages"][0]["worker"]["load"]
        assert load["outputs_in_place"] is True
        buffers = [pipeline.input_buffer("x", (256, 1024), np.float32) for _ in range(2)]
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        for i in range(8):
            x: Any = rng.standard_normal((256, 1024)).astype(np.float32)
            if i % 3 < 2:  # an input buffer (two in turn), else a plain array
                buffers[i % 3][...] = x
                x = buffers[i % 3]
            (expected,) = direct.run(["y"], {"x": x})
            if i % 2:  # dropped before the ack: its segment is pooled and comes back
                with pipeline.run({"x": x}) as result:
                    np.testing.assert_array_equal(result.outputs["y"], expected)
                continue
            # kept past the ack: its segment stays the caller's, the worker replaces it
            result = pipeline.run({"x": x})
            y = result.outputs["y"]
            np.testing.assert_array_equal(y, expected)
            with pytest.warns(ResourceWarning, match="still referenced"):
                result.ack()
            kept.append((y, expected))
            del y
        for y, expected in kept:  # never written again by a later request
            np.testing.assert_array_equal(y, expected)
        del kept
        del buffers
    assert ledger.is_empty()


def test_a_pipeline_input_buffer_is_filled_in_place_and_sent_by_reference(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    from edge_core.artifacts import create_manifest
    from edge_ort.bundles import write_add_relu_graph

    bundle = tmp_path / "big"
    bundle.mkdir()
    graph = write_add_relu_graph(bundle, ("n", 3))
    rng = np.random.default_rng(5)
    np.savez(bundle / "example.npz", x=rng.standard_normal((200_000, 3)).astype(np.float32))
    create_manifest(bundle, example_inputs="example.npz")
    direct = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    with open_stage(plugins, ledger, bundle) as pipeline:
        buffer = pipeline.input_buffer("x", (200_000, 3), np.float32)  # 2.3 MiB: shared memory
        producer = pipeline.stages[0].loaded.client._producer  # type: ignore[attr-defined]
        held = producer.held_bytes
        for _ in range(3):
            buffer[...] = rng.standard_normal((200_000, 3)).astype(np.float32)
            (expected,) = direct.run(["y"], {"x": buffer})
            with pipeline.run({"x": buffer}) as result:
                np.testing.assert_array_equal(result.outputs["y"], expected)
            assert buffer.flags.writeable  # the request ended: the caller may refill it
        assert producer.held_bytes == held  # no segment was leased for a copy
        del buffer
    assert ledger.is_empty()


def _expect(bundle: Path, expected: np.ndarray) -> None:
    """Write ``expected`` as the bundle's expected outputs, its manifest made again."""
    from edge_core.artifacts import create_manifest

    np.savez(bundle / "expected.npz", y=expected)
    create_manifest(bundle, component="add-relu", example_inputs="example_inputs.npz",
                    expected_outputs="expected.npz", exporter="onnx.helper", overwrite=True)


@pytest.mark.parametrize(("expected", "why"), [
    (np.maximum(EXAMPLE_X + EXAMPLE_X, 0).reshape(3, 2), "shape mismatch: expected [3, 2], "
                                                         "got [2, 3]"),
    (np.maximum(EXAMPLE_X + EXAMPLE_X, 0).astype(np.float64),
     "dtype mismatch: expected float64, got float32 (shape [2, 3])"),
])
def test_expected_outputs_of_another_shape_or_dtype_are_refused_saying_so(
    plugins: PluginSet, ledger: ResourceLedger, add_relu_bundle: dict[str, Path],
    expected: np.ndarray, why: str,
) -> None:
    from edge_core.runtime import NumericsRefused

    _expect(add_relu_bundle["dir"], expected)
    with pytest.raises(NumericsRefused) as info:
        open_stage(plugins, ledger, add_relu_bundle["dir"])
    assert str(info.value).endswith(f"reference: output 'y': {why}"), str(info.value)
    assert ledger.is_empty()


def test_edge_run_names_the_output_and_worst_element_beyond_the_bound(
    add_relu_bundle: dict[str, Path], tmp_path: Path,
) -> None:
    expected = np.maximum(EXAMPLE_X + EXAMPLE_X, 0)
    expected[1, 1] = 0.5  # relu(-8) is 0
    _expect(add_relu_bundle["dir"], expected)
    (tmp_path / "p.toml").write_text(
        f'name = "p"\n\n[[stages]]\nid = "classify"\nmanifest = "{add_relu_bundle["dir"]}"\n\n'
        '[stages.backend]\nname = "ort-cpu"\n')
    done = subprocess.run([sys.executable, "-m", "edge_core.cli", "run", str(tmp_path / "p.toml")],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "EDGE_PLUGINS": "ort-cpu"})
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert ("NumericsRefused: stages[classify].numerics: bucket 'example' (static, "
            "{'x': [2, 3]}): outputs differ from the expected-outputs reference: output 'y': "
            "values out of tolerance (max_abs_error 0.5 > tolerance 0.0001, normalised_error "
            "0.06836 > tolerance 0.0001): worst element [1, 1]: expected 0.5, got 0.0\n"
            ) in done.stderr, done.stderr
