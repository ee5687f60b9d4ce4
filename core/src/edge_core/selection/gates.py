"""Stored load gates: a candidate's full gate, kept so that the next open may check less.

A stage's load gate warms up every example of its shape set — each static bucket, and each
dynamic entry at its minimum, its maximum and a shape between — and checks placement,
numerics and observed memory (:mod:`edge_core.runtime.gate`). When a full gate passes, the
opener stores what it checked here, under :func:`~edge_core.selection.key.gate_key`: the
stage's configuration (backend, provider and session options, route, placement, shapes,
demands), its bundle's manifest sha256, its backend's declared environment and its runtime
identity (:func:`edge_core.identity.runtime_identity`: distributions, EP libraries,
devices, edge-core's version). An open whose key matches a stored gate checks one point of
each dynamic entry (:data:`REUSED_POINT`) instead of all three, and its plan says so
("gate reused from DATE, 1 of 3 points checked now"); any change of the key runs the full
gate again and names the parts that changed (against the stored gate of that stage and
backend whose key differs in the fewest parts).

The directory is ``$EDGE_GATE_CACHE`` when set, else ``gates/`` under the placement
decisions' directory (:func:`~edge_core.selection.store.default_cache_dir`). A file is
named for its key's digest and holds::

    {"format": "edge-gate/1", "key": "<sha256>", "parts": {...}, "owner": "<pipeline/stage>",
     "backend": "<name>", "checked_at": "<UTC ISO 8601>", "points": [{entry, point, shapes}],
     "digest": "<sha256 of everything above>"}

A file that cannot be read or does not verify is ignored (the full gate runs, and the
lookup says why), never an exception; nor is such a file, or one of another format, the
stored gate the changed parts are named against. Writes are atomic (a private temporary file, then a
rename), mode 0600.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_core.identity import identity_digest
from edge_core.selection.key import GATE_KEY_PARTS, DecisionKey
from edge_core.selection.store import default_cache_dir, make_private_directory

__all__ = ["FORMAT", "GATE_CACHE_ENV", "REUSED_POINT", "GateLookup", "GateStore", "StoredGate",
           "default_gate_dir"]

FORMAT = "edge-gate/1"
"""The ``format`` of a stored gate file."""

GATE_CACHE_ENV = "EDGE_GATE_CACHE"
"""Environment variable naming the stored gates' directory."""

REUSED_POINT = "min"
"""The one point of each dynamic entry an open with a matching stored gate checks: the
smallest shape, which still loads the session on its target, checks where its nodes run
and compares its outputs with the bundle's reference, at the least cost (the stored full
gate covered the maximum, where memory peaks)."""

_SUFFIX = ".json"


def default_gate_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$EDGE_GATE_CACHE``, else ``gates/`` in the placement decisions' directory."""
    env = os.environ if env is None else env
    configured = env.get(GATE_CACHE_ENV)
    if configured:
        return Path(configured)
    return default_cache_dir(env) / "gates"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _digest(document: Mapping[str, Any]) -> str:
    return identity_digest({k: v for k, v in document.items() if k != "digest"})


@attrs.frozen
class StoredGate:
    """A full gate read back from the store, verified."""

    key: str
    """The key's digest."""
    parts: Mapping[str, str]
    """The key's parts' digests when it was stored."""
    owner: str
    """The stage it was checked for (``pipeline/stage``)."""
    backend: str
    """The candidate's backend."""
    checked_at: str
    """When the full gate ran (UTC, ISO 8601)."""
    points: tuple[Mapping[str, Any], ...]
    """Every warm-up point it checked: ``{entry, point, shapes}``."""


@attrs.frozen
class GateLookup:
    """What the store found for a key."""

    found: StoredGate | None
    """The verified stored gate, or ``None``."""
    problem: str | None = None
    """Why a file for this key was not used."""
    changed: tuple[str, ...] = ()
    """Without one for this key: the key parts that differ from the nearest stored gate
    of the same stage and backend — the one differing in the fewest parts, the newest among
    those (empty when there is none)."""


class GateStore:
    """The stored gates in one directory (created on first save, mode 0700)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        """Use ``directory``, or :func:`default_gate_dir`."""
        self.directory = Path(directory) if directory is not None else default_gate_dir()

    def path(self, key: DecisionKey | str) -> Path:
        """The file a key's gate lives in."""
        digest = key.digest if isinstance(key, DecisionKey) else key
        return self.directory / f"{digest}{_SUFFIX}"

    def load(self, key: DecisionKey, owner: str, backend: str) -> GateLookup:
        """The verified gate stored under ``key``, if any (never raises for what it reads)."""
        path = self.path(key)
        if not path.exists():
            return GateLookup(found=None, changed=self.nearest_changes(key, owner, backend))
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            return GateLookup(found=None, problem=f"{path}: cannot be read ({exc})")
        problem = _problem(document, key.digest)
        if problem is not None:
            return GateLookup(found=None, problem=f"{path}: {problem}")
        return GateLookup(found=StoredGate(
            key=key.digest, parts=document["parts"], owner=str(document.get("owner")),
            backend=str(document.get("backend")), checked_at=document["checked_at"],
            points=tuple(document["points"])))

    def save(self, key: DecisionKey, owner: str, backend: str,
             points: Sequence[Mapping[str, Any]]) -> StoredGate:
        """Store a full gate that passed at ``points``; returns what :meth:`load` gives.

        Raises:
            OSError: the directory cannot be written.
        """
        document: dict[str, Any] = {
            "format": FORMAT, "key": key.digest, "parts": dict(key.parts), "owner": owner,
            "backend": backend, "checked_at": _now(), "stored_ns": time.time_ns(),
            "points": [json.loads(json.dumps(dict(p), default=str)) for p in points]}
        document["digest"] = _digest(document)
        make_private_directory(self.directory)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".gate.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1, sort_keys=True)
            os.replace(temporary, self.path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return StoredGate(key=key.digest, parts=dict(key.parts), owner=owner, backend=backend,
                          checked_at=document["checked_at"],
                          points=tuple(document["points"]))

    def nearest_changes(self, key: DecisionKey, owner: str, backend: str) -> tuple[str, ...]:
        """Key parts that differ from the nearest stored gate of ``owner`` on ``backend``.

        The nearest is the one whose key differs in the fewest parts, the newest among those.
        """
        nearest: tuple[tuple[int, str, int], Mapping[str, str]] | None = None
        try:
            paths = list(self.directory.glob(f"*{_SUFFIX}"))
        except OSError:
            return ()
        for path in paths:
            summary = _summary(str(path))
            if summary is not None and summary.owner == owner and summary.backend == backend:
                same = -sum(key.parts.get(n) != summary.parts.get(n) for n in GATE_KEY_PARTS)
                when = (same, summary.checked_at, summary.stored_ns)
                if nearest is None or when > nearest[0]:
                    nearest = (when, summary.parts)
        _forget_others(str(self.directory), {str(path) for path in paths})
        if nearest is None:
            return ()
        return tuple(name for name in GATE_KEY_PARTS
                     if key.parts.get(name) != nearest[1].get(name))


@attrs.frozen
class _Summary:
    """What the nearest-gate comparison reads of a stored gate that verifies."""

    owner: object
    backend: object
    parts: Mapping[str, Any]
    checked_at: str
    stored_ns: int
    """0 in a file written before it was kept: ``checked_at`` has whole seconds, and two
    gates stored in one second are told apart by it."""


_SUMMARIES: dict[str, tuple[tuple[int, int, int, int], _Summary | None]] = {}
"""Path -> (inode, mtime in ns, status change time in ns, size) when read, and what it held
(``None``: a file that does not verify). Every start without a gate of its own compares its
key with every stored gate (:meth:`GateStore.nearest_changes`); a file read before is not
read, parsed and digested again while its inode, mtime, ctime and size are those it was
read with (a save replaces the file: a new inode; a rewrite in place that puts its mtime
back, as ``cp -p`` or ``rsync -t`` do, still moves its ctime, which nothing can set)."""


def _summary(path: str) -> _Summary | None:
    """The stored gate at ``path`` as the nearest-gate comparison reads it, or ``None``."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)
    known = _SUMMARIES.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    summary: _Summary | None = None
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.loads(handle.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # not kept: read again next time
    if (isinstance(document, dict) and document.get("format") == FORMAT
            and document.get("digest") == _digest(document)
            and isinstance(document.get("parts"), dict)
            and isinstance(document.get("checked_at"), str)):
        stored = document.get("stored_ns")
        summary = _Summary(owner=document.get("owner"), backend=document.get("backend"),
                           parts=document["parts"], checked_at=document["checked_at"],
                           stored_ns=stored if isinstance(stored, int) else 0)
    _SUMMARIES[path] = (stamp, summary)
    return summary


def _forget_others(directory: str, present: set[str]) -> None:
    """Drop what :data:`_SUMMARIES` holds of files of ``directory`` no longer there."""
    prefix = os.path.join(directory, "")
    for path in list(_SUMMARIES):  # a copy: another thread's start may add meanwhile
        if path.startswith(prefix) and path not in present:
            _SUMMARIES.pop(path, None)


def _problem(document: object, digest: str) -> str | None:
    """Why a stored gate document is not usable for ``digest`` (``None``: it is)."""
    if not isinstance(document, dict):
        return "not a JSON object"
    if document.get("format") != FORMAT:
        return f"format {document.get('format')!r}, expected {FORMAT!r}"
    if document.get("key") != digest:
        return "it names another key"
    if document.get("digest") != _digest(document):
        return "its digest does not verify (changed after it was written)"
    points = document.get("points")
    if (not isinstance(document.get("parts"), dict)
            or not isinstance(document.get("checked_at"), str)
            or not isinstance(points, list) or not points
            or not all(isinstance(p, dict) for p in points)):
        return "parts, checked_at or points missing"
    return None
