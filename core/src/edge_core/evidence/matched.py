"""Instrumentation matched: the order of a profile's runs, and what the tracer costs.

A profile opens the pipeline several times, alternating: *untraced*, *traced*, untraced
again (``--startup-samples N``: N traced runs, each between two untraced ones; the last
untraced run is the baseline that measures the request levels). Every run opens the
pipeline, serves the first output, then the same *matched block*: the same requests of
the first class or input group, one at a time on the calling thread (``Pipeline.run``;
``Pipeline.stream`` for a streamed stage, timing its first event too).

:func:`overhead` compares them: the tracer's overhead is the traced runs' mean minus the
untraced runs' mean (open, first output, matched-block p50), and the *order effect* is
the last untraced run minus the first — a cold first run shows up there, not as tracer
overhead. :func:`cache_state` reads, from a run's execution plan, whether each stage's
load reused a compiled EP-context model (``hit``), compiled one (``miss``), both across
its buckets (``mixed``) or uses no such cache (``none``); :func:`by_cache` splits the
runs' start-up figures by that state.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["by_cache", "cache_state", "cache_states", "matched_p50_ms", "overhead",
           "phase_samples", "sequence"]


def sequence(startup_samples: int) -> list[str]:
    """The roles of the runs in order: untraced, (traced, untraced) x N.

    The last untraced run is the baseline; with N = 0 it is the only run (no start-up
    phases, no tracer overhead: the record says so).
    """
    roles = ["untraced"]
    for _ in range(max(0, startup_samples)):
        roles += ["traced", "untraced"]
    return roles


def cache_state(stage: Mapping[str, Any]) -> str:
    """``hit``, ``miss``, ``mixed`` or ``none``: a plan stage's EP-context cache use."""
    load = ((stage.get("worker") or {}).get("load")) or {}
    entries = []
    if isinstance(load.get("ep_context"), Mapping):
        entries.append(load["ep_context"])
    for bucket in (load.get("bucket_sessions") or {}).values():
        if isinstance(bucket, Mapping) and isinstance(bucket.get("ep_context"), Mapping):
            entries.append(bucket["ep_context"])
    if not entries:
        return "none"
    reused = [bool(entry.get("reused")) for entry in entries]
    return "hit" if all(reused) else "miss" if not any(reused) else "mixed"


def cache_states(plan: Mapping[str, Any]) -> dict[str, str]:
    """Stage id → :func:`cache_state` for every stage of an execution plan."""
    return {str(s["id"]): cache_state(s) for s in plan.get("stages") or []}


def matched_p50_ms(block: Mapping[str, Any] | None) -> float | None:
    """The p50 of a matched block's request times (ms)."""
    totals = [float(s["total_s"]) for s in (block or {}).get("samples") or []]
    return statistics.median(totals) * 1e3 if totals else None


def _mean(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if isinstance(v, int | float)]
    return statistics.fmean(found) if found else None


def _compare(traced: Sequence[float | None], untraced: Sequence[float | None],
             ) -> dict[str, Any]:
    t, u = _mean(traced), _mean(untraced)
    first, last = (untraced[0], untraced[-1]) if len(untraced) > 1 else (None, None)
    return {"traced": list(traced), "untraced": list(untraced),
            "overhead": (t - u) if t is not None and u is not None else None,
            "ratio": (t / u) if t is not None and u else None,
            "order_effect": (last - first) if first is not None and last is not None
            else None}


def overhead(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The tracer's overhead and the order effect over a profile's runs (in run order).

    ``open_s``, ``first_output_s`` and ``matched_p50_ms`` each give the traced and
    untraced values in order, ``overhead`` (traced mean - untraced mean), ``ratio`` and
    ``order_effect`` (last untraced - first untraced).
    """
    traced = [r for r in runs if r.get("instrumented")]
    untraced = [r for r in runs if not r.get("instrumented")]
    return {
        "sequence": ["traced" if r.get("instrumented") else "untraced" for r in runs],
        "open_s": _compare([r.get("open_s") for r in traced],
                           [r.get("open_s") for r in untraced]),
        "first_output_s": _compare([r.get("first_output_s") for r in traced],
                                   [r.get("first_output_s") for r in untraced]),
        "matched_p50_ms": _compare([matched_p50_ms(r.get("matched")) for r in traced],
                                   [matched_p50_ms(r.get("matched")) for r in untraced]),
        "matched_requests": len(((runs[0].get("matched") or {}).get("samples")) or [])
        if runs else 0,
    }


def phase_samples(traced: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Stage → phase → ``{"samples", "median"}`` over the traced runs' start-up phases."""
    found: dict[str, dict[str, list[float]]] = {}
    for run in traced:
        for sid, phases in (run.get("stages") or {}).items():
            for phase, value in phases.items():
                if isinstance(value, int | float):
                    found.setdefault(sid, {}).setdefault(phase, []).append(float(value))
    return {sid: {phase: {"samples": values, "median": statistics.median(values)}
                  for phase, values in phases.items()} for sid, phases in found.items()}


def by_cache(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Stage → cache state → the open times (every run) and load times (traced runs)."""
    found: dict[str, dict[str, dict[str, list[float]]]] = {}
    for run in runs:
        for sid, state in (run.get("compiled_cache") or {}).items():
            row = found.setdefault(sid, {}).setdefault(state, {"open_s": [], "load_s": []})
            if isinstance(run.get("open_s"), int | float):
                row["open_s"].append(float(run["open_s"]))
            load = ((run.get("stages") or {}).get(sid) or {}).get("load_s")
            if isinstance(load, int | float):
                row["load_s"].append(float(load))
    return found
