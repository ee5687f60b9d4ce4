"""Latency summaries: percentiles that always travel with their sample count."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "summarise"]


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile by linear interpolation between closest ranks.

    The method is NumPy's default ("linear"): rank ``fraction * (n - 1)`` of the sorted
    values, interpolated. Raises ``ValueError`` on an empty sequence or a fraction
    outside [0, 1].
    """
    if not values:
        raise ValueError("values: need at least one sample: []")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction: must be within [0, 1]: {fraction!r}")
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarise(seconds: Sequence[float]) -> dict[str, float | int]:
    """Sample count, p50, p95, min, max and mean of latencies given in seconds, in ms."""
    if not seconds:
        return {"n": 0}
    ms = [s * 1e3 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 0.50),
        "p95_ms": percentile(ms, 0.95),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "mean_ms": sum(ms) / len(ms),
    }
