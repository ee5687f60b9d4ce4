"""Evidence records of AI Hub runs: plain JSON dictionaries written as files.

A record says what the hosted service did with one bundle on one device. It is never
evidence of local deployment. Labels:

- ``COMPONENT``: the component ran on the hosted device and its outputs matched the
  local reference within the bound (execution evidence, for that device only).
- ``PROFILE_ONLY``: anything less (compiled, profiled, or outputs absent or out of
  bound). Per-layer delegation ("all layers on the NPU") is the compiler's plan as
  reported by the profiler; it is recorded under ``delegation`` and is not execution
  evidence.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "COMPONENT",
    "NOT_LOCAL",
    "PROFILE_ONLY",
    "delegation",
    "label_for",
    "new_record",
    "write_record",
]

COMPONENT = "COMPONENT"
PROFILE_ONLY = "PROFILE_ONLY"
NOT_LOCAL = ("AI Hub ran this bundle on a hosted device; this record is not evidence of "
             "deployment on this machine or on any device the record does not name")


def new_record(command: str, bundle: Mapping[str, Any], device: Mapping[str, Any],
               api_url: str, client_version: str) -> dict[str, Any]:
    """A fresh record: status ``running`` until :func:`label_for` and the caller finish it."""
    return {
        "kind": "edge-hub-evidence",
        "schema": 1,
        "command": command,
        "label": PROFILE_ONLY,
        "status": "running",
        "not_local_deployment": True,
        "note": NOT_LOCAL,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "bundle": dict(bundle),
        "device": dict(device),
        "hub": {"api_url": api_url, "client": "qai-hub " + client_version},
        "jobs": {},
        "compile_options": None,
        "delegation": None,
        "layers": [],
        "estimated_inference_time_us": None,
        "peak_memory_bytes": None,
        "execution": {"evidence": "none", "comparison": None},
        "error": None,
    }


def delegation(layers: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Layer counts per compute unit, as the profiler reports the compiled plan."""
    counts: dict[str, int] = {}
    for layer in layers:
        unit = str(layer.get("compute_unit", "UNSPECIFIED"))
        counts[unit] = counts.get(unit, 0) + 1
    return {
        "layers": len(layers),
        "by_compute_unit": counts,
        "all_on_npu": bool(layers) and set(counts) == {"NPU"},
        "note": "the compiler's placement as profiled; not evidence that outputs are right",
    }


def label_for(record: Mapping[str, Any]) -> str:
    """``COMPONENT`` only for a passing comparison of hosted outputs; else ``PROFILE_ONLY``."""
    comparison = (record.get("execution") or {}).get("comparison") or {}
    passed = record.get("status") == "passed" and comparison.get("passed") is True
    return COMPONENT if passed else PROFILE_ONLY


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "record"


def write_record(record: Mapping[str, Any], directory: Path) -> Path:
    """Write ``record`` atomically as ``<component>-<command>-<job>.json`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    jobs = record.get("jobs") or {}
    last = next(reversed(jobs.values()), "nojob") if jobs else "nojob"
    component = str((record.get("bundle") or {}).get("component", "bundle"))
    name = _safe(f"{component}-{record.get('command')}-{last}") + ".json"
    fd, temporary = tempfile.mkstemp(prefix=".edge-hub-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2, default=str)
            handle.write("\n")
        target = directory / name
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
