"""Memory of a measured pipeline, told apart: loading peak, runtime peak, the sampled sum.

Boundaries (Linux; every figure is of each stage's worker *process tree*: the worker and
everything it started, the root matched by PID and start time so a reused PID is never
read):

- **loading peak**: the tree's summed peak resident set (``VmHWM``) right after
  ``Pipeline.open`` returned — load, warm-up, placement gate — before any request;
- then every process's high-water mark is reset (``/proc/PID/clear_refs`` ← ``5``,
  allowed to the process owner), so that
- **runtime peak**: the summed ``VmHWM`` read after the measured requests is what
  serving alone reached. Where the reset is refused, ``runtime_peak_bytes`` is ``None``
  and ``separable`` false: a peak that includes loading is never passed off as a runtime
  figure;
- **per segment** (a request class at one concurrency level): the marks reset the
  high-water marks at the segment's start and read them at its end, giving that
  segment's peak, and the current resident sets at both ends give its growth;
- **peak of the sum**: a sampler thread adds up the current resident sets of every tree
  every ``interval_s``; the highest sum it saw is the peak of the sum *as sampled* — a
  sum of per-process peaks reached at different moments is not that, and both are kept.

Pools: every pool the ledger charged a stage (its reservation) is listed with
``observed`` — ``machine:ram`` by the measurements above, another pool by the stage's own
observed figure (``observed_memory``) — or ``unobserved`` (VRAM a backend cannot read, an
NPU's memory): an unobserved pool is never counted as within its demand.
``runtime_over_demand`` flags a runtime peak above the stage's reserved demand.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import psutil

from edge_contracts.devices import RAM_POOL
from edge_core.host.identity import descendant_processes, described_identity
from edge_core.host.identity import start_time as identity_start_time
from edge_core.runtime import Pipeline

__all__ = ["PLAN_KEY", "MemoryWatch", "RssSampler", "annotate_plan", "demand_checks",
           "pool_rows", "stage_trees", "tree_rss"]

_START_SLACK_S = 0.01


def _tree(described: Mapping[str, object]) -> list[psutil.Process]:
    """The live processes of a worker tree named by a stage's ``describe()``."""
    identity = described_identity(described)
    if identity is None:
        return []
    try:
        root = psutil.Process(identity.pid)
        if abs(identity_start_time(root) - identity.start_time) > _START_SLACK_S:
            return []
        return [root, *descendant_processes(root)]
    except psutil.Error:
        return []


def stage_trees(pipeline: Pipeline) -> dict[str, list[psutil.Process]]:
    """Stage name (``stage#r`` for replica r > 0) → its worker tree's processes now.

    In-process stages (no worker identity) are left out.
    """
    found: dict[str, list[psutil.Process]] = {}
    for runtime in pipeline.stages:
        tree = _tree(runtime.loaded.describe())
        if tree:
            found[runtime.name] = tree
    return found


def _hwm(proc: psutil.Process) -> int | None:
    try:
        with open(f"/proc/{proc.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_hwm(proc: psutil.Process) -> bool:
    try:
        with open(f"/proc/{proc.pid}/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _rss(proc: psutil.Process) -> int:
    with contextlib.suppress(psutil.Error):
        return int(proc.memory_info().rss)
    return 0


class MemoryWatch:
    """The loading peak, runtime peak and per-segment peaks of every stage's worker tree."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self.loading: dict[str, int] = {}
        self.runtime: dict[str, int] = {}
        self.segments: list[dict[str, Any]] = []
        self.separable = True
        self._open_segment: dict[str, Any] | None = None

    def _peaks(self) -> dict[str, int]:
        peaks: dict[str, int] = {}
        for name, tree in stage_trees(self._pipeline).items():
            values = [v for v in (_hwm(p) for p in tree) if v is not None]
            if values:
                peaks[name] = sum(values)
        return peaks

    def _reset(self) -> None:
        for tree in stage_trees(self._pipeline).values():
            for proc in tree:
                if not _reset_hwm(proc):
                    self.separable = False

    def _keep_runtime(self, peaks: Mapping[str, int]) -> None:
        for name, value in peaks.items():
            self.runtime[name] = max(self.runtime.get(name, 0), value)

    def after_open(self) -> None:
        """Read the loading peaks, then reset every high-water mark."""
        self.loading = self._peaks()
        self._reset()

    def begin(self, label: str) -> None:
        """Start a segment: read what ran before it, reset, note the resident sets."""
        self._keep_runtime(self._peaks())
        self._reset()
        self._open_segment = {"segment": label, "rss_start": tree_rss(self._pipeline),
                              "started": time.monotonic()}

    def end(self) -> dict[str, Any]:
        """End the open segment: its peak per tree and its growth (resident, end - start)."""
        segment = self._open_segment
        if segment is None:
            raise RuntimeError("memory segment: end() without begin(): None")
        self._open_segment = None
        peaks = self._peaks()
        self._keep_runtime(peaks)
        end = tree_rss(self._pipeline)
        start: dict[str, int] = segment["rss_start"]
        row = {"segment": segment["segment"],
               "seconds": round(time.monotonic() - segment["started"], 3),
               "peak_bytes": peaks if self.separable else None,
               "rss_start_bytes": start, "rss_end_bytes": end,
               "growth_bytes": {name: end[name] - start[name] for name in end if name in start}}
        self.segments.append(row)
        return row

    def finish(self) -> dict[str, Any]:
        """The per-tree loading and runtime peaks (runtime ``None`` if not separable)."""
        self._keep_runtime(self._peaks())
        names = sorted(set(self.loading) | set(self.runtime))
        return {
            "separable": self.separable,
            "trees": {name: {"loading_peak_bytes": self.loading.get(name),
                             "runtime_peak_bytes": self.runtime.get(name)
                             if self.separable else None}
                      for name in names},
            "segments": self.segments,
        }


def tree_rss(pipeline: Pipeline) -> dict[str, int]:
    """Stage name → the summed current resident set of its worker tree."""
    return {name: sum(_rss(p) for p in tree) for name, tree in stage_trees(pipeline).items()}


class RssSampler:
    """A thread that sums every worker tree's current resident set every ``interval_s``.

    Use as a context manager around the work; :meth:`result` gives the peak of the sum
    (with when it happened and each tree's share then) and the sample count.
    """

    def __init__(self, pipeline: Pipeline, interval_s: float = 0.1) -> None:
        self._pipeline = pipeline
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edge-profile-rss",
                                        daemon=True)
        self.samples = 0
        self.peak_sum = 0
        self.peak_at: float | None = None
        self.peak_trees: dict[str, int] = {}
        self.timeline: list[tuple[float, int]] = []
        self._started = 0.0

    def sample(self) -> int:
        """Take one sample now; returns the sum."""
        trees = tree_rss(self._pipeline)
        total = sum(trees.values())
        self.samples += 1
        now = time.monotonic()
        self.timeline.append((round(now - self._started, 3), total))
        if total > self.peak_sum:
            self.peak_sum, self.peak_at, self.peak_trees = total, now - self._started, trees
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self._started = time.monotonic()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.sample()

    def result(self, keep: int = 600) -> dict[str, Any]:
        """Peak of the sum (sampled), its time, each tree then; a thinned timeline."""
        step = max(1, len(self.timeline) // keep)
        return {"interval_s": self.interval_s, "samples": self.samples,
                "peak_of_sum_bytes": self.peak_sum,
                "peak_at_s": round(self.peak_at, 3) if self.peak_at is not None else None,
                "trees_at_peak_bytes": self.peak_trees,
                "timeline": [list(point) for point in self.timeline[::step]]}


def _stage_name(stage: Mapping[str, Any]) -> str:
    replica = stage.get("replica") or 0
    return f"{stage['id']}#{replica}" if replica else str(stage["id"])


def pool_rows(plan: Mapping[str, Any], trees: Mapping[str, Any],
              observed: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Any]]:
    """Per stage, every pool it was charged: demand, observed or not, peaks, over demand.

    ``trees`` is :meth:`MemoryWatch.finish`'s ``trees``; ``observed`` the stages' own
    observed figures (``observed_memory``) by stage name.
    """
    rows: dict[str, dict[str, Any]] = {}
    for stage in plan.get("stages") or []:
        name = _stage_name(stage)
        demands = (stage.get("reservation") or {}).get("demands") or {}
        tree = trees.get(name) or {}
        own = observed.get(name) or {}
        pools: dict[str, Any] = {}
        for pool, demand in demands.items():
            if pool == RAM_POOL and tree:
                runtime = tree.get("runtime_peak_bytes")
                loading = tree.get("loading_peak_bytes")
                pools[pool] = {
                    "demand_bytes": demand, "observation": "observed",
                    "how": "worker-tree VmHWM (this profile)",
                    "loading_peak_bytes": loading, "runtime_peak_bytes": runtime,
                    "loading_over_demand": loading is not None and loading > demand,
                    "runtime_over_demand": runtime is not None and runtime > demand,
                }
            elif pool in own:
                peak = int(own[pool])
                pools[pool] = {"demand_bytes": demand, "observation": "observed",
                               "how": "the stage's own observed peak (load included)",
                               "peak_bytes": peak, "runtime_over_demand": peak > demand}
            else:
                pools[pool] = {"demand_bytes": demand, "observation": "unobserved",
                               "how": "nothing on this machine reads this pool for the stage",
                               "runtime_over_demand": None}
        rows[name] = pools
    return rows


def demand_checks(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per stage and charged pool: the stage's observed peak against its demand.

    Read from the plan's own check (each stage's ``memory``: the runtime compares the
    peak since the stage started, load and warm-up included, whenever a plan is made:
    :mod:`edge_core.runtime.memory_check`), so for ``edge run``'s plan, taken after the
    requests, ``over_demand`` is a peak above the demand at any time; an unobserved pool
    says so (``over_demand`` None).
    """
    found: dict[str, dict[str, Any]] = {}
    for stage in plan.get("stages") or []:
        pools = (stage.get("memory") or {}).get("pools") or {}
        found[_stage_name(stage)] = {
            pool: {"demand_bytes": check["demand_bytes"],
                   "observed_peak_bytes": check["peak_bytes"],
                   "over_demand": (None if check["verdict"] == "unobserved"
                                   else check["verdict"] == "over")}
            for pool, check in pools.items()}
    return found


PLAN_KEY = "memory_after_requests"
"""The key :func:`annotate_plan` adds to each stage of a plan."""


def annotate_plan(plan: dict[str, Any]) -> list[str]:
    """Add :data:`PLAN_KEY` to each stage of ``plan`` (kept where a stage has it already).

    Returns the names of the stages with a pool whose observed peak is above its demand.
    """
    checks = demand_checks(plan)
    over = []
    for stage in plan.get("stages") or []:
        name = _stage_name(stage)
        found = stage.setdefault(PLAN_KEY, checks.get(name, {}))
        if any(isinstance(v, Mapping) and v.get("over_demand") for v in found.values()):
            over.append(name)
    return over
