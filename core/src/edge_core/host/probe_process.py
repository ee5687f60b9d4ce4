"""Probe subprocesses: short-lived helpers started as workers are, minus the channel.

Besides its workers, edge-core and its plugins start short helper processes to look at
the machine without loading a runtime in the controller: a Python interpreter that lists
ONNX Runtime's devices or installed distributions, ``nvidia-smi``, a fresh interpreter that
loads a plugin. Such a probe runs code that reads its environment just as a worker does,
and ``/proc/<pid>/environ`` shows that environment to every process of the same user. So
:func:`run_probe` starts every probe the same way:

- its environment is the workers' allowlist (:func:`edge_core.host.environment
  .worker_environment`): the names an interpreter needs, edge-core's own worker names,
  plus the names *that probe* declares it needs (a module-level ``*_ENV_NAMES`` tuple
  next to the probe, as a worker stage declares ``worker_env_names``) and values it sets;
  nothing else of the controller's environment — no credential, no ``PYTHONSTARTUP``;
- its standard input is closed (``/dev/null``): a probe never reads the controller's;
- its run is bounded: ``timeout_s`` is required, and ``subprocess.TimeoutExpired`` kills it.

A Python probe's script starts with :data:`DROP_CWD`, the line the worker bootstrap starts
with, so the working directory (``sys.path[0]`` under ``-c``) is never searched: an
``onnxruntime.py`` or ``numpy.py`` in the folder ``edge`` runs from is never imported.
Probes that run with ``-I`` (isolated mode) have no such entry to begin with.

:func:`observed_probes` lists the program of every probe asked while it is active (run
here, or answered from :mod:`edge_core.host.probe_answers`): ``edge probe`` keeps its
whole answer only with the identity of each program its probes asked.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence

from edge_core.host.environment import check_env_names, worker_environment

__all__ = ["DROP_CWD", "note_probe", "observed_probes", "probe_environment", "run_probe"]

DROP_CWD = 'import sys; getattr(sys.flags, "safe_path", 0) or sys.path.pop(0)'
"""First line of every Python probe script run with ``-c``: drop the working directory
from ``sys.path`` before any import (``-P`` does it from 3.11 on; then the line is a
no-op)."""


_OBSERVERS: list[list[str]] = []


@contextlib.contextmanager
def observed_probes() -> Iterator[list[str]]:
    """While active, the program (``argv[0]``) of every probe asked, in any thread."""
    programs: list[str] = []
    _OBSERVERS.append(programs)
    try:
        yield programs
    finally:  # by identity: two observers' lists may be equal
        _OBSERVERS[:] = [other for other in _OBSERVERS if other is not programs]


def note_probe(argv: Sequence[str]) -> None:
    """Tell :func:`observed_probes` that a probe of ``argv`` was asked (run or cached)."""
    for programs in list(_OBSERVERS):
        programs.append(str(argv[0]))


def probe_environment(
    source: Mapping[str, str] | None = None,
    *,
    declared: Iterable[str] = (),
    values: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a probe starts with: the workers' allowlist plus ``declared``.

    Args:
        source: the environment names are copied from (default: this process's).
        declared: names (or ``PREFIX*``) this probe needs from ``source``.
        values: variables the probe sets itself (``EDGE_PLUGINS`` for a plugin probe).

    Raises:
        RouteRefused: a declared name that is neither ``NAME`` nor ``PREFIX*``.

    """
    return worker_environment(
        os.environ if source is None else source,
        declared=check_env_names(declared, "probe_env_names"),
        values=values,
        inherit_python_path=True,
    )


def run_probe(
    argv: Sequence[str],
    *,
    timeout_s: float,
    declared: Iterable[str] = (),
    values: Mapping[str, str] | None = None,
    source: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one probe to its end; its output captured as text, its exit status not checked.

    Args:
        argv: the command (never through a shell).
        timeout_s: bound on the run, seconds (positive and finite).
        declared: names (or ``PREFIX*``) the probe needs from the environment.
        values: variables set for the probe.
        source: the environment names are copied from (default: this process's).

    Raises:
        ValueError: ``timeout_s`` is not a positive finite number.
        OSError: the command cannot be started.
        subprocess.TimeoutExpired: the probe ran past ``timeout_s`` (it has been killed).

    """
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
            or not math.isfinite(timeout_s) or timeout_s <= 0):
        raise ValueError(f"timeout_s: must be a positive finite number of seconds: {timeout_s!r}")
    env = probe_environment(source, declared=declared, values=values)
    note_probe(argv)
    return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=env, timeout=timeout_s, check=False)
