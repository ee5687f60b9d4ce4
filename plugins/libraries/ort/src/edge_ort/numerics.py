"""Comparing a stage's outputs with a reference: max absolute and normalised error.

Worker side: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["DEFAULT_BOUND", "compare_outputs", "json_number"]

#: Used when the bundle declares no bound.
DEFAULT_BOUND = {"max_abs_error": 1e-4, "normalised_error": 1e-4}


def _as_float(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "biu":
        return array.astype(np.float64)
    if array.dtype.kind == "V" or array.dtype.name == "bfloat16":
        return array.astype(np.float32).astype(np.float64)
    return array.astype(np.float64)


def json_number(value: float) -> float | str:
    """``value`` as JSON can carry it: a finite float, else ``"nan"``, ``"inf"``, ``"-inf"``."""
    return value if np.isfinite(value) else str(value)


def _tensor(array: np.ndarray) -> dict[str, Any]:
    """An array's dtype and shape, for a record that says what differs."""
    return {"dtype": str(array.dtype), "shape": [int(d) for d in array.shape]}


def _worst_element(a: np.ndarray, r: np.ndarray, diff: np.ndarray,
                   nan_where: np.ndarray) -> dict[str, Any]:
    """The element that fails worst: the first NaN mismatch, else the largest difference."""
    flat = int(np.argmax(nan_where)) if nan_where.any() else int(np.argmax(diff))
    index = [int(i) for i in np.unravel_index(flat, a.shape)]
    return {"index": index, "expected": json_number(float(r.flat[flat])),
            "got": json_number(float(a.flat[flat]))}


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    bound: Mapping[str, Any] | None = None,
    reference_kind: str = "expected-outputs",
) -> dict[str, Any]:
    """Compare every reference output with the actual one.

    ``max_abs_error`` is the largest absolute element difference; ``normalised_error`` is
    ``||actual - reference||_2 / max(||reference||_2, tiny)`` (``"inf"`` where a value is
    infinite and the reference's is not: JSON has no infinity). A missing output, a shape or
    dtype difference, or a NaN where the reference has none (or none where it has one)
    fails the comparison.

    Each output's record says why it failed, in ``why``: ``missing``; ``shape`` or
    ``dtype``, with the ``expected`` and ``got`` dtype and shape; ``nan`` or ``tolerance``,
    with the bounds exceeded (``exceeds``). A compared output's ``worst`` is its worst
    element: ``index``, ``expected`` and ``got`` (the first NaN mismatch, else the
    largest difference; a value JSON cannot carry is ``"nan"``, ``"inf"`` or ``"-inf"``).

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
            per_output[name] = {"passed": False, "why": "missing", "problem": "output missing"}
            passed = False
            continue
        if got.shape != ref.shape or got.dtype != ref.dtype:
            problem = f"expected {ref.dtype}{list(ref.shape)}, got {got.dtype}{list(got.shape)}"
            per_output[name] = {"passed": False,
                                "why": "shape" if got.shape != ref.shape else "dtype",
                                "problem": problem, "expected": _tensor(ref),
                                "got": _tensor(got)}
            passed = False
            continue
        a, r = _as_float(got), _as_float(ref)
        nan_where = np.isnan(a) != np.isnan(r)
        nan_mismatch = bool(np.any(nan_where))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a - r)  # an infinity where the reference is finite stays one
            diff[np.isnan(diff)] = 0.0  # NaN against NaN, inf against inf: the same
            max_abs = float(diff.max()) if diff.size else 0.0
            denom = float(np.linalg.norm(np.nan_to_num(r))) if r.size else 0.0
            norm = float(np.linalg.norm(diff)) / max(denom, 1e-30) if diff.size else 0.0
        exceeds = [key for key, value in (("max_abs_error", max_abs),
                                          ("normalised_error", norm))
                   if value > float(limits[key])]
        ok = not nan_mismatch and not exceeds
        record: dict[str, Any] = {
            "passed": ok, "max_abs_error": json_number(max_abs),
            "normalised_error": json_number(norm),
            "nan_mismatch": nan_mismatch, "exact": bool(max_abs == 0.0 and not nan_mismatch),
        }
        if not ok:
            record.update(why="nan" if nan_mismatch else "tolerance", exceeds=exceeds)
        if diff.size:
            record["worst"] = _worst_element(a, r, diff, nan_where)
        per_output[name] = record
        worst_abs = max(worst_abs, max_abs)
        worst_norm = max(worst_norm, norm)
        passed = passed and ok
    return {
        "reference": reference_kind,
        "bound": {k: float(v) for k, v in limits.items()},
        "max_abs_error": json_number(worst_abs),
        "normalised_error": json_number(worst_norm),
        "passed": passed,
        "outputs": per_output,
    }
