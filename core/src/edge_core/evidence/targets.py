"""Product targets (``ttft_p95_ms <= 800``) and how a record's measured figures meet them.

A target is ``METRIC[@cN] OP NUMBER`` with ``OP`` one of ``<= < >= > ==``. The metric is
one of :data:`METRICS`; ``@cN`` restricts it to concurrency level N, else it applies to
every measured request class (or input group) at every level, and each of those must meet
it. A target whose metric the profile did not measure is *unmeasured*: it is neither met
nor failed.

Targets come from the pipeline file (``targets = ["ttft_p95_ms <= 800"]``) or from a
targets file given to ``edge profile`` or ``edge qualify`` (``--targets FILE``: TOML or
JSON with the same ``targets`` list). The golden set's pass criteria use the same
expressions over the quality function's metrics (:func:`parse_target` with ``known``).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_core.config.targets import METRICS, Target
from edge_core.config.targets import parse_target as parse_config_target
from edge_core.errors import ConfigError
from edge_core.evidence.errors import RecordInvalid

__all__ = ["METRICS", "PROTOCOL_MIN_REQUESTS", "Target", "evaluate", "load_targets",
           "measured_metrics", "parse_target", "parse_targets"]

PROTOCOL_MIN_REQUESTS = 20
"""Measured requests per class and concurrency level the profiling protocol asks for."""


def parse_target(text: object, field: str = "targets",
                 known: Iterable[str] | None = None) -> Target:
    """Parse one ``METRIC[@cN] OP NUMBER`` expression.

    The grammar is the pipeline file's own (:func:`edge_core.config.targets.parse_target`);
    here a bad expression is an evidence error.

    Raises:
        RecordInvalid: not a string of that form, a metric not in ``known`` (default
            :data:`METRICS`), a level below 1 or a bound that is not a finite number.
    """
    try:
        return parse_config_target(text, field, known)
    except ConfigError as exc:
        raise RecordInvalid(exc.path, exc.reason, exc.value) from None


def parse_targets(values: object, field: str = "targets") -> tuple[Target, ...]:
    """Parse a list of target expressions (``field[i]`` names a bad one)."""
    if not isinstance(values, list | tuple):
        raise RecordInvalid(field, "must be a list of 'METRIC OP NUMBER' strings", values)
    return tuple(parse_target(v, f"{field}[{i}]") for i, v in enumerate(values))


def load_targets(path: str | os.PathLike[str]) -> tuple[Target, ...]:
    """Read a targets file: TOML or JSON with ``targets = ["ttft_p95_ms <= 800", ...]``.

    Raises:
        RecordInvalid: unreadable, not UTF-8, not TOML/JSON, no ``targets`` list, or a bad target.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordInvalid(str(file), f"cannot read the targets file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise RecordInvalid(str(file),
                            f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        data: Any = (json.loads(text) if file.suffix == ".json" else tomllib.loads(text))
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RecordInvalid(str(file), f"not valid {'JSON' if file.suffix == '.json' else 'TOML'}"
                            f" ({exc})") from None
    if not isinstance(data, dict) or "targets" not in data:
        raise RecordInvalid(f"{file}: targets", "the file needs a 'targets' list")
    return parse_targets(data["targets"], f"{file}: targets")


def _level_of(scope: str) -> int | None:
    _, _, level = scope.rpartition("@c")
    return int(level) if level.isdigit() else None


def _put(found: dict[str, dict[str, float]], metric: str, scope: str, value: object) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        found.setdefault(metric, {})[scope] = float(value)


def measured_metrics(performance: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Metric → scope (``group@cN``, or ``pipeline``) → value, from a record's performance."""
    found: dict[str, dict[str, float]] = {}
    for scope, row in (performance.get("latency") or {}).items():
        if row.get("n"):
            _put(found, "latency_p50_ms", scope, row.get("p50_ms"))
            _put(found, "latency_p95_ms", scope, row.get("p95_ms"))
            _put(found, "throughput_rps", scope, row.get("throughput_rps"))
    for scope, row in (performance.get("streams") or {}).items():
        if not row.get("streamed"):
            continue
        for metric, part, key in (("ttft_p50_ms", "ttft_ms", "p50_ms"),
                                  ("ttft_p95_ms", "ttft_ms", "p95_ms"),
                                  ("inter_token_p50_ms", "inter_token_ms", "p50_ms"),
                                  ("inter_token_p95_ms", "inter_token_ms", "p95_ms"),
                                  ("request_p95_ms", "request_ms", "p95_ms"),
                                  ("tail_p95_ms", "tail_ms", "p95_ms")):
            _put(found, metric, scope, (row.get(part) or {}).get(key))
        _put(found, "decode_tokens_per_s", scope,
             (row.get("decode_tokens_per_s") or {}).get("pooled"))
        _put(found, "prefill_tokens_per_s", scope,
             (row.get("prefill_tokens_per_s") or {}).get("pooled"))
        realtime = row.get("realtime")
        if realtime:
            _put(found, "first_chunk_p95_ms", scope,
                 (realtime.get("first_chunk_ms") or {}).get("p95_ms"))
            _put(found, "rtf_max", scope, (realtime.get("rtf") or {}).get("max"))
            _put(found, "deficit_count", scope, realtime.get("deficits"))
            _put(found, "deficit_s", scope, realtime.get("deficit_s"))
    startup = performance.get("startup") or {}
    _put(found, "open_s", "pipeline", startup.get("baseline_open_total_s"))
    first = startup.get("baseline_first_output_s")
    if isinstance(first, int | float):
        _put(found, "first_output_ms", "pipeline", first * 1e3)
    cancel = (performance.get("stream_cases") or {}).get("cancellation") or {}
    _put(found, "cancel_ms", "pipeline", cancel.get("cancel_to_end_ms"))
    memory = performance.get("memory_told_apart") or {}
    trees = memory.get("trees") or {}
    runtime = [t.get("runtime_peak_bytes") for t in trees.values()]
    if runtime and all(isinstance(v, int) for v in runtime):
        _put(found, "runtime_peak_mib", "pipeline", sum(runtime) / 2**20)
    peak = (memory.get("sampled") or {}).get("peak_of_sum_bytes")
    if isinstance(peak, int) and peak > 0:
        _put(found, "peak_of_sum_mib", "pipeline", peak / 2**20)
    trend = ((performance.get("sustained") or {}).get("trend") or {}).get("p95_ms")
    if isinstance(trend, Mapping):
        _put(found, "sustained_p95_slope_ms_per_10min", "pipeline", trend.get("per_10min"))
    return found


def evaluate(targets: Sequence[Target],
             metrics: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Each target against the measured figures: ``met`` true/false, or ``unmeasured``.

    A target met everywhere it applies is met; one missed at any scope is failed and
    lists where (``missed``).
    """
    rows: list[dict[str, Any]] = []
    for target in targets:
        values = {scope: value for scope, value in (metrics.get(target.metric) or {}).items()
                  if target.level is None or _level_of(scope) == target.level}
        if not values:
            rows.append({"target": target.text, "outcome": "unmeasured", "values": {}})
            continue
        missed = sorted(scope for scope, value in values.items() if not target.met_by(value))
        rows.append({"target": target.text, "outcome": "failed" if missed else "met",
                     "values": values, "missed": missed})
    return rows
