"""Shape sets on the QNN HTP simulator: one compiled session (and cache entry) per bucket.

The conv-relu graph has a symbolic batch ``N``. Each static bucket gets its own session
with ``N`` fixed to the bucket's size, which QNN compiles and runs wholly on the HTP; a
dynamic entry keeps ``N`` symbolic, QNN declines it, and the gate refuses the stage naming
that bucket and its CPU nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edge_contracts.shapesets import ShapeRefused
from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.placement import PlacementRefusal
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline

from .conftest import build_conv_relu

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"


def batch(rows: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed + rows).random((rows, 3, 8, 8), dtype=np.float32)


def bucketed_bundle(directory: Path, *, dynamic: bool) -> Path:
    """Static buckets N in {1, 2}, plus (``dynamic``) an entry N in [3, 6]."""
    directory.mkdir()
    graph = build_conv_relu(directory / "model.onnx", batch="N")
    cpu = ort.InferenceSession(str(graph), providers=[CPU])
    shapes: list[dict[str, Any]] = []

    def example(name: str, rows: int) -> dict[str, str]:
        x = batch(rows)
        np.savez(directory / f"{name}.npz", x=x)
        np.savez(directory / f"{name}.expected.npz", y=cpu.run(["y"], {"x": x})[0])
        return {"example_inputs": f"{name}.npz", "expected_outputs": f"{name}.expected.npz"}

    for rows in (1, 2):
        shapes.append({"name": f"n{rows}",
                       "inputs": {"x": {"dtype": "float32", "dims": [rows, 3, 8, 8]}},
                       "examples": [example(f"n{rows}", rows)]})
    if dynamic:
        shapes.append({"name": "many",
                       "inputs": {"x": {"dtype": "float32", "dims": [[3, 6], 3, 8, 8]}},
                       "examples": [example(f"many{r}", r) for r in (3, 6, 4)]})
    create_manifest(directory, component="conv-relu-buckets", example_inputs="n1.npz",
                    expected_outputs="n1.expected.npz", precision="fp32",
                    exporter="onnx.helper", validation={"shapes": shapes})
    return directory


def open_qnn(plugins: PluginSet, ledger: ResourceLedger, bundle: Path, cache: Path) -> Pipeline:
    config = load_pipeline({"name": "p", "stages": [{
        "id": "s", "manifest": str(bundle),
        "backend": {"name": "qnn", "options": {"context_cache_dir": str(cache)}}}]})
    return Pipeline.open(config, plugins, ledger)


def test_every_static_bucket_compiles_on_qnn_with_its_own_cache_entry(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    bundle = bucketed_bundle(tmp_path / "b", dynamic=False)
    cache = tmp_path / "cache"
    with open_qnn(plugins, ledger, bundle, cache) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        assert [(b["entry"], set(b["placement"]), b["fraction_on_target"])
                for b in plan["buckets"]] == [("n1", {QNN}, 1.0), ("n2", {QNN}, 1.0)]
        assert all(b["numerics"]["passed"] for b in plan["buckets"])
        sessions = plan["warmup"]["bucket_sessions"]
        assert {name: s["fixed"] for name, s in sessions.items()} == {"n1": {"N": 1},
                                                                     "n2": {"N": 2}}
        keys = {s["ep_context"]["key"] for s in sessions.values()}
        assert len(keys) == 2 and sorted(p.name for p in cache.iterdir()) == sorted(keys)
        cpu = ort.InferenceSession(str(bundle / "model.onnx"), providers=[CPU])
        for rows in (1, 2):
            x = batch(rows, seed=100)
            with pipeline.run({"x": x}) as result:
                np.testing.assert_allclose(result.outputs["y"], cpu.run(["y"], {"x": x})[0],
                                           atol=1e-4, rtol=1e-4)
        with pytest.raises(ShapeRefused, match=r"inputs\.x: outside every declared shape"):
            pipeline.run({"x": batch(3)})
    with open_qnn(plugins, ledger, bundle, cache) as again:  # both entries reused
        reused = again.execution_plan()["stages"][0]["warmup"]["bucket_sessions"]
        assert all(s["ep_context"]["reused"] for s in reused.values())


def test_a_dynamic_entry_falls_to_cpu_and_the_gate_names_that_bucket(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path
) -> None:
    bundle = bucketed_bundle(tmp_path / "b", dynamic=True)
    with pytest.raises(PlacementRefusal) as info:
        open_qnn(plugins, ledger, bundle, tmp_path / "cache")
    message = str(info.value)
    assert "bucket 'many' (min, {'x': [3, 3, 8, 8]})" in message
    assert "CPUExecutionProvider ran" in message
    assert QNN not in info.value.report.providers
