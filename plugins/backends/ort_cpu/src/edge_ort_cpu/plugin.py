"""The ``ort-cpu`` backend: ONNX Runtime's CPU execution provider, the embedded default.

The plugin is an :class:`edge_ort.plugin_base.OrtPlugin` instance (entry point
``edge_ort_cpu.plugin:PLUGIN``); the worker is the shared :mod:`edge_ort.worker`.
"""

from __future__ import annotations

from edge_ort.plugin_base import OrtPlugin

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"

PLUGIN = OrtPlugin(
    backend="ort-cpu",
    target="CPUExecutionProvider",
    description="ONNX Runtime on the CPU: the embedded default backend.",
    distribution="edge-ort-cpu",
)
