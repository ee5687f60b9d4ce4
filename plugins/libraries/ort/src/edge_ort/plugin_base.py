"""The controller side shared by every ONNX Runtime backend, as one pluggy plugin class.

Each ORT distribution (``edge-ort-cpu``, ``edge-qnn``, ``edge-ort-directml``,
``edge-ort-vitisai``) registers an instance of :class:`OrtPlugin` (or a subclass that
adds its options, EP library and devices) through its entry point. Importing this module
is cheap: every heavy import (attrs, numpy, the host layer) happens inside the hooks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from edge_core import hookimpl
from edge_ort.preload import WORKER_PRELOAD

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from edge_contracts.requests import StageEvent, StageRequest
    from edge_core.backend import BackendInfo, CancelOutcome, ProbeReport
    from edge_core.host.retire import RetireOutcome
    from edge_core.placement import WarmupReport
    from edge_core.stage import StageContext
    from edge_ort.controller import OrtStage

__all__ = ["OrtPlugin"]


class OrtPlugin:
    """One ORT backend's hook implementations.

    Args:
        backend: The backend name (``ort-cpu`` ...).
        target: The execution provider the backend places work on, spelled as ONNX
            Runtime spells it.
        description: One line for ``edge plugins`` and ``edge probe``.
        distribution: The edge distribution shipping the plugin (for probe messages).
    """

    #: The hook-contract version this plugin implements.
    EDGE_CONTRACT = "1.0"

    #: What its ``BackendInfo`` declares of its workers' start (``worker_preload``): its
    #: workers start on the controller's interpreter where a stage's route sets none.
    #: None where a stage without a route may start elsewhere (a vendor interpreter).
    worker_preload: tuple[str, ...] | None = WORKER_PRELOAD

    def __init__(self, backend: str, target: str, description: str, distribution: str) -> None:
        self.backend = backend
        self.target = target
        self.description = description
        self.distribution = distribution

    # -- what a subclass adapts ----------------------------------------------------------

    def options_class(self) -> type:
        """The attrs class a stage's ``[backend.options]`` are structured into."""
        from edge_ort.options import OrtOptions

        return OrtOptions

    def load_config(self, options: Any, stage: StageContext) -> dict[str, Any]:
        """Provider list, EP libraries and session settings for the worker's ``load``."""
        from edge_ort.options import base_load_config

        return base_load_config(self.target, options)

    def probe_report(self) -> ProbeReport:
        """Availability of this backend in the controller's interpreter."""
        from edge_ort.probing import probe_cpu_backend

        return probe_cpu_backend(self.backend)

    def device_id(self, options: Any) -> str | None:
        """The physical device whose initialisation lock guards load and warm-up."""
        return None

    # -- hooks -------------------------------------------------------------------------

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        """Declare the backend: graph stages, one call at a time, a bundle, no params.

        Not preemptible; a session's run takes its inputs only, so a stage reads no
        request parameters.
        """
        from edge_core.backend import BackendInfo

        return [BackendInfo(name=self.backend, kinds=["graph"], preemptible=False,
                            max_concurrency=1, providers=[self.target],
                            description=self.description, needs_bundle=True,
                            params=(), worker_preload=self.worker_preload)]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        """Report availability, devices and the onnxruntime distributions present."""
        return [self.probe_report()]

    @hookimpl
    def edge_validate_stage(self, backend: str, section: Mapping[str, Any], path: str) -> Any:
        """Structure the options strictly; errors carry the full path."""
        from edge_core.config import structure_config

        return structure_config(dict(section), self.options_class(), path=path)

    @hookimpl
    def edge_reserve(self, stage: StageContext) -> Mapping[str, int]:
        """Declared demands, else an estimate from the bundle's size."""
        from edge_ort.options import estimate_demands

        return estimate_demands(stage)

    @hookimpl
    def edge_load(self, stage: StageContext) -> OrtStage:
        """Verify the bundle, start the worker, create the session on the target."""
        from edge_ort.controller import OrtStage

        return OrtStage.open(stage, self.load_config(stage.options, stage),
                             self.device_id(stage.options))

    @hookimpl
    def edge_warmup_placement(self, loaded: OrtStage) -> WarmupReport:
        """Run the example bucket; report node → provider and the numerical check."""
        return loaded.warm_up()

    @hookimpl
    def edge_call(self, loaded: OrtStage, request: StageRequest,
                  inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        """Check the inputs against the frozen bucket here, then send them."""
        return loaded.run(request, inputs)

    @hookimpl
    def edge_cancel(self, loaded: OrtStage, request_id: str, epoch: int) -> CancelOutcome:
        """An ORT run cannot be interrupted: a running call needs its worker retired."""
        return loaded.cancel(request_id, epoch, preemptible=False)

    @hookimpl
    def edge_retire(self, loaded: OrtStage, deadline_s: float) -> RetireOutcome:
        """Retire the worker tree and remove the staged bundle copy."""
        return loaded.retire(deadline_s)

    @hookimpl
    def edge_conformance_stage(self, backend: str, workdir: Path) -> Mapping[str, Any] | None:
        """A tiny bundle, ``y = relu(loop_n(x) + loop_n(x))``, whose cost grows with ``n``.

        The loop body passes ``x`` through unchanged, so ``y`` does not depend on ``n``;
        the ordinary request runs it once, the slow one (same bucket) a hundred million
        times, long enough to be cancelled while running.
        """
        import numpy as np

        from edge_core.artifacts import create_manifest
        from edge_ort.bundles import graph_bytes

        if backend != self.backend:
            return None
        bundle = workdir / "bundle"
        bundle.mkdir()
        (bundle / "model.onnx").write_bytes(graph_bytes("loop_add_relu.onnx"))
        x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.25]], dtype=np.float32)
        once = np.array(1, dtype=np.int64)
        y = np.maximum(x + x, 0).astype(np.float32)
        np.savez(bundle / "example_inputs.npz", x=x, n=once)
        np.savez(bundle / "expected.npz", y=y)
        create_manifest(bundle, component="conformance", example_inputs="example_inputs.npz",
                        expected_outputs="expected.npz", precision="fp32",
                        exporter="onnx.helper")
        stage: dict[str, Any] = {"backend": {"name": backend}, "manifest": str(bundle)}
        if self.target != "CPUExecutionProvider":
            # The loop is control flow, which ORT runs on its CPU provider; the arithmetic
            # must run on the target: 2 of the graph's 5 nodes, the body's 2 included.
            stage["placement"] = {"min_fraction_on_target": 0.4,
                                  "allowed_providers": ["CPUExecutionProvider"]}
        return {
            "stage": stage,
            "inputs": {"x": x, "n": once},
            "expected": {"y": y},
            "bound": {"max_abs_error": 1e-6, "normalised_error": 1e-6},
            "slow_inputs": {"x": x, "n": np.array(100_000_000, dtype=np.int64)},
        }
