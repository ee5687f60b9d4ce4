"""Which ``onnxruntime`` distributions an interpreter has, found without importing any.

``onnxruntime``, ``onnxruntime-gpu``, ``onnxruntime-directml``, ``onnxruntime-qnn`` and
vendor builds all install the same ``onnxruntime`` package and overwrite each other's
files: with two of them installed, which one runs depends on installation order. The
controller never forces one; it reports what it finds, and warns when there are several.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from edge_core.host.probe_process import run_probe
from edge_core.installed import distribution_folder, installed_versions, recorded_files

__all__ = [
    "KNOWN_DISTRIBUTIONS",
    "conflict_note",
    "installed_distributions",
    "ships_onnxruntime_package",
]

KNOWN_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-openvino",
    "onnxruntime-vitisai",
    "onnxruntime-training",
)

_SCRIPT = """
import json
from importlib.metadata import PackageNotFoundError, version
found = {}
for name in NAMES:
    try:
        found[name] = version(name)
    except PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def installed_distributions(interpreter: str | None = None, timeout_s: float = 10.0, *,
                            env_names: Sequence[str] = ()) -> dict[str, str]:
    """Distribution name → version for every known ORT distribution installed.

    Another interpreter runs isolated (``-I``) as a probe
    (:func:`edge_core.host.probe_process.run_probe`): the allowlisted environment plus
    ``env_names``, stdin closed.

    Args:
        interpreter: Another Python to ask (in a subprocess); ``None`` asks this one.
        timeout_s: Bound on the subprocess.
        env_names: Names (or ``PREFIX*``) the subprocess takes from this environment.

    Raises:
        subprocess.CalledProcessError: the interpreter exited with a failure.
        subprocess.TimeoutExpired: it ran past ``timeout_s``.
        OSError: it cannot be started.
    """
    if interpreter is None or interpreter == sys.executable:
        # read from the metadata folders: importlib.metadata costs every fresh ``edge``
        return installed_versions(KNOWN_DISTRIBUTIONS)
    script = _SCRIPT.replace("NAMES", repr(KNOWN_DISTRIBUTIONS))
    result = run_probe([interpreter, "-I", "-c", script], timeout_s=timeout_s,
                       declared=env_names)
    result.check_returncode()
    loaded: dict[str, str] = json.loads(result.stdout)
    return loaded


def ships_onnxruntime_package(name: str, interpreter: str | None = None) -> bool:
    """False for a distribution whose recorded files hold no ``onnxruntime`` package.

    ``onnxruntime-qnn`` 2.x installs only ``onnxruntime_qnn`` (the QNN plugin EP library)
    and depends on ``onnxruntime``; it coexists with it. Only this interpreter's records
    are read: for another interpreter, or without a file record, the answer is True.
    """
    if interpreter not in (None, sys.executable):
        return True
    folder = distribution_folder(name)
    files = recorded_files(folder) if folder is not None else None
    if files is None:
        return True
    return any(str(f).replace("\\", "/") == "onnxruntime/__init__.py" for f in files)


def conflict_note(found: dict[str, str], interpreter: str) -> str | None:
    """A warning when several distributions provide ``onnxruntime`` in one interpreter."""
    found = {n: v for n, v in found.items() if ships_onnxruntime_package(n, interpreter)}
    if len(found) < 2:
        return None
    listed = ", ".join(f"{name} {version}" for name, version in sorted(found.items()))
    return (
        f"several onnxruntime distributions are installed in {interpreter}: {listed}; they "
        "overwrite each other's 'onnxruntime' package, so which one runs depends on the "
        "order they were installed in; keep exactly one per environment (use a route to a "
        "separate interpreter for each)"
    )
