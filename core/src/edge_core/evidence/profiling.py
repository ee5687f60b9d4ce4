"""The profiling harness behind ``edge profile``: one JSON profile of a pipeline.

Two separate runs of the pipeline, in this order:

1. **traced** — opened with the phase tracer installed (:mod:`.startup`): start-up phases
   per stage, the first output, bare process starts on each route and a warm restart of
   every stage. The tracer slows what it watches; nothing here is a latency figure.
2. **baseline** — opened again with no instrumentation: the open time, the first output,
   then warm-up and measured requests per input group and concurrency level
   (:mod:`.workload`), worker-tree memory peaks, the ledger's reservations and the
   execution plan (actual placement, numerics).

Any failure ends the profile with ``outcome.ok = false``, the step that failed and the
error's type chain, so that ``edge qualify`` can name the failing layer; whatever was
opened is closed first.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_core import __version__
from edge_core.evidence import startup, workload
from edge_core.identity import host_identity
from edge_core.progress import Progress
from edge_core.runtime.pipeline import Pipeline

__all__ = ["PROFILE_SCHEMA", "ProfileSettings", "run_profile", "write_profile"]

PROFILE_SCHEMA = "edge.profile/1"
"""The ``schema`` value of every profile this module writes."""


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name}: must be >= 1: {value!r}")


def _non_negative(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"{attribute.name}: must be >= 0: {value!r}")


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _levels(_: object, attribute: attrs.Attribute[tuple[int, ...]],
            value: tuple[int, ...]) -> None:
    if not value or any(isinstance(v, bool) or v < 1 for v in value):
        raise ValueError(f"{attribute.name}: need positive levels: {value!r}")


@attrs.frozen
class ProfileSettings:
    """How much to measure.

    Attributes:
        requests: measured requests per input group and concurrency level.
        warmup_requests: unmeasured requests per group before measuring (kept apart).
        concurrency: levels to try, in order; one above the admission is skipped.
        process_start_repeats: bare worker starts per route.
        warm_restart: restart every stage once in the traced run.
        deadline_s: the bound on each request, waiting for admission and slots included.
    """

    requests: int = attrs.field(default=20, validator=_positive)
    warmup_requests: int = attrs.field(default=2, validator=_non_negative)
    concurrency: tuple[int, ...] = attrs.field(default=(1, 2, 4), converter=_ints,
                                               validator=_levels)
    process_start_repeats: int = attrs.field(default=3, validator=_positive)
    warm_restart: bool = True
    deadline_s: float = 300.0


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


def _memory(pipeline: Pipeline) -> dict[str, Any]:
    from edge_core.host.identity import described_identity
    from edge_core.workerstage import tree_peak_rss

    stages = {}
    checks = {s["id"]: s["memory_check"] for s in pipeline.execution_plan()["stages"]}
    for runtime in pipeline.stages:
        described: dict[str, Any] = dict(runtime.loaded.describe())
        identity = described_identity(described)
        peak = (tree_peak_rss(identity.pid, identity.start_time)
                if identity is not None else None)
        observed = dict(runtime.loaded.observed_memory())
        stages[runtime.stage_id] = {
            "worker_tree_peak_rss_bytes": peak, "observed": observed,
            # demanded pools with no observed figure: never counted as within the demand
            "unobserved": sorted(pool for pool, how in checks[runtime.stage_id].items()
                                 if how == "unobserved"),
        }
    return {"stages": stages, "ledger": pipeline.ledger.snapshot(),
            "boundary": "peak resident set (VmHWM) summed over each worker's process "
                        "tree, read after the measured requests"}


def _tried(pipeline: Pipeline) -> dict[str, Any]:
    """Stage id → the candidates tried at open, in order (exactly one chosen)."""
    return {s["id"]: s["candidates"] for s in pipeline.execution_plan()["stages"]}


def _refusals(exc: BaseException) -> dict[str, Any] | None:
    """Stage id → candidates tried, when the open ended with every candidate refused."""
    from edge_core.runtime.candidates import CandidatesRefused

    return dict(exc.tried) if isinstance(exc, CandidatesRefused) else None


class _Ticker:
    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress

    def __call__(self) -> None:
        if self.progress is not None:
            self.progress.update(1)


def _traced(path: str, name: str | None, settings: ProfileSettings, inputs: Callable[
        [Pipeline], list[workload.InputGroup]], say: Callable[[str], None],
        profile: dict[str, Any]) -> None:
    clock = startup.StartupClock([], say)
    traced: dict[str, Any] = {"instrumented": True, "tracer": "sys.setprofile"}
    profile["traced"] = traced
    step = "open"
    pipeline: Pipeline | None = None
    try:
        pipeline = startup.traced_open(path, name, clock, say)
        profile["candidates"] = _tried(pipeline)
        opened = startup.open_summary(clock)
        traced["open"] = opened
        step = "inputs"
        groups = inputs(pipeline)
        step = "first_output"
        traced["first_output_s"] = workload.timed_run(pipeline, groups[0].arrays)["total_s"]
        step = "process_start"
        say("timing bare worker starts")
        bare = startup.measure_process_start(pipeline, settings.process_start_repeats)
        traced["process_start"] = bare
        traced["stages"] = startup.stage_startup(opened, bare)
        if settings.warm_restart:
            step = "warm_restart"
            say("restarting every stage (warm)")
            traced["warm_restart"] = startup.measure_warm_restart(
                pipeline, lambda: workload.timed_run(pipeline, groups[0].arrays)["total_s"])
    except Exception as exc:
        traced["reached"] = clock.reached()
        profile["outcome"] = _error(step, exc)
        if _refusals(exc) is not None:
            profile["candidates"] = _refusals(exc)
    finally:
        profile["config"] = clock.config
        try:
            profile["probes"] = startup.probe_backends(clock)
        except Exception as exc:  # a probe that breaks is recorded, not fatal
            profile["probes"] = [{"error": f"{type(exc).__name__}: {exc}"}]
        if pipeline is not None:
            traced["closed"] = pipeline.close()


def _baseline(path: str, name: str | None, settings: ProfileSettings, inputs: Callable[
        [Pipeline], list[workload.InputGroup]], progress: Progress | None,
        say: Callable[[str], None], profile: dict[str, Any]) -> None:
    from edge_core.runtime.opening import open_pipeline

    baseline: dict[str, Any] = {"instrumented": False}
    profile["baseline"] = baseline
    step = "open"
    pipeline: Pipeline | None = None
    try:
        started = time.perf_counter()
        pipeline = open_pipeline(path, name=name)
        baseline["open_total_s"] = time.perf_counter() - started
        profile["candidates"] = _tried(pipeline)  # the run the plan and figures are of
        step = "inputs"
        groups = inputs(pipeline)
        step = "first_output"
        baseline["first_output_s"] = workload.timed_run(pipeline, groups[0].arrays)["total_s"]
        allowed = sum(1 for c in settings.concurrency if c <= pipeline.admission.limit)
        if progress is not None:
            progress.set_total(len(groups) * (settings.warmup_requests
                                              + settings.requests * allowed))
        step = "requests"
        say("measuring requests")
        baseline["groups"] = [
            workload.measure_group(pipeline, group, requests=settings.requests,
                                   warmup=settings.warmup_requests,
                                   concurrency=settings.concurrency,
                                   deadline_s=settings.deadline_s, tick=_Ticker(progress))
            for group in groups
        ]
        step = "memory"
        baseline["memory"] = _memory(pipeline)
        profile["plan"] = pipeline.execution_plan()
        failed = [(g["name"], lvl["concurrency"]) for g in baseline["groups"]
                  for lvl in g["levels"] if lvl["status"] == "failed"]
        if failed:
            first = next(lvl["errors"][0] for g in baseline["groups"] for lvl in g["levels"]
                         if lvl["status"] == "failed")
            profile["outcome"] = {"ok": False, "step": "requests", "error_type": first["type"],
                                  "error": first["message"], "chain": [
                                      {"type": first["type"], "classes": [first["type"]],
                                       "message": first["message"]}],
                                  "failed_levels": failed}
    except Exception as exc:
        profile["outcome"] = _error(step, exc)
        if _refusals(exc) is not None:
            profile["candidates"] = _refusals(exc)
    finally:
        if pipeline is not None:
            baseline["closed"] = pipeline.close()
            baseline["ledger_after_close"] = pipeline.ledger.snapshot()


def run_profile(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    sources: Sequence[str] = (),
    npz_files: Sequence[str] = (),
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
        "boundaries": {"startup": startup.__doc__, "requests": workload.__doc__},
        "outcome": {"ok": True},
    }

    def inputs(pipeline: Pipeline) -> list[workload.InputGroup]:
        return workload.resolve_groups(pipeline, sources, npz_files)

    tell("traced run: start-up phases")
    _traced(str(path), name, settings, inputs, tell, profile)
    if profile["outcome"]["ok"]:
        tell("baseline run: uninstrumented")
        _baseline(str(path), name, settings, inputs, progress, tell, profile)
    profile["finished_at"] = _now()
    return profile


def write_profile(profile: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a profile as indented JSON (parents created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(profile, indent=2, default=str) + "\n", encoding="utf-8")
