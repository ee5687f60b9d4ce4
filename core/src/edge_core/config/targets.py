"""The form of a performance target: ``METRIC[@cN] OP NUMBER``, and its parser.

A pipeline's ``targets`` field holds such expressions, checked when the file is read;
the evidence tools (:mod:`edge_core.evidence.targets`) judge measured figures against
them. ``OP`` is one of ``<= < >= > ==``, the metric one of :data:`METRICS`, and ``@cN``
restricts it to concurrency level N.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import attrs

from edge_core.errors import ConfigError

__all__ = ["METRICS", "Target", "parse_target"]

METRICS: Mapping[str, str] = {
    # graph requests, per input group and level
    "latency_p50_ms": "request latency p50 (Pipeline.run to result)",
    "latency_p95_ms": "request latency p95",
    "throughput_rps": "requests per second at the level",
    # streamed requests, per class and level
    "ttft_p50_ms": "time to first token p50",
    "ttft_p95_ms": "time to first token p95",
    "inter_token_p50_ms": "inter-token interval p50 (per token)",
    "inter_token_p95_ms": "inter-token interval p95 (per token)",
    "decode_tokens_per_s": "decode tokens per second (pooled)",
    "prefill_tokens_per_s": "effective prefill tokens per second (pooled)",
    "request_p95_ms": "complete streamed request p95",
    "tail_p95_ms": "last event to result (flush) p95",
    "first_chunk_p95_ms": "first chunk p95 (media streams)",
    "rtf_max": "highest real-time factor of a request (media streams)",
    "deficit_count": "playback deficits (media streams)",
    "deficit_s": "total playback deficit seconds (media streams)",
    # the whole profile
    "open_s": "pipeline open, uninstrumented (baseline run)",
    "first_output_ms": "first request after open, uninstrumented (baseline run)",
    "cancel_ms": "cancel to the request's end (cancellation case)",
    "runtime_peak_mib": "sum of the worker trees' runtime peaks",
    "peak_of_sum_mib": "highest sampled sum of the worker trees' resident sets",
    "sustained_p95_slope_ms_per_10min": "trend of the per-window p95 in sustained mode",
}
"""Every metric a target may name, with what it measures."""

_OPS = {"<=": float.__le__, "<": float.__lt__, ">=": float.__ge__, ">": float.__gt__,
        "==": float.__eq__}
_FORM = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)(?:@c(\d+))?\s*(<=|>=|==|<|>)\s*(\S+)\s*$")


@attrs.frozen
class Target:
    """One target: metric, optional level, comparison, bound (and how it was written)."""

    metric: str
    op: str
    bound: float
    level: int | None = None
    text: str = ""

    def met_by(self, value: float) -> bool:
        """True when ``value`` meets the target."""
        return bool(_OPS[self.op](float(value), self.bound))


def parse_target(text: object, field: str = "targets",
                 known: Iterable[str] | None = None) -> Target:
    """Parse one ``METRIC[@cN] OP NUMBER`` expression.

    Raises:
        ConfigError: at ``field``: not a string of that form, a metric not in ``known``
            (default :data:`METRICS`), a level below 1 or a bound that is not a finite
            number.
    """
    if not isinstance(text, str):
        raise ConfigError(field, "must be a string 'METRIC OP NUMBER'", text)
    found = _FORM.match(text)
    if found is None:
        raise ConfigError(field, "not of the form 'METRIC[@cN] OP NUMBER' (OP one of "
                            "<= < >= > ==)", text)
    metric, level, op, number = found.groups()
    names = set(METRICS if known is None else known)
    if metric not in names:
        raise ConfigError(field, f"unknown metric {metric!r} (known: {sorted(names)})", text)
    try:
        bound = float(number)
    except ValueError:
        raise ConfigError(field, "the bound is not a number", text) from None
    if not math.isfinite(bound):
        raise ConfigError(field, "the bound must be finite", text)
    if level is not None and int(level) < 1:
        raise ConfigError(field, "a concurrency level is at least 1", text)
    return Target(metric, op, bound, int(level) if level else None, text.strip())
