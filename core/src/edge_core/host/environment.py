"""The environment a worker starts with: an allowlist, never the controller's whole one.

A worker runs code that reads its environment (its runtime, the interpreter itself), and
``/proc/<pid>/environ`` shows that environment to every process of the same user for the
worker's whole life. So :func:`worker_environment` builds it from four sources only:

1. the names any interpreter needs (:data:`INTERPRETER_NAMES`: ``PATH``, ``HOME``,
   ``TMPDIR``, the locale, the dynamic loader's path ...), copied from the source
   environment when set;
2. the names edge-core's own worker code reads (:data:`EDGE_WORKER_NAMES`:
   ``EDGE_COPY_THREADS``, ``EDGE_HEAP``, ``EDGE_SHM_HUGE``, ``EDGE_SPIN_US``), and the
   names by which a user turns a runtime's data collection off or on
   (:data:`OPT_OUT_NAMES`: ``ORT_DISABLE_TELEMETRY``, ``DO_NOT_TRACK``), copied as given;
   where the source does not set one of :data:`OPT_OUT_DEFAULTS` it is set as there:
   ONNX Runtime's telemetry uploader is off in edge-core's workers and probes unless
   the user sets ``ORT_DISABLE_TELEMETRY`` themselves (``0`` turns it on);
3. the names the backend declares its workers need (``WorkerStage.worker_env_names``,
   e.g. ``VLLM_*``), copied when set, plus values the backend sets itself;
4. the route's own ``env`` (from the pipeline file), set as given.

``PYTHONPATH`` is built, not copied: the private staging directory of a foreign
interpreter, then the route's ``python_path``, then (same interpreter only) the
controller's own ``PYTHONPATH``. Nothing else passes; in particular no ``PYTHON*``
variable other than those listed (``PYTHONSTARTUP``, ``PYTHONINSPECT``,
``PYTHONHOME`` ... would change what the worker's interpreter runs), and no secret: the
boot configuration travels over the worker's private socket, not the environment.

A declared name ending in ``*`` is a prefix (``VLLM_*``); any other is exact.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from edge_contracts.copy_env import COPY_THREADS_ENV
from edge_contracts.heap import HEAP_ENV
from edge_contracts.hugepages import HUGE_ENV
from edge_contracts.waiting import SPIN_ENV
from edge_core.host.errors import RouteRefused

__all__ = [
    "EDGE_WORKER_NAMES",
    "INTERPRETER_NAMES",
    "INTERPRETER_PREFIXES",
    "OPT_OUT_DEFAULTS",
    "OPT_OUT_NAMES",
    "check_env_names",
    "worker_environment",
]

INTERPRETER_NAMES: frozenset[str] = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TZ", "TERM", "LANG", "LANGUAGE",
    "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "XDG_CACHE_HOME",
    "XDG_RUNTIME_DIR", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
    # Windows: what the C runtime and the interpreter need to start at all
    "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "PATHEXT", "USERPROFILE",
    "APPDATA", "LOCALAPPDATA", "PROGRAMDATA", "NUMBER_OF_PROCESSORS",
})
"""Variables an interpreter and its C libraries need; passed when set."""

INTERPRETER_PREFIXES: tuple[str, ...] = ("LC_",)
"""Prefixes of such variables (the locale categories)."""

EDGE_WORKER_NAMES: frozenset[str] = frozenset({COPY_THREADS_ENV, HEAP_ENV, HUGE_ENV, SPIN_ENV})
"""Variables edge-core's own worker code (``edge_contracts``) reads."""

OPT_OUT_NAMES: frozenset[str] = frozenset({"ORT_DISABLE_TELEMETRY", "DO_NOT_TRACK"})
"""Variables by which a user turns a runtime's data collection off (ONNX Runtime's
telemetry uploader, read as it initializes; the common ``DO_NOT_TRACK``); passed when set."""

OPT_OUT_DEFAULTS: Mapping[str, str] = MappingProxyType({"ORT_DISABLE_TELEMETRY": "1"})
"""Set where the source environment does not set the name (a user's own value wins).

ONNX Runtime's official Linux wheels (1.32's, read and measured) start a telemetry
uploader as ``onnxruntime`` is imported, on by default: a thread that keeps a store
(``~/.cache/Microsoft/DeveloperTools/.onnxruntime``) and sends its events to
Microsoft's collector. edge-core's workers and probes run the models a user
gave them on their own machine; they do so with the uploader off, as the library's
``ORT_DISABLE_TELEMETRY=1`` says, unless the user sets that variable themselves. Off,
its import starts no thread, which is also what lets a warm pool's zygote import it
(:func:`edge_core.host.zygote.pre_imports`)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")


def check_env_names(names: Iterable[str], field: str) -> tuple[str, ...]:
    """Return ``names`` as a tuple; each a variable name, or a prefix ending in ``*``.

    Raises:
        RouteRefused: naming ``field[index]`` for a name that is neither.

    """
    checked = tuple(names)
    for index, name in enumerate(checked):
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise RouteRefused(f"{field}[{index}]", "must be NAME or PREFIX*", name)
    return checked


def _wanted(declared: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    exact = set(INTERPRETER_NAMES | EDGE_WORKER_NAMES | OPT_OUT_NAMES)
    prefixes = list(INTERPRETER_PREFIXES)
    for name in declared:
        if name.endswith("*"):
            prefixes.append(name[:-1])
        else:
            exact.add(name)
    return frozenset(exact), tuple(prefixes)


def worker_environment(
    source: Mapping[str, str],
    *,
    declared: Iterable[str] = (),
    values: Mapping[str, str] | None = None,
    route_env: Mapping[str, str] | None = None,
    python_path: Iterable[str | Path] = (),
    inherit_python_path: bool = True,
) -> dict[str, str]:
    """Build a worker's environment from the allowlist (see the module docstring).

    Args:
        source: the environment names are copied from (the controller's, usually).
        declared: names (or ``PREFIX*``) the backend's workers need from ``source``.
        values: variables the backend sets for its workers.
        route_env: the route's own variables, set last.
        python_path: directories put first on ``PYTHONPATH``.
        inherit_python_path: append ``source``'s ``PYTHONPATH`` (same interpreter only).

    """
    exact, prefixes = _wanted(declared)
    env = {
        name: value
        for name, value in source.items()
        if name in exact or (prefixes and name.startswith(prefixes))
    }
    for name, value in OPT_OUT_DEFAULTS.items():
        env.setdefault(name, value)
    env.update(values or {})
    env.update(route_env or {})
    paths = [str(p) for p in python_path]
    if inherit_python_path and source.get("PYTHONPATH"):
        paths.append(source["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    return env
