"""Named synthetic pipelines for placement by measurement: candidates that differ in speed only.

Every pipeline is two echo stages: ``a`` on one backend, held fixed, and ``b`` with two
candidates that compute the same thing (``x * 2``, so every output can be checked
exactly) but differ in how long a call takes (``delay_s``) or how long they take to open
(``load_delay_s``). The figures are sleeps, so they hold on a loaded machine as well as
on an idle one; what a measurement adds on top is the real chain's overhead.

========================  ==========================================================
``preferred-slower``      ``b``'s first candidate passes every gate but is 4 times
                          slower per call than the second: ``measured`` must choose
                          the second, ``first-passing`` the first.
``faster-slow-to-open``   ``b``'s first candidate opens at once and is slower; the
                          second is 4 times faster per call but takes ``load_delay``
                          seconds to open: ``start = "first-ready"`` serves on the
                          first at once and switches to the second once measured.
``split-does-not-pay``    ``b``'s candidates tie within the margin, the earlier-listed
                          on another backend than ``a`` (``echo-preemptible``): the
                          split is judged against the fewest-backend placement (both
                          stages on ``echo``), which serves.
========================  ==========================================================

:func:`pipeline` gives the mapping :func:`edge_core.config.load_pipeline` reads; every
key can be overridden (``selection``, ``start``, ``measurement``...). Echo stages have no
bundle and so no examples: :func:`write_workload` writes the inputs a measurement times
(``workload = [path]``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Final

import numpy as np

__all__ = ["FAST_S", "FIXED_S", "LOAD_DELAY_S", "NAMES", "SCALE", "SLOW_S", "TIE_S",
           "candidate_options", "pipeline", "workload_inputs", "write_workload"]

NAMES: Final = ("preferred-slower", "faster-slow-to-open", "split-does-not-pay")
"""The synthetic pipelines, by name."""

FAST_S: Final = 0.02
"""Seconds per call of a fast candidate."""
SLOW_S: Final = 0.08
"""Seconds per call of a slow candidate (4 times the fast one)."""
FIXED_S: Final = 0.005
"""Seconds per call of stage ``a``."""
TIE_S: Final = 0.1
"""Seconds per call of both candidates of ``split-does-not-pay``."""
LOAD_DELAY_S: Final = 2.0
"""Seconds the slow-to-open candidate of ``faster-slow-to-open`` takes to load."""
SCALE: Final = 2.0
"""What every ``b`` candidate multiplies by (``a`` multiplies by 1)."""

_TRANSFORM = "edge_echo.transforms:passthrough"


def _echo(backend: str, **options: Any) -> dict[str, Any]:
    return {"backend": {"name": backend, "options": {"scale": SCALE, **options}}}


def candidate_options(name: str, *, load_delay_s: float = LOAD_DELAY_S) -> list[dict[str, Any]]:
    """The ``candidates`` of stage ``b`` of pipeline ``name``, in order of preference.

    Raises:
        KeyError: ``name`` is not one of :data:`NAMES`.

    """
    if name == "preferred-slower":
        return [_echo("echo", delay_s=SLOW_S), _echo("echo", delay_s=FAST_S)]
    if name == "faster-slow-to-open":
        return [_echo("echo", delay_s=SLOW_S),
                _echo("echo", delay_s=FAST_S, load_delay_s=load_delay_s)]
    if name == "split-does-not-pay":
        return [_echo("echo-preemptible", delay_s=TIE_S), _echo("echo", delay_s=TIE_S)]
    raise KeyError(f"no synthetic pipeline {name!r} (known: {', '.join(NAMES)})")


def pipeline(name: str, *, load_delay_s: float = LOAD_DELAY_S, **keys: Any) -> dict[str, Any]:
    """The pipeline ``name`` as a mapping; ``keys`` override or add top-level keys.

    Raises:
        KeyError: ``name`` is not one of :data:`NAMES`.

    """
    candidates = candidate_options(name, load_delay_s=load_delay_s)
    measurement: dict[str, Any] = {"budget_s": 20.0, "min_samples": 3, "max_samples": 12}
    if name == "split-does-not-pay":
        # the preemptible echo polls every 5 ms: a tie within 10 %, not within 5 %
        measurement["margin"] = 0.1
    document: dict[str, Any] = {
        "name": name,
        "stages": [
            {"id": "a", "backend": {"name": "echo", "options": {"scale": 1.0,
                                                                 "delay_s": FIXED_S}}},
            {"id": "b", "input_transform": _TRANSFORM, "candidates": candidates},
        ],
        "measurement": measurement,
    }
    if name == "faster-slow-to-open":
        document["start"] = "first-ready"
    for key, value in keys.items():
        if key == "measurement" and isinstance(value, dict):
            document["measurement"] = {**document["measurement"], **value}
        else:
            document[key] = copy.deepcopy(value)
    return document


def workload_inputs() -> dict[str, np.ndarray]:
    """The first stage's inputs a measurement of these pipelines times (a 2x2 float32)."""
    return {"x": np.arange(4, dtype=np.float32).reshape(2, 2) - 1.5}


def write_workload(folder: str | Path) -> Path:
    """Write :func:`workload_inputs` as ``workload.npz`` in ``folder``; return its path."""
    path = Path(folder) / "workload.npz"
    with path.open("wb") as handle:
        np.savez(handle, x=workload_inputs()["x"])
    return path
