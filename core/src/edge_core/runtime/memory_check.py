"""Each stage's observed memory peak against the demand it declared, whenever asked.

Admission charges every stage its declared demand before anything loads; the gate then
refuses a stage whose peak after load and warm-up already exceeds it
(``DemandExceeded``). Real requests come later and vary in size, so a demand can be
right at the gate and wrong an hour later. This module compares again each time a
report is asked for: the execution plan (each stage's ``memory``), the pipeline's health
(``memory``, which ``edge serve`` shows on ``/health``) and the evidence record. The
peak is the backend's own observation (:meth:`~edge_core.stage.LoadedStage.observed_memory`;
for a worker stage, the peak resident set summed over the worker's process tree since it
started, so every request served so far is in it).

Per stage and demanded pool the verdict is ``within`` (peak <= demand), ``over``
(peak > demand: the ledger under-charged this stage, and its demand should be raised)
or ``unobserved`` (the backend observes nothing of that pool: never reported as
within). A stage over its demand keeps serving; the report says so, with the figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edge_core.runtime.stage_slot import StageSlot

__all__ = ["BOUNDARY", "checked_stage", "memory_report", "over_demand", "stage_memory"]

BOUNDARY = ("peak resident set (VmHWM) summed over the stage worker's process tree since "
            "it started, against the stage's declared demand")
"""What the figures measure (a conservative peak: shared library pages count in full)."""


def _observe(stage: StageSlot) -> Mapping[str, int]:
    """The stage's peak now (the gate's figure when it has no worker or cannot say)."""
    runtime = stage.runtime
    if runtime is None:
        return stage.observed
    try:
        now = dict(runtime.loaded.observed_memory())
    except Exception:  # a report never fails for a stage that cannot be asked now
        return stage.observed
    return {pool: max(now.get(pool, 0), stage.observed.get(pool, 0))
            for pool in {*now, *stage.observed}}


def stage_memory(demands: Mapping[str, int], observed: Mapping[str, int]) -> dict[str, Any]:
    """``{"pools": {pool: {...}}, "over_demand": bool}`` for one stage.

    Each demanded pool gets ``demand_bytes``, ``peak_bytes``, ``peak_over_demand`` (the
    ratio, rounded to 3 places) and ``verdict`` (``within``, ``over``, ``unobserved``).
    """
    pools: dict[str, dict[str, Any]] = {}
    for pool, demand in sorted(demands.items()):
        peak = observed.get(pool)
        if peak is None:
            pools[pool] = {"demand_bytes": demand, "peak_bytes": None,
                           "peak_over_demand": None, "verdict": "unobserved"}
            continue
        ratio = round(peak / demand, 3) if demand > 0 else None
        pools[pool] = {"demand_bytes": demand, "peak_bytes": int(peak),
                       "peak_over_demand": ratio,
                       "verdict": "over" if peak > demand else "within"}
    return {"pools": pools,
            "over_demand": any(p["verdict"] == "over" for p in pools.values())}


def checked_stage(stage: StageSlot) -> dict[str, Any]:
    """:func:`stage_memory` of one stage, its peak observed now."""
    return stage_memory(stage.demands, _observe(stage))


def over_demand(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the plan entries (``id``, or ``id#replica``) whose memory is over demand."""
    return [entry["id"] if not entry.get("replica") else f"{entry['id']}#{entry['replica']}"
            for entry in entries if (entry.get("memory") or {}).get("over_demand")]


def memory_report(stages: Iterable[StageSlot]) -> dict[str, Any]:
    """Every stage's check (replica r > 0 named ``stage#r``) and which are over demand."""
    checked = {stage.name: checked_stage(stage) for stage in stages}
    return {"stages": checked,
            "over_demand": [name for name, check in checked.items() if check["over_demand"]],
            "boundary": BOUNDARY}
