"""``complete-model`` only when the reference is a hashed member of the verified bundle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_core.artifacts import create_manifest
from edge_core.runtime.evidence import BACKEND_EXECUTION, COMPLETE_MODEL, evidence_label

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


def test_an_independent_run_that_passed_is_complete_model_and_named(tmp_path: Path) -> None:
    run = {"reference": "independent-run:ort-cpu", "passed": True, "bound": {}}
    label, basis = evidence_label(None, tmp_path, run)
    assert label == COMPLETE_MODEL and "independent-run:ort-cpu" in basis


def test_an_independent_run_not_made_failed_or_misnamed_is_not(tmp_path: Path) -> None:
    failed = {"reference": "independent-run:ort-cpu", "passed": False,
              "reason": "outputs.y: beyond the bound"}
    label, basis = evidence_label(None, tmp_path, failed)
    assert label == BACKEND_EXECUTION and "outputs.y: beyond the bound" in basis
    claimed = {"reference": "cpu-run", "passed": True}  # not a run core started
    assert evidence_label(None, tmp_path, claimed)[0] == BACKEND_EXECUTION
    missing = {"reference": "independent-run:ort-cpu"}  # no verdict: not compared
    assert evidence_label(None, tmp_path, missing)[0] == BACKEND_EXECUTION
