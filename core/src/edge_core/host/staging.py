"""Staging of worker code for a foreign interpreter.

A vendor interpreter has none of edge-core installed. Before its worker starts, the
controller copies ``edge_contracts`` and the route's worker packages into a private
directory (``mkdtemp``, mode 0700, its name tagged with the controller's PID and creation
time: :mod:`edge_core.host.leftovers`) that goes first on the worker's ``PYTHONPATH``.
Only source files are copied (no ``__pycache__``); the directory is removed when the
worker is retired, by the worker's supervisor if the controller dies, else by the next
edge-core process. Worker code may import only ``edge_contracts``, numpy and its own runtime.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from edge_core.host.errors import RouteRefused
from edge_core.host.leftovers import tagged_prefix

__all__ = ["STAGED_ALWAYS", "stage_packages"]

STAGED_ALWAYS = ("edge_contracts",)
"""Packages staged for every foreign worker."""

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "tests")


def _copy(name: str, into: Path) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise RouteRefused("route.stage", "not importable in the controller", name)
    if spec.submodule_search_locations:
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(source, into / name, ignore=_IGNORE)
    else:
        assert spec.origin is not None
        origin = Path(spec.origin)
        if origin.suffix != ".py":
            raise RouteRefused("route.stage", "only pure-Python modules can be staged", name)
        shutil.copy2(origin, into / origin.name)


def stage_packages(names: tuple[str, ...]) -> Path:
    """Copy ``edge_contracts`` and ``names`` into a new private directory; return it.

    The caller owns the directory and removes it (``shutil.rmtree``) when done.
    """
    directory = Path(tempfile.mkdtemp(prefix=tagged_prefix("stage")))
    try:
        for name in dict.fromkeys((*STAGED_ALWAYS, *names)):
            _copy(name, directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory
