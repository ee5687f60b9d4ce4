"""A qualification record from an AI Hub job record.

Two shapes are read: the evidence record ``edge hub`` writes (``kind:
"edge-hub-evidence"``), and a flat job record (``status``, ``device``, ``job_ids``,
``compute_units``, ``inference_time_us`` / ``inference_time_ms`` /
``estimated_inference_time`` in microseconds, ``peak_memory_bytes``, optional
``numerics``, ``failed_job``, ``failure_reason``; see docs/evidence.md).

A hosted job is never local deployment, so a successful job is at best COMPONENT
(outputs compared within bound) or else PROFILE_ONLY; a failed compile job is REJECTED,
another failed job FAILED, a failure before any job was submitted (token, device) or an
explicit ``blocked`` status BLOCKED. Layers the compiler *delegated* to a compute unit
are kept apart from anything observed to execute.
"""

from __future__ import annotations

import datetime
import shlex
from collections.abc import Mapping
from typing import Any

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status

__all__ = ["normalise_hub_evidence", "record_from_hub_job"]


def _labels(overrides: Mapping[str, str | None] | None) -> dict[str, str]:
    return {k: v for k, v in (overrides or {}).items() if v}


def normalise_hub_evidence(record: Mapping[str, Any]) -> dict[str, Any]:
    """The flat job record equivalent to an ``edge hub`` evidence record."""
    jobs = dict(record.get("jobs") or {})
    state = str(record.get("status"))
    comparison = (record.get("execution") or {}).get("comparison")
    delegation = record.get("delegation") or {}
    bundle = dict(record.get("bundle") or {})
    job: dict[str, Any] = {
        "device": record.get("device"), "job_ids": jobs,
        "model": bundle.get("component"), "bundle": bundle,
        "target_runtime": record.get("compile_options"),
        "compute_units": delegation.get("by_compute_unit"),
        "estimated_inference_time": record.get("estimated_inference_time_us"),
        "peak_memory_bytes": record.get("peak_memory_bytes"),
        "numerics": comparison, "created_at": record.get("created"),
        "client_version": (record.get("hub") or {}).get("client"),
        "command": f"edge hub {record.get('command')}",
        "failure_reason": record.get("error"),
    }
    if state == "passed":
        job["status"] = "success"
    elif comparison is not None and not comparison.get("passed"):
        job["status"] = "success"  # the jobs ran; the comparison failed (FAILED numerics)
    elif not jobs:
        job["status"] = "blocked"  # refused before any job was submitted
    else:
        job["status"] = "failed"
        job["failed_job"] = next(reversed(jobs))
    return job


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
    if job.get("kind") == "edge-hub-evidence":
        job = normalise_hub_evidence(job)
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
        failure=failure, notes=tuple(notes), verdicts=_verdicts(status, failure),
    )


def _verdicts(status: Status, failure: Failure | None) -> dict[str, Any]:
    """A hosted job's verdicts: never local deployment, so at most components are judged."""
    hosted = "a hosted job: not evidence of local deployment"
    if failure is not None and status is not Status.BLOCKED:
        functional = {"verdict": "failed", "layer": failure.layer, "basis": failure.reason}
    elif status is Status.COMPONENT:
        functional = {"verdict": "unjudged", "basis": "a hosted component matched the local "
                      "reference: " + hosted}
    else:
        functional = {"verdict": "unjudged", "basis": hosted}
    return {"functional": functional,
            "quality": {"verdict": "unjudged", "basis": "no golden set runs on a hosted job"},
            "performance": {"verdict": "unjudged", "basis": "the hosted service's own "
                            "figures, judged against no product target"},
            "reliability": {"verdict": "unjudged", "basis": hosted}}
