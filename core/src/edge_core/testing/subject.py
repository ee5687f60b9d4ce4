"""The backend under test: its declaration, its probe's answer and the stage it provides.

:func:`prepare` resolves a backend among the loaded plugins, probes it, and (when it is
available) asks its owner for a conformance stage built in a private directory, which
:meth:`Subject.cleanup` removes.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import attrs

from edge_core.backend import BackendInfo, ProbeReport
from edge_core.binding import backend_table, bind_owner
from edge_core.errors import BackendUnavailable
from edge_core.plugins import PluginSet
from edge_core.testing.conformance_stage import ConformanceStage
from edge_core.testing.sharing import PipelineShare

__all__ = ["PROBE_TIMEOUT_S", "Subject", "prepare"]

#: How long the kit waits for a plugin's probe before calling the backend unavailable.
PROBE_TIMEOUT_S = 10.0


@attrs.frozen
class Subject:
    """One backend prepared for the checks.

    Attributes:
        backend: The backend name.
        info: Its declaration (``edge_backends``).
        plugin: The name of the plugin that owns it.
        plugins: The loaded plugins (the runtime resolves stages through them).
        probe: Its probe report, or None when the probe failed.
        unavailable: Why nothing can run here (the probe's reason), or None.
        stage: The stage it provided, or None.
        stage_problem: Why there is no stage: the hook answered None, raised, or returned
            something malformed (``stage_failed`` tells which).
        stage_failed: True when the missing stage is the plugin's fault.
        workdir: The private directory the stage was built in.
        share: The pipeline consecutive stage checks share (see
            :mod:`edge_core.testing.sharing`).
    """

    backend: str
    info: BackendInfo
    plugin: str
    plugins: PluginSet
    probe: ProbeReport | None
    unavailable: str | None
    stage: ConformanceStage | None
    stage_problem: str | None
    stage_failed: bool
    workdir: Path
    share: PipelineShare = attrs.field(factory=PipelineShare, eq=False, repr=False)

    def cleanup(self) -> None:
        """Close a pipeline still shared, unjudged; remove the stage's directory."""
        self.share.abandon()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _probe(plugins: PluginSet, plugin: str, backend: str) -> tuple[ProbeReport | None, str | None]:
    answer = plugins.call_one(plugin, "edge_probe", timeout_s=PROBE_TIMEOUT_S)
    if answer.error:
        return None, f"probe of plugin {plugin!r} failed: {answer.error}"
    report = next((r for r in answer.result or () if getattr(r, "backend", None) == backend),
                  None)
    if report is None:
        return None, f"probe of plugin {plugin!r} did not report backend {backend!r}"
    return report, None if report.available else str(report.reason)


def prepare(plugins: PluginSet, backend: str) -> Subject:
    """Resolve, probe and (when available) build the backend's conformance stage.

    Raises:
        BackendUnavailable: no loaded plugin declares ``backend``.
    """
    table = backend_table(plugins)
    if backend not in table:
        raise BackendUnavailable(f"backend: no installed plugin provides it: {backend!r} "
                                 f"(available: {sorted(table)})")
    info, plugin = table[backend]
    report, unavailable = _probe(plugins, plugin, backend)
    workdir = Path(tempfile.mkdtemp(prefix=f"edge-conformance-{backend}-"))
    stage: ConformanceStage | None = None
    problem: str | None = None
    failed = False
    if unavailable is None:
        try:
            answer = bind_owner(plugins, backend).conformance_stage(backend, workdir)
            if answer is None:
                problem = (f"edge_conformance_stage: plugin {plugin!r} provides no stage "
                           f"for backend {backend!r}")
            else:
                stage = ConformanceStage.parse(backend, answer, workdir)
        except Exception as exc:  # the plugin's failure is a check failure, not a crash
            problem, failed = f"edge_conformance_stage: {type(exc).__name__}: {exc}", True
    return Subject(backend=backend, info=info, plugin=plugin, plugins=plugins, probe=report,
                   unavailable=unavailable, stage=stage, stage_problem=problem,
                   stage_failed=failed, workdir=workdir)
