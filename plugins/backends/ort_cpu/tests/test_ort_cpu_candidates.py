"""Candidate backends on real onnxruntime sessions: placement and artifact refusals, fallback.

``dml-here`` is a real ORT backend asking for DirectML on a CPU-only onnxruntime build
(the provider is absent, so the real placement gate refuses it); the second candidate
names a bundle whose graph was altered after hashing; the third serves on the CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import CandidatesRefused, Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.plugin_base import OrtPlugin

from .conftest import EXAMPLE_X

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def _corrupt_copy(bundle: Path, where: Path) -> Path:
    copy = Path(shutil.copytree(bundle, where))
    with open(copy / "model.onnx", "ab") as handle:
        handle.write(b"\0")
    return copy


def test_ort_candidates_fall_back_from_placement_and_artifact_to_the_cpu(
    add_relu_bundle: dict[str, Path], tmp_path: Path
) -> None:
    dml = OrtPlugin(backend="dml-here", target="DmlExecutionProvider",
                    description="asks for DirectML on a CPU-only build", distribution="test")
    plugins = load_plugins(objects={"dml-here": dml}, env={"EDGE_PLUGINS": "ort-cpu"})
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    corrupt = _corrupt_copy(add_relu_bundle["dir"], tmp_path / "corrupt")
    stage = {"id": "s", "manifest": str(add_relu_bundle["dir"]), "candidates": [
        {"backend": {"name": "dml-here"}},
        {"backend": {"name": "ort-cpu"}, "manifest": str(corrupt)},
        {"backend": {"name": "ort-cpu"}},
    ]}
    config = load_pipeline({"name": "p", "stages": [stage]})
    with Pipeline.open(config, plugins, ledger) as pipeline:
        plan = pipeline.execution_plan()["stages"][0]
        assert [(c["backend"], c["outcome"], c["layer"]) for c in plan["candidates"]] == [
            ("dml-here", "refused", "placement"), ("ort-cpu", "refused", "artifact"),
            ("ort-cpu", "chosen", None)]
        assert "DmlExecutionProvider" in plan["candidates"][0]["reason"]
        assert "model.onnx" in plan["candidates"][1]["reason"]
        assert plan["placement"]["providers"]["CPUExecutionProvider"]["nodes"] == 2
        assert [t.owner for t in ledger.holdings()] == ["p/s"]
        with pipeline.run({"x": EXAMPLE_X}) as result:
            np.testing.assert_array_equal(result.outputs["y"],
                                          np.maximum(EXAMPLE_X + EXAMPLE_X, 0))
    assert ledger.is_empty()

    only_bad = load_pipeline({"name": "p", "stages": [{**stage, "candidates":
                                                       stage["candidates"][:2]}]})
    with pytest.raises(CandidatesRefused) as info:
        Pipeline.open(only_bad, plugins, ledger)
    assert [r["layer"] for r in info.value.refusals] == ["placement", "artifact"]
    assert ledger.is_empty() and not ledger.quarantined()
