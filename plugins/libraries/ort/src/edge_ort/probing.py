"""Probing ORT backends cheaply: no onnxruntime, no numpy imported in the controller."""

from __future__ import annotations

import importlib.util
import sys

from edge_core.backend import ProbeReport
from edge_core.pools import host_cpu
from edge_ort.distributions import conflict_note, installed_distributions

__all__ = ["probe_cpu_backend"]


def probe_cpu_backend(backend: str) -> ProbeReport:
    """The CPU provider is in every ORT build: available iff ``onnxruntime`` is importable."""
    found = installed_distributions()
    notes = [note for note in [conflict_note(found, sys.executable)] if note]
    if importlib.util.find_spec("onnxruntime") is None:
        return ProbeReport(
            backend=backend, available=False, notes=notes,
            reason=f"no onnxruntime distribution is installed in {sys.executable} "
            "(pip install onnxruntime, or route the stage to an interpreter that has one)",
        )
    runtime = {name: version for name, version in found.items()}
    return ProbeReport(backend=backend, available=True, devices=[host_cpu()],
                       runtime=runtime, notes=notes)
