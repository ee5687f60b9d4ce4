"""Shape sets on ort-cpu: every bucket warmed up and gated, other shapes refused, fit.

The graph is ``y = relu(x + x)`` with a symbolic batch (``n x 3``); the bundle declares
static buckets n in {1, 2, 4} and a dynamic entry n in [8, 32], with examples and
expected outputs per bucket as listed members.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.shapesets import ShapeRefused
from edge_core.artifacts import create_manifest
from edge_core.artifacts.errors import ReferenceRefused
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline
from edge_core.shapes import fit
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.bundles import write_add_relu_graph

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def _example(directory: Path, name: str, rows: int, *, expected: bool = True) -> dict[str, Any]:
    x = (np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - 4.0) / 3.0
    np.savez(directory / f"{name}.npz", x=x)
    example: dict[str, Any] = {"example_inputs": f"{name}.npz"}
    if expected:
        np.savez(directory / f"{name}.expected.npz", y=np.maximum(x + x, 0))
        example["expected_outputs"] = f"{name}.expected.npz"
    return example


def write_bucketed_bundle(directory: Path, *, between: bool = True) -> Path:
    """The dynamic-batch add-relu graph with three static buckets and one range."""
    directory.mkdir()
    write_add_relu_graph(directory, shape=("n", 3))
    shapes: list[dict[str, Any]] = []
    for rows in (1, 2, 4):
        shapes.append({"name": f"n{rows}",
                       "inputs": {"x": {"dtype": "float32", "dims": [rows, 3]}},
                       "examples": [_example(directory, f"n{rows}", rows)]})
    points = [8, 32] + ([13] if between else [])
    shapes.append({"name": "many", "inputs": {"x": {"dtype": "float32", "dims": [[8, 32], 3]}},
                   "examples": [_example(directory, f"many{r}", r, expected=r != 13)
                                for r in points]})
    create_manifest(directory, component="add-relu", example_inputs="n1.npz",
                    expected_outputs="n1.expected.npz", exporter="onnx.helper",
                    validation={"shapes": shapes})
    return directory


def open_stage(plugins: PluginSet, ledger: ResourceLedger, bundle: Path) -> Pipeline:
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle)}]})
    return Pipeline.open(config, plugins, ledger)


def test_every_bucket_is_warmed_up_gated_and_listed_in_the_plan(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    bundle = write_bucketed_bundle(tmp_path / "b")
    with open_stage(plugins, ledger, bundle) as pipeline:
        buckets = pipeline.execution_plan()["stages"][0]["buckets"]
        assert [(b["entry"], b["point"], b["shapes"]["x"][0]) for b in buckets] == [
            ("n1", "static", 1), ("n2", "static", 2), ("n4", "static", 4),
            ("many", "min", 8), ("many", "max", 32), ("many", "between", 13)]
        assert all(b["placement"] == {"CPUExecutionProvider": 2} for b in buckets)
        compared = [b["numerics"]["reference"] for b in buckets]
        assert compared == ["expected-outputs"] * 5 + ["none"]
        assert all(b["numerics"]["passed"] for b in buckets)
        # the range's shape between has no expected outputs: 3 of 4 buckets compared
        stage = pipeline.execution_plan()["stages"][0]
        assert stage["evidence"] == "backend-execution"
        assert stage["evidence_buckets"] == {
            "compared": 3, "declared": 4, "runs_compared": 5, "runs": 6,
            "not_compared": {"many": "1 of 3 example(s) name no expected outputs"}}
        for rows in (1, 2, 4, 8, 20, 32):
            x = np.full((rows, 3), 0.5, np.float32)
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"], x + x)


def test_shapes_outside_every_entry_are_refused_before_sending(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    bundle = write_bucketed_bundle(tmp_path / "b")
    with open_stage(plugins, ledger, bundle) as pipeline:
        stage = pipeline.stage("s")
        for rows in (3, 5, 33):
            with pytest.raises(ShapeRefused) as info:
                pipeline.run({"x": np.zeros((rows, 3), np.float32)})
            assert info.value.field == "inputs.x"
            assert info.value.input == "x"
            assert info.value.shape == f"float32[{rows}, 3]"
            assert "n4{x: float32[4,3]}" in info.value.served
            assert "many{x: float32[8..32,3]}" in info.value.served
        assert stage.outstanding == 0 and pipeline.admission.used == 0
        # fit pads 3 rows to the 4-row bucket, and 33 is too large for every entry
        fitted = fit({"x": np.ones((3, 3), np.float32)}, stage.shapes)
        assert fitted.entry.name == "n4" and fitted.shapes == {"x": (3, 3)}
        with pipeline.run(fitted.inputs) as result:
            np.testing.assert_array_equal(result.outputs["y"][:3], np.full((3, 3), 2.0))
            np.testing.assert_array_equal(result.outputs["y"][3:], np.zeros((1, 3)))
        with pytest.raises(ShapeRefused, match="fits in no entry"):
            fit({"x": np.ones((33, 3), np.float32)}, stage.shapes)


def test_a_shape_accepted_before_lets_through_only_itself(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    """The last lone input accepted is accepted again without matching: that shape only.

    (``edge_ort.bucket.LoneAccepted``, on the controller and in the worker.) After a
    served shape was accepted, another name, dtype or shape of the same input is still
    refused before sending, with nothing held; the accepted one is served again.
    """
    bundle = write_bucketed_bundle(tmp_path / "b")
    with open_stage(plugins, ledger, bundle) as pipeline:
        stage = pipeline.stage("s")
        x = np.ones((2, 3), np.float32)
        for _ in range(2):  # the second accepted as the first was
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["y"], np.full((2, 3), 2.0))
        for refused, shape in ((np.zeros((3, 3), np.float32), "float32[3, 3]"),
                               (np.zeros((2, 3), np.float64), "float64[2, 3]"),
                               (np.zeros((2, 3, 1), np.float32), "float32[2, 3, 1]")):
            with pytest.raises(ShapeRefused) as info:
                pipeline.run({"x": refused})
            assert info.value.input == "x" and info.value.shape == shape
        with pytest.raises(ShapeRefused, match="input names differ"):
            pipeline.run({"z": x})
        assert stage.outstanding == 0 and pipeline.admission.used == 0
        with pipeline.run({"x": x.copy()}) as result:
            np.testing.assert_array_equal(result.outputs["y"], np.full((2, 3), 2.0))


def test_a_range_without_a_shape_between_is_refused_with_nothing_charged(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    with pytest.raises(ReferenceRefused, match=r"missing \['between'\]"):
        write_bucketed_bundle(tmp_path / "refused", between=False)  # refused at creation
    bundle = write_bucketed_bundle(tmp_path / "b")
    manifest = bundle / "edge-manifest.json"
    data = json.loads(manifest.read_text())
    del data["metadata"]["validation"]["shapes"][3]["examples"][2]  # edited afterwards
    manifest.write_text(json.dumps(data))
    with pytest.raises(ReferenceRefused, match=r"shapes\[3\]\.examples: .*missing \['between'\]"):
        open_stage(plugins, ledger, bundle)
    assert ledger.is_empty()


def test_the_pipeline_file_may_serve_a_subset_of_the_bundles_shapes(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    from edge_core.errors import ConfigError

    bundle = write_bucketed_bundle(tmp_path / "b")

    def open_serving(shapes: list[str]) -> Pipeline:
        config = load_pipeline({"name": "p", "stages": [
            {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle),
             "shapes": shapes}]})
        return Pipeline.open(config, plugins, ledger)

    with open_serving(["n2", "many"]) as pipeline:
        buckets = pipeline.execution_plan()["stages"][0]["buckets"]
        assert [(b["entry"], b["point"]) for b in buckets] == [
            ("n2", "static"), ("many", "min"), ("many", "max"), ("many", "between")]
        assert pipeline.stage("s").shapes.names == ("n2", "many")
        counts = pipeline.execution_plan()["stages"][0]["evidence_buckets"]
        assert (counts["compared"], counts["declared"]) == (1, 2)
        with pytest.raises(ShapeRefused, match=r"served: n2\{x: float32\[2,3\]\} \| many"):
            pipeline.run({"x": np.zeros((1, 3), np.float32)})  # n1 is not served here
    with open_serving(["n1", "n4"]) as pipeline:  # every served bucket has its reference
        stage = pipeline.execution_plan()["stages"][0]
        assert stage["evidence"] == "complete-model"
        assert (stage["evidence_buckets"]["compared"],
                stage["evidence_buckets"]["declared"]) == (2, 2)
    with pytest.raises(ConfigError, match=r"stages\[s\]\.shapes\[1\]: not an entry of the "
                                          r"bundle's shape set \['n1', 'n2', 'n4', 'many'\]"):
        open_serving(["n2", "n3"])
    assert ledger.is_empty()


def test_one_bucket_off_its_reference_refuses_the_stage_naming_that_bucket(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Path,
) -> None:
    from edge_core.runtime import NumericsRefused

    bundle = tmp_path / "b"
    write_bucketed_bundle(bundle)
    np.savez(bundle / "n2.expected.npz", y=np.full((2, 3), 7.0, np.float32))  # wrong
    manifest = json.loads((bundle / "edge-manifest.json").read_text())
    create_manifest(bundle, component="add-relu", example_inputs="n1.npz",
                    expected_outputs="n1.expected.npz", exporter="onnx.helper",
                    validation=manifest["metadata"]["validation"], overwrite=True)
    with pytest.raises(NumericsRefused, match=r"stages\[s\]\.numerics: bucket 'n2' "
                                              r"\(static, \{'x': \[2, 3\]\}\)") as info:
        open_stage(plugins, ledger, bundle)
    # the bucket's own record says which output failed and its worst element
    assert "reference: output 'y': values out of tolerance (max_abs_error " in str(info.value)
    assert "worst element [" in str(info.value) and ", got " in str(info.value)
    assert ledger.is_empty()
