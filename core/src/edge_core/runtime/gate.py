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
    """Refuse a numerical check that ran and did not pass, naming its errors and bound."""
    if numerics is not None and not numerics.get("passed", False):
        raise NumericsRefused(
            f"{where}: outputs differ from the {numerics.get('reference')} reference beyond "
            f"the bound {numerics.get('bound')}: max_abs_error={numerics.get('max_abs_error')}, "
            f"normalised_error={numerics.get('normalised_error')}"
        )


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
