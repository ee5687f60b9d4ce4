"""Checks and field types of a pipeline's candidate selection: how a stage's backend is chosen.

``selection`` says whether the first candidate that passes every gate serves
(``"first-passing"``) or the one measured best on the whole chain (``"measured"``);
``objective`` says what "best" means; ``start`` says whether the pipeline serves only once
every stage's choice is made (``"all-ready"``) or as soon as each stage has one ready
candidate (``"first-ready"``). The numbers that tune a measurement (margins, budget,
sample counts) are the ``[measurement]`` table (:class:`edge_core.config.model.MeasurementConfig`).
The runtime's side is :mod:`edge_core.selection`.
"""

from __future__ import annotations

import math
from typing import Annotated

from edge_core.config.checks import Check, CheckError

__all__ = [
    "OBJECTIVES",
    "SELECTIONS",
    "STARTS",
    "Margin",
    "Objective",
    "Selection",
    "Start",
    "check_margin",
    "check_objective",
    "check_selection",
    "check_start",
]

SELECTIONS: tuple[str, ...] = ("measured", "first-passing")
"""``selection``: measure every passing candidate and keep the best, or keep the first."""

OBJECTIVES: tuple[str, ...] = ("latency", "throughput", "memory")
"""``objective`` of a measured selection: p50 of the whole chain one request at a time;
requests per second at the pipeline's admission; least reserved memory among the
placements whose p50 is within ``measurement.latency_bound_s``."""

STARTS: tuple[str, ...] = ("all-ready", "first-ready")
"""``start``: serve once every choice is made, or once each stage has one ready candidate."""


def _one_of(value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise CheckError(f"expected one of {', '.join(allowed)}", value)
    return value


def check_selection(value: object) -> str:
    """Return one of :data:`SELECTIONS`."""
    return _one_of(value, SELECTIONS)


def check_objective(value: object) -> str:
    """Return one of :data:`OBJECTIVES`."""
    return _one_of(value, OBJECTIVES)


def check_start(value: object) -> str:
    """Return one of :data:`STARTS`."""
    return _one_of(value, STARTS)


def check_margin(value: object) -> float:
    """Return a relative margin: a finite number in [0, 1) (``0.05`` is 5 %)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckError("expected a number in [0, 1)", value)
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number < 1.0:
        raise CheckError("must be in [0, 1)", value)
    return number


Selection = Annotated[str, Check(check_selection)]
Objective = Annotated[str, Check(check_objective)]
Start = Annotated[str, Check(check_start)]
Margin = Annotated[float, Check(check_margin)]
