"""Input buffers of a loaded stage: arrays the caller fills in place, sent by reference.

An input buffer is an array in the controller's shared memory that the caller fills in
place and that travels to the stage's worker by reference (:mod:`edge_core.host.inputs`).
A loaded stage offers them when it has the methods named here (a worker stage with shared
memory does); on any other stage an input buffer is a private array. A
:class:`~edge_core.runtime.stage_runtime.StageRuntime` asks these functions of its current
worker's loaded stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["check_input_buffers", "input_buffer_counts", "make_input_buffer",
           "owns_input_buffer"]


def make_input_buffer(loaded: Any, shape: tuple[int, ...], dtype: Any) -> tuple[Any, bool]:
    """An array to fill in place, and whether it is the loaded stage's own.

    On a worker stage with shared memory it lives in the controller's segment and
    travels by reference, without a copy (ownership: :mod:`edge_core.host.inputs`:
    read-only while a request holds it, reusable once that request has ended); on other
    stages, or below the shared-memory threshold, it is a private array.
    """
    make = getattr(loaded, "input_buffer", None)
    if make is None:
        return np.empty(tuple(shape), dtype), False
    return make(tuple(shape), dtype), True


def owns_input_buffer(loaded: Any, value: Any) -> bool:
    """True when ``value`` is an input buffer of the loaded stage's worker.

    Such a buffer travels by reference only to that worker; sent to another stage or
    replica it is an ordinary array (copied).
    """
    owns = getattr(loaded, "owns_input_buffer", None)
    return owns is not None and bool(owns(value))


def check_input_buffers(loaded: Any, inputs: Mapping[str, Any]) -> None:
    """Raise ``InputBufferBusy`` when one of ``inputs`` is a buffer a request holds."""
    check = getattr(loaded, "check_input_buffers", None)
    if check is not None:
        check(inputs)


def input_buffer_counts(loaded: Any) -> dict[str, int]:
    """Input-buffer counts of the loaded stage's worker (zeros on stages without them).

    ``buffers``: alive; ``sent``: how many requests carried one by reference.
    """
    counts = getattr(loaded, "input_buffer_counts", None)
    return dict(counts()) if counts is not None else {"buffers": 0, "sent": 0}
