"""The echo worker: ``y = x * scale`` after a delay, with injectable failures.

Imports only ``edge_contracts`` and numpy, like every worker module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.worker import BaseHandler, Call

__all__ = ["EchoHandler", "create"]


class InjectedFailure(RuntimeError):
    """A failure the stage's options asked for."""


class EchoHandler(BaseHandler):
    """Multiplies every input by ``scale``; cancellable in place when preemptible."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self._ballast: bytearray | None = None
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    def versions(self) -> Mapping[str, str]:
        """Numpy is the runtime here."""
        return {"numpy": np.__version__, "edge_echo": "0.1.0"}

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Keep the options; allocate (and touch) ``allocate_mb`` of memory if asked."""
        self.options = dict(config)
        if self.options.get("fail_at") == "load":
            raise InjectedFailure("load failed as configured")
        megabytes = int(self.options.get("allocate_mb", 0))
        if megabytes:
            self._ballast = bytearray(megabytes * 1024 * 1024)
            for offset in range(0, len(self._ballast), 4096):
                self._ballast[offset] = 1
        return {"loaded": True, "pid_note": "echo"}

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Report one node on the configured provider and the warm-up numerics."""
        if self.options.get("fail_at") == "warmup":
            raise InjectedFailure("warm-up failed as configured")
        shape = tuple(self.options.get("example_shape", [2, 2]))
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        y = self._compute({"x": x})["x"]
        expected = x * float(self.options.get("scale", 1.0))
        if self.options.get("wrong_numerics"):
            expected = expected + 1.0
        error = float(np.max(np.abs(y - expected))) if y.size else 0.0
        provider = str(self.options.get("provider", "numpy"))
        return {
            "providers": {provider: {"nodes": 1, "op_types": {"Mul": 1},
                                     "node_names": ["echo_mul"]}},
            "available": ["numpy"],
            "numerics": {"reference": "expected-outputs", "max_abs_error": error,
                         "normalised_error": error, "bound": {"max_abs_error": 0.0},
                         "passed": error == 0.0},
        }

    def _compute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        scale = float(self.options.get("scale", 1.0))
        return {name: (np.asarray(a) * scale).astype(np.asarray(a).dtype)
                for name, a in inputs.items()}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Compute after ``delay_s``: inline (blocking) or on a thread when preemptible."""
        if self.options.get("fail_at") == "call":
            raise InjectedFailure("call failed as configured")
        # A request may ask for its own delay (``params.delay_s``): a slow request.
        delay = float(call.params.get("delay_s", self.options.get("delay_s", 0.0)))
        if not self.options.get("preemptible"):
            if delay:
                time.sleep(delay)
            return self._compute(call.inputs)
        inputs = {name: np.array(a, copy=True) for name, a in call.inputs.items()}
        threading.Thread(target=self._later, args=(call, inputs, delay), daemon=True).start()
        return None

    def _later(self, call: Call, inputs: Mapping[str, np.ndarray], delay: float) -> None:
        end = time.monotonic() + delay
        while time.monotonic() < end:
            with self._lock:
                if call.request_id in self._cancelled:
                    self._cancelled.discard(call.request_id)
                    return
            time.sleep(0.005)
        call.done(self._compute(inputs))
        with self._lock:
            self._cancelled.discard(call.request_id)

    def cancel(self, request_id: str) -> None:
        """Stop a running request in place."""
        with self._lock:
            self._cancelled.add(request_id)


def create() -> EchoHandler:
    """The route entry's factory."""
    return EchoHandler()
