"""Building a qualification record from a profile (AI Hub job records: :mod:`.hubjob`).

A failed run is classified by its error's class chain
(:func:`~edge_core.evidence.status.classify_error`). Otherwise the four verdicts
(:mod:`.verdicts`) are judged — functional from the execution plan, quality from the
golden-set run, performance from the product targets (the profile's, or ``targets``
given here), reliability from the request errors, the closes and the ledger — and give
the status: PASS only when all four were judged and met.

Version 1 profiles (``edge.profile/1``) are read too: they have no quality run, no
conditions and one traced and one baseline run, and their records say so.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status, classify_error
from edge_core.evidence.targets import PROTOCOL_MIN_REQUESTS
from edge_core.evidence.verdicts import (
    decide,
    functional_verdict,
    performance_verdict,
    quality_verdict,
    reliability_verdict,
)

__all__ = ["record_from_profile"]

_PROFILE_SCHEMAS = ("edge.profile/1", "edge.profile/2")


def _labels(overrides: Mapping[str, str | None] | None) -> dict[str, str]:
    return {k: v for k, v in (overrides or {}).items() if v}


def _stage_functional(stage: Mapping[str, Any]) -> dict[str, Any]:
    placement = stage.get("placement") or {}
    providers = {name: int(v.get("nodes", 0))
                 for name, v in (placement.get("providers") or {}).items()}
    target = placement.get("target")
    return {
        "target": target,
        "method": placement.get("method"),
        "providers": providers,
        "on_target": bool(providers) and set(providers) == {target},
        "numerics": stage.get("numerics"),
        "evidence": stage.get("evidence"),
        "evidence_buckets": stage.get("evidence_buckets"),
        "gate": stage.get("gate"),
    }


def _graph_level(level: Mapping[str, Any]) -> dict[str, Any]:
    return {**level["summary"]["total"], "stages": level["summary"]["stages"],
            "throughput_rps": level.get("throughput_rps"), "wall_s": level.get("wall_s"),
            "status": level.get("status"), "errors": len(level.get("errors") or [])}


def _stream_level(level: Mapping[str, Any]) -> dict[str, Any]:
    return {**level["stream"], "throughput_rps": level.get("throughput_rps"),
            "wall_s": level.get("wall_s"), "status": level.get("status"),
            "errors": len(level.get("errors") or [])}


def _startup(profile: Mapping[str, Any]) -> dict[str, Any]:
    traced = profile.get("traced") or {}
    baseline = profile.get("baseline") or {}
    before: Mapping[str, Any] = next((r for r in profile.get("runs") or []
                   if not r.get("instrumented") and r.get("warm_restart")), {})
    startup = profile.get("startup") or {}
    return {
        "traced": {k: traced.get(k) for k in ("open", "stages", "first_output_s")},
        "warm_restart": traced.get("warm_restart"),
        "untraced_warm_restart": before.get("warm_restart"),
        "baseline_open_total_s": baseline.get("open_total_s"),
        "baseline_first_output_s": baseline.get("first_output_s"),
        "phase_samples": startup.get("phases"),
        "by_cache": startup.get("by_cache"),
        "compiled_cache": baseline.get("compiled_cache"),
        # per untraced open, how each stage's gate ran ("gate reused from DATE, 1 of 3
        # points checked now", or full): their open_s is read with it
        "untraced_gates": [r.get("gates") for r in profile.get("runs") or []
                           if not r.get("instrumented") and r.get("gates") is not None],
    }


def _memory(profile: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    baseline = profile.get("baseline") or {}
    memory = baseline.get("memory") or {}
    plan_stages = (profile.get("plan") or {}).get("stages") or []
    reserved = {s["id"]: s.get("reservation", {}).get("demands") for s in plan_stages}
    per_stage = {sid: {"worker_tree_peak_rss_bytes": m.get("worker_tree_peak_rss_bytes"),
                       "reserved": reserved.get(sid),
                       # the peak after the requests against the declared demand, per pool
                       "peak_over_demand": {
                           pool: check["peak_over_demand"] for pool, check in
                           ((m.get("demand_check") or {}).get("pools") or {}).items()},
                       "over_demand": (m.get("demand_check") or {}).get("over_demand")}
                 for sid, m in (memory.get("stages") or {}).items()}
    told = memory.get("told_apart")
    if not told:
        return per_stage, {}
    sampled = {k: v for k, v in (memory.get("sampled") or {}).items() if k != "timeline"}
    return per_stage, {"separable": told.get("separable"), "trees": told.get("trees"),
                       "segments": told.get("segments"), "sampled": sampled,
                       "pools": memory.get("pools"), "boundary": memory.get("boundary")}


def _performance(profile: Mapping[str, Any]) -> dict[str, Any]:
    baseline = profile.get("baseline") or {}
    latency: dict[str, Any] = {}
    streams: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    ttft_samples: dict[str, Any] = {}
    for group in baseline.get("groups") or []:
        for level in group.get("levels") or []:
            key = f"{group['name']}@c{level['concurrency']}"
            if "stream" in level:
                streams[key] = _stream_level(level)
                ttft_samples[key] = [(int(s["events"][0][1]) - int(s["submitted_ns"])) / 1e6
                                     for s in level.get("samples") or [] if s.get("events")]
            elif "summary" in level:
                latency[key] = _graph_level(level)
                samples[key] = [s["total_s"] * 1e3 for s in level.get("samples") or []]
            else:
                latency[key] = {"status": level.get("status"), "reason": level.get("reason")}
    per_stage, told = _memory(profile)
    cases = {name: {k: v for k, v in case.items() if k != "sample"}
             for name, case in (baseline.get("stream_cases") or {}).items()
             if isinstance(case, Mapping)}
    sustained = baseline.get("sustained")
    below = sorted(f"{key} (n={row['n']})" for part in (latency, streams)
                   for key, row in part.items()
                   if isinstance(row.get("n"), int) and row["n"] < PROTOCOL_MIN_REQUESTS)
    found: dict[str, Any] = {
        "startup": _startup(profile),
        "latency": latency,
        "latency_samples_ms": samples,
        "memory": per_stage,
        "boundaries": profile.get("boundaries"),
        "protocol": {"min_requests": PROTOCOL_MIN_REQUESTS, "below": below,
                     "sustained": "measured" if sustained else "not run (--duration)"},
    }
    if streams:
        found.update({"streams": streams, "ttft_samples_ms": ttft_samples})
    if cases:
        found["stream_cases"] = cases
    if told:
        found["memory_told_apart"] = told
    if sustained:
        found["sustained"] = {k: v for k, v in sustained.items() if k != "errors"} | {
            "errors": len(sustained.get("errors") or [])}
    if profile.get("instrumentation"):
        found["instrumentation"] = profile["instrumentation"]
    return found


def _from_outcome(outcome: Mapping[str, Any]) -> tuple[Status, Failure]:
    chain = outcome.get("chain") or []
    classes = chain[0].get("classes", []) if chain else [outcome.get("error_type", "")]
    found = classify_error(classes)
    failure = Failure(layer=found.layer, reason=str(outcome.get("error") or "-"),
                      next_step=found.next_step, step=outcome.get("step"),
                      error_type=outcome.get("error_type"))
    return found.status, failure


def _conditions(profile: Mapping[str, Any]) -> dict[str, Any]:
    found = profile.get("conditions") or {}
    shots = found.get("snapshots") or []
    return {"summary": found.get("summary"),
            "before": shots[0] if shots else None, "after": shots[-1] if shots else None,
            "compiled_cache": found.get("compiled_cache"),
            "snapshots": len(shots)} if found else {}


def _placement(plan: Mapping[str, Any]) -> dict[str, Any]:
    found = {}
    for stage in plan.get("stages") or []:
        row = {"candidates": stage.get("candidates")}
        for key in ("placement_decision", "measurement", "comparison"):
            if key in stage:
                row[key] = stage[key]
        found[str(stage["id"])] = row
    return found


def _memory_notes(performance: Mapping[str, Any]) -> list[str]:
    notes = []
    for stage, pools in ((performance.get("memory_told_apart") or {}).get("pools")
                         or {}).items():
        for pool, row in pools.items():
            if row.get("runtime_over_demand"):
                peak = row.get("runtime_peak_bytes") or row.get("peak_bytes") or 0
                notes.append(f"runtime peak over the declared demand: stage {stage} {pool} "
                             f"{peak / 2**20:.0f} MiB > {row['demand_bytes'] / 2**20:.0f} MiB")
            elif row.get("observation") == "unobserved":
                notes.append(f"stage {stage} {pool}: unobserved (not counted as within its "
                             "demand)")
    return notes


def record_from_profile(profile: Mapping[str, Any], *, profile_path: str | None = None,
                        labels: Mapping[str, str | None] | None = None,
                        targets: Sequence[str] | None = None,
                        targets_origin: str | None = None) -> QualificationRecord:
    """The record of the cell a profile measured.

    Args:
        profile: a profile written by ``edge profile`` (``edge.profile/1`` or ``/2``).
        profile_path: where it was read from (kept in ``source``).
        labels: ``device`` / ``model`` / ``configuration`` to override the cell labels.
        targets: product targets to judge performance by, instead of the profile's.
        targets_origin: where ``targets`` came from (kept in the verdict).

    Raises:
        RecordInvalid: not a profile, one without an outcome, or a target that does not
            parse.
    """
    if profile.get("schema") not in _PROFILE_SCHEMAS:
        raise RecordInvalid("schema", f"must be one of {list(_PROFILE_SCHEMAS)}",
                            profile.get("schema"))
    outcome = profile.get("outcome")
    if not isinstance(outcome, Mapping):
        raise RecordInvalid("outcome", "must be an object", outcome)
    host = profile.get("host") or {}
    plan = profile.get("plan") or {}
    stages = plan.get("stages") or []
    given = _labels(labels)
    functional: dict[str, Any] = {"stages": {s["id"]: _stage_functional(s) for s in stages},
                                  "complete_model": bool(stages) and all(
                                      s.get("evidence") == "complete-model" for s in stages)}
    config = profile.get("config") or {}
    configured = config.get("stages") or []
    kinds = sorted({str(v["target"]) for v in functional["stages"].values()}
                   or {str((s.get("placement") or {}).get("target")) for s in configured})
    backends = sorted({str(s.get("backend")) for s in stages or configured})
    pipeline_file = str(profile.get("pipeline_file", ""))
    model = plan.get("pipeline") or config.get("name") or Path(pipeline_file).stem
    cell = Cell(
        device=given.get("device") or f"{host.get('cpu_model', 'unknown')} "
        f"({host.get('os', '?')} {host.get('machine', '?')})",
        model=given.get("model") or model or "unknown",
        configuration=given.get("configuration")
        or (f"{'+'.join(backends)} / {'+'.join(kinds)}" if backends else "unknown"),
    )
    run_failure = None if outcome.get("ok") else _from_outcome(outcome)
    performance = _performance(profile) if profile.get("baseline") else {}
    if targets is None:
        targets, targets_origin = list(profile.get("targets") or []), (
            "the profile (the pipeline's targets and edge profile --targets)")
    fverdict, fstatus = functional_verdict(functional, run_failure[1] if run_failure else None)
    verdicts = {
        "functional": fverdict,
        "quality": quality_verdict((profile.get("baseline") or {}).get("quality")),
        "performance": performance_verdict(performance, targets,
                                           targets_origin or "--targets"),
        "reliability": reliability_verdict(profile),
    }
    status, failure, notes = decide(verdicts, fstatus, run_failure)
    if profile.get("schema") == "edge.profile/1":
        notes.append("a version 1 profile: no quality run, no operating conditions, no "
                     "matched untraced run after the traced one")
    if profile.get("schema") != "edge.profile/1" and not profile.get("traced"):
        asked = (profile.get("settings") or {}).get("startup_samples")
        why = ("--startup-samples 0" if asked == 0 else
               f"the run failed at {(profile.get('outcome') or {}).get('step')} first"
               if not (profile.get("outcome") or {}).get("ok", True) else "none recorded")
        notes.append(f"no traced run ({why}): no start-up phases, no tracer overhead")
    below = (performance.get("protocol") or {}).get("below")
    if below:
        notes.append(f"fewer than the protocol's {PROTOCOL_MIN_REQUESTS} requests: {below}")
    notes += _memory_notes(performance)
    argv = list((profile.get("command") or {}).get("argv") or [])
    identity = dict(profile.get("identity") or {})
    return QualificationRecord(
        status=status, cell=cell, created_at=str(profile.get("created_at")),
        source={"kind": "profile", "path": profile_path, "schema": profile.get("schema")},
        device={"host": host, "targets": kinds, "probes": profile.get("probes") or []},
        artifact={s["id"]: (s.get("worker") or {}).get("manifest") for s in stages},
        backend={s["id"]: {"backend": s.get("backend"), "plugin": s.get("plugin"),
                           "runtime": (s.get("worker") or {}).get("runtime"),
                           "route": s.get("route")} for s in stages},
        command={"argv": argv, "shell": shlex.join(argv) if argv else None,
                 "cwd": (profile.get("command") or {}).get("cwd"),
                 "pipeline_file": pipeline_file},
        execution_plan=plan or None,
        functional=functional,
        performance=performance,
        failure=failure, notes=tuple(notes), verdicts=verdicts,
        conditions=_conditions(profile), identity=identity, placement=_placement(plan),
    )
