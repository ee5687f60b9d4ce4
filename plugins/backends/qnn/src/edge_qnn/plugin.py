"""The ``qnn`` backend: Qualcomm QNN through ONNX Runtime's plugin execution provider.

The plugin is an :class:`edge_ort.plugin_base.OrtPlugin` subclass (entry point
``edge_qnn.plugin:PLUGIN``); the worker is the shared :mod:`edge_ort.worker`, which
registers ``onnxruntime_qnn``'s EP library, adds the provider for the QNN devices ORT
reports, and keeps compiled graphs in the EP-context cache. The ``edge hub`` commands
(AI Hub, an optional extra) are added through ``edge_register_commands``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_core import hookimpl
from edge_ort.plugin_base import OrtPlugin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from edge_core.backend import ProbeReport
    from edge_core.stage import StageContext

__all__ = ["BASE_RAM_BYTES", "BUNDLE_RAM_FACTOR", "EDGE_CONTRACT", "PLUGIN", "QnnPlugin"]

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"
#: Resident memory of a QNN worker with the HTP libraries loaded (about 210 MiB measured
#: on the simulator with a 1 MB graph), rounded up.
BASE_RAM_BYTES = 256 * 1024 * 1024
#: Graph preparation and activations per bundle byte: the PP-OCRv4 stages, fixed-shape,
#: fp16, peaked at 217 MB (1.0 MB bundle), 301 MB (11.3 MB) and 400 MB (18.3 MB).
BUNDLE_RAM_FACTOR = 12


class QnnPlugin(OrtPlugin):
    """The ORT plugin class with QNN's options, EP library, cache and probe."""

    def options_class(self) -> type:
        """Stage options: :class:`edge_qnn.options.QnnOptions`."""
        from edge_qnn.options import QnnOptions

        return QnnOptions

    def load_config(self, options: Any, stage: StageContext) -> dict[str, Any]:
        """Register ``onnxruntime_qnn``'s library; add QNN for its devices; cache contexts."""
        from edge_ort.options import base_load_config
        from edge_qnn.options import QnnOptions, provider_options

        options = options or QnnOptions()
        config = base_load_config(self.target, options)
        qnn = provider_options(options)
        config["providers"] = [[self.target, qnn]]
        config["plugin_ep"] = True
        config["ep_libraries"] = [{"name": self.target, "module": "onnxruntime_qnn"}]
        if options.context_cache:
            # Thread-pool settings (spinning, thread counts) do not change what QNN
            # compiles: they stay out of the key, so they never force a recompilation.
            compiled = {key: value for key, value in options.session_config.items()
                        if not key.startswith(("session.intra_op.", "session.inter_op."))}
            config["ep_context"] = {
                "dir": str(options.cache_dir()),
                "material": {"provider_options": qnn, "session_config": compiled},
            }
        return config

    def probe_report(self) -> ProbeReport:
        """QNN devices and SDK version as ONNX Runtime sees them, or why not."""
        from edge_qnn.probing import probe_qnn

        return probe_qnn(self.backend)

    @hookimpl
    def edge_reserve(self, stage: StageContext) -> Mapping[str, int]:
        """Declared demands, else the QNN worker's base plus twelve times the bundle."""
        from edge_contracts.devices import RAM_POOL

        if stage.declared_demands:
            return dict(stage.declared_demands)
        size = 0
        if stage.manifest_dir is not None and stage.manifest_dir.is_dir():
            size = sum(p.stat().st_size for p in stage.manifest_dir.rglob("*") if p.is_file())
        return {RAM_POOL: BASE_RAM_BYTES + BUNDLE_RAM_FACTOR * size}

    def device_id(self, options: Any) -> str | None:
        """One QNN device: loads and warm-ups on it are serialised."""
        return "qnn0"

    @hookimpl
    def edge_conformance_stage(self, backend: str, workdir: Path) -> Mapping[str, Any] | None:
        """A static float32 ``Conv(3→4, 3x3) → Relu`` bundle that QNN places whole.

        The inherited ORT stage spins a ``Loop`` (control flow, CPU-only) and has no
        QNN-placeable arithmetic on the simulator; this graph runs wholly on QNN, so the
        kit checks the default policy (fraction 1.0). No slow request: a QNN graph has a
        fixed cost per bucket.
        """
        from importlib import resources

        import numpy as np

        from edge_core.artifacts import create_manifest

        if backend != self.backend:
            return None
        rng = np.random.default_rng(3)  # the weight baked into the graph, then the input
        weight = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
        x = rng.random((1, 3, 8, 8), dtype=np.float32)
        bundle = workdir / "bundle"
        bundle.mkdir()
        graph = resources.files("edge_qnn").joinpath("graphs", "conv_relu.onnx")
        (bundle / "model.onnx").write_bytes(graph.read_bytes())
        padded = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))
        y = np.maximum(np.einsum("chwij,ocij->ohw", windows, weight), 0)[None]
        y = y.astype(np.float32)
        np.savez(bundle / "example_inputs.npz", x=x)
        np.savez(bundle / "expected.npz", y=y)
        create_manifest(bundle, component="conformance-qnn",
                        example_inputs="example_inputs.npz", expected_outputs="expected.npz",
                        precision="fp32", exporter="onnx.helper")
        bound = {"max_abs_error": 1e-4, "normalised_error": 1e-5}
        return {
            "stage": {"backend": {"name": backend,
                                  "options": {"context_cache": False, "numerics_bound": bound}},
                      "manifest": str(bundle)},
            "inputs": {"x": x},
            "expected": {"y": y},
            "bound": bound,
            "slow_inputs": None,
        }

    @hookimpl
    def edge_register_commands(self, subparsers: Any) -> None:
        """Add ``edge hub`` (AI Hub) and ``edge derive`` (static and QDQ bundles for QNN)."""
        from edge_ort.derive.command import register as register_derive
        from edge_qnn.hub.command import register

        register(subparsers)
        register_derive(subparsers)


PLUGIN = QnnPlugin(
    backend="qnn",
    target="QNNExecutionProvider",
    description="Qualcomm QNN through ONNX Runtime (HTP, GPU or CPU QNN backends).",
    distribution="edge-qnn",
)
