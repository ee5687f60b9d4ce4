"""Traced start-up: each stage's start-up phases, the first output, process start, warm restart.

Boundaries (all ``time.perf_counter`` in the controller process):

- ``configuration_s`` / ``plugins_s`` / ``ledger_s``: reading the pipeline file, loading
  the plugins it needs, probing pools for the ledger.
- ``plan_s``: from ``Pipeline.open`` until its first "loading stage" progress message
  (backend resolution, probes, topology check, reservation of the whole plan).
- The traced open starts its stages one after another (``Pipeline.open(...,
  parallel_start=False)``), so that each stage's phases lie between its own progress
  marks — and runs every stage's full gate, never a stored one reused (its plan is the
  profile's evidence); an untraced open starts them in parallel and reuses a matching
  stored gate, as a user's open does (docs/runtime.md, "Gate reuse").
- per stage, ``load_s``: from "loading stage X" to "warming up stage X" (the owner's
  ``edge_load``), split by the tracer into ``artifact_verification_s``,
  ``worker_start_s`` (spawn → verified hello), ``worker_load_s`` (the worker's ``load``
  control call; where the load is sent with the start — no device lock held — the wait
  for its reply once the client is built: the worker's load began within
  ``worker_start_s``, as the hello was verified) and ``load_other_s`` (the rest of
  ``edge_load``);
- per stage, ``warmup_placement_s``: from "warming up stage X" to the next stage's
  "loading" message or the end of ``open`` (warm-up run, placement gate, numerics and
  memory checks), of which ``worker_warmup_s`` is the worker's ``warmup`` call;
- ``process_start_s``: a bare worker (entry ``edge_contracts.worker:BaseHandler``, no
  runtime imported) started on the stage's route, spawn → verified hello, median of a
  few starts;
- ``imports_s``: the entry's imports and handler construction, measured in the worker
  process itself (``entry_import_s`` + ``handler_s`` of its hello's ``startup``, on the
  worker's ``time.perf_counter``; ``imports_basis`` = ``worker``). ``worker_start_s`` -
  ``process_start_s`` is kept beside it as ``imports_derived_s`` (two separate starts:
  a cross-check, not the figure); a worker whose hello carries no ``startup`` (an older
  edge-contracts in a vendor interpreter) gets the derived figure, ``imports_basis`` =
  ``derived``;
- ``first_output_s``: the first ``Pipeline.run`` after ``open`` returned, until its result;
- ``warm_restart``: ``StageRuntime.restart()`` of each stage (retire, load again under a
  new generation, full gate) with the OS caches warm, then one request; traced (split
  into phases) in the traced run, untraced (totals only) in the first untraced run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from edge_core.evidence.tracing import PhaseTracer, default_targets
from edge_core.runtime import Pipeline

__all__ = ["BARE_ENTRY", "StartupClock", "measure_process_start", "measure_warm_restart",
           "open_summary", "probe_backends", "stage_startup", "traced_open", "worker_startup"]

BARE_ENTRY = "edge_contracts.worker:BaseHandler"
"""The worker entry used to time a bare process start: imports no runtime."""


def _targets() -> dict[str, Callable[..., Any]]:
    from edge_core.host.client import WorkerClient

    return {**default_targets(), "worker_retire": WorkerClient.retire}


class StartupClock:
    """Marks taken while a pipeline opens, turned into per-stage phases afterwards."""

    def __init__(self, stage_ids: list[str], say: Callable[[str], None] | None = None) -> None:
        self.stage_ids = stage_ids
        self.marks: list[tuple[str, str, float]] = []
        self.points: dict[str, float] = {}
        self.tracer = PhaseTracer(_targets())
        self.config: dict[str, Any] | None = None
        self.plugins: Any = None
        self._say = say

    def progress(self, message: str) -> None:
        """The ``progress`` callback for ``Pipeline.open``: records loading/warm-up marks."""
        now = time.perf_counter()
        for sid in self.stage_ids:
            if message.startswith(f"loading stage {sid} on "):
                self.marks.append(("load", sid, now))
            elif message == f"warming up stage {sid}":
                self.marks.append(("warmup", sid, now))
        if self._say is not None:
            self._say(message)

    def mark(self, name: str) -> None:
        """Record a named point in time."""
        self.points[name] = time.perf_counter()

    def stage_phases(self, end: float) -> dict[str, dict[str, float]]:
        """Stage id → phase seconds for every stage that reached its load."""
        result: dict[str, dict[str, float]] = {}
        bounds = [t for _, _, t in self.marks] + [end]
        for index, (kind, sid, start) in enumerate(self.marks):
            stop = bounds[index + 1]
            traced = self.tracer.between(start, stop)
            phases = result.setdefault(sid, {})
            if kind == "load":
                phases["load_s"] = stop - start
                for name in ("artifact_verification", "worker_start", "worker_load"):
                    phases[f"{name}_s"] = traced.get(name, 0.0)
                phases["load_other_s"] = phases["load_s"] - sum(
                    phases[f"{n}_s"] for n in ("artifact_verification", "worker_start",
                                               "worker_load"))
            else:
                phases["warmup_placement_s"] = stop - start
                phases["worker_warmup_s"] = traced.get("worker_warmup", 0.0)
        return result

    def reached(self) -> list[dict[str, Any]]:
        """The marks in order, relative to the start of ``open`` (for failed runs)."""
        origin = self.points.get("open", self.marks[0][2] if self.marks else 0.0)
        return [{"step": kind, "stage": sid, "at_s": t - origin} for kind, sid, t in self.marks]


def traced_open(path: str, name: str | None, clock: StartupClock,
                say: Callable[[str], None] | None = None) -> Pipeline:
    """Open the pipeline at ``path`` with the tracer installed; fills ``clock.points``."""
    from edge_core.plugins import load_plugins
    from edge_core.runtime.pipeline_files import default_ledger, load_config

    clock.mark("start")
    config = load_config(path, name)
    clock.config = config.to_json()
    clock.stage_ids[:] = [s.id for s in config.stages]
    clock.mark("configured")
    plugins = load_plugins(local_modules=config.plugins)
    clock.plugins = plugins
    clock.mark("plugins")
    ledger = default_ledger(config, plugins)
    clock.mark("open")
    with clock.tracer:
        # one stage after another: each stage's phases lie between its own progress
        # marks; every gate full: this open's plan is the profile's evidence
        pipeline = Pipeline.open(config, plugins, ledger, progress=clock.progress,
                                 parallel_start=False, full_gates=True)
    clock.mark("opened")
    return pipeline


def open_summary(clock: StartupClock) -> dict[str, Any]:
    """Pipeline-level start-up seconds and per-stage phases from a completed traced open."""
    p = clock.points
    first_load = clock.marks[0][2] if clock.marks else p["opened"]
    return {
        "configuration_s": p["configured"] - p["start"],
        "plugins_s": p["plugins"] - p["configured"],
        "ledger_s": p["open"] - p["plugins"],
        "plan_s": first_load - p["open"],
        "open_s": p["opened"] - p["open"],
        "total_s": p["opened"] - p["start"],
        "stages": clock.stage_phases(p["opened"]),
    }


def probe_backends(plugins: Any, config: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The probe reports (devices, availability, reason) of the backends the stages name.

    Each owner's answer is the one ``plugins`` already got (:meth:`PluginSet.probe
    <edge_core.plugins.PluginSet.probe>`: the profiled run's open asked it), whatever its
    age; a plugin it never asked, or whose probe failed, is asked now.
    """
    import math

    from edge_core.binding import backend_table
    from edge_core.runtime.opener import PROBE_TIMEOUT_S

    if plugins is None or config is None:
        return []
    stages = config.get("stages", [])
    names = {str(stage["backend"]) for stage in stages} | {
        str(c["backend"]) for stage in stages for c in stage.get("candidates") or ()}
    table = backend_table(plugins)
    reports = []
    for owner in sorted({table[n][1] for n in names if n in table}):
        answer = plugins.probe(owner, timeout_s=PROBE_TIMEOUT_S, max_age_s=math.inf)
        reports += [r.to_json() for r in answer.result or () if r.backend in names]
    return reports


def _route_of(pipeline: Pipeline, stage_id: str) -> Any:
    client = getattr(pipeline.stage(stage_id).loaded, "client", None)
    return getattr(client, "route", None)


def measure_process_start(pipeline: Pipeline, repeats: int) -> dict[str, Any]:
    """Stage id → bare-worker start samples on the stage's route (shared routes once).

    A bare worker's output goes where the stages' workers' goes
    (:func:`~edge_core.host.worker_logs.open_worker_output`): with a log folder set, to
    ``<stage>.process-start.g1.log`` there (opened before the timed start).
    """
    from edge_core.host.bootstrap import start_worker
    from edge_core.host.worker_logs import open_worker_output

    by_route: dict[tuple[Any, ...], dict[str, Any]] = {}
    result: dict[str, Any] = {}
    for runtime in pipeline.stages:
        route = _route_of(pipeline, runtime.stage_id)
        if route is None:
            result[runtime.stage_id] = {"skipped": "not a worker-backed stage"}
            continue
        key = (route.interpreter, route.os_domain, route.stage, route.python_path)
        if key not in by_route:
            bare = attrs.evolve(route, entry=BARE_ENTRY)
            samples = []
            paths: list[str] = []
            for _ in range(max(1, repeats)):
                output = open_worker_output(f"{runtime.stage_id}.process-start", 1)
                try:
                    started = time.perf_counter()
                    client = start_worker(bare, generation=1, stdout=output.stdout,
                                          stderr=output.stderr)
                    samples.append(time.perf_counter() - started)
                finally:
                    output.close()  # the worker keeps its own handle
                paths.append(client.start_path.kind)  # forked by the warm pool, or spawned
                client.retire()
            by_route[key] = {"samples_s": samples, "median_s": statistics.median(samples),
                             "interpreter": route.interpreter, "entry": BARE_ENTRY,
                             "start_paths": paths}
        result[runtime.stage_id] = by_route[key]
    return result


def measure_warm_restart(pipeline: Pipeline, run_once: Callable[[], float], *,
                         traced: bool = True) -> dict[str, Any]:
    """Restart each stage in turn, then time one request through the pipeline.

    ``traced``: split each restart into the traced phases; untraced, only its total.
    """
    stages: dict[str, Any] = {}
    for runtime in pipeline.stages:
        tracer = PhaseTracer(_targets())
        started = time.perf_counter()
        if traced:
            with tracer:
                runtime.restart()
        else:
            runtime.restart()
        ended = time.perf_counter()
        row: dict[str, Any] = {"restart_s": ended - started, "generation": runtime.generation}
        if traced:
            spans = tracer.between(started, ended)
            row.update({f"{phase}_s": spans.get(phase, 0.0)
                        for phase in ("worker_retire", "artifact_verification", "worker_start",
                                      "worker_load", "worker_warmup")})
        stages[runtime.stage_id] = row
    return {"instrumented": traced, "stages": stages, "first_output_s": run_once()}


def worker_startup(pipeline: Pipeline) -> dict[str, dict[str, float]]:
    """Stage id → the ``startup`` its worker measured and sent in its hello.

    ``entry_import_s`` and ``handler_s`` (see the module docstring); a stage that is not
    worker-backed, or whose worker sent no such figures, is left out.
    """
    result: dict[str, dict[str, float]] = {}
    for runtime in pipeline.stages:
        client = getattr(pipeline.stage(runtime.stage_id).loaded, "client", None)
        hello = getattr(client, "hello", None)
        figures = hello.get("startup") if isinstance(hello, Mapping) else None
        if not isinstance(figures, Mapping):
            continue
        picked = {name: figures.get(name) for name in ("entry_import_s", "handler_s")}
        if all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
               for v in picked.values()):
            result[runtime.stage_id] = {k: float(v) for k, v in picked.items() if v is not None}
    return result


def stage_startup(open_phases: Mapping[str, Any], process_start: Mapping[str, Any],
                  measured: Mapping[str, Mapping[str, float]] | None = None,
                  ) -> dict[str, dict[str, Any]]:
    """Per stage: the traced phases, ``process_start_s`` and ``imports_s`` with its basis.

    ``measured``: :func:`worker_startup` of the same open; a stage found there has
    ``imports_s`` as its worker measured it, else the derived difference.
    """
    result: dict[str, dict[str, Any]] = {}
    for sid, phases in open_phases["stages"].items():
        row: dict[str, Any] = dict(phases)
        bare = process_start.get(sid, {})
        start = bare.get("median_s")
        row["process_start_s"] = start
        worker = phases.get("worker_start_s")
        derived = (worker - start) if start is not None and worker else None
        row["imports_derived_s"] = derived
        own = (measured or {}).get(sid)
        if own is not None:
            row["entry_import_s"] = own["entry_import_s"]
            row["handler_s"] = own["handler_s"]
            row["imports_s"] = own["entry_import_s"] + own["handler_s"]
            row["imports_basis"] = "worker"
        else:
            row["imports_s"] = derived
            row["imports_basis"] = "derived" if derived is not None else None
        result[sid] = row
    return result
