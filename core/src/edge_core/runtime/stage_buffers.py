"""The input-buffer methods of a stage runtime (:class:`~.stage_runtime.StageRuntime`).

An input buffer is an array in the controller's shared memory that the caller fills in
place and that travels to the stage's worker by reference (:mod:`edge_core.host.inputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.validation import require_id

__all__ = ["InputBufferMethods"]


class InputBufferMethods:
    """Input buffers of the stage's current worker; mixed into ``StageRuntime``."""

    loaded: Any
    made_input_buffers: bool

    def _require_ready(self) -> None:
        """Raise ``StageClosed`` unless the stage serves (``StageRuntime`` defines it)."""
        raise NotImplementedError

    def input_buffer(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """Return an array to fill in place and pass as input ``name`` of a later submit.

        On a worker stage with shared memory it lives in the controller's segment and
        travels by reference, without a copy (ownership: :mod:`edge_core.host.inputs`:
        read-only while a request holds it, reusable once that request has ended); on
        other stages, or below the shared-memory threshold, it is a private array.
        """
        self._require_ready()
        require_id(name, "input_buffer.name")
        make = getattr(self.loaded, "input_buffer", None)
        self.made_input_buffers = make is not None or self.made_input_buffers
        if make is None:
            return np.empty(tuple(shape), dtype)
        return make(tuple(shape), dtype)

    def owns_input_buffer(self, value: Any) -> bool:
        """True when ``value`` is an input buffer of this stage's current worker.

        Such a buffer travels by reference only to that worker; sent to another stage or
        replica it is an ordinary array (copied).
        """
        owns = getattr(self.loaded, "owns_input_buffer", None)
        return owns is not None and bool(owns(value))

    def check_input_buffers(self, inputs: Mapping[str, Any]) -> None:
        """Raise ``InputBufferBusy`` when one of ``inputs`` is a buffer a request holds."""
        check = getattr(self.loaded, "check_input_buffers", None)
        if check is not None:
            check(inputs)

    def input_buffer_counts(self) -> dict[str, int]:
        """Input-buffer counts of the current worker (zeros on stages without them).

        ``buffers``: alive; ``sent``: how many requests carried one by reference.
        """
        counts = getattr(self.loaded, "input_buffer_counts", None)
        return dict(counts()) if counts is not None else {"buffers": 0, "sent": 0}
