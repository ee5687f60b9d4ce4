"""Process identity for owner records, standard library only: PID plus creation time.

Shared memory records its creator (:mod:`edge_contracts.shm`); whoever sweeps leftovers
checks that owner with :func:`owner_alive`. The creation time is read from ``/proc`` the
way psutil computes it, so the controller's psutil readings agree with it.
"""

from __future__ import annotations

import os

__all__ = ["OWNER_TOLERANCE_S", "create_time_of", "owner_alive", "owner_identity"]

OWNER_TOLERANCE_S = 0.05
"""Two creation times closer than this name the same process."""


def owner_identity() -> tuple[int, float]:
    """This process's PID and creation time (0.0 where it cannot be read)."""
    pid = os.getpid()
    cached = _OWNER_CACHE.get(pid)
    if cached is None:
        cached = (pid, max(create_time_of(pid) or 0.0, 0.0))
        _OWNER_CACHE.clear()  # a forked child has a new PID: one entry is enough
        _OWNER_CACHE[pid] = cached
    return cached


_OWNER_CACHE: dict[int, tuple[int, float]] = {}


def create_time_of(pid: int) -> float | None:
    """Creation time of ``pid`` as psutil computes it on Linux; None if unknown or gone.

    A zombie (exited, not yet reaped) counts as gone: -1.0.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
        with open("/proc/stat", encoding="ascii") as handle:
            btime = next(int(line.split()[1]) for line in handle if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return -1.0
    return int(fields[19]) / os.sysconf("SC_CLK_TCK") + btime


def owner_alive(pid: int, created: float) -> bool:
    """Whether the owner recorded as ``(pid, created)`` still runs (True when unsure)."""
    if pid <= 0:
        return True  # no owner recorded: not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: judged by its creation time below
        pass
    now = create_time_of(pid)
    if now is None or created <= 0.0:  # the PID runs and nothing tells it apart
        return os.path.isdir(f"/proc/{pid}") or not os.path.isdir("/proc")
    return abs(now - created) <= OWNER_TOLERANCE_S
