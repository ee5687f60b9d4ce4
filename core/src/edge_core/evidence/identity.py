"""The identity of the machine a profile ran on: OS, kernel, CPU, memory, Python."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

import psutil

__all__ = ["host_identity"]


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
