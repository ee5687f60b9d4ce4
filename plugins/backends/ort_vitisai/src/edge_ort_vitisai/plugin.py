"""The ``ort-vitisai`` backend: ONNX Runtime's VitisAI provider on the Ryzen AI NPU.

The plugin is an :class:`edge_ort.plugin_base.OrtPlugin` (entry point
``edge_ort_vitisai.plugin:PLUGIN``); the worker is the shared :mod:`edge_ort.worker`,
started in the route's interpreter — which must hold the Ryzen AI build
``onnxruntime-vitisai`` on Windows.

Probe: the execution domain, the distribution in the interpreter named by
``EDGE_ORT_VITISAI_PYTHON`` (default: the controller's), and the NPUs ORT's
``get_ep_devices()`` pairs with ``VitisAIExecutionProvider`` there once the provider
library is registered. Reserve and load probe the stage's own route again; an A16W8 bundle
is admitted only under a placement policy that allows a CPU share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_core import hookimpl
from edge_ort.vendor_plugin import Prober, VendorOrtPlugin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edge_core.backend import ProbeReport
    from edge_core.stage import StageContext
    from edge_ort.controller import OrtStage
    from edge_ort.vendor import VendorBackend, VendorProbe

__all__ = ["EDGE_CONTRACT", "PLUGIN", "VitisAIPlugin", "vendor_backend"]

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"
#: Names the vendor interpreter that probes and routeless stages use.
INTERPRETER_ENV = "EDGE_ORT_VITISAI_PYTHON"

def vendor_backend() -> VendorBackend:
    """What ``ort-vitisai`` requires of the interpreter it runs in."""
    from edge_ort.vendor import VendorBackend
    from edge_ort_vitisai.npu import VITISAI_LIBRARY
    from edge_ort_vitisai.options import PROVIDER

    return VendorBackend(backend="ort-vitisai", provider=PROVIDER,
                         distribution="onnxruntime-vitisai", device_type="NPU",
                         interpreter_env=INTERPRETER_ENV, libraries=(VITISAI_LIBRARY,))


class VitisAIPlugin(VendorOrtPlugin):
    """The ``ort-vitisai`` hooks.

    Args:
        prober: Observes an interpreter (default: :func:`edge_ort.vendor.probe_vendor`);
            tests pass recorded Windows listings here.
    """

    EDGE_CONTRACT = EDGE_CONTRACT

    def __init__(self, prober: Prober | None = None) -> None:
        super().__init__(backend="ort-vitisai", target="VitisAIExecutionProvider",
                         description="ONNX Runtime VitisAI on the AMD Ryzen AI NPU "
                         "(Windows only).", distribution="edge-ort-vitisai", prober=prober)

    def vendor_backend(self) -> VendorBackend:
        """See the module-level :func:`vendor_backend`."""
        return vendor_backend()

    def options_class(self) -> type:
        """:class:`edge_ort_vitisai.options.VitisAIOptions`."""
        from edge_ort_vitisai.options import VitisAIOptions

        return VitisAIOptions

    def available_report(self, probe: VendorProbe, notes: list[str]) -> ProbeReport:
        """The NPUs ORT pairs with VitisAI (they draw from host RAM)."""
        from edge_core.backend import ProbeReport
        from edge_ort_vitisai.npu import npu_descriptors

        notes = [*notes, *(f"NPU: {d.label()}, vendor_id 0x{d.vendor_id:04x}, device_id "
                           f"0x{d.device_id:04x}" for d in probe.devices())]
        return ProbeReport(backend=self.backend, available=True, runtime=probe.runtime(),
                           devices=npu_descriptors(probe.devices(), probe.domain), notes=notes)

    def check_stage(self, stage: StageContext, refresh: bool = False) -> str:
        """Judge the stage before anything loads; return the physical id of its NPU.

        Raises:
            StageRefused: an A16W8 bundle meets a policy that allows no CPU share, or the
                placement names another provider.
            RouteUnavailable: the route's interpreter cannot run VitisAI (the reason says
                which check failed).
        """
        from edge_ort_vitisai.npu import npu_physical_id
        from edge_ort_vitisai.policy import check_a16w8_policy

        check_a16w8_policy(stage)
        return npu_physical_id(self.probe_route(stage, refresh).devices()[0])

    def load_config(self, options: Any, stage: StageContext) -> dict[str, Any]:
        """VitisAI with its typed options, then CPU."""
        from edge_ort_vitisai.options import vitisai_load_config

        return vitisai_load_config(options)

    @hookimpl
    def edge_reserve(self, stage: StageContext) -> Mapping[str, int]:
        """Judge the stage, then charge host RAM (the NPU has no memory of its own)."""
        from edge_ort.options import estimate_demands

        self.check_stage(stage)
        return estimate_demands(stage)

    @hookimpl
    def edge_load(self, stage: StageContext) -> OrtStage:
        """Judge the stage and probe its route afresh, then verify, start and load."""
        from edge_ort.controller import OrtStage
        from edge_ort.vendor import with_default_route

        device = self.check_stage(stage, refresh=True)
        stage = with_default_route(stage, vendor_backend())
        return OrtStage.open(stage, self.load_config(stage.options, stage), device)


PLUGIN = VitisAIPlugin()
