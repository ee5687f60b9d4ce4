"""The honest-placement gate: what actually ran where, and whether that is acceptable.

A backend's warm-up reports which execution provider (or device) ran every node of the
example run as a :class:`PlacementReport`. The gate in :func:`check_placement` is applied
by core, the same way for every backend, and never rewrites the report: a refusal and
an acceptance both keep the real split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from edge_core.errors import PlacementRefused

__all__ = [
    "BucketWarmup",
    "PlacementPolicy",
    "PlacementReport",
    "ProviderShare",
    "WarmupReport",
    "check_placement",
]


def _check_fraction(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError(f"{attribute.name}: must be in (0, 1]: {value!r}")


def _to_names(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"expected a collection of provider names: {value!r}")
    return tuple(str(v) for v in value)


@attrs.frozen
class PlacementPolicy:
    """What a stage demands of its placement.

    Attributes:
        target: The provider (or device target) the stage must run on, spelled as the
            runtime spells it (``QNNExecutionProvider``); ``None`` means the backend's default.
        min_fraction_on_target: Least fraction of executed nodes that must run on the target.
        allowed_providers: Providers other than the target that may run nodes; a provider
            outside ``{target} | allowed_providers`` that ran anything refuses the stage.

    """

    target: str | None = None
    min_fraction_on_target: float = attrs.field(default=1.0, validator=_check_fraction)
    allowed_providers: tuple[str, ...] = attrs.field(default=(), converter=_to_names)


@attrs.frozen
class ProviderShare:
    """The nodes one provider ran during warm-up, with a count per operator type."""

    nodes: int = attrs.field(validator=attrs.validators.ge(0))
    op_types: Mapping[str, int] = attrs.field(factory=dict)
    node_names: tuple[str, ...] = attrs.field(default=(), converter=_to_names)


@attrs.frozen
class PlacementReport:
    """Where a warm-up run actually executed.

    Attributes:
        target: The provider the stage asked for.
        available_providers: Providers the runtime had registered for the session.
        providers: Provider name to the nodes it ran.
        method: How the split was observed (``graph-assignment-info``, ``profiling``,
            ``engine-devices`` ...), so that a reader can weigh the evidence.
        notes: Observations from the backend (warnings the runtime printed, say).

    """

    target: str
    available_providers: tuple[str, ...] = attrs.field(converter=_to_names)
    providers: Mapping[str, ProviderShare]
    method: str
    notes: tuple[str, ...] = attrs.field(default=(), converter=_to_names)

    @property
    def total_nodes(self) -> int:
        """Nodes observed on any provider."""
        return sum(share.nodes for share in self.providers.values())

    @property
    def fraction_on_target(self) -> float:
        """Fraction of observed nodes that ran on the target (0.0 when none were observed)."""
        total = self.total_nodes
        share = self.providers.get(self.target)
        return (share.nodes / total) if total and share else 0.0

    def split(self) -> dict[str, int]:
        """Provider name to node count, for messages and plans."""
        return {name: share.nodes for name, share in sorted(self.providers.items())}

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dictionary that keeps the whole split."""
        return {
            "target": self.target,
            "available_providers": list(self.available_providers),
            "method": self.method,
            "total_nodes": self.total_nodes,
            "fraction_on_target": self.fraction_on_target,
            "providers": {
                name: {
                    "nodes": share.nodes,
                    "op_types": dict(sorted(share.op_types.items())),
                    "node_names": list(share.node_names),
                }
                for name, share in sorted(self.providers.items())
            },
            "notes": list(self.notes),
        }


def _to_buckets(value: Any) -> tuple[BucketWarmup, ...]:
    return tuple(value)


@attrs.frozen
class BucketWarmup:
    """The warm-up of one entry of a stage's shape set: where it ran, how it compared.

    Attributes:
        entry: The shape-set entry (a static bucket or a dynamic range).
        point: ``static``, or where in the range: ``min``, ``max``, ``between``.
        shapes: Input name to the shape that was run.
        placement: Where this run executed (a static bucket may land on an NPU while a
            dynamic entry falls to CPU).
        numerics: The comparison with this bucket's reference (as :attr:`WarmupReport.numerics`).
        warmup_ms: How long the run took.
    """

    entry: str
    point: str
    shapes: Mapping[str, tuple[int, ...]]
    placement: PlacementReport
    numerics: Mapping[str, Any] | None = None
    warmup_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the execution plan's per-bucket line)."""
        return {
            "entry": self.entry,
            "point": self.point,
            "shapes": {name: list(shape) for name, shape in sorted(self.shapes.items())},
            "placement": self.placement.split(),
            "fraction_on_target": self.placement.fraction_on_target,
            "numerics": dict(self.numerics) if self.numerics is not None else None,
            "warmup_ms": self.warmup_ms,
        }


@attrs.frozen
class WarmupReport:
    """What ``edge_warmup_placement`` returns: the placement and the numerical check.

    Attributes:
        placement: Where the example run executed.
        numerics: The comparison of the example run's outputs with a reference, as a
            JSON-ready record with at least ``passed`` (bool) and ``reference`` (what was
            compared with: ``expected-outputs``, ``cpu-run`` or ``none``); ``None`` when the
            backend has nothing to compare (a generator, say).
        extra: Backend-specific observations for the execution plan (timings, bucket).
        buckets: One record per warm-up run of the stage's shape set; the gate checks the
            placement and numerics of every one. Empty for stages without a shape set.
        shapes: The served shape set (``edge_contracts.shapesets.ShapeSet``), or ``None``.
    """

    placement: PlacementReport
    numerics: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    buckets: tuple[BucketWarmup, ...] = attrs.field(default=(), converter=_to_buckets)
    shapes: Any = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "placement": self.placement.to_json(),
            "numerics": dict(self.numerics) if self.numerics is not None else None,
            "extra": dict(self.extra),
            "buckets": [b.to_json() for b in self.buckets],
            "shapes": self.shapes.to_json() if self.shapes is not None else None,
        }


class PlacementRefusal(PlacementRefused):
    """The gate's refusal; carries the report so that callers keep the real split."""

    def __init__(self, stage_id: str, reason: str, report: PlacementReport) -> None:
        self.stage_id = stage_id
        self.reason = reason
        self.report = report
        super().__init__(f"stages[{stage_id}].placement: {reason}: split={report.split()}")


def check_placement(stage_id: str, report: PlacementReport, policy: PlacementPolicy) -> None:
    """Refuse a stage whose warm-up placement does not meet its policy.

    Checks, in order: the target provider was registered at all (ONNX Runtime only warns
    when it is absent and runs everything on CPU); some nodes were observed (otherwise the
    placement is unverified); no provider outside the allowed set ran a node; the fraction
    on target reaches ``policy.min_fraction_on_target``.

    Raises:
        PlacementRefusal: naming the stage, the reason and the real split.

    """
    target = report.target
    if target not in report.available_providers:
        raise PlacementRefusal(
            stage_id,
            f"requested provider {target!r} is not available "
            f"(registered: {list(report.available_providers)})",
            report,
        )
    if report.total_nodes == 0:
        raise PlacementRefusal(
            stage_id, f"no nodes observed by {report.method!r}: placement unverified", report
        )
    allowed = {target, *policy.allowed_providers}
    strangers = {
        name: share for name, share in report.providers.items()
        if share.nodes and name not in allowed
    }
    if strangers:
        detail = "; ".join(
            f"{name} ran {share.nodes} node(s)"
            + (f" ({', '.join(share.node_names[:8])})" if share.node_names else "")
            for name, share in sorted(strangers.items())
        )
        raise PlacementRefusal(
            stage_id, f"providers outside the allowed set {sorted(allowed)} ran nodes: {detail}",
            report,
        )
    fraction = report.fraction_on_target
    if fraction < policy.min_fraction_on_target:
        raise PlacementRefusal(
            stage_id,
            f"fraction on {target} is {fraction:.4f}, below min_fraction_on_target "
            f"{policy.min_fraction_on_target}",
            report,
        )
