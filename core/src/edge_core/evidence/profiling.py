"""The profiling harness behind ``edge profile``: one JSON profile of a pipeline.

The pipeline is opened several times, in alternating order (:mod:`.matched`): untraced,
traced, untraced (``--startup-samples N``: N traced runs, each between untraced ones).
Every run times its open and its first output and serves the same *matched block* of
requests, so the tracer's overhead is told from the order the runs came in.

- **untraced** runs: the open, the first output, the matched block; the first one also
  restarts every stage (warm restart, totals only). They open as a user's open does
  (stages in parallel, a matching stored full gate reused): each records how every
  stage's gate ran (``gates``), so its ``open_s`` is read with it.
- **traced** runs: opened with the phase tracer installed (:mod:`.startup`), one stage
  after another and with full gates: start-up phases per stage, the first output and the
  matched block under the tracer, bare process starts on each route and a traced warm
  restart of every stage. The tracer slows
  what it watches; nothing here is a latency figure.
- the last untraced run is the **baseline**: after the matched block it measures warm-up
  and measured requests per input group or request class and concurrency level
  (:mod:`.workload`; streamed stages: :mod:`.stream_levels`), the slow-consumer and
  cancellation cases of a streamed stage, the golden set's quality check (:mod:`.golden`),
  the sustained run (``--duration``: :mod:`.sustained`), memory told apart
  (:mod:`.memory`), the ledger's reservations and the execution plan (its open runs
  every stage's full gate: the plan is the evidence).

Every profile also records the operating conditions (:mod:`.conditions`: before, at
each level, after), the runtime identity the measured-placement decisions key on
(:func:`edge_core.identity.runtime_identity` and its digest), the controller's and the
routes' package inventories, and the source revision when run from a checkout.

A failure ends the profile with ``outcome.ok = false``, the step that failed and the
error's class chain, so that ``edge qualify`` can name the failing layer; whatever was
opened is closed first. A request that fails does not end its level: every error is kept
with its class chain, and the outcome names the first.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_core import __version__
from edge_core.discovery import plugin_errors
from edge_core.evidence import (
    conditions,
    matched,
    memory,
    startup,
    stream_levels,
    sustained,
    workload,
)
from edge_core.evidence.profile_limits import (
    DEFAULT_WINDOW_S,
    MAX_DURATION_S,
    MAX_PROCESS_STARTS,
    MAX_REQUESTS,
    MAX_STARTUP_SAMPLES,
    MAX_WINDOW_S,
)
from edge_core.evidence.tracing import PhaseTracer
from edge_core.evidence.workload_file import RequestClass
from edge_core.identity import (
    host_identity,
    identity_digest,
    package_inventory,
    runtime_identity,
    source_revision,
)
from edge_core.progress import Progress
from edge_core.runtime import CandidatesRefused, Pipeline

__all__ = ["PROFILE_SCHEMA", "PROFILE_SCHEMAS", "ProfileSettings", "run_profile",
           "write_profile"]

PROFILE_SCHEMA = "edge.profile/2"
"""The ``schema`` value of every profile this module writes."""

PROFILE_SCHEMAS = ("edge.profile/1", PROFILE_SCHEMA)
"""The profile schemas ``edge qualify`` reads (version 1: before matched runs)."""


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name}: must be >= 1: {value!r}")


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    # NaN and infinity refused: a profile is JSON, which has neither
    if isinstance(value, bool) or not value >= 0 or not math.isfinite(value):
        raise ValueError(f"{attribute.name}: must be a finite number >= 0: {value!r}")


def _positive_number(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            or not math.isfinite(value)):
        raise ValueError(f"{attribute.name}: must be a finite number > 0: {value!r}")


def _positive_or_none(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not value > 0
                              or not math.isfinite(value)):
        raise ValueError(f"{attribute.name}: must be a finite number > 0: {value!r}")


def _at_most(high: float) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    """A validator: a value (or ``None``) of at most ``high`` (:mod:`.profile_limits`)."""

    def check(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and value > high:
            raise ValueError(f"{attribute.name}: must be at most {high:g}: {value!r}")

    return check


def _ints(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(values)


def _texts(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


def _levels(_: object, attribute: attrs.Attribute[tuple[int, ...]],
            value: tuple[int, ...]) -> None:
    if not value or any(isinstance(v, bool) or v < 1 for v in value):
        raise ValueError(f"{attribute.name}: need positive levels: {value!r}")


@attrs.frozen
class ProfileSettings:
    """How much to measure.

    Attributes:
        requests: measured requests per input group (or request class) and level.
        warmup_requests: unmeasured requests per group before measuring (kept apart).
        concurrency: levels to try, in order; one above the admission is skipped.
        process_start_repeats: bare worker starts per route (each traced run).
        warm_restart: restart every stage once in the first untraced and traced runs.
        deadline_s: the bound on each request, waiting for admission and slots included.
        startup_samples: traced runs, each between two untraced runs (0: the baseline
            alone, without start-up phases or the tracer's overhead).
        matched_requests: requests of the matched block every run serves.
        slow_consumer_pause_s: how long the slow consumer stops (streamed stages).
        chunk_seconds: media seconds per streamed event when the stage does not say
            (``duration_s`` in its events); ``None``: no real-time measures then.
        duration_s: the sustained run's length (``None``: no sustained run); it runs at
            the highest level of ``concurrency`` the pipeline admits.
        window_s: the sustained run's window.
        memory_interval_s: the resident-set sampler's period.
        sysfs: the sysfs root the conditions are read from (``None``: ``/sys`` or
            ``$EDGE_SYSFS_ROOT``).
        targets: product targets given with ``--targets`` (the pipeline's own are added).

    The counts and lengths that size the run have the ceilings of
    :mod:`~edge_core.evidence.profile_limits` (those of ``edge profile``'s options): a
    value over one is a ``ValueError`` naming the field.
    """

    requests: int = attrs.field(default=20, validator=[_positive, _at_most(MAX_REQUESTS)])
    warmup_requests: int = attrs.field(default=2,
                                     validator=[_non_negative, _at_most(MAX_REQUESTS)])
    concurrency: tuple[int, ...] = attrs.field(default=(1, 2, 4), converter=_ints,
                                               validator=_levels)
    process_start_repeats: int = attrs.field(
        default=3, validator=[_positive, _at_most(MAX_PROCESS_STARTS)])
    warm_restart: bool = True
    deadline_s: float = 300.0
    startup_samples: int = attrs.field(
        default=1, validator=[_non_negative, _at_most(MAX_STARTUP_SAMPLES)])
    matched_requests: int = attrs.field(default=5,
                                      validator=[_positive, _at_most(MAX_REQUESTS)])
    slow_consumer_pause_s: float = attrs.field(default=1.0, validator=_non_negative)
    chunk_seconds: float | None = attrs.field(default=None, validator=_positive_or_none)
    duration_s: float | None = attrs.field(
        default=None, validator=[_positive_or_none, _at_most(MAX_DURATION_S)])
    window_s: float = attrs.field(default=DEFAULT_WINDOW_S,
                                  validator=[_positive_number, _at_most(MAX_WINDOW_S)])
    memory_interval_s: float = attrs.field(default=0.1, validator=_positive_number)
    sysfs: str | None = None
    targets: tuple[str, ...] = attrs.field(default=(), converter=_texts)


def _error(step: str, exc: BaseException) -> dict[str, Any]:
    chain: list[dict[str, Any]] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 5:
        chain.append({"type": type(seen).__name__,
                      "classes": [c.__name__ for c in type(seen).__mro__],
                      "message": str(seen)})
        seen = seen.__cause__ or seen.__context__
    return {"ok": False, "step": step, "error_type": type(exc).__name__,
            "error": str(exc), "chain": chain}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _tried(pipeline: Pipeline) -> dict[str, Any]:
    """Stage id → the candidates tried at open, in order (exactly one chosen)."""
    return {s["id"]: s["candidates"] for s in pipeline.execution_plan()["stages"]}


def _refusals(exc: BaseException) -> dict[str, Any] | None:
    """Stage id → candidates tried, when the open ended with every candidate refused."""
    return dict(exc.tried) if isinstance(exc, CandidatesRefused) else None


class _Ticker:
    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress

    def __call__(self) -> None:
        if self.progress is not None:
            self.progress.update(1)


class _MemoryHooks(workload.LevelHooks):
    """Around each level: a memory segment and a conditions snapshot."""

    def __init__(self, watch: memory.MemoryWatch, shots: list[dict[str, Any]],
                 sysfs: str | None) -> None:
        self.watch = watch
        self.shots = shots
        self.sysfs = sysfs

    def before(self, label: str) -> None:
        self.shots.append({**conditions.snapshot(self.sysfs), "label": f"{label} start"})
        self.watch.begin(label)

    def after(self) -> dict[str, Any] | None:
        row = self.watch.end()
        self.shots.append({**conditions.snapshot(self.sysfs), "label": f"{row['segment']} end"})
        return {"memory": row}


class _Harness:
    """One profile in the making: inputs, the streamed flag, and the runs in order."""

    def __init__(self, path: str, name: str | None, settings: ProfileSettings,
                 sources: Sequence[str], npz_files: Sequence[str],
                 classes: Sequence[RequestClass], progress: Progress | None,
                 say: Callable[[str], None], profile: dict[str, Any]) -> None:
        self.path = path
        self.name = name
        self.settings = settings
        self.sources = sources
        self.npz_files = npz_files
        self.classes = classes
        self.progress = progress
        self.say = say
        self.profile = profile
        self.streamed: bool | None = None
        self.plugins: Any = None
        self.shots: list[dict[str, Any]] = profile["conditions"]["snapshots"]
        self.tick = _Ticker(progress)

    # -- requests every run makes ---------------------------------------------------------

    def groups(self, pipeline: Pipeline) -> list[workload.InputGroup]:
        return workload.resolve_groups(pipeline, self.sources, self.npz_files, self.classes)

    def first_output(self, pipeline: Pipeline, group: workload.InputGroup) -> float:
        """The first request after open (``Pipeline.run``); decides whether it streams."""
        started = time.perf_counter()
        with pipeline.run(group.arrays, params=group.params(0),
                          deadline_s=self.settings.deadline_s) as result:
            total = time.perf_counter() - started
            events = getattr(result.final, "events", ()) or ()
            streamed = any(not event.terminal for event in events)
        if self.streamed is None:
            kinds = pipeline.execution_plan()["stages"][-1]["kind"]
            self.streamed = streamed or "generate" in kinds
            self.profile["streamed"] = self.streamed
        return total

    def matched(self, pipeline: Pipeline, group: workload.InputGroup,
                tracer: PhaseTracer | None = None) -> dict[str, Any]:
        """The matched block: the same requests, one at a time, on this thread."""
        samples = []
        for index in range(self.settings.matched_requests):
            def once(index: int = index) -> dict[str, Any]:
                if self.streamed:
                    return stream_levels.timed_stream(pipeline, group.arrays,
                                                      group.params(index),
                                                      self.settings.deadline_s)
                return workload.timed_run(pipeline, group.arrays, self.settings.deadline_s,
                                          group.params(index))
            if tracer is not None:
                with tracer:
                    samples.append(once())
            else:
                samples.append(once())
        return {"group": group.name, "instrumented": tracer is not None, "samples": samples}

    def _clock(self) -> startup.StartupClock:
        """A clock for an untraced open: its progress marks say how far a failed one got."""
        stages = [str(s["id"]) for s in (self.profile.get("config") or {}).get("stages") or []]
        return startup.StartupClock(stages, self.say)

    def _fail(self, step: str, exc: BaseException) -> None:
        self.profile["outcome"] = _error(step, exc)
        refused = _refusals(exc)
        if refused is not None:
            self.profile["candidates"] = refused

    def _close(self, pipeline: Pipeline | None, entry: dict[str, Any]) -> None:
        if pipeline is not None:
            entry["closed"] = pipeline.close()
            entry["ledger_after_close"] = pipeline.ledger.snapshot()
        self.shots.append({**conditions.snapshot(self.settings.sysfs),
                           "label": f"after run {entry['index']} ({entry['role']})"})

    # -- the runs -------------------------------------------------------------------------

    def untraced(self, index: int, first: bool) -> dict[str, Any]:
        from edge_core.runtime.pipeline_files import open_pipeline

        entry: dict[str, Any] = {"index": index, "role": "untraced", "instrumented": False}
        step = "open"
        pipeline: Pipeline | None = None
        clock = self._clock()
        try:
            started = time.perf_counter()
            pipeline = open_pipeline(self.path, name=self.name, progress=clock.progress)
            entry["open_s"] = time.perf_counter() - started
            self.plugins = pipeline.plugins  # its probe answers are the profile's
            plan = pipeline.execution_plan()
            entry["compiled_cache"] = matched.cache_states(plan)
            # how each stage's load gate ran in this open: full, or reused from a stored
            # full gate (its open_s is then not a full gate's)
            entry["gates"] = {stage["id"]: stage.get("gate") for stage in plan["stages"]}
            self.profile["candidates"] = _tried(pipeline)
            step = "inputs"
            groups = self.groups(pipeline)
            step = "first_output"
            entry["first_output_s"] = self.first_output(pipeline, groups[0])
            step = "matched"
            entry["matched"] = self.matched(pipeline, groups[0])
            if first and self.settings.warm_restart:
                step = "warm_restart"
                self.say("restarting every stage (warm, untraced)")
                entry["warm_restart"] = startup.measure_warm_restart(
                    pipeline, lambda: self.first_output(pipeline, groups[0]), traced=False)
        except Exception as exc:
            entry["reached"] = clock.reached()
            self._fail(step, exc)
        finally:
            self._close(pipeline, entry)
        return entry

    def traced(self, index: int, first: bool) -> dict[str, Any]:
        clock = startup.StartupClock([], self.say)
        entry: dict[str, Any] = {"index": index, "role": "traced", "instrumented": True,
                                 "tracer": "sys.setprofile"}
        step = "open"
        pipeline: Pipeline | None = None
        try:
            pipeline = startup.traced_open(self.path, self.name, clock, self.say)
            self.plugins = clock.plugins
            self.profile["candidates"] = _tried(pipeline)
            opened = startup.open_summary(clock)
            entry["open"] = opened
            entry["open_s"] = opened["total_s"]  # file to serving, as an untraced run's
            entry["compiled_cache"] = matched.cache_states(pipeline.execution_plan())
            step = "inputs"
            groups = self.groups(pipeline)
            step = "first_output"
            with clock.tracer:
                entry["first_output_s"] = self.first_output(pipeline, groups[0])
            step = "matched"
            entry["matched"] = self.matched(pipeline, groups[0], PhaseTracer({}))
            step = "process_start"
            self.say("timing bare worker starts")
            bare = startup.measure_process_start(pipeline,
                                                 self.settings.process_start_repeats)
            entry["process_start"] = bare
            entry["stages"] = startup.stage_startup(opened, bare,
                                                    startup.worker_startup(pipeline))
            if first and self.settings.warm_restart:
                step = "warm_restart"
                self.say("restarting every stage (warm, traced)")
                entry["warm_restart"] = startup.measure_warm_restart(
                    pipeline, lambda: self.first_output(pipeline, groups[0]))
        except Exception as exc:
            entry["reached"] = clock.reached()
            self._fail(step, exc)
        finally:
            self._close(pipeline, entry)
        return entry

    def baseline(self, index: int) -> dict[str, Any]:
        from edge_core.runtime.pipeline_files import open_pipeline

        settings = self.settings
        entry: dict[str, Any] = {"index": index, "role": "baseline", "instrumented": False}
        step = "open"
        pipeline: Pipeline | None = None
        clock = self._clock()
        try:
            started = time.perf_counter()
            pipeline = open_pipeline(self.path, name=self.name, progress=clock.progress,
                                     full_gates=True)  # its plan is the evidence
            entry["open_s"] = entry["open_total_s"] = time.perf_counter() - started
            self.plugins = pipeline.plugins  # its probe answers are the profile's
            watch = memory.MemoryWatch(pipeline)
            watch.after_open()
            entry["compiled_cache"] = matched.cache_states(pipeline.execution_plan())
            self.profile["candidates"] = _tried(pipeline)  # the run the figures are of
            step = "inputs"
            groups = self.groups(pipeline)
            step = "first_output"
            entry["first_output_s"] = self.first_output(pipeline, groups[0])
            step = "matched"
            entry["matched"] = self.matched(pipeline, groups[0])
            allowed = sum(1 for c in settings.concurrency if c <= pipeline.admission.limit)
            if self.progress is not None:
                self.progress.set_total(len(groups) * (settings.warmup_requests
                                                       + settings.requests * allowed))
            step = "requests"
            self.say("measuring requests")
            with memory.RssSampler(pipeline, settings.memory_interval_s) as sampler:
                entry["groups"] = self._levels(pipeline, groups, watch)
                if self.streamed:
                    step = "stream_cases"
                    self.say("slow consumer and cancellation")
                    entry["stream_cases"] = {
                        "slow_consumer": stream_levels.slow_consumer(
                            pipeline, groups[0], settings.deadline_s,
                            settings.slow_consumer_pause_s, settings.chunk_seconds),
                        "cancellation": stream_levels.cancellation(
                            pipeline, groups[0], settings.deadline_s, settings.chunk_seconds),
                    }
                step = "quality"
                entry["quality"] = self._quality(pipeline)
                if settings.duration_s is not None:
                    step = "sustained"
                    level = max([c for c in settings.concurrency
                                 if c <= pipeline.admission.limit] or [1])
                    self.say(f"sustained run: {settings.duration_s:g} s at concurrency "
                             f"{level}")
                    entry["sustained"] = sustained.sustained_run(
                        pipeline, groups, concurrency=level,
                        duration_s=settings.duration_s, window_s=settings.window_s,
                        deadline_s=settings.deadline_s, streamed=bool(self.streamed),
                        chunk_seconds=settings.chunk_seconds, sysfs=settings.sysfs,
                        say=self.say)
            step = "memory"
            plan = pipeline.execution_plan()
            entry["memory"] = self._memory(pipeline, plan, watch, sampler)
            self.profile["plan"] = plan
            self._request_failures(entry)
        except Exception as exc:
            entry["reached"] = clock.reached()
            self._fail(step, exc)
        finally:
            self._close(pipeline, entry)
        return entry

    # -- the baseline's parts -------------------------------------------------------------

    def _levels(self, pipeline: Pipeline, groups: Sequence[workload.InputGroup],
                watch: memory.MemoryWatch) -> list[dict[str, Any]]:
        settings = self.settings
        hooks = _MemoryHooks(watch, self.shots, settings.sysfs)

        def streamed(group: workload.InputGroup, level: int) -> dict[str, Any]:
            return stream_levels.stream_level(pipeline, group, level, settings.requests,
                                              settings.deadline_s, self.tick,
                                              settings.chunk_seconds)

        return [workload.measure_group(pipeline, group, requests=settings.requests,
                                       warmup=settings.warmup_requests,
                                       concurrency=settings.concurrency,
                                       deadline_s=settings.deadline_s, tick=self.tick,
                                       level=streamed if self.streamed else None,
                                       hooks=hooks)
                for group in groups]

    def _quality(self, pipeline: Pipeline) -> dict[str, Any]:
        from edge_core.config.transforms import resolve_input_transform
        from edge_core.evidence.golden import load_golden, run_golden

        config = pipeline.config
        if config.quality is None or config.golden is None:
            missing = [n for n, v in (("quality", config.quality), ("golden", config.golden))
                       if v is None]
            return {"declared": False, "reason": f"the pipeline names no {' or '.join(missing)}"}
        base = config.source.parent if config.source is not None else Path.cwd()
        golden = load_golden(base / config.golden)
        function = resolve_input_transform(config.quality, "quality")
        self.say(f"quality: {config.quality.reference} on {len(golden.items)} golden item(s)")
        report = run_golden(pipeline, golden, config.quality.reference, function,
                            self.settings.deadline_s)
        return {"declared": True, **report}

    def _memory(self, pipeline: Pipeline, plan: dict[str, Any], watch: memory.MemoryWatch,
                sampler: memory.RssSampler) -> dict[str, Any]:
        from edge_core.host.identity import described_identity
        from edge_core.workerstage import tree_peak_rss

        stages = {}
        checks = {s["id"]: s["memory_check"] for s in plan["stages"]}
        demand_checks = {s["id"]: s.get("memory") for s in plan["stages"]}
        observed_by_name = {}
        for runtime in pipeline.stages:
            described: dict[str, Any] = dict(runtime.loaded.describe())
            identity = described_identity(described)
            peak = (tree_peak_rss(identity.pid, identity.start_time)
                    if identity is not None else None)
            observed = dict(runtime.loaded.observed_memory())
            observed_by_name[runtime.name] = observed
            stages[runtime.stage_id] = {
                "worker_tree_peak_rss_bytes": peak, "observed": observed,
                # demanded pools with no observed figure: never counted as within the demand
                "unobserved": sorted(pool for pool, how in checks[runtime.stage_id].items()
                                     if how == "unobserved"),
                # the plan's peak so far against the declared demand, per pool
                "demand_check": demand_checks.get(runtime.stage_id),
            }
        told = watch.finish()
        return {"stages": stages, "ledger": pipeline.ledger.snapshot(),
                "boundary": "peak resident set (VmHWM) summed over each worker's process "
                            "tree, read after the measured requests (since the high-water "
                            "marks were reset after open: runtime only)"
                if told["separable"] else "peak resident set (VmHWM) summed over each "
                "worker's process tree, read after the measured requests (load included)",
                "told_apart": told, "sampled": sampler.result(),
                "pools": memory.pool_rows(plan, told["trees"], observed_by_name),
                "boundaries": memory.__doc__}

    def _request_failures(self, entry: dict[str, Any]) -> None:
        failed = [[g["name"], lvl["concurrency"]] for g in entry["groups"]
                  for lvl in g["levels"] if lvl["status"] == "failed"]
        if not failed:
            return
        first = next(lvl["errors"][0] for g in entry["groups"] for lvl in g["levels"]
                     if lvl["status"] == "failed")
        self.profile["outcome"] = {
            "ok": False, "step": "requests", "error_type": first["type"],
            "error": first["message"], "failed_levels": failed,
            "chain": [{"type": first["type"], "classes": first["classes"],
                       "message": first["message"]}]}


def _plugins(harness: _Harness) -> Any:
    """The plugins of the profiled pipeline (loaded again when no run got that far)."""
    config = harness.profile.get("config")
    if harness.plugins is None and config:
        from edge_core.plugins import load_plugins

        harness.plugins = load_plugins(local_modules=config.get("plugins") or ())
    return harness.plugins


def _identity(harness: _Harness, plugins: Any) -> dict[str, Any]:
    """The runtime identity (and digest), the inventories and the source revision."""
    config = harness.profile.get("config") or {}
    stages = config.get("stages") or []
    backends = {str(s["backend"]) for s in stages} | {
        str(c["backend"]) for s in stages for c in s.get("candidates") or ()}
    found: dict[str, Any] = {"source": source_revision(),
                             "controller_packages": package_inventory()}
    if plugins is not None:
        runtime = runtime_identity(plugins, backends, max_age_s=math.inf)  # the run's probes
        found["runtime"] = runtime
        found["digest"] = identity_digest(runtime)
    interpreters = sorted({str(route["interpreter"]) for s in stages
                           for route in [s.get("route") or {}] if route.get("interpreter")})
    found["route_packages"] = {i: package_inventory(i) for i in interpreters}
    return found


def run_profile(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    sources: Sequence[str] = (),
    npz_files: Sequence[str] = (),
    classes: Sequence[RequestClass] = (),
    settings: ProfileSettings | None = None,
    command: Sequence[str] = (),
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Profile the pipeline at ``path``; return the profile (never raises for the run).

    Args:
        path: a pipeline file or pyproject.toml.
        name: the pipeline's name in a pyproject.toml.
        sources: ``--input`` values, one input group each (prepare function).
        npz_files: ``--inputs`` .npz files, one input group each.
        classes: request classes (``--workload``, ``--params``): the final stage's params.
        settings: how much to measure.
        command: the command line to record as the reproducible command.
        progress: advanced by one per request of the baseline run.
        say: receives one line per step.
    """
    settings = settings or ProfileSettings()
    tell = say or (lambda _message: None)
    profile: dict[str, Any] = {
        "schema": PROFILE_SCHEMA,
        "created_at": _now(),
        "edge_core": __version__,
        "pipeline_file": str(path),
        "pipeline_name": name,
        "command": {"argv": list(command), "cwd": os.getcwd()},
        "host": host_identity(),
        "settings": attrs.asdict(settings),
        "boundaries": {"startup": startup.__doc__, "requests": workload.__doc__,
                       "streams": stream_levels.__doc__, "runs": matched.__doc__},
        "outcome": {"ok": True},
        "conditions": {"snapshots": [{**conditions.snapshot(settings.sysfs),
                                      "label": "before"}]},
        "config": None, "probes": None,
    }
    try:  # the cell's labels even when no run opens (the first run then fails the same)
        from edge_core.runtime.pipeline_files import load_config

        profile["config"] = load_config(path, name).to_json()
    except Exception:  # noqa: S110 - the first run records this error with its step
        pass
    harness = _Harness(str(path), name, settings, sources, npz_files, classes, progress,
                       tell, profile)
    runs: list[dict[str, Any]] = []
    roles = matched.sequence(settings.startup_samples)
    for index, role in enumerate(roles):
        if index == len(roles) - 1:
            tell("baseline run: uninstrumented, measuring requests")
            entry = harness.baseline(index)
            profile["baseline"] = entry
        elif role == "traced":
            tell(f"run {index + 1}/{len(roles)}: traced (start-up phases)")
            entry = harness.traced(index, first=index == 1)
            profile.setdefault("traced", entry)
        else:
            tell(f"run {index + 1}/{len(roles)}: untraced")
            entry = harness.untraced(index, first=index == 0)
        runs.append(entry)
        if not profile["outcome"]["ok"]:
            break
    profile["runs"] = [{k: v for k, v in run.items() if k not in ("groups",)}
                       for run in runs if run is not profile.get("baseline")]
    traced_runs = [r for r in runs if r.get("instrumented") and "stages" in r]
    profile["startup"] = {"phases": matched.phase_samples(traced_runs),
                          "by_cache": matched.by_cache(runs)}
    profile["instrumentation"] = matched.overhead(runs)
    profile["targets"] = list(settings.targets) + list(
        (profile.get("config") or {}).get("targets") or [])
    profile["plugin_errors"] = None  # no plugin set: the file could not be read
    try:
        plugins = _plugins(harness)
        if plugins is not None:
            profile["plugin_errors"] = plugin_errors(r.to_json() for r in plugins.records)
        profile["probes"] = startup.probe_backends(plugins, profile.get("config"))
        profile["identity"] = _identity(harness, plugins)
    except Exception as exc:  # recorded, never fatal: the figures stand without it
        profile["probes"] = profile.get("probes") or [{"error": f"{type(exc).__name__}: {exc}"}]
        profile["identity"] = {"error": f"{type(exc).__name__}: {exc}"}
    shots = profile["conditions"]["snapshots"]
    shots.append({**conditions.snapshot(settings.sysfs), "label": "after"})
    origin = shots[0]["at"]
    for shot in shots:
        shot["at_s"] = round(shot.pop("at") - origin, 3)
    profile["conditions"]["summary"] = conditions.summarise(
        [{**s, "at": s["at_s"]} for s in shots])
    profile["conditions"]["compiled_cache"] = (profile.get("baseline") or {}).get(
        "compiled_cache")
    profile["finished_at"] = _now()
    return profile


def write_profile(profile: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a profile as indented JSON (parents created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(profile, indent=2, default=str) + "\n", encoding="utf-8")
