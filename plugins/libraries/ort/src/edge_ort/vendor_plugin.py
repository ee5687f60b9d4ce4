"""The shared shape of an ORT backend that needs a vendor build (DirectML, VitisAI).

:class:`VendorOrtPlugin` adds to :class:`~edge_ort.plugin_base.OrtPlugin` what such
backends have in common: a prober that observes an interpreter (the default one for
``edge probe``, the stage's own route before reserve and load), the unavailable report
with the probe's reason, and the route check that refuses a stage before anything loads.
A subclass says what its backend requires (:meth:`vendor_backend`) and how to describe the
devices found (:meth:`available_report`). Importing this module stays cheap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from edge_ort.plugin_base import OrtPlugin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edge_contracts.devices import ExecutionDomain
    from edge_core.backend import ProbeReport
    from edge_core.stage import StageContext
    from edge_ort.vendor import VendorBackend, VendorProbe

__all__ = ["Prober", "VendorOrtPlugin"]

#: ``(interpreter, domain, refresh) -> VendorProbe``; ``None`` arguments mean the defaults.
Prober = Callable[["str | None", "ExecutionDomain | None", bool], "VendorProbe"]


class VendorOrtPlugin(OrtPlugin, ABC):
    """An ORT backend whose provider exists only in a vendor build, on vendor hardware.

    Args:
        backend, target, description, distribution: As for :class:`OrtPlugin`.
        prober: Observes an interpreter (default: :func:`edge_ort.vendor.probe_vendor`);
            tests pass recorded listings here.
    """

    #: A stage without a route runs on the vendor interpreter its variable names, where
    #: set: its workers' key is not the controller's own (no zygote started ahead).
    worker_preload = None

    def __init__(self, backend: str, target: str, description: str, distribution: str,
                 prober: Prober | None = None) -> None:
        super().__init__(backend=backend, target=target, description=description,
                         distribution=distribution)
        self._prober: Prober = prober or self._live_probe

    @abstractmethod
    def vendor_backend(self) -> VendorBackend:
        """What the backend requires of the interpreter it runs in."""

    @abstractmethod
    def available_report(self, probe: VendorProbe, notes: list[str]) -> ProbeReport:
        """The report for an interpreter that passed every check: its devices and pools."""

    def _live_probe(self, interpreter: str | None, domain: ExecutionDomain | None,
                    refresh: bool) -> VendorProbe:
        from edge_ort.vendor import probe_vendor

        return probe_vendor(self.vendor_backend(), interpreter, domain, refresh=refresh)

    def probe_report(self) -> ProbeReport:
        """Probe the default interpreter; unavailable with the failed check as the reason."""
        from edge_core.backend import ProbeReport

        probe = self._prober(None, None, False)
        env = self.vendor_backend().interpreter_env
        notes = [*probe.notes, f"interpreter probed: {probe.interpreter} "
                 f"(set {env} to probe a vendor environment)"]
        if not probe.available:
            return ProbeReport(backend=self.backend, available=False, reason=probe.reason,
                               runtime=probe.runtime(), notes=notes)
        return self.available_report(probe, notes)

    def probe_route(self, stage: StageContext, refresh: bool = False) -> VendorProbe:
        """Probe the stage's own route; refuse a stage that targets another provider.

        Raises:
            StageRefused: the stage's placement names another provider.
            RouteUnavailable: the route's interpreter cannot run the backend (the reason
                says which check failed).
        """
        from edge_ort.vendor import RouteUnavailable, check_stage_target, route_interpreter

        check_stage_target(stage, self.target)
        interpreter, domain = route_interpreter(stage, self.vendor_backend())
        probe = self._prober(interpreter, domain, refresh)
        if not probe.available:
            raise RouteUnavailable(f"stages[{stage.stage_id}].backend.route.interpreter",
                                   str(probe.reason), interpreter)
        return probe
