"""What a dead edge-core process left behind, and its removal; never a live one's.

A controller killed with ``SIGKILL`` runs no cleanup. Its worker supervisors clean up
after it (:mod:`edge_core.host.supervisor`), but a supervisor can be killed too. So
everything edge-core puts outside a process carries its owner's identity, PID plus
start time (since boot on Linux, which no step of the wall clock moves:
:mod:`edge_core.host.identity`):

* shared-memory segments record their creator in the segment header
  (:func:`edge_contracts.shm.segment_owner`);
* staged directories in the system temporary directory — worker packages
  (``edge-stage-``) and verified bundle copies (``edge-bundle-``) — carry it in their
  name: ``edge-stage-o<pid>-b<start time since boot in centiseconds>-<random>``
  (:func:`owner_tag`; without ``/proc``, ``o<pid>-<creation time in centiseconds>``,
  the form every tag had before start times counted from boot).

:func:`find_leftovers` lists what belongs to owners that are gone; :func:`remove_leftovers`
removes it. The first worker started in a process runs :func:`sweep_once`, and
``edge cleanup`` runs the same on demand. An owner counts as gone only when no process
has its PID *and* start time, so a live owner's files, and files whose owner cannot
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

from edge_contracts.owners import Owner
from edge_contracts.shm import sweep_dead_owners
from edge_core.host.identity import (
    CREATE_TIME_TOLERANCE_S,
    START_TIME_BOOT_RELATIVE,
    ProcessIdentity,
)

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
"""Kinds of owner-tagged directories: ``edge-<kind>-o<pid>-b<centiseconds>-<random>``."""

_TAGGED = re.compile(r"^edge-(stage|bundle)-o(\d+)-(b?)(\d+)-")
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
    """The owner's creation time (seconds since the epoch; 0.0 when not recorded)."""
    owner_start_time: float = 0.0
    """The owner's start time (seconds since boot; 0.0 when not recorded)."""

    def to_json(self) -> dict[str, object]:
        """Plain form for ``edge cleanup --json``."""
        return {
            "kind": self.kind,
            "path": self.path,
            "owner": {"pid": self.owner_pid, "create_time": self.owner_create_time,
                      "start_time": self.owner_start_time},
        }


def owner_tag() -> str:
    """This process's tag for the names it creates: ``o<pid>-b<start centiseconds>``.

    ``b``: the start time counts from boot. Where it does not (no ``/proc``), the tag is
    ``o<pid>-<creation centiseconds>``.
    """
    me = ProcessIdentity.of(os.getpid())
    mark = "b" if START_TIME_BOOT_RELATIVE else ""
    return f"o{me.pid}-{mark}{round(me.start_time * 100)}"


def tagged_prefix(kind: str) -> str:
    """The ``mkdtemp`` prefix for a staged directory of ``kind`` owned by this process."""
    return f"edge-{kind}-{owner_tag()}-"


def _owner_alive(pid: int, centis: int, boot_relative: bool) -> bool:
    """Whether the owner tagged ``o<pid>-[b]<centis>`` runs (True when it cannot be told).

    A tag without ``b`` on a host that counts from boot was written before start times
    did: it is judged by psutil's creation time, which steps of the wall clock move.
    """
    try:
        proc = psutil.Process(pid)
        if boot_relative or not START_TIME_BOOT_RELATIVE:
            now = ProcessIdentity.of_process(proc).start_time
        else:
            now = proc.create_time()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # cannot tell: keep it
        return True
    return abs(now - centis / 100) <= max(CREATE_TIME_TOLERANCE_S, 0.011)


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
        pid, boot_relative, centis = int(match.group(2)), bool(match.group(3)), int(match.group(4))
        if not _owner_alive(pid, centis, boot_relative):
            start, created = (centis / 100, 0.0) if boot_relative else (0.0, centis / 100)
            found.append(Leftover(match.group(1), entry.path, pid, created, start))
    return found


def _segment(name: str, owner: Owner) -> Leftover:
    return Leftover("segment", name, owner.pid, owner.create_time, owner.start_time)


def find_leftovers(temp_dir: str | os.PathLike[str] | None = None) -> list[Leftover]:
    """List the segments and staged directories whose owner is gone (nothing removed)."""
    segments = [_segment(name, owner) for name, owner in sweep_dead_owners(dry_run=True)]
    return segments + _dead_directories(Path(temp_dir or tempfile.gettempdir()))


def remove_leftovers(temp_dir: str | os.PathLike[str] | None = None) -> list[Leftover]:
    """Remove what :func:`find_leftovers` lists (re-checking each owner); return it."""
    removed = [_segment(name, owner) for name, owner in sweep_dead_owners()]
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
