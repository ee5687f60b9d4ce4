"""Process identity for owner records, standard library only: PID plus start time.

Shared memory records its creator (:mod:`edge_contracts.shm`); whoever sweeps leftovers
checks that owner with :func:`owner_alive`.

A process is named by its PID and its **start time since boot**: ``/proc/PID/stat``
field 22 (clock ticks from boot to the process's start) divided by ``CLK_TCK``. The
kernel fixes it when the process starts and it never moves, whatever the wall clock
does. The creation time in seconds since the epoch (start time plus ``btime`` from
``/proc/stat``, as psutil computes it) is kept for display only: ``btime`` is the wall
clock minus the time since boot, so it moves by the size of every step of the wall
clock (an NTP/chrony step, a VM resume, ``settimeofday``), and two readings of the same
process taken on either side of a step differ by that much.

Where ``/proc`` does not exist this module cannot read start times: owner records then
carry none and an owner is judged by its PID alone (see :func:`owner_alive`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "OWNER_TOLERANCE_S",
    "Owner",
    "boot_time",
    "create_time_of",
    "owner_alive",
    "owner_identity",
    "proc_stat_available",
    "process_start",
    "start_time_of",
]

OWNER_TOLERANCE_S = 0.05
"""Two start (or creation) times closer than this name the same process."""


@dataclass(frozen=True)
class Owner:
    """The process recorded as the owner of something it left outside itself."""

    pid: int
    """Its PID (0: no owner recorded)."""
    start_time: float
    """Seconds from boot to its start (``/proc``); 0.0 when not recorded or unreadable."""
    create_time: float
    """Seconds since the epoch when it started, for display; 0.0 when unknown."""


def proc_stat_available() -> bool:
    """Whether start times since boot can be read here (Linux ``/proc``)."""
    return os.path.exists("/proc/self/stat")


def boot_time() -> float | None:
    """The ``btime`` of ``/proc/stat`` (wall clock minus time since boot); None if unknown.

    Read anew on every call, as psutil does: it moves when the wall clock is stepped, so
    it only turns a start time into a creation time to display and is never compared.
    """
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            return float(next(int(line.split()[1]) for line in handle
                              if line.startswith("btime")))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK")


def process_start(pid: int) -> tuple[float, bool] | None:
    """``pid``'s start time in seconds since boot and whether it is a zombie; None if gone.

    From ``/proc/PID/stat``: field 22 (clock ticks from boot to the start) over
    ``CLK_TCK``, and field 3 (the state; ``Z`` or ``X``: exited, not yet reaped).
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(")") + 2 :].split()
        state, ticks = fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None
    return ticks / _ticks_per_s(), state in ("Z", "X")


def start_time_of(pid: int) -> float | None:
    """Seconds from boot to the start of ``pid``; None if unknown or gone.

    A zombie (exited, not yet reaped) counts as gone: -1.0.
    """
    found = process_start(pid)
    if found is None:
        return None
    return -1.0 if found[1] else found[0]


def create_time_of(pid: int) -> float | None:
    """Creation time of ``pid`` in seconds since the epoch, for display; None if unknown.

    As psutil computes it on Linux: :func:`start_time_of` plus :func:`boot_time`. Never
    compare it with a value read at another moment (see the module docstring). A zombie
    counts as gone: -1.0.
    """
    start = start_time_of(pid)
    if start is None or start < 0:
        return start
    btime = boot_time()
    return None if btime is None else start + btime


def owner_identity() -> Owner:
    """This process as an owner (start and creation time 0.0 where they cannot be read)."""
    pid = os.getpid()
    cached = _OWNER_CACHE.get(pid)
    if cached is None:
        start = max(start_time_of(pid) or 0.0, 0.0)
        btime = boot_time()
        created = start + btime if start > 0.0 and btime is not None else 0.0
        cached = Owner(pid, start, created)
        _OWNER_CACHE.clear()  # a forked child has a new PID: one entry is enough
        _OWNER_CACHE[pid] = cached
    return cached


_OWNER_CACHE: dict[int, Owner] = {}


def owner_alive(owner: Owner) -> bool:
    """Whether ``owner`` still runs (True when unsure).

    Judged by the start time since boot when the record has one. A record without one
    (written before start times were recorded) is judged by its creation time, which a
    step of the wall clock since it was written can make look like another process's.
    A record with neither is judged by its PID alone.
    """
    pid = owner.pid
    if pid <= 0:
        return True  # no owner recorded: not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: judged by its start time below
        pass
    if owner.start_time > 0.0:
        recorded, now = owner.start_time, start_time_of(pid)
    else:
        recorded, now = owner.create_time, create_time_of(pid)
    if now is None or recorded <= 0.0:  # the PID runs and nothing tells it apart
        return os.path.isdir(f"/proc/{pid}") or not os.path.isdir("/proc")
    return abs(now - recorded) <= OWNER_TOLERANCE_S
