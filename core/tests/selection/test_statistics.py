"""Quantiles and their distribution-free bounds, against numpy and against simulation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_core.selection.statistics import quantile, quantile_bounds, summarize

costs = st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False), min_size=1,
                 max_size=80)


@given(costs, st.floats(min_value=0.0, max_value=1.0))
def test_quantile_is_numpys_linear_quantile(samples: list[float], q: float) -> None:
    assert quantile(sorted(samples), q) == pytest.approx(float(np.quantile(samples, q)),
                                                         rel=1e-9, abs=1e-9)


@given(costs, st.sampled_from([0.5, 0.95]))
def test_bounds_are_samples_around_the_estimate_or_open(samples: list[float], q: float) -> None:
    ordered = sorted(samples)
    low, high = quantile_bounds(ordered, q)
    estimate = quantile(ordered, q)
    assert low <= estimate <= high
    assert low == 0.0 or low in ordered
    assert math.isinf(high) or high in ordered


def test_too_few_samples_give_open_bounds_and_six_give_the_extremes() -> None:
    assert quantile_bounds([1.0, 2.0, 3.0], 0.5) == (0.0, math.inf)
    assert quantile_bounds([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.5) == (1.0, 6.0)
    # more samples: the bounds move inwards
    ordered = [float(i) for i in range(1, 41)]
    low, high = quantile_bounds(ordered, 0.5)
    assert 10.0 < low < 20.5 < high < 31.0
    # the p95's upper bound stays open until enough samples lie above it
    assert math.isinf(quantile_bounds(ordered, 0.95)[1])


@pytest.mark.parametrize("n", [6, 10, 25])
def test_the_median_bounds_cover_it_at_least_as_often_as_promised(n: int) -> None:
    rng = random.Random(28)
    trials, covered = 2000, 0
    for _ in range(trials):  # a skewed population whose median is log(2)
        ordered = sorted(rng.expovariate(1.0) for _ in range(n))
        low, high = quantile_bounds(ordered, 0.5, 0.9)
        covered += low <= math.log(2) <= high
    assert covered / trials >= 0.9 - 0.02  # sampling error of 2000 trials


def test_summary_figures_and_json() -> None:
    summary = summarize([0.3, 0.1, 0.2, 0.4, 0.5, 0.6])
    assert (summary.n, summary.p50) == (6, pytest.approx(0.35))
    assert (summary.p50_low, summary.p50_high) == (0.1, 0.6)
    assert summary.to_json()["p95_high"] is None  # open: not infinite in JSON


@pytest.mark.parametrize("bad", [[], [-1.0], [math.nan], [math.inf]])
def test_bad_samples_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="summarize"):
        summarize(bad)


@pytest.mark.parametrize(("q", "confidence"), [(0.0, 0.9), (1.0, 0.9), (0.5, 1.0), (0.5, 0.0)])
def test_bounds_refuse_degenerate_arguments(q: float, confidence: float) -> None:
    with pytest.raises(ValueError, match="quantile_bounds"):
        quantile_bounds([1.0, 2.0], q, confidence)
