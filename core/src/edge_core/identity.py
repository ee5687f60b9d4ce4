"""Identities: of the machine (OS, kernel, CPU, memory, Python) and of the stack that serves.

:func:`host_identity` names the machine a profile or record ran on. :func:`runtime_identity`
names everything below a pipeline's configuration that a measurement depends on: edge-core's
version, the machine, and per backend its plugin distribution, the runtime versions its
probe reports (ONNX Runtime builds, EP libraries, SDKs, a driver where a probe reports one)
and the identities of the devices it would place work on. It is the one function both the
stored placement decisions and the evidence records use, so that "the same stack" means the
same thing to both; :func:`identity_digest` turns any such identity into a stable key.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from edge_core import __version__
from edge_core.binding import backend_table
from edge_core.plugins import PluginSet

__all__ = ["MACHINE_KEYS", "host_identity", "identity_digest", "runtime_identity"]

MACHINE_KEYS = ("os", "os_release", "machine", "cpu_model", "logical_cpus", "usable_cpus",
                "memory_bytes", "python", "python_implementation")
"""The parts of :func:`host_identity` a measurement depends on (the kernel's build string
and the distribution's name are left out: they change without changing the stack)."""


def _os_release() -> str | None:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip().strip('"')
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_identity() -> dict[str, Any]:
    """What identifies this machine for a qualification record (no user or host names)."""
    return {
        "os": platform.system(),
        "os_release": platform.release(),
        "os_version": platform.version(),
        "distribution": _os_release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
    }


def runtime_identity(plugins: PluginSet, backends: Iterable[str], *,
                     timeout_s: float = 10.0) -> dict[str, Any]:
    """The identity of the stack the named backends run on, as their probes see it now.

    Returns ``{"edge_core": version, "machine": {...}, "backends": {name: {...}}}``; per
    backend: ``plugin``, ``distribution``, ``version``, ``available``, ``runtime`` (the
    probe's runtime versions), ``devices`` (their full descriptors) and, when the probe
    failed, ``probe_error``. A backend no installed plugin declares is
    ``{"installed": False}``. Probes are the cheap, cached ones of ``edge probe``
    (:meth:`PluginSet.probe`); nothing here imports a runtime.
    """
    host = host_identity()
    table = backend_table(plugins)
    found: dict[str, Any] = {}
    for name in sorted(set(backends)):
        owner = table.get(name)
        if owner is None:
            found[name] = {"installed": False}
            continue
        record = plugins.record(owner[1])
        entry: dict[str, Any] = {"plugin": owner[1], "distribution": record.distribution,
                                 "version": record.version}
        answer = plugins.probe(owner[1], timeout_s=timeout_s)
        if answer.error:
            entry["probe_error"] = answer.error
        report = next((r for r in answer.result or () if getattr(r, "backend", None) == name),
                      None)
        entry["available"] = bool(report is not None and report.available)
        entry["runtime"] = dict(report.runtime) if report is not None else {}
        entry["devices"] = ([d.to_dict() for d in report.devices] if report is not None
                            else [])
        found[name] = entry
    return {"edge_core": __version__, "machine": {k: host[k] for k in MACHINE_KEYS},
            "backends": found}


def identity_digest(identity: Mapping[str, Any]) -> str:
    """A stable sha256 of a JSON-ready identity (keys sorted, no whitespace)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
