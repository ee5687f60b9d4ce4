"""``complete-model`` only when every declared bucket was compared with hashed expected outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_core.artifacts import create_manifest
from edge_core.placement import BucketWarmup, PlacementReport, ProviderShare
from edge_core.runtime.evidence import (
    BACKEND_EXECUTION,
    COMPLETE_MODEL,
    evidence_label,
    evidence_of,
)

PASSED = {"reference": "expected-outputs", "passed": True, "max_abs_error": 0.0}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "model.bin").write_bytes(b"graph bytes")
    np.savez(root / "example.npz", x=np.ones(3, np.float32))
    np.savez(root / "expected.npz", y=np.full(3, 2.0, np.float32))
    create_manifest(root, graph="model.bin", example_inputs="example.npz",
                    expected_outputs="expected.npz")
    return root


def test_expected_outputs_hashed_in_the_bundle_are_complete_model_evidence(
    bundle: Path,
) -> None:
    label, basis = evidence_label(PASSED, bundle)
    assert label == COMPLETE_MODEL
    assert "expected.npz" in basis


def test_expected_outputs_changed_after_hashing_are_not(bundle: Path) -> None:
    np.savez(bundle / "expected.npz", y=np.full(3, 3.0, np.float32))
    label, basis = evidence_label(PASSED, bundle)
    assert label == BACKEND_EXECUTION
    assert "sha256 differs" in basis


def test_a_bundle_that_declares_no_expected_outputs_is_not(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    (root / "model.bin").write_bytes(b"graph bytes")
    np.savez(root / "example.npz", x=np.ones(3, np.float32))
    create_manifest(root, graph="model.bin", example_inputs="example.npz")
    assert evidence_label(PASSED, root)[0] == BACKEND_EXECUTION


def test_no_bundle_a_failed_check_or_the_backends_own_reference_is_not(bundle: Path) -> None:
    assert evidence_label(PASSED, None) == (
        BACKEND_EXECUTION, "expected outputs claimed, but the stage has no bundle")
    assert evidence_label({**PASSED, "passed": False}, bundle)[0] == BACKEND_EXECUTION
    assert evidence_label(None, bundle)[0] == BACKEND_EXECUTION
    for reference in ("cpu-run", "float64-formula", "anything", "none"):
        label, basis = evidence_label({**PASSED, "reference": reference}, bundle)
        assert label == BACKEND_EXECUTION and repr(reference) in basis


def test_a_missing_manifest_is_not(tmp_path: Path) -> None:
    label, basis = evidence_label(PASSED, tmp_path)
    assert label == BACKEND_EXECUTION
    assert "cannot be checked" in basis


def test_a_manifest_verified_at_load_is_judged_not_the_one_on_disk_now(bundle: Path) -> None:
    """What the execution plan passes for a stage verified in place (its pin's manifest):
    a manifest rewritten since is not read; expected outputs rewritten since are not
    counted against the verified sha256s."""
    from edge_core.artifacts import verify_bundle

    verified = verify_bundle(bundle, stage=False).manifest
    create_manifest(bundle, graph="model.bin", example_inputs="example.npz",
                    overwrite=True)  # the manifest rewritten: names no expected outputs
    assert evidence_label(PASSED, bundle)[0] == BACKEND_EXECUTION  # the disk's
    found = evidence_of(PASSED, bundle, manifest=verified)
    assert found.label == COMPLETE_MODEL and "expected.npz" in found.basis
    np.savez(bundle / "expected.npz", y=np.full(3, 3.0, np.float32))
    found = evidence_of(PASSED, bundle, manifest=verified)
    assert found.label == BACKEND_EXECUTION
    assert "expected.npz: sha256 differs from the manifest" in found.basis


# -- bucket counts: how many declared buckets were compared --------------------------------

CPU = PlacementReport(target="cpu", available_providers=["cpu"],
                      providers={"cpu": ProviderShare(nodes=1)}, method="test")
NONE = {"reference": "none", "passed": True}


def _bucket(entry: str, point: str, numerics: dict[str, object] | None) -> BucketWarmup:
    return BucketWarmup(entry=entry, point=point, shapes={"x": (1, 3)}, placement=CPU,
                        numerics=numerics)


def _shaped_bundle(root: Path, *, between_expected: bool) -> Path:
    """Two static buckets and a range (three examples), expected outputs per example."""
    root.mkdir()
    (root / "model.bin").write_bytes(b"graph bytes")
    shapes = []
    for name, rows in (("n1", [1]), ("n2", [2]), ("many", [8, 32, 13])):
        examples = []
        for r in rows:
            np.savez(root / f"{name}_{r}.npz", x=np.ones((r, 3), np.float32))
            example = {"example_inputs": f"{name}_{r}.npz"}
            if r != 13 or between_expected:
                np.savez(root / f"{name}_{r}.expected.npz", y=np.ones((r, 3), np.float32))
                example["expected_outputs"] = f"{name}_{r}.expected.npz"
            examples.append(example)
        dims = [rows[0], 3] if len(rows) == 1 else [[8, 32], 3]
        shapes.append({"name": name, "inputs": {"x": {"dtype": "float32", "dims": dims}},
                       "examples": examples})
    create_manifest(root, graph="model.bin", example_inputs="n1_1.npz",
                    validation={"shapes": shapes})
    return root


ALL_RUNS = [("n1", "static"), ("n2", "static"), ("many", "min"), ("many", "max"),
            ("many", "between")]


def test_every_declared_bucket_compared_is_complete_model_with_its_counts(
    tmp_path: Path,
) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=True)
    found = evidence_of(PASSED, bundle, [_bucket(e, p, PASSED) for e, p in ALL_RUNS])
    assert found.label == COMPLETE_MODEL
    assert found.buckets.to_json() == {"compared": 3, "declared": 3, "runs_compared": 5,
                                       "runs": 5, "not_compared": {}}
    assert found.basis.startswith("3 of 3 declared bucket(s) compared with ")


def test_a_bucket_without_expected_outputs_is_not_counted_even_if_the_backend_says_so(
    tmp_path: Path,
) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=False)
    # the backend claims every run was compared with expected outputs, the last one too
    found = evidence_of(PASSED, bundle, [_bucket(e, p, PASSED) for e, p in ALL_RUNS])
    assert found.label == BACKEND_EXECUTION
    counts = found.buckets.to_json()
    assert (counts["compared"], counts["declared"]) == (2, 3)
    assert (counts["runs_compared"], counts["runs"]) == (4, 5)
    assert counts["not_compared"] == {"many": "1 of 3 example(s) name no expected outputs"}
    assert found.basis.startswith("2 of 3 declared bucket(s) compared; not compared: many")


def test_a_run_the_backend_did_not_compare_leaves_its_bucket_uncounted(tmp_path: Path) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=True)
    runs = [_bucket(e, p, NONE if p == "max" else PASSED) for e, p in ALL_RUNS]
    found = evidence_of(PASSED, bundle, runs)
    assert found.label == BACKEND_EXECUTION
    assert found.buckets.compared == 2 and found.buckets.runs_compared == 4
    assert "2 of 3 warm-up run(s) passed" in found.buckets.not_compared["many"]
    # a bucket the warm-up never reported is not compared either
    found = evidence_of(PASSED, bundle, runs[:2])
    assert (found.buckets.compared, found.buckets.declared) == (2, 3)


def test_the_stages_selection_of_buckets_is_what_is_declared(tmp_path: Path) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=False)
    runs = [_bucket(e, p, PASSED) for e, p in ALL_RUNS[:2]]
    found = evidence_of(PASSED, bundle, runs, selected=("n1", "n2"))
    assert found.label == COMPLETE_MODEL
    assert (found.buckets.compared, found.buckets.declared) == (2, 2)


def test_a_changed_bucket_reference_is_not_counted(tmp_path: Path) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=True)
    np.savez(bundle / "n2_2.expected.npz", y=np.zeros((2, 3), np.float32))
    found = evidence_of(PASSED, bundle, [_bucket(e, p, PASSED) for e, p in ALL_RUNS])
    assert found.label == BACKEND_EXECUTION
    assert found.buckets.not_compared == {
        "n2": "n2_2.expected.npz: sha256 differs from the manifest"}
    assert found.buckets.runs_compared == 4


def test_a_single_example_counts_one_bucket(bundle: Path) -> None:
    assert evidence_of(PASSED, bundle).buckets.to_json() == {
        "compared": 1, "declared": 1, "runs_compared": 1, "runs": 1, "not_compared": {}}
    failed = evidence_of(PASSED, bundle, [_bucket("example", "static", NONE)])
    assert failed.label == BACKEND_EXECUTION and failed.buckets.compared == 0
    assert evidence_of(None, bundle).buckets.compared == 0


def test_the_counts_come_from_the_bundle_whatever_the_overall_reference(tmp_path: Path) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=True)
    cpu_run = {**PASSED, "reference": "cpu-run"}
    runs = [_bucket(e, p, cpu_run if e == "many" else PASSED) for e, p in ALL_RUNS]
    found = evidence_of({**PASSED, "reference": "cpu-run+expected-outputs"}, bundle, runs)
    assert found.label == BACKEND_EXECUTION and "'cpu-run+expected-outputs'" in found.basis
    assert (found.buckets.compared, found.buckets.declared) == (2, 3)
    assert found.buckets.not_compared == {
        "many": "0 of 3 warm-up run(s) passed a comparison with expected-outputs"}


def test_an_independent_run_that_passed_is_complete_model_and_named(tmp_path: Path) -> None:
    run = {"reference": "independent-run:ort-cpu", "passed": True, "bound": {}}
    label, basis = evidence_label(None, tmp_path, run)
    assert label == COMPLETE_MODEL and "independent-run:ort-cpu" in basis


def test_an_independent_run_covers_one_bucket_not_a_shape_set(tmp_path: Path) -> None:
    bundle = _shaped_bundle(tmp_path / "b", between_expected=False)
    run = {"reference": "independent-run:ort-cpu", "passed": True, "bound": {}}
    runs = [_bucket(e, p, PASSED) for e, p in ALL_RUNS]
    found = evidence_of(PASSED, bundle, runs, reference=run)
    assert found.label == BACKEND_EXECUTION and "example inputs only" in found.basis
    assert (found.buckets.compared, found.buckets.declared) == (2, 3)


def test_an_independent_run_not_made_failed_or_misnamed_is_not(tmp_path: Path) -> None:
    failed = {"reference": "independent-run:ort-cpu", "passed": False,
              "reason": "outputs.y: beyond the bound"}
    label, basis = evidence_label(None, tmp_path, failed)
    assert label == BACKEND_EXECUTION and "outputs.y: beyond the bound" in basis
    claimed = {"reference": "cpu-run", "passed": True}  # not a run core started
    assert evidence_label(None, tmp_path, claimed)[0] == BACKEND_EXECUTION
    missing = {"reference": "independent-run:ort-cpu"}  # no verdict: not compared
    assert evidence_label(None, tmp_path, missing)[0] == BACKEND_EXECUTION
