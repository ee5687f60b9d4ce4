"""Checks and field types of a stage's lifecycle options: call bound and restart policy.

``call_timeout_s`` bounds one stage call (None: the default of the backend's kind, see
:mod:`edge_core.runtime.deadlines`); ``restart``, ``max_restarts`` and
``restart_backoff_s`` are the restart policy (:mod:`edge_core.runtime.restarts`, whose
:class:`~edge_core.runtime.restarts.RestartMode` takes the value of ``restart``).
"""

from __future__ import annotations

import math
from typing import Annotated

from edge_core.config.checks import Check, CheckError

__all__ = [
    "RESTART_MODES",
    "NonNegativeInt",
    "NonNegativeSeconds",
    "PositiveSeconds",
    "RestartOption",
    "check_non_negative_int",
    "check_non_negative_seconds",
    "check_positive_seconds",
    "check_restart_mode",
]

RESTART_MODES: tuple[str, ...] = ("never", "on-failure")
"""The values of a stage's ``restart`` option."""


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckError("expected a number of seconds", value)
    seconds = float(value)
    if not math.isfinite(seconds):
        raise CheckError("expected a finite number of seconds", value)
    return seconds


def check_positive_seconds(value: object) -> float:
    """Return a finite number of seconds above zero, as a float."""
    seconds = _seconds(value)
    if seconds <= 0:
        raise CheckError("must be above 0 seconds", value)
    return seconds


def check_non_negative_seconds(value: object) -> float:
    """Return a finite number of seconds of at least zero, as a float."""
    seconds = _seconds(value)
    if seconds < 0:
        raise CheckError("must be at least 0 seconds", value)
    return seconds


def check_non_negative_int(value: object) -> int:
    """Return an integer of at least 0 (``bool`` is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckError("expected an integer", value)
    if value < 0:
        raise CheckError("must be at least 0", value)
    return value


def check_restart_mode(value: object) -> str:
    """Return one of :data:`RESTART_MODES`."""
    if not isinstance(value, str) or value not in RESTART_MODES:
        raise CheckError(f"expected one of {', '.join(RESTART_MODES)}", value)
    return value


PositiveSeconds = Annotated[float, Check(check_positive_seconds)]
NonNegativeSeconds = Annotated[float, Check(check_non_negative_seconds)]
NonNegativeInt = Annotated[int, Check(check_non_negative_int)]
RestartOption = Annotated[str, Check(check_restart_mode)]
"""The ``restart`` option's value: one of :data:`RESTART_MODES`."""
