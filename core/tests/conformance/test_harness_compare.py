"""The kit's output comparison refuses NaN mismatches and dtype changes, not only large errors."""

from __future__ import annotations

import numpy as np

from edge_core.testing.harness import compare_outputs

BOUND = {"max_abs_error": 1e-3, "normalised_error": 1e-3}


def test_all_nan_outputs_do_not_match_finite_expectations() -> None:
    problems = compare_outputs({"y": np.full(3, np.nan, np.float32)}, {},
                               {"y": np.zeros(3, np.float32)}, BOUND)
    assert problems and "NaN" in problems[0]


def test_a_different_dtype_does_not_match() -> None:
    problems = compare_outputs({"y": np.zeros(3, np.float16)}, {},
                               {"y": np.zeros(3, np.float32)}, BOUND)
    assert problems == ["outputs.y.dtype: expected float32: float16"]


def test_values_within_the_bound_match() -> None:
    assert compare_outputs({"y": np.array([1.0, 2.0001], np.float32)}, {},
                           {"y": np.array([1.0, 2.0], np.float32)}, BOUND) == []
