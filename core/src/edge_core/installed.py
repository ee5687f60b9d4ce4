"""Installed distributions found from their metadata folders, without ``importlib.metadata``.

``importlib.metadata`` parses every distribution's metadata as e-mail headers and costs a
fresh ``edge`` process tens of milliseconds before it answers. A wheel installed by pip
(and an editable install) has a ``NAME-VERSION.dist-info`` folder on ``sys.path`` whose
name already says the normalised name and the version; a setuptools ``.egg-info`` folder
says them in its ``PKG-INFO``. As with ``importlib.metadata``, the first distribution of a
name on the path wins.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator

__all__ = ["distribution_folder", "distribution_version", "installed_versions",
           "metadata_folders", "normalise", "recorded_files"]


def normalise(name: str) -> str:
    """A distribution name as its folder spells it (PEP 503 and 427: lower case, ``_``)."""
    return name.lower().replace("-", "_").replace(".", "_")


def _header(path: str, field: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break
                if line.startswith(f"{field}:"):
                    return line[len(field) + 1:].strip()
    except OSError:
        pass
    return None


def _name_of(folder: str, child: str) -> str:
    if child.endswith(".dist-info"):
        return normalise(child[:-len(".dist-info")].rsplit("-", 1)[0])
    named = _header(os.path.join(folder, "PKG-INFO"), "Name")
    return normalise(named or child[:-len(".egg-info")].split("-")[0])


def metadata_folders(path: Iterable[str] | None = None) -> Iterator[tuple[str, str]]:
    """(normalised name, metadata folder) of every distribution on ``path``.

    ``path`` defaults to ``sys.path``; the first of each name only, in path order.
    """
    seen: set[str] = set()
    for entry in list(sys.path if path is None else path):
        directory = entry or "."
        try:
            children = sorted(os.listdir(directory))
        except OSError:
            continue
        for child in children:
            if not child.endswith((".dist-info", ".egg-info")):
                continue
            folder = os.path.join(directory, child)
            name = _name_of(folder, child)
            if name in seen:
                continue
            seen.add(name)
            yield name, folder


def distribution_folder(name: str, path: Iterable[str] | None = None) -> str | None:
    """The metadata folder of distribution ``name`` on ``path``, or ``None``."""
    wanted = normalise(name)
    return next((folder for found, folder in metadata_folders(path) if found == wanted), None)


def distribution_version(folder: str) -> str | None:
    """The version a metadata folder names (its ``METADATA``/``PKG-INFO`` header)."""
    meta = "METADATA" if folder.endswith(".dist-info") else "PKG-INFO"
    return _header(os.path.join(folder, meta), "Version")


def recorded_files(folder: str) -> list[str] | None:
    """The files a ``.dist-info`` folder's ``RECORD`` lists (``None``: no record)."""
    try:
        with open(os.path.join(folder, "RECORD"), encoding="utf-8") as handle:
            return [line.split(",", 1)[0] for line in handle if line.strip()]
    except OSError:
        return None


def installed_versions(names: Iterable[str], path: Iterable[str] | None = None
                       ) -> dict[str, str]:
    """Name → version of each of ``names`` installed on ``path`` (absent ones left out)."""
    wanted = {normalise(name): name for name in names}
    found: dict[str, str] = {}
    for normal, folder in metadata_folders(path):
        if normal in wanted:
            version = distribution_version(folder)
            if version is not None:
                found[wanted[normal]] = version
    return found
