"""Probing the ``qnn`` backend: which QNN devices ONNX Runtime sees, and which SDK.

The probe runs in a child interpreter (the controller's own unless ``EDGE_QNN_PYTHON``
names another), so the controller never loads the QNN libraries itself. It starts as every
probe does (:func:`edge_core.host.probe_process.run_probe`): an allowlisted environment
plus :data:`PROBE_ENV_NAMES`, stdin closed, the working directory off ``sys.path``. The child
registers the EP library exactly as the worker does and lists ``get_ep_devices()``. Its
answer is kept per boot and per installed stack (:mod:`edge_core.host.probe_answers`):
a fresh ``edge probe`` does not start that interpreter again until something changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from edge_contracts.devices import RAM_POOL, DeviceDescriptor, DeviceKind, Integration
from edge_core.backend import ProbeReport
from edge_core.host.probe_answers import PROBE_CACHE_ENV, cached_probe
from edge_core.host.probe_process import DROP_CWD
from edge_core.pools import detect_execution_domain, host_cpu

__all__ = ["EP_NAME", "PROBE_ENV_NAMES", "PYTHON_ENV", "probe_interpreter", "probe_qnn",
           "report_from"]

EP_NAME = "QNNExecutionProvider"
#: Environment variable naming the interpreter to probe (default: the controller's).
PYTHON_ENV = "EDGE_QNN_PYTHON"
PROBE_TIMEOUT_S = 60.0
PROBE_ENV_NAMES: tuple[str, ...] = ("ADSP_LIBRARY_PATH",)
"""What the probe interpreter takes from the controller's environment besides the probe
allowlist (:mod:`edge_core.host.probe_process`): where the Hexagon DSP libraries are."""

# The first line drops sys.path[0] (the working directory, for ``-c``) before any
# import, so an ``onnxruntime.py`` in the folder edge was started from is never run.
_SCRIPT = DROP_CWD + """
import json
EP = "QNNExecutionProvider"
out = {}
try:
    import onnxruntime as ort
    out["onnxruntime"] = ort.__version__
    import onnxruntime_qnn as qnn
    out["onnxruntime-qnn"] = qnn.__version__
    from onnxruntime_qnn import build_and_package_info as info
    out["qnn_sdk"] = str(getattr(info, "qnn_version", "unknown"))
    ort.register_execution_provider_library(qnn.get_ep_name(), qnn.get_library_path())
    out["devices"] = [
        {"type": str(d.device.type).rsplit(".", 1)[-1], "vendor": d.device.vendor,
         "device_id": int(d.device.device_id), "ep_vendor": d.ep_vendor,
         "metadata": dict(d.device.metadata), "ep_metadata": dict(d.ep_metadata)}
        for d in ort.get_ep_devices() if d.ep_name == EP
    ]
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
print(json.dumps(out))
"""


def probe_interpreter() -> str:
    """The interpreter the probe asks: ``$EDGE_QNN_PYTHON`` or the controller's own."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def _device(entry: Mapping[str, Any]) -> DeviceDescriptor:
    kind = str(entry.get("type", "")).upper()
    if kind == "CPU":
        return host_cpu()
    return DeviceDescriptor(
        physical_id=f"qnn-{kind.lower() or 'device'}{int(entry.get('device_id', 0))}",
        kind=DeviceKind.GPU if kind == "GPU" else DeviceKind.NPU,
        name=f"QNN {kind or 'device'} ({entry.get('vendor') or 'unknown vendor'})",
        execution_domain=detect_execution_domain(),
        integration=Integration.INTEGRATED,
        pools=(RAM_POOL,),
    )


def report_from(backend: str, found: Mapping[str, Any], interpreter: str) -> ProbeReport:
    """Build the probe report from the child's JSON answer."""
    runtime = {k: str(found[k]) for k in ("onnxruntime", "onnxruntime-qnn", "qnn_sdk")
               if k in found}
    if "error" in found:
        return ProbeReport(backend=backend, available=False, runtime=runtime,
                           reason=f"QNN execution provider not usable in {interpreter}: "
                           f"{found['error']} (pip install onnxruntime-qnn)")
    devices = list(found.get("devices", []))
    if not devices:
        return ProbeReport(backend=backend, available=False, runtime=runtime,
                           reason=f"ONNX Runtime in {interpreter} registered the QNN library "
                           "but reports no QNN device")
    notes = [
        f"QNN EP device: type {d.get('type')}, vendor {d.get('vendor')}, "
        f"id {d.get('device_id')}" + (" (on x86_64 the HTP backend is the QNN simulator)"
                                      if d.get("type") == "CPU" else "")
        for d in devices
    ]
    simulated = all(str(d.get("type", "")).upper() == "CPU" for d in devices)
    limitation = ("HTP simulator: no Qualcomm NPU here, QNN simulates its HTP backend on "
                  "the CPU" if simulated else None)
    return ProbeReport(backend=backend, available=True, runtime=runtime, notes=notes,
                       devices=[_device(d) for d in devices], limitation=limitation)


def probe_qnn(backend: str) -> ProbeReport:
    """Ask the probe interpreter which QNN devices and versions ONNX Runtime sees."""
    interpreter = probe_interpreter()
    try:  # kept per boot and installed stack (edge_core.host.probe_answers)
        result, cached_at = cached_probe([interpreter, "-c", _SCRIPT], interpreter=interpreter,
                                         timeout_s=PROBE_TIMEOUT_S, declared=PROBE_ENV_NAMES)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ProbeReport(backend=backend, available=False,
                           reason=f"probe interpreter {interpreter} failed: {exc}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return ProbeReport(backend=backend, available=False,
                           reason=f"probe interpreter {interpreter} exited "
                           f"{result.returncode}: {tail}")
    report = report_from(backend, json.loads(lines[-1]), interpreter)
    if cached_at is not None:
        report = attrs.evolve(report, notes=(
            *report.notes, f"probe answer cached at {cached_at} (same interpreter, installed "
            f"packages, environment and boot; {PROBE_CACHE_ENV}=off asks afresh)"))
    return report
