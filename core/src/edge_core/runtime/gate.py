"""The load gate: what a stage's warm-up report and observed memory must pass to serve.

Pure functions over what a stage reported; the stage opener
(:class:`~edge_core.runtime.opener.StageOpener`) asks the backend for the report and the
observed memory and calls them in this order:

1. :func:`warmup_report` — the backend returned a :class:`WarmupReport` at all;
2. :func:`check_warmup` — the placement target, the overall placement, each entry of the
   stage's shape set (:func:`check_buckets`: a static bucket may land on the NPU while a
   dynamic entry falls to CPU) and the numerical check against the reference;
3. :func:`memory_verdicts` and :func:`check_memory` — each demanded pool the backend
   observes is ``checked`` (and its observed peak must not exceed the demand), one it
   observes nothing of is ``unobserved``, never passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_core.errors import EdgeError
from edge_core.placement import PlacementPolicy, PlacementRefusal, WarmupReport, check_placement
from edge_core.runtime.errors import DemandExceeded, NumericsRefused

__all__ = ["check_buckets", "check_memory", "check_warmup", "memory_verdicts", "warmup_report"]


def warmup_report(stage_id: str, report: Any) -> WarmupReport:
    """``report`` itself when it is a :class:`WarmupReport`.

    Raises:
        EdgeError: naming ``edge_warmup_placement`` and what it returned instead.
    """
    if not isinstance(report, WarmupReport):
        raise EdgeError(f"stages[{stage_id}]: edge_warmup_placement returned {report!r}, "
                        "not a WarmupReport")
    return report


def check_warmup(stage_id: str, report: WarmupReport, policy: PlacementPolicy) -> None:
    """Refuse a warm-up whose placement, any bucket's placement or numerics fail.

    A policy without a target takes the one the backend reported.

    Raises:
        EdgeError: the backend reported on another target than the policy's.
        PlacementRefusal: the placement (overall or of a bucket) misses the policy.
        NumericsRefused: the outputs differ from the reference beyond the bound.
    """
    if policy.target is None:
        policy = PlacementPolicy(target=report.placement.target,
                                 min_fraction_on_target=policy.min_fraction_on_target,
                                 allowed_providers=policy.allowed_providers)
    if report.placement.target != policy.target:
        raise EdgeError(f"stages[{stage_id}].placement.target: the backend reported on "
                        f"{report.placement.target!r}: {policy.target!r}")
    check_placement(stage_id, report.placement, policy)
    check_buckets(stage_id, report, policy)
    _check_numerics(f"stages[{stage_id}].numerics", report.numerics)


def check_buckets(stage_id: str, report: WarmupReport, policy: PlacementPolicy) -> None:
    """Refuse the stage when any bucket's placement or numerical check fails.

    Raises:
        PlacementRefusal: naming the bucket, its shapes and the real split.
        NumericsRefused: naming the bucket and its errors against the bound.
    """
    for bucket in report.buckets:
        label = (f"bucket {bucket.entry!r} ({bucket.point}, "
                 f"{ {n: list(s) for n, s in sorted(bucket.shapes.items())} })")
        try:
            check_placement(stage_id, bucket.placement, policy)
        except PlacementRefusal as exc:
            raise PlacementRefusal(stage_id, f"{label}: {exc.reason}", exc.report) from None
        _check_numerics(f"stages[{stage_id}].numerics: {label}", bucket.numerics)


def _check_numerics(where: str, numerics: Mapping[str, Any] | None) -> None:
    """Refuse a numerical check that ran and did not pass, naming its errors and bound.

    When the record has per-output detail (``outputs``: name → ``{passed, why, ...}``, as
    :func:`edge_ort.numerics.compare_outputs` writes it), the refusal says which output
    failed and why: missing, its shape or dtype, a NaN, or its worst element beyond the
    bound.
    """
    if numerics is None or numerics.get("passed", False):
        return
    head = f"{where}: outputs differ from the {numerics.get('reference')} reference"
    reasons = _failed_outputs(numerics)
    if reasons:
        raise NumericsRefused(f"{head}: {'; '.join(reasons)}")
    raise NumericsRefused(
        f"{head} beyond the bound {numerics.get('bound')}: "
        f"max_abs_error={numerics.get('max_abs_error')}, "
        f"normalised_error={numerics.get('normalised_error')}"
    )


def _failed_outputs(numerics: Mapping[str, Any]) -> list[str]:
    """One phrase per failed output of a numerics record that says why, sorted by name."""
    outputs = numerics.get("outputs")
    if not isinstance(outputs, Mapping):
        return []
    given = numerics.get("bound")
    bound: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    reasons = []
    for name, record in sorted(outputs.items()):
        if not isinstance(record, Mapping) or record.get("passed", True):
            continue
        reasons.append(f"output {name!r}: {_why(record, bound)}")
    return reasons


def _why(record: Mapping[str, Any], bound: Mapping[str, Any]) -> str:
    """Why one output failed, from its record's ``why`` (else its ``problem``)."""
    why = record.get("why")
    expected, got = record.get("expected") or {}, record.get("got") or {}
    if why == "missing":
        return "missing from the stage's outputs (the reference has it)"
    if why == "shape" and isinstance(expected, Mapping) and isinstance(got, Mapping):
        dtypes = ("" if expected.get("dtype") == got.get("dtype") else
                  f" (and dtype {expected.get('dtype')}, got {got.get('dtype')})")
        return f"shape mismatch: expected {expected.get('shape')}, got {got.get('shape')}{dtypes}"
    if why == "dtype" and isinstance(expected, Mapping) and isinstance(got, Mapping):
        return (f"dtype mismatch: expected {expected.get('dtype')}, got {got.get('dtype')} "
                f"(shape {expected.get('shape')})")
    if why in ("nan", "tolerance"):
        worst = record.get("worst") if isinstance(record.get("worst"), Mapping) else None
        element = (f"worst element {worst.get('index')}: expected {worst.get('expected')}, "
                   f"got {worst.get('got')}" if worst else "")
        if why == "nan":
            head = "NaN mismatch (a NaN where the reference has a number, or the reverse)"
            return f"{head}: {element.replace('worst element', 'element')}" if element else head
        exceeded = [f"{key} {_number(record.get(key))} > tolerance {_number(bound.get(key))}"
                    for key in record.get("exceeds") or () if key in bound]
        head = "values out of tolerance"
        if exceeded:
            head += f" ({', '.join(exceeded)})"
        return f"{head}: {element}" if element else head
    return str(record.get("problem") or "did not pass")


def _number(value: Any) -> Any:
    """A float with 4 significant digits (an error against its bound), else as it is."""
    return f"{value:.4g}" if isinstance(value, float) else value


def memory_verdicts(demands: Mapping[str, int], observed: Mapping[str, int]) -> dict[str, str]:
    """Demanded pool → ``checked`` when the backend observes it, else ``unobserved``.

    A demanded pool the backend observes nothing of (VRAM, say) is not checked: the plan
    records it as ``unobserved``, never as passed.
    """
    return {pool: "checked" if pool in observed else "unobserved" for pool in demands}


def check_memory(stage_id: str, demands: Mapping[str, int], observed: Mapping[str, int]) -> None:
    """Refuse a stage whose observed peak in a demanded pool exceeds its demand.

    Raises:
        DemandExceeded: naming the pool, the observed peak and the demand.
    """
    for pool, peak in observed.items():
        demand = demands.get(pool)
        if demand is not None and peak > demand:
            raise DemandExceeded(
                f"stages[{stage_id}].resources.demands[{pool!r}]: observed peak {peak} bytes "
                f"({_readable(peak)}) after load and warm-up exceeds the demand "
                f"({_readable(demand)}; a size without a unit counts bytes): declare at least "
                f"the peak: {demand}"
            )


def _readable(nbytes: int) -> str:
    """``nbytes`` for a reader: MiB with one decimal from 1 MiB, else bytes."""
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} bytes"
