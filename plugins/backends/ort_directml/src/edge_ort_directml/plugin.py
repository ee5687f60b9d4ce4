"""The ``ort-directml`` backend: ONNX Runtime's DirectML provider on a DirectX 12 GPU.

The plugin is an :class:`edge_ort.plugin_base.OrtPlugin` (entry point
``edge_ort_directml.plugin:PLUGIN``); the worker is the shared :mod:`edge_ort.worker`,
started in the route's interpreter — which must hold ``onnxruntime-directml`` on Windows.

Probe: the execution domain, the distribution in the interpreter named by
``EDGE_ORT_DIRECTML_PYTHON`` (default: the controller's), and the adapters ORT's
``get_ep_devices()`` pairs with ``DmlExecutionProvider`` there. Reserve and load probe the
stage's own route again and pin the adapter the options name by its DXGI index.
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
    from edge_ort_directml.adapters import DmlAdapter

__all__ = ["EDGE_CONTRACT", "PLUGIN", "DirectMLPlugin", "vendor_backend"]

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"
#: Names the vendor interpreter that probes and routeless stages use.
INTERPRETER_ENV = "EDGE_ORT_DIRECTML_PYTHON"

def vendor_backend() -> VendorBackend:
    """What ``ort-directml`` requires of the interpreter it runs in."""
    from edge_ort.vendor import VendorBackend
    from edge_ort_directml.options import PROVIDER

    return VendorBackend(backend="ort-directml", provider=PROVIDER,
                         distribution="onnxruntime-directml", device_type="GPU",
                         interpreter_env=INTERPRETER_ENV)


class DirectMLPlugin(VendorOrtPlugin):
    """The ``ort-directml`` hooks.

    Args:
        prober: Observes an interpreter (default: :func:`edge_ort.vendor.probe_vendor`);
            tests pass recorded Windows listings here.
    """

    EDGE_CONTRACT = EDGE_CONTRACT

    def __init__(self, prober: Prober | None = None) -> None:
        super().__init__(backend="ort-directml", target="DmlExecutionProvider",
                         description="ONNX Runtime DirectML on any DirectX 12 GPU "
                         "(Windows only).", distribution="edge-ort-directml", prober=prober)

    def vendor_backend(self) -> VendorBackend:
        """See the module-level :func:`vendor_backend`."""
        return vendor_backend()

    def options_class(self) -> type:
        """:class:`edge_ort_directml.options.DmlOptions`."""
        from edge_ort_directml.options import DmlOptions

        return DmlOptions

    def available_report(self, probe: VendorProbe, notes: list[str]) -> ProbeReport:
        """The adapters ORT pairs with DirectML, each with its pool and dedicated memory."""
        from edge_core.backend import ProbeReport
        from edge_ort.epdevices import EpDevicesInvalid
        from edge_ort_directml.adapters import adapters_from, pool_totals

        try:
            adapters = adapters_from(probe.devices())
        except EpDevicesInvalid as exc:
            return ProbeReport(backend=self.backend, available=False, runtime=probe.runtime(),
                               reason=f"unreadable adapter listing: {exc}", notes=notes)
        notes = [*notes, *(f"adapter {a.index}: {a.to_json()}" for a in adapters)]
        return ProbeReport(backend=self.backend, available=True,
                           devices=[a.descriptor(probe.domain) for a in adapters],
                           runtime=probe.runtime(), notes=notes,
                           pool_totals=pool_totals(adapters))

    def stage_adapter(self, stage: StageContext, refresh: bool = False) -> DmlAdapter:
        """The adapter the stage runs on, probed in the stage's own route.

        Raises:
            StageRefused: the placement names another provider, or the options name no
                listed adapter.
            RouteUnavailable: the route's interpreter cannot run DirectML (the reason says
                which check failed).
        """
        from edge_ort.epdevices import EpDevicesInvalid
        from edge_ort.vendor import RouteUnavailable
        from edge_ort_directml.adapters import adapters_from
        from edge_ort_directml.options import DmlOptions, select_adapter

        probe = self.probe_route(stage, refresh)
        try:
            adapters = adapters_from(probe.devices())
        except EpDevicesInvalid as exc:
            raise RouteUnavailable(f"stages[{stage.stage_id}].backend.route.interpreter",
                                   f"unreadable adapter listing: {exc}",
                                   probe.interpreter) from None
        return select_adapter(adapters, stage.options or DmlOptions(),
                              f"stages[{stage.stage_id}].backend.options")

    def load_config(self, options: Any, stage: StageContext) -> dict[str, Any]:
        """DirectML pinned to the stage's adapter, then CPU."""
        from edge_ort_directml.options import dml_load_config

        return dml_load_config(options, self.stage_adapter(stage))

    @hookimpl
    def edge_reserve(self, stage: StageContext) -> Mapping[str, int]:
        """Charge the adapter's pool: ``machine:ram`` if integrated, its VRAM if discrete."""
        from edge_ort_directml.demands import dml_demands

        return dml_demands(stage, self.stage_adapter(stage))

    @hookimpl
    def edge_load(self, stage: StageContext) -> OrtStage:
        """Probe the route afresh, then verify, start the worker and load on the adapter."""
        from edge_ort.controller import OrtStage
        from edge_ort.vendor import with_default_route
        from edge_ort_directml.options import dml_load_config

        adapter = self.stage_adapter(stage, refresh=True)
        stage = with_default_route(stage, vendor_backend())
        return OrtStage.open(stage, dml_load_config(stage.options, adapter),
                             adapter.physical_id)


PLUGIN = DirectMLPlugin()
