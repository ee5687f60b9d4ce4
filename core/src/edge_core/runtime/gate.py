"""The load gate per bucket: every warm-up run of a stage's shape set must pass.

:meth:`edge_core.runtime.pipeline.Pipeline` gates a stage's overall warm-up report; this
module adds the same checks for each entry of its shape set (placement — a static bucket
may land on the NPU while a dynamic entry falls to CPU — and numerics), naming the bucket
in the refusal.
"""

from __future__ import annotations

from edge_core.placement import PlacementPolicy, PlacementRefusal, WarmupReport, check_placement
from edge_core.runtime.errors import NumericsRefused

__all__ = ["check_buckets"]


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
        numerics = bucket.numerics
        if numerics is not None and not numerics.get("passed", False):
            raise NumericsRefused(
                f"stages[{stage_id}].numerics: {label}: outputs differ from the "
                f"{numerics.get('reference')} reference beyond the bound "
                f"{numerics.get('bound')}: max_abs_error={numerics.get('max_abs_error')}, "
                f"normalised_error={numerics.get('normalised_error')}"
            )
