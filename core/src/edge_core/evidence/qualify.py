"""Building a qualification record from a profile (AI Hub job records: :mod:`.hubjob`).

From a profile (``edge profile``): a failed run is classified by its error's class chain
(:func:`~edge_core.evidence.status.classify_error`); a completed run is PASS when every
stage ran entirely on its target and matched its reference, PARTIAL when a stage split
onto a fallback provider, COMPONENT when only some stages were compared against a
reference, PROFILE_ONLY when none was.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status, classify_error

__all__ = ["record_from_profile"]


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
    }


def _performance(profile: Mapping[str, Any]) -> dict[str, Any]:
    traced = profile.get("traced") or {}
    baseline = profile.get("baseline") or {}
    latency: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for group in baseline.get("groups") or []:
        for level in group.get("levels") or []:
            key = f"{group['name']}@c{level['concurrency']}"
            if level.get("status") != "measured":
                latency[key] = {"status": level.get("status"), "reason": level.get("reason")}
                continue
            latency[key] = {**level["summary"]["total"], "stages": level["summary"]["stages"],
                            "throughput_rps": level.get("throughput_rps"),
                            "wall_s": level.get("wall_s")}
            samples[key] = [s["total_s"] * 1e3 for s in level.get("samples") or []]
    memory = (baseline.get("memory") or {}).get("stages") or {}
    plan_stages = (profile.get("plan") or {}).get("stages") or []
    reserved = {s["id"]: s.get("reservation", {}).get("demands") for s in plan_stages}
    return {
        "startup": {
            "traced": {k: traced.get(k) for k in ("open", "stages", "first_output_s")},
            "warm_restart": traced.get("warm_restart"),
            "baseline_open_total_s": baseline.get("open_total_s"),
            "baseline_first_output_s": baseline.get("first_output_s"),
        },
        "latency": latency,
        "latency_samples_ms": samples,
        "memory": {sid: {"worker_tree_peak_rss_bytes": m.get("worker_tree_peak_rss_bytes"),
                         "reserved": reserved.get(sid)} for sid, m in memory.items()},
        "boundaries": profile.get("boundaries"),
    }


def _from_outcome(outcome: Mapping[str, Any]) -> tuple[Status, Failure]:
    chain = outcome.get("chain") or []
    classes = chain[0].get("classes", []) if chain else [outcome.get("error_type", "")]
    found = classify_error(classes)
    failure = Failure(layer=found.layer, reason=str(outcome.get("error") or "-"),
                      next_step=found.next_step, step=outcome.get("step"),
                      error_type=outcome.get("error_type"))
    return found.status, failure


def _classify_run(functional: Mapping[str, Any]) -> tuple[Status, list[str]]:
    stages = functional["stages"]
    checked = [sid for sid, s in stages.items() if s["evidence"] == "complete-model"]
    notes = []
    if not checked:
        return Status.PROFILE_ONLY, ["no stage was compared against a reference"]
    if len(checked) < len(stages):
        unchecked = sorted(set(stages) - set(checked))
        return Status.COMPONENT, [f"not compared against a reference: {unchecked}"]
    split = sorted(sid for sid, s in stages.items() if not s["on_target"])
    if split:
        notes.append(f"part of the graph ran off-target in stages {split}")
        return Status.PARTIAL, notes
    return Status.PASS, notes


def record_from_profile(profile: Mapping[str, Any], *, profile_path: str | None = None,
                        labels: Mapping[str, str | None] | None = None) -> QualificationRecord:
    """The record of the cell a profile measured.

    Args:
        profile: a profile written by ``edge profile`` (schema ``edge.profile/1``).
        profile_path: where it was read from (kept in ``source``).
        labels: ``device`` / ``model`` / ``configuration`` to override the cell labels.

    Raises:
        RecordInvalid: not a profile, or one without an outcome.
    """
    if profile.get("schema") != "edge.profile/1":
        raise RecordInvalid("schema", "must be 'edge.profile/1'", profile.get("schema"))
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
    targets = sorted({str(v["target"]) for v in functional["stages"].values()}
                     or {str((s.get("placement") or {}).get("target")) for s in configured})
    backends = sorted({str(s.get("backend")) for s in stages or configured})
    pipeline_file = str(profile.get("pipeline_file", ""))
    model = plan.get("pipeline") or config.get("name") or Path(pipeline_file).stem
    cell = Cell(
        device=given.get("device") or f"{host.get('cpu_model', 'unknown')} "
        f"({host.get('os', '?')} {host.get('machine', '?')})",
        model=given.get("model") or model or "unknown",
        configuration=given.get("configuration")
        or (f"{'+'.join(backends)} / {'+'.join(targets)}" if backends else "unknown"),
    )
    failure = None
    notes: list[str] = []
    if outcome.get("ok"):
        status, notes = _classify_run(functional)
    else:
        status, failure = _from_outcome(outcome)
    argv = list((profile.get("command") or {}).get("argv") or [])
    return QualificationRecord(
        status=status, cell=cell, created_at=str(profile.get("created_at")),
        source={"kind": "profile", "path": profile_path, "schema": profile.get("schema")},
        device={"host": host, "targets": targets, "probes": profile.get("probes") or []},
        artifact={s["id"]: (s.get("worker") or {}).get("manifest") for s in stages},
        backend={s["id"]: {"backend": s.get("backend"), "plugin": s.get("plugin"),
                           "runtime": (s.get("worker") or {}).get("runtime"),
                           "route": s.get("route")} for s in stages},
        command={"argv": argv, "shell": shlex.join(argv) if argv else None,
                 "cwd": (profile.get("command") or {}).get("cwd"),
                 "pipeline_file": pipeline_file},
        execution_plan=plan or None,
        functional=functional,
        performance=_performance(profile) if outcome.get("ok") else {},
        failure=failure, notes=tuple(notes),
    )
