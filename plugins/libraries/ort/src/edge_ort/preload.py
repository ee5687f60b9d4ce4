"""What an ONNX Runtime worker's zygote imports ahead of the fork (the warm pool).

One name, used by the stage class (``OrtStage.worker_preload``, what its starts ask
for) and by the backends' declarations (``BackendInfo.worker_preload``, what
``Pipeline.open`` starts a zygote with as it begins): the two must agree, or the zygote
started ahead is of another key than the starts.
"""

from __future__ import annotations

__all__ = ["WORKER_PRELOAD"]

WORKER_PRELOAD: tuple[str, ...] = ("onnxruntime",)
"""``onnxruntime``: imported by the zygote where its telemetry is off
(:func:`edge_core.host.zygote.pre_imports`), not by each worker."""
