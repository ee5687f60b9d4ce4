"""The classifier stage of ``pipeline-auto.toml`` on the QNN HTP simulator, with its fallback.

Built as ``make demo`` builds it: the page bundles, then ``classify-qnn`` derived from
the classifier (one static bucket of ``BATCH`` rows). The stage is opened from the
file's own ``[[stages.candidates]]`` (qnn with fp16 and a bounded gate, then ort-cpu)
and its ``[measurement]``: exactly one candidate is chosen — the faster, ort-cpu — and
the other says why (a refusal with its layer, or its measured figures). One padded call
is then checked against the fp32 reference.
Slow (the simulator compiles and runs the classifier), kept to one call.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page(demo_build: Path) -> Path:
    """The page bundles and the derived classifier, as ``make demo`` writes them.

    The session's shared ``demo_build`` (the root conftest.py), derived with the same
    bucket of ``BATCH`` rows.
    """
    from edge_ocr_example.page_bundle import AUTO_CLASSIFY
    from edge_ocr_example.page_pipeline import BATCH

    out = demo_build / "build" / "ocr"
    manifest = (out / AUTO_CLASSIFY / "edge-manifest.json").read_text(encoding="utf-8")
    assert f"b{BATCH}x3x48x192" in manifest  # the bucket this test's calls fill
    return out


@pytest.fixture
def ledger() -> Iterator[ResourceLedger]:
    ledger = ResourceLedger([Pool(name="machine:ram", total=16 * 1024**3)])
    yield ledger
    assert ledger.is_empty() and not ledger.quarantined()


def classify_stage(page: Path, cache: Path) -> dict[str, Any]:
    """The classifier stage of ``pipeline-auto.toml``, as the first stage of a pipeline."""
    from edge_ocr_example.page_bundle import AUTO_PIPELINE

    stages = tomllib.loads((page / AUTO_PIPELINE).read_text(encoding="utf-8"))["stages"]
    stage = next(s for s in stages if s["id"] == "classify")
    del stage["input_transform"]  # it is the only stage here: it takes the caller's rows
    stage["manifest"] = str(page / stage["manifest"])
    for candidate in stage["candidates"]:
        if "manifest" in candidate:
            candidate["manifest"] = str(page / candidate["manifest"])
        if candidate["backend"]["name"] == "qnn":
            candidate["backend"]["options"]["context_cache_dir"] = str(cache)
    return stage


def test_the_auto_classifier_chooses_one_candidate_and_matches_the_reference(
    page: Path, ledger: ResourceLedger, tmp_path: Path
) -> None:
    from edge_ocr_example.page_bundle import AUTO_FP16_BOUND, AUTO_MEASUREMENT
    from edge_ocr_example.page_pipeline import BATCH

    stage = classify_stage(page, tmp_path / "cache")
    qnn = stage["candidates"][0]["backend"]
    assert qnn["name"] == "qnn" and qnn["options"]["gate_timeout_s"] <= 120
    config = load_pipeline({"name": "auto-classify", "stages": [stage],
                            "measurement": dict(AUTO_MEASUREMENT)})
    plugins = load_plugins(env={"EDGE_PLUGINS": "qnn,ort-cpu"})
    with Pipeline.open(config, plugins, ledger) as pipeline:
        tried = pipeline.execution_plan()["stages"][0]["candidates"]
        outcomes = [c["outcome"] for c in tried]
        # measured on the bundle's examples: ort-cpu is faster by far than the simulator
        assert outcomes.count("chosen") == 1 and outcomes[-1] == "chosen"
        assert [c["backend"] for c in tried] == ["qnn", "ort-cpu"][: len(tried)]
        for other in tried[:-1]:  # whatever the simulator did, it is said
            assert other["reason"]
            assert other["layer"] if other["outcome"] == "refused" else other["measured"]
        examples = page / "classify-qnn" / "examples"
        with np.load(examples / f"b{BATCH}x3x48x192.npz") as x, \
                np.load(examples / f"b{BATCH}x3x48x192.expected.npz") as expected, \
                pipeline.run({"x": x["x"]}) as result:
            name = next(iter(expected.files))
            error = np.abs(result.outputs[name] - expected[name]).max()
            assert error <= AUTO_FP16_BOUND["max_abs_error"]
