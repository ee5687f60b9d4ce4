"""Percentiles and the phase tracer."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from edge_core.evidence.stats import percentile, summarise
from edge_core.evidence.tracing import PhaseTracer


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.95, 1.0])
def test_percentile_matches_numpy_linear_interpolation(fraction: float) -> None:
    values = [5.0, 1.0, 9.5, 3.25, 7.0, 2.0, 8.0]
    assert percentile(values, fraction) == pytest.approx(np.percentile(values, fraction * 100))


def test_percentile_refuses_empty_samples_and_fractions_outside_unit_interval() -> None:
    with pytest.raises(ValueError, match="values: need at least one sample"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match=r"fraction: must be within \[0, 1\]: 1.5"):
        percentile([1.0], 1.5)


def test_summary_reports_milliseconds_with_the_sample_count() -> None:
    summary = summarise([0.001, 0.002, 0.003, 0.004])
    assert summary["n"] == 4
    assert summary["p50_ms"] == pytest.approx(2.5)
    assert summary["min_ms"] == pytest.approx(1.0) and summary["max_ms"] == pytest.approx(4.0)
    assert summarise([]) == {"n": 0}


def _slow() -> None:
    time.sleep(0.02)


def _failing() -> None:
    time.sleep(0.01)
    raise RuntimeError("boom")


def _other() -> None:
    time.sleep(0.01)


def test_tracer_times_only_its_targets_including_calls_that_raise() -> None:
    tracer = PhaseTracer({"slow": _slow, "failing:variant": _failing})
    before = sys.getprofile()
    with tracer:
        _slow()
        _other()
        with pytest.raises(RuntimeError):
            _failing()
    assert sys.getprofile() is before
    assert [span.phase for span in tracer.spans] == ["slow", "failing"]
    assert tracer.spans[0].seconds >= 0.02
    assert tracer.spans[1].seconds >= 0.01
    totals = tracer.between(tracer.spans[0].start, tracer.spans[1].start)
    assert set(totals) == {"slow"}


def test_tracer_refuses_a_target_without_code() -> None:
    with pytest.raises(TypeError, match=r"targets\['len'\]: has no code object"):
        PhaseTracer({"len": len})
