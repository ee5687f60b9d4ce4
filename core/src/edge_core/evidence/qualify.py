"""Building a qualification record from a profile or from an AI Hub job record.

From a profile (``edge profile``): a failed run is classified by its error's class chain
(:func:`~edge_core.evidence.status.classify_error`); a completed run is PASS when every
stage ran entirely on its target and matched its reference, PARTIAL when a stage split
onto a fallback provider, COMPONENT when only some stages were compared against a
reference, PROFILE_ONLY when none was.

From an AI Hub job record (a JSON object; see docs/evidence.md for the fields): a hosted
job is never local deployment, so a successful job is at best COMPONENT (outputs compared
within bound) or else PROFILE_ONLY; a failed compile job is REJECTED, another failed job
FAILED, a missing prerequisite (token, device) BLOCKED. Layers the compiler *delegated*
to a compute unit are kept apart from anything observed to execute.
"""

from __future__ import annotations

import datetime
import shlex
from collections.abc import Mapping
from typing import Any

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status, classify_error

__all__ = ["record_from_hub_job", "record_from_profile"]


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
    targets = sorted({str(v["target"]) for v in functional["stages"].values()})
    backends = sorted({str(s.get("backend")) for s in stages})
    pipeline_file = str(profile.get("pipeline_file", ""))
    model = plan.get("pipeline") or pipeline_file.rsplit("/", 2)[-2:][0] or "unknown"
    cell = Cell(
        device=given.get("device") or f"{host.get('cpu_model', 'unknown')} "
        f"({host.get('os', '?')} {host.get('machine', '?')})",
        model=given.get("model") or model,
        configuration=given.get("configuration")
        or (f"{'+'.join(backends)} / {'+'.join(targets)}" if stages else "unknown"),
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
        device={"host": host, "targets": targets},
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


_SUCCESS = {"success", "succeeded", "completed", "complete", "done", "ok"}
_FAILED = {"failed", "failure", "error"}
_BLOCKED = {"blocked", "unavailable", "unauthorized", "no-device", "no-token"}


def _number(job: Mapping[str, Any], field: str) -> float | None:
    value = job.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordInvalid(field, "must be a number", value)
    return float(value)


def _hub_device(job: Mapping[str, Any]) -> dict[str, Any]:
    device = job.get("device")
    if isinstance(device, str) and device.strip():
        return {"name": device}
    if isinstance(device, Mapping) and str(device.get("name", "")).strip():
        return dict(device)
    raise RecordInvalid("device", "must be a name or an object with a name", device)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hub_performance(job: Mapping[str, Any]) -> dict[str, Any]:
    micro = _number(job, "inference_time_us")
    milli = _number(job, "inference_time_ms")
    if micro is None and milli is None:
        micro = _number(job, "estimated_inference_time")  # AI Hub reports microseconds
    inference_ms = milli if milli is not None else (micro / 1e3 if micro is not None else None)
    peak = job.get("peak_memory_bytes")
    if peak is not None and not (_is_int(peak) or (
            isinstance(peak, list | tuple) and len(peak) == 2 and all(map(_is_int, peak)))):
        raise RecordInvalid("peak_memory_bytes", "must be an integer or a [low, high] pair",
                            peak)
    return {"inference_time_ms": inference_ms,
            "peak_memory_bytes": list(peak) if isinstance(peak, list | tuple) else peak,
            "boundary": "as reported by the hosted profile job (on-device timing), "
                        "not measured by edge"}


def record_from_hub_job(job: Mapping[str, Any], *, job_path: str | None = None,
                        labels: Mapping[str, str | None] | None = None,
                        command: list[str] | None = None) -> QualificationRecord:
    """The record of a hosted AI Hub job record (never PASS or PARTIAL: not local).

    Raises:
        RecordInvalid: a field is missing or of the wrong type (named in the error).
    """
    if not isinstance(job, Mapping):
        raise RecordInvalid("job", "must be a JSON object", type(job).__name__)
    raw_status = job.get("status", job.get("job_status"))
    if not isinstance(raw_status, str):
        raise RecordInvalid("status", "must be a string", raw_status)
    state = raw_status.strip().lower()
    device = _hub_device(job)
    job_ids = job.get("job_ids") or {}
    if not isinstance(job_ids, Mapping):
        raise RecordInvalid("job_ids", "must be an object of job kind to id", job_ids)
    units = job.get("compute_units")
    if units is not None and not isinstance(units, Mapping | list):
        raise RecordInvalid("compute_units", "must be an object or a list", units)
    numerics = job.get("numerics")
    if numerics is not None and not isinstance(numerics, Mapping):
        raise RecordInvalid("numerics", "must be an object", numerics)
    given = _labels(labels)
    reason = str(job.get("failure_reason") or job.get("reason") or raw_status)
    failed_job = str(job.get("failed_job") or "")
    failure = None
    notes = ["hosted job on a cloud device: not evidence of local deployment"]
    if state in _SUCCESS:
        if numerics is None:
            status = Status.PROFILE_ONLY
            notes.append("no output comparison against a local reference")
        elif numerics.get("passed"):
            status = Status.COMPONENT
        else:
            status = Status.FAILED
            failure = Failure("numerics", f"outputs beyond bound: {dict(numerics)}",
                              "compare against the CPU reference; check the export's "
                              "quantisation", "inference", None)
    elif state in _FAILED:
        layer = failed_job or "hub-job"
        status = Status.REJECTED if failed_job == "compile" else Status.FAILED
        step = ("fix the export the compiler refused (ops, shapes), then compile again"
                if status is Status.REJECTED else
                f"open job {job_ids.get(failed_job) or '?'} in AI Hub and read its log")
        failure = Failure(layer, reason, step, failed_job or None, None)
    elif state in _BLOCKED:
        status = Status.BLOCKED
        failure = Failure("prerequisite", reason, "configure the AI Hub token "
                          "(QAIHUB_CLIENT_INI) or pick an available device "
                          "(`edge hub devices`)", None, None)
    else:
        raise RecordInvalid("status", f"unknown job status (success: {sorted(_SUCCESS)}, "
                            f"failed: {sorted(_FAILED)}, blocked: {sorted(_BLOCKED)})",
                            raw_status)
    created = job.get("created_at") or datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds")
    argv = list(command or [])
    return QualificationRecord(
        status=status,
        cell=Cell(device=given.get("device") or str(device["name"]),
                  model=given.get("model") or str(job.get("model") or "unknown"),
                  configuration=given.get("configuration")
                  or f"ai-hub {job.get('target_runtime') or 'job'}"),
        created_at=str(created),
        source={"kind": "ai-hub", "path": job_path, "job_ids": dict(job_ids)},
        device=device,
        artifact={"model": job.get("model"), "bundle": job.get("bundle"),
                  "model_id": job.get("model_id")},
        backend={"facility": "ai-hub", "target_runtime": job.get("target_runtime"),
                 "client": job.get("client_version")},
        command={"argv": argv, "shell": shlex.join(argv) if argv else None,
                 "hub_command": job.get("command")},
        execution_plan=None,
        functional={"numerics": dict(numerics) if numerics is not None else None,
                    "delegation_reported": {"compute_units": units, "observed": False,
                                            "note": "what the compiler assigned, not "
                                                    "observed execution"}},
        performance=_hub_performance(job) if state in _SUCCESS else {},
        failure=failure, notes=tuple(notes),
    )
