"""The ``qnn`` backend: Qualcomm QNN through ONNX Runtime's plugin execution provider.

The plugin is an :class:`edge_ort.plugin_base.OrtPlugin` subclass (entry point
``edge_qnn.plugin:PLUGIN``); the worker is the shared :mod:`edge_ort.worker`, which
registers ``onnxruntime_qnn``'s EP library, adds the provider for the QNN devices ORT
reports, and keeps compiled graphs in the EP-context cache. The ``edge hub`` commands
(AI Hub, an optional extra) are added through ``edge_register_commands``.
"""

from __future__ import annotations

from typing import Any

from edge_core import hookimpl
from edge_ort.plugin_base import OrtPlugin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edge_core.backend import ProbeReport
    from edge_core.stage import StageContext

__all__ = ["EDGE_CONTRACT", "PLUGIN", "QnnPlugin"]

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"


class QnnPlugin(OrtPlugin):
    """The ORT plugin class with QNN's options, EP library, cache and probe."""

    def options_class(self) -> type:
        """Stage options: :class:`edge_qnn.options.QnnOptions`."""
        from edge_qnn.options import QnnOptions

        return QnnOptions

    def load_config(self, options: Any, stage: StageContext) -> dict[str, Any]:
        """Register ``onnxruntime_qnn``'s library; add QNN for its devices; cache contexts."""
        from edge_ort.controller import base_load_config
        from edge_qnn.options import QnnOptions, provider_options

        options = options or QnnOptions()
        config = base_load_config(self.target, options)
        qnn = provider_options(options)
        config["providers"] = [[self.target, qnn]]
        config["plugin_ep"] = True
        config["ep_libraries"] = [{"name": self.target, "module": "onnxruntime_qnn"}]
        if options.context_cache:
            config["ep_context"] = {
                "dir": str(options.cache_dir()),
                "material": {"provider_options": qnn,
                             "session_config": dict(options.session_config)},
            }
        return config

    def probe_report(self) -> ProbeReport:
        """QNN devices and SDK version as ONNX Runtime sees them, or why not."""
        from edge_qnn.probing import probe_qnn

        return probe_qnn(self.backend)

    def device_id(self, options: Any) -> str | None:
        """One QNN device: loads and warm-ups on it are serialised."""
        return "qnn0"

    @hookimpl
    def edge_register_commands(self, subparsers: Any) -> None:
        """Add ``edge hub`` (AI Hub: devices, compile, profile, infer)."""
        from edge_qnn.hub.command import register

        register(subparsers)


PLUGIN = QnnPlugin(
    backend="qnn",
    target="QNNExecutionProvider",
    description="Qualcomm QNN through ONNX Runtime (HTP, GPU or CPU QNN backends).",
    distribution="edge-qnn",
)
