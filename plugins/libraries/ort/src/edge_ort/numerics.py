"""Comparing a stage's outputs with a reference: max absolute and normalised error.

Worker side: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["DEFAULT_BOUND", "compare_outputs"]

#: Used when the bundle declares no bound.
DEFAULT_BOUND = {"max_abs_error": 1e-4, "normalised_error": 1e-4}


def _as_float(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "biu":
        return array.astype(np.float64)
    if array.dtype.kind == "V" or array.dtype.name == "bfloat16":
        return array.astype(np.float32).astype(np.float64)
    return array.astype(np.float64)


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    bound: Mapping[str, Any] | None = None,
    reference_kind: str = "expected-outputs",
) -> dict[str, Any]:
    """Compare every reference output with the actual one.

    ``max_abs_error`` is the largest absolute element difference; ``normalised_error`` is
    ``||actual - reference||_2 / max(||reference||_2, tiny)``. A missing output, a shape or
    dtype difference, or a NaN where the reference has none fails the comparison.

    Returns:
        A JSON-ready record: per output and overall errors, the bound and ``passed``.
    """
    limits = {**DEFAULT_BOUND, **(bound or {})}
    per_output: dict[str, dict[str, Any]] = {}
    passed = True
    worst_abs = 0.0
    worst_norm = 0.0
    for name, ref in reference.items():
        got = actual.get(name)
        if got is None:
            per_output[name] = {"passed": False, "problem": "output missing"}
            passed = False
            continue
        if got.shape != ref.shape or got.dtype != ref.dtype:
            problem = f"expected {ref.dtype}{list(ref.shape)}, got {got.dtype}{list(got.shape)}"
            per_output[name] = {"passed": False, "problem": problem}
            passed = False
            continue
        a, r = _as_float(got), _as_float(ref)
        nan_mismatch = bool(np.any(np.isnan(a) != np.isnan(r)))
        diff = np.abs(np.nan_to_num(a - r, nan=0.0))
        max_abs = float(diff.max()) if diff.size else 0.0
        denom = float(np.linalg.norm(np.nan_to_num(r))) if r.size else 0.0
        norm = float(np.linalg.norm(diff)) / max(denom, 1e-30) if diff.size else 0.0
        ok = (not nan_mismatch and max_abs <= float(limits["max_abs_error"])
              and norm <= float(limits["normalised_error"]))
        per_output[name] = {
            "passed": ok, "max_abs_error": max_abs, "normalised_error": norm,
            "nan_mismatch": nan_mismatch, "exact": bool(max_abs == 0.0 and not nan_mismatch),
        }
        worst_abs = max(worst_abs, max_abs)
        worst_norm = max(worst_norm, norm)
        passed = passed and ok
    return {
        "reference": reference_kind,
        "bound": {k: float(v) for k, v in limits.items()},
        "max_abs_error": worst_abs,
        "normalised_error": worst_norm,
        "passed": passed,
        "outputs": per_output,
    }
