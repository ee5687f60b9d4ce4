"""The worker: ``y = tanh(x) * scale``, ``scale`` read from the verified bundle.

Runs in the worker process and imports only ``edge_contracts`` and numpy. Each request
runs on its own thread, so a running request can be cancelled in place: the backend is
declared preemptible. A request may ask to take ``spin_s`` seconds (the conformance kit's
slow request).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edge_contracts.worker import BaseHandler, Call

__all__ = ["TanhHandler", "create"]

MAX_SPIN_S = 60.0


class TanhHandler(BaseHandler):
    """Computes ``tanh(x) * scale`` for the input ``x`` (float32)."""

    def __init__(self) -> None:
        self.scale = np.float32(1.0)
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    def versions(self) -> Mapping[str, str]:
        """The runtime here is numpy."""
        return {"numpy": np.__version__}

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Read ``scale`` from the bundle's ``params.npz`` (never with pickle)."""
        with np.load(Path(config["bundle"]) / "params.npz", allow_pickle=False) as params:
            self.scale = np.float32(params["scale"])
        return {"scale": float(self.scale)}

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run the example input; report both operations on numpy and the numerics."""
        x = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)
        y = self._compute(x)
        reference = np.tanh(x.astype(np.float64)) * float(self.scale)
        error = float(np.max(np.abs(y - reference)))
        bound = 1e-6
        return {
            "providers": {"numpy": {"nodes": 2, "op_types": {"Tanh": 1, "Mul": 1},
                                    "node_names": ["tanh", "scale"]}},
            "numerics": {"reference": "float64-formula", "max_abs_error": error,
                         "normalised_error": error, "bound": {"max_abs_error": bound},
                         "passed": error <= bound},
        }

    def _compute(self, x: np.ndarray) -> np.ndarray:
        y: np.ndarray = (np.tanh(x) * self.scale).astype(np.float32)
        return y

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Check the input, then compute on a thread; cancellable until it finishes."""
        x = call.inputs.get("x")
        if x is None or x.dtype != np.float32:
            raise ValueError(f"inputs.x: a float32 array is required: "
                             f"{None if x is None else x.dtype}")
        spin = float(call.params.get("spin_s", 0.0))
        if not 0.0 <= spin <= MAX_SPIN_S:
            raise ValueError(f"params.spin_s: must be within [0, {MAX_SPIN_S}]: {spin}")
        threading.Thread(target=self._run, args=(call, np.array(x, copy=True), spin),
                         daemon=True).start()
        return None

    def _run(self, call: Call, x: np.ndarray, spin: float) -> None:
        end = time.monotonic() + spin
        while True:
            with self._lock:
                if call.request_id in self._cancelled:
                    self._cancelled.discard(call.request_id)
                    return
            if time.monotonic() >= end:
                break
            time.sleep(0.005)
        call.done({"y": self._compute(x)})

    def cancel(self, request_id: str) -> None:
        """Stop a request in place (its CANCELLED event was already sent)."""
        with self._lock:
            self._cancelled.add(request_id)


def create() -> TanhHandler:
    """The worker entry's factory (``edge_example_backend.worker:create``)."""
    return TanhHandler()
