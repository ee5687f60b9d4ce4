"""Identities: of the machine (OS, kernel, CPU, memory, Python) and of the stack that serves.

:func:`host_identity` names the machine a profile or record ran on. :func:`runtime_identity`
names everything below a pipeline's configuration that a measurement depends on: edge-core's
version, the machine, and per backend its plugin distribution, the runtime versions its
probe reports (ONNX Runtime builds, EP libraries, SDKs, a driver where a probe reports one)
and the identities of the devices it would place work on. It is the one function both the
stored placement decisions and the evidence records use, so that "the same stack" means the
same thing to both; :func:`identity_digest` turns any such identity into a stable key.

:func:`package_inventory` lists what an environment has installed (the controller's, or a
route interpreter's) and :func:`source_revision` the git commit edge-core runs from: the
evidence records carry both, beside (not inside) the runtime identity, whose digest must
not change when an unrelated package does. A stage routed to another interpreter (a
vendor environment) runs whatever that environment has installed, so
``runtime_identity(..., interpreters=...)`` includes each route interpreter's inventory,
read from its ``site-packages`` without running it (``package_inventory(...,
from_disk=True)``): a stored placement decision is made again when it changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from edge_core import __version__
from edge_core.binding import backend_table
from edge_core.plugins import PluginSet

__all__ = ["MACHINE_KEYS", "host_identity", "identity_digest", "package_inventory",
           "runtime_identity", "source_revision"]

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
                     timeout_s: float = 10.0,
                     interpreters: Iterable[str | os.PathLike[str]] = (),
                     max_age_s: float = 30.0) -> dict[str, Any]:
    """The identity of the stack the named backends run on, as their probes see it now.

    Returns ``{"edge_core": version, "machine": {...}, "backends": {name: {...}}}``; per
    backend: ``plugin``, ``distribution``, ``version``, ``available``, ``runtime`` (the
    probe's runtime versions), ``devices`` (their full descriptors) and, when the probe
    failed, ``probe_error``. A backend no installed plugin declares is
    ``{"installed": False}``. Probes are the cheap, cached ones of ``edge probe``
    (:meth:`PluginSet.probe`: an answer ``plugins`` got within ``max_age_s`` is reused);
    nothing here imports a runtime. With ``interpreters`` (the
    stages' route interpreters) it also holds ``"interpreters": {path:
    package_inventory(path, from_disk=True)}``; without, the identity is as before.
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
        answer = plugins.probe(owner[1], timeout_s=timeout_s, max_age_s=max_age_s)
        if answer.error:
            entry["probe_error"] = answer.error
        report = next((r for r in answer.result or () if getattr(r, "backend", None) == name),
                      None)
        entry["available"] = bool(report is not None and report.available)
        entry["runtime"] = dict(report.runtime) if report is not None else {}
        entry["devices"] = ([d.to_dict() for d in report.devices] if report is not None
                            else [])
        found[name] = entry
    identity: dict[str, Any] = {"edge_core": __version__,
                                "machine": {k: host[k] for k in MACHINE_KEYS},
                                "backends": found}
    routes = sorted({str(p) for p in interpreters})
    if routes:
        identity["interpreters"] = {p: package_inventory(p, from_disk=True) for p in routes}
    return identity


def identity_digest(identity: Mapping[str, Any]) -> str:
    """A stable sha256 of a JSON-ready identity (keys sorted, no whitespace)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_INVENTORY_SCRIPT = (
    "import importlib.metadata as m, json, sys\n"
    "found = {}\n"
    "for d in m.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name: found[name] = d.version\n"
    "json.dump({'python': sys.version.split()[0], 'packages': found}, sys.stdout)\n"
)


_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(?:-py[^-]*)?"
                        r"\.(?:dist-info|egg-info)$")


def _site_packages(interpreter: Path) -> list[Path]:
    """The ``site-packages`` folders of the environment ``interpreter`` belongs to."""
    found: list[Path] = []
    # bin/python (POSIX venv or prefix), Scripts/python.exe (Windows venv), python.exe
    for prefix in dict.fromkeys((interpreter.parent.parent, interpreter.parent)):
        found += sorted(prefix.glob("lib/python*/site-packages"))
        found += sorted(prefix.glob("lib64/python*/site-packages"))
        found += [p for p in (prefix / "Lib" / "site-packages",) if p.is_dir()]
        if found:
            break
    unique: dict[str, Path] = {}
    for folder in found:  # lib64 is often a link to lib: keep the first name
        unique.setdefault(os.path.realpath(folder), folder)
    return list(unique.values())


def _metadata_name(info: Path) -> str | None:
    """The ``Name:`` a ``.dist-info``/``.egg-info`` declares (its first lines only)."""
    for member in ("METADATA", "PKG-INFO"):
        try:
            with (info / member).open(encoding="utf-8", errors="replace") as handle:
                for _, line in zip(range(40), handle, strict=False):
                    if line.startswith("Name:"):
                        return line.partition(":")[2].strip() or None
        except OSError:
            continue
    return None


def _disk_inventory(interpreter: str) -> dict[str, Any]:
    """What ``interpreter``'s environment has installed, read from disk (never run)."""
    folders = _site_packages(Path(interpreter))
    packages: dict[str, str] = {}
    for folder in folders:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            match = _DIST_INFO.match(entry.name)
            if match is not None:
                name = _metadata_name(entry) or match["name"].replace("_", "-")
                packages.setdefault(name, match["version"])
    return {"interpreter": interpreter, "site_packages": [str(f) for f in folders],
            "packages": dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))}


def package_inventory(interpreter: str | os.PathLike[str] | None = None, *,
                      timeout_s: float = 30.0, from_disk: bool = False) -> dict[str, Any]:
    """The distributions installed for an interpreter: name → version, sorted by name.

    ``interpreter`` ``None`` reads this process's own environment (the controller's);
    another interpreter (a route's) is asked in a child process started in isolated mode
    (``-I``: no user site, no ``PYTHONPATH``), so it lists what that environment has
    installed. Returns ``{"interpreter", "python", "packages"}``, or ``{"interpreter",
    "error"}`` when the child failed or gave no answer within ``timeout_s``. With
    ``from_disk`` the interpreter is never started: its environment's ``site-packages``
    (a venv's or a prefix's, POSIX or Windows layout) are read instead, and the answer is
    ``{"interpreter", "site_packages", "packages"}`` (empty lists where there is none) —
    what a stored placement decision keys on, since a vendor environment may be slow, or
    broken, to start.
    """
    import importlib.metadata
    import subprocess

    if interpreter is not None:
        interpreter = str(interpreter)
        if from_disk:
            return _disk_inventory(interpreter)
    if interpreter is None:
        found: dict[str, str] = {}
        for dist in importlib.metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                found[str(name)] = dist.version
        return {"interpreter": "controller", "python": sys.version.split()[0],
                "packages": dict(sorted(found.items(), key=lambda kv: kv[0].lower()))}
    try:
        done = subprocess.run([interpreter, "-I", "-c", _INVENTORY_SCRIPT],
                              capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"interpreter": interpreter, "error": f"{type(exc).__name__}: {exc}"}
    try:
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("packages"), dict):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return {"interpreter": interpreter,
                "error": f"exit status {done.returncode}: {tail[0][:300]}"}
    packages = {str(k): str(v) for k, v in answer["packages"].items()}
    return {"interpreter": interpreter, "python": str(answer.get("python")),
            "packages": dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))}


def source_revision(start: str | os.PathLike[str] | None = None, *,
                    timeout_s: float = 10.0) -> dict[str, Any]:
    """The source revision of edge-core when it runs from a git checkout.

    Looks for a ``.git`` (a directory, or a worktree's file) above ``start`` (default:
    this package's directory). Returns ``{"vcs": "git", "commit", "dirty"}`` (``dirty``:
    tracked files differ from the commit), or ``{"vcs": None, "reason"}`` when edge-core
    was installed from a wheel, or git is missing or failed. No path is recorded.
    """
    import shutil
    import subprocess

    here = Path(start) if start is not None else Path(__file__).resolve().parent
    root = next((p for p in (here, *here.parents) if (p / ".git").exists()), None)
    if root is None:
        return {"vcs": None, "reason": "not running from a checkout (no .git above the "
                "package)"}
    git = shutil.which("git")
    if git is None:
        return {"vcs": None, "reason": "a checkout, but no git on PATH to read it"}
    try:
        head = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL)
        status = subprocess.run([git, "-C", str(root), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"vcs": None, "reason": f"git failed: {type(exc).__name__}: {exc}"}
    commit = head.stdout.strip()
    if head.returncode != 0 or not commit:
        return {"vcs": None, "reason": f"git rev-parse failed: {head.stderr.strip()[:300]}"}
    return {"vcs": "git", "commit": commit,
            "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
