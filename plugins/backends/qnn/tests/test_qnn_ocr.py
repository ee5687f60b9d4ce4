"""An OCR stage (PP-OCRv4 text-direction classifier) through the qnn backend.

As shipped, the graph has symbolic dimensions: the QNN EP declines every node and the
gate refuses the stage with the whole graph on CPU. Fixed at the example bucket's shape
(the test does that to a copy), it finalises on the HTP simulator only with fp16
precision (fp32 fails with QNN_COMMON_ERROR_MEM_ALLOC there), runs wholly on QNN, and
matches the bundle's expected outputs within the declared bound.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.placement import PlacementRefusal
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline

pytestmark = pytest.mark.slow

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"
#: Declared bound for fp16 on HTP against the fp32 CPU reference (observed: 0.0015).
FP16_BOUND = {"max_abs_error": 0.01, "normalised_error": 0.01}


@pytest.fixture(scope="module")
def classify_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The OCR classify bundle, built from the pinned rapidocr wheel."""
    from edge_ocr_example.bundle import build_bundles
    from edge_ocr_example.models import fetch_wheel

    out = tmp_path_factory.mktemp("ocr") / "bundles"
    build_bundles(out, wheel=fetch_wheel())
    return out / "classify"


def fixed_shape_copy(bundle: Path, target: Path) -> Path:
    """A bundle whose graph has every symbolic input dimension set from the example."""
    import onnx

    from edge_core.artifacts import create_manifest

    manifest = json.loads((bundle / "edge-manifest.json").read_text(encoding="utf-8"))
    metadata = manifest["metadata"]
    target.mkdir()
    with np.load(bundle / metadata["example_inputs"], allow_pickle=False) as data:
        example = {name: data[name].shape for name in data.files}
    model = onnx.load(str(bundle / metadata["graph"]))
    for value in model.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, example.get(value.name, ()),
                             strict=False):
            if dim.dim_param or dim.dim_value <= 0:
                dim.Clear()
                dim.dim_value = int(size)
    onnx.save(model, str(target / metadata["graph"]))
    for member in (metadata["example_inputs"], "expected_outputs.npz"):
        shutil.copy2(bundle / member, target / member)
    create_manifest(target, component=manifest["component"] + "-fixed",
                    example_inputs=metadata["example_inputs"],
                    expected_outputs="expected_outputs.npz", precision="float32",
                    exporter="fixed-shape copy of " + metadata["graph"])
    return target


@pytest.fixture
def ledger() -> Iterator[ResourceLedger]:
    ledger = ResourceLedger([Pool(name="machine:ram", total=16 * 1024**3)])
    yield ledger
    assert ledger.is_empty()


@pytest.fixture(scope="module")
def plugins() -> PluginSet:
    return load_plugins(env={"EDGE_PLUGINS": "qnn"})


def open_stage(plugins: PluginSet, ledger: ResourceLedger, bundle: Path,
               options: dict[str, Any]) -> Pipeline:
    config = load_pipeline({"name": "ocr-qnn", "stages": [{
        "id": "classify", "manifest": str(bundle),
        "backend": {"name": "qnn", "options": options}}]})
    return Pipeline.open(config, plugins, ledger)


def test_the_shipped_classifier_has_symbolic_shapes_and_is_refused_wholly_on_cpu(
    plugins: PluginSet, ledger: ResourceLedger, classify_bundle: Path, tmp_path: Path
) -> None:
    with pytest.raises(PlacementRefusal) as info:
        open_stage(plugins, ledger, classify_bundle, {"context_cache": False})
    report = info.value.report
    assert set(report.providers) == {CPU}
    assert report.providers[CPU].nodes == report.total_nodes > 100


def test_the_fixed_shape_classifier_runs_wholly_on_qnn_in_fp16_within_the_bound(
    plugins: PluginSet, ledger: ResourceLedger, classify_bundle: Path, tmp_path: Path
) -> None:
    fixed = fixed_shape_copy(classify_bundle, tmp_path / "classify-fixed")
    options = {"fp16_precision": True, "soc_model": 60, "numerics_bound": FP16_BOUND,
               "context_cache_dir": str(tmp_path / "cache")}
    with open_stage(plugins, ledger, fixed, options) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        assert plan["placement"]["fraction_on_target"] == 1.0
        assert set(plan["placement"]["providers"]) == {QNN}
        numerics = plan["numerics"]
        assert numerics["reference"] == "expected-outputs"
        assert numerics["passed"] is True
        assert numerics["max_abs_error"] <= FP16_BOUND["max_abs_error"]
