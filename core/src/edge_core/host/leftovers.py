"""What a dead edge-core process left behind, and its removal; never a live one's.

A controller killed with ``SIGKILL`` runs no cleanup. Its worker supervisors clean up
after it (:mod:`edge_core.host.supervisor`), but a supervisor can be killed too. So
everything edge-core puts outside a process carries its owner's identity, PID plus
creation time:

* shared-memory segments record their creator in the segment header
  (:func:`edge_contracts.shm.segment_owner`);
* staged directories in the system temporary directory — worker packages
  (``edge-stage-``) and verified bundle copies (``edge-bundle-``) — carry it in their
  name: ``edge-stage-o<pid>-<creation time in centiseconds>-<random>``
  (:func:`owner_tag`).

:func:`find_leftovers` lists what belongs to owners that are gone; :func:`remove_leftovers`
removes it. The first worker started in a process runs :func:`sweep_once`, and
``edge cleanup`` runs the same on demand. An owner counts as gone only when no process
has its PID *and* creation time, so a live owner's files, and files whose owner cannot
be told, are never removed. Directories made under a caller's own ``staging_root`` are
the caller's to clean.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import attrs
import psutil

from edge_contracts.shm import sweep_dead_owners
from edge_core.host.identity import CREATE_TIME_TOLERANCE_S

__all__ = [
    "TEMP_KINDS",
    "Leftover",
    "find_leftovers",
    "owner_tag",
    "remove_leftovers",
    "sweep_once",
    "tagged_prefix",
]

TEMP_KINDS = ("stage", "bundle")
"""Kinds of owner-tagged directories: ``edge-<kind>-o<pid>-<centiseconds>-<random>``."""

_TAGGED = re.compile(r"^edge-(stage|bundle)-o(\d+)-(\d+)-")
_swept = False
_sweep_lock = threading.Lock()


@attrs.frozen
class Leftover:
    """One thing a dead owner left: a segment or a staged directory."""

    kind: str
    """``segment``, ``stage`` or ``bundle``."""
    path: str
    """The segment's name, or the directory's path."""
    owner_pid: int
    """The owner's PID."""
    owner_create_time: float
    """The owner's creation time (seconds since the epoch)."""

    def to_json(self) -> dict[str, object]:
        """Plain form for ``edge cleanup --json``."""
        return {
            "kind": self.kind,
            "path": self.path,
            "owner": {"pid": self.owner_pid, "create_time": self.owner_create_time},
        }


def owner_tag() -> str:
    """This process's tag for the names it creates: ``o<pid>-<creation centiseconds>``."""
    me = psutil.Process()
    return f"o{me.pid}-{round(me.create_time() * 100)}"


def tagged_prefix(kind: str) -> str:
    """The ``mkdtemp`` prefix for a staged directory of ``kind`` owned by this process."""
    return f"edge-{kind}-{owner_tag()}-"


def _owner_alive(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        now = proc.create_time()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # cannot tell: keep it
        return True
    return abs(now - created) <= max(CREATE_TIME_TOLERANCE_S, 0.011)


def _dead_directories(root: Path) -> list[Leftover]:
    found = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        match = _TAGGED.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue  # another user's: not ours to judge
        except OSError:
            continue
        pid, created = int(match.group(2)), int(match.group(3)) / 100
        if not _owner_alive(pid, created):
            found.append(Leftover(match.group(1), entry.path, pid, created))
    return found


def find_leftovers(temp_dir: str | os.PathLike[str] | None = None) -> list[Leftover]:
    """List the segments and staged directories whose owner is gone (nothing removed)."""
    segments = [Leftover("segment", name, pid, created)
                for name, pid, created in sweep_dead_owners(dry_run=True)]
    return segments + _dead_directories(Path(temp_dir or tempfile.gettempdir()))


def remove_leftovers(temp_dir: str | os.PathLike[str] | None = None) -> list[Leftover]:
    """Remove what :func:`find_leftovers` lists (re-checking each owner); return it."""
    removed = [Leftover("segment", name, pid, created)
               for name, pid, created in sweep_dead_owners()]
    for leftover in _dead_directories(Path(temp_dir or tempfile.gettempdir())):
        shutil.rmtree(leftover.path, ignore_errors=True)
        if not os.path.exists(leftover.path):
            removed.append(leftover)
    return removed


def sweep_once() -> None:
    """Run :func:`remove_leftovers` the first time it is called in this process."""
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    remove_leftovers()
