"""Sample statistics of a measurement: quantiles with distribution-free confidence bounds.

Latencies are skewed and occasionally disturbed (another process, a page fault), so no
distribution is assumed: a quantile's bounds are order statistics whose coverage follows
from the binomial distribution alone. For the median of ``n`` samples at 95 % the bounds
are the smallest and largest sample from ``n = 6`` on and tighten as samples accumulate;
with fewer samples a bound that cannot be given at that confidence is open (``0`` below,
``inf`` above), so nothing is stopped on too little evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["DEFAULT_CONFIDENCE", "Summary", "quantile", "quantile_bounds", "summarize"]

DEFAULT_CONFIDENCE = 0.95
"""Two-sided confidence of the bounds a race stops candidates on."""


def _binomial_pmf(n: int, p: float) -> list[float]:
    """P(B = k) for k = 0..n, B ~ Binomial(n, p), computed in log space (no overflow)."""
    if p <= 0.0:
        return [1.0] + [0.0] * n
    if p >= 1.0:
        return [0.0] * n + [1.0]
    log_p, log_q = math.log(p), math.log1p(-p)
    return [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                     + k * log_p + (n - k) * log_q) for k in range(n + 1)]


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted samples, interpolated linearly (numpy's default).

    Raises:
        ValueError: no samples, or ``q`` outside [0, 1].

    """
    if not ordered:
        raise ValueError("quantile: no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q must be in [0, 1]: {q!r}")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def quantile_bounds(ordered: Sequence[float], q: float,
                    confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Distribution-free bounds on the ``q`` quantile of the population behind ``ordered``.

    Returns ``(x_(l), x_(u))``, the l-th and u-th smallest samples (1-based), chosen so
    that ``P(l <= B < u) >= confidence`` for ``B ~ Binomial(n, q)`` (the count of samples
    below the true quantile), widening the side with more probability mass first. A side
    that runs out of samples before the confidence is reached is open: ``0.0`` below
    (every figure here is a non-negative cost) and ``inf`` above.

    Raises:
        ValueError: no samples, ``q`` outside (0, 1) or ``confidence`` outside (0, 1).

    """
    n = len(ordered)
    if n == 0:
        raise ValueError("quantile_bounds: no samples")
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile_bounds: q must be in (0, 1): {q!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"quantile_bounds: confidence must be in (0, 1): {confidence!r}")
    pmf = _binomial_pmf(n, q)
    # The interval [x_(l), x_(u)] covers the quantile when l <= B <= u - 1.
    lower = min(max(math.floor(n * q), 0), n)  # B values covered: lower .. upper - 1
    upper = lower + 1
    covered = sum(pmf[lower:upper])
    while covered < confidence and (lower > 0 or upper <= n):
        below = pmf[lower - 1] if lower > 0 else -1.0
        above = pmf[upper] if upper <= n else -1.0
        if below >= above:
            lower -= 1
            covered += below
        else:
            covered += above
            upper += 1
    if covered < confidence:
        return 0.0, math.inf
    low = ordered[lower - 1] if lower >= 1 else 0.0
    high = ordered[upper - 1] if upper <= n else math.inf
    return low, high


@attrs.frozen
class Summary:
    """The figures of one candidate's samples (seconds, or any non-negative cost)."""

    n: int
    """Samples taken."""
    p50: float
    """The median."""
    p95: float
    """The 95th percentile."""
    p50_low: float
    """Lower confidence bound of the median (0.0 while too few samples)."""
    p50_high: float
    """Upper confidence bound of the median (``inf`` while too few samples)."""
    p95_low: float
    """Lower confidence bound of the 95th percentile."""
    p95_high: float
    """Upper confidence bound of the 95th percentile (``inf`` until ~60 samples at 95 %)."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready figures; an open bound is ``None``."""
        return {name: (None if isinstance(value, float) and math.isinf(value) else value)
                for name, value in attrs.asdict(self).items()}


def summarize(samples: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Summary:
    """p50 and p95 of ``samples`` with their bounds at ``confidence``.

    Raises:
        ValueError: no samples, or a sample that is negative or not finite.

    """
    if not samples:
        raise ValueError("summarize: no samples")
    for value in samples:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"summarize: samples must be finite and >= 0: {value!r}")
    ordered = sorted(float(v) for v in samples)
    p50_low, p50_high = quantile_bounds(ordered, 0.5, confidence)
    p95_low, p95_high = quantile_bounds(ordered, 0.95, confidence)
    return Summary(n=len(ordered), p50=quantile(ordered, 0.5), p95=quantile(ordered, 0.95),
                   p50_low=p50_low, p50_high=p50_high, p95_low=p95_low, p95_high=p95_high)
