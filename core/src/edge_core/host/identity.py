"""Process identity: a PID is only meaningful together with the process's start time.

A :class:`ProcessIdentity` is the pair ``(pid, start_time)``. Every liveness check and
every signal goes through :meth:`ProcessIdentity.process`, which returns a live
:class:`psutil.Process` only when the PID still belongs to the *same* process; a PID that
was reused by an unrelated process is therefore never signalled.

The start time is read by :func:`start_time`: on Linux, seconds from boot to the start
(``/proc/PID/stat``, :mod:`edge_contracts.owners`), which no step of the wall clock moves.
psutil's ``create_time()`` adds the boot time, re-read from ``/proc/stat`` at each call
and moved by every step (NTP, VM resume, ``settimeofday``): it is kept in the identity
for display only. Where ``/proc`` is missing the start time *is* psutil's creation time,
which those platforms store with the process (a step does not change it either).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping

import attrs
import psutil

from edge_contracts import owners
from edge_contracts.owners import proc_stat_available, process_start

__all__ = [
    "CREATE_TIME_TOLERANCE_S",
    "START_TIME_BOOT_RELATIVE",
    "ProcessIdentity",
    "descendant_processes",
    "descendants",
    "described_identity",
    "related_members",
    "session_members",
    "start_time",
]

CREATE_TIME_TOLERANCE_S = 0.05
"""Two start times closer than this name the same process (clock-tick granularity)."""

START_TIME_BOOT_RELATIVE = proc_stat_available()
"""True where start times count from boot (Linux ``/proc``); else they are psutil's."""


def start_time(proc: psutil.Process) -> float:
    """The start time that names ``proc`` (see the module docstring).

    Raises:
        psutil.NoSuchProcess: it is gone.
    """
    if not START_TIME_BOOT_RELATIVE:
        return proc.create_time()
    found = process_start(proc.pid)
    if found is None:
        raise psutil.NoSuchProcess(proc.pid)
    return found[0]


def _display_time(started: float) -> float:
    """Seconds since the epoch for the start time ``started``; 0.0 if it cannot be told."""
    if not START_TIME_BOOT_RELATIVE:
        return started
    booted = owners.boot_time()  # read now: moves with steps of the wall clock
    return 0.0 if booted is None else started + booted


@attrs.frozen
class ProcessIdentity:
    """A process named by PID and start time; equal identities name the same process."""

    pid: int
    start_time: float
    """Seconds from boot to its start on Linux; psutil's creation time elsewhere."""
    create_time: float = attrs.field(default=0.0, eq=False)
    """Seconds since the epoch, as psutil gave it at capture: for plans and reports only."""

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """Capture the identity of the live process ``pid`` (raises ``psutil.NoSuchProcess``)."""
        return cls.of_process(psutil.Process(pid))

    @classmethod
    def of_process(cls, proc: psutil.Process) -> ProcessIdentity:
        """Capture the identity of ``proc`` (raises ``psutil.NoSuchProcess``)."""
        started = start_time(proc)
        return cls(proc.pid, started, _display_time(started))

    def matches(self, started: float) -> bool:
        """Tell whether the start time ``started`` names the same process as this identity."""
        return abs(self.start_time - started) <= CREATE_TIME_TOLERANCE_S

    def process(self) -> psutil.Process | None:
        """Return the live, non-zombie process of this identity; None if gone or reused."""
        try:
            proc = psutil.Process(self.pid)
            if not self.matches(start_time(proc)):
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied:  # pragma: no cover - another user's process
            return None
        return proc

    def is_alive(self) -> bool:
        """Tell whether the very process of this identity runs (zombies count as gone)."""
        return self.process() is not None

    def to_dict(self) -> dict[str, float | int]:
        """Plain form for execution plans and reports."""
        return {"pid": self.pid, "start_time": self.start_time, "create_time": self.create_time}


def described_identity(described: Mapping[str, object]) -> ProcessIdentity | None:
    """The worker identity in a stage's ``describe()`` (``pid``, ``start_time``); None if none.

    A description with ``create_time`` but no ``start_time`` (a stage written before start
    times counted from boot) is turned into a start time with the boot time read now, so a
    step of the wall clock since its capture makes it name no process.
    """
    pid, started = described.get("pid"), described.get("start_time")
    created = described.get("create_time")
    if type(pid) is not int:
        return None
    shown = float(created) if isinstance(created, int | float) else 0.0
    if isinstance(started, int | float):
        return ProcessIdentity(pid, float(started), shown)
    if not isinstance(created, int | float):
        return None
    if not START_TIME_BOOT_RELATIVE:
        return ProcessIdentity(pid, shown, shown)
    booted = owners.boot_time()
    return None if booted is None else ProcessIdentity(pid, shown - booted, shown)


def _identity(proc: psutil.Process) -> ProcessIdentity | None:
    try:
        return ProcessIdentity.of_process(proc)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def descendant_processes(root: psutil.Process) -> list[psutil.Process]:
    """Every descendant of ``root``; read from ``/proc/PID/task/TID/children`` on Linux.

    That file lists a thread's children directly, so the walk costs a few reads instead
    of psutil's scan of every process on the machine (it runs on the start-up path and
    at each memory sample). Falls back to psutil where the file does not exist.
    """
    if not os.path.exists(f"/proc/{root.pid}/task/{root.pid}/children"):
        return list(root.children(recursive=True))
    found: list[psutil.Process] = []
    pending = [root.pid]
    while pending:
        pid = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # it left while the tree was walked
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:
                continue
            for child in children:
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(child))
                pending.append(child)
    return found


def descendants(root: ProcessIdentity) -> set[ProcessIdentity]:
    """Identities of the live descendants of ``root`` (empty if ``root`` is gone)."""
    proc = root.process()
    if proc is None:
        return set()
    try:
        children = descendant_processes(proc)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return set()
    found = {_identity(child) for child in children}
    return {ident for ident in found if ident is not None}


def session_members(leader: ProcessIdentity) -> set[ProcessIdentity]:
    """Live processes in the session that ``leader`` started (re-parented orphans included).

    A worker is started as a session leader, so its session id equals its PID. Members
    created before the leader cannot belong to it, which keeps a reused PID's unrelated
    session out as long as the leader lived when it was captured.
    """
    members: set[ProcessIdentity] = set()
    reused_at = _reuse_time(leader)
    for pid in psutil.pids():
        try:
            if os.getsid(pid) != leader.pid:  # one cheap call per process
                continue
            proc = psutil.Process(pid)
            member = ProcessIdentity.of_process(proc)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        if member.start_time + CREATE_TIME_TOLERANCE_S < leader.start_time:
            continue
        if reused_at is not None and member.start_time >= reused_at:
            continue  # a member of the unrelated session of whoever reused the PID
        members.add(member)
    return members


def _reuse_time(leader: ProcessIdentity) -> float | None:
    """Start time of an unrelated process now holding ``leader``'s PID, if any."""
    try:
        created = start_time(psutil.Process(leader.pid))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return None if leader.matches(created) else created


def _group_members(anchors: Mapping[int, ProcessIdentity]) -> set[ProcessIdentity]:
    """Live processes whose session or process group is led by one of ``anchors``.

    ``anchors`` maps a PID to the identity captured for it. A member created before its
    leader, or after an unrelated process took over the leader's PID, belongs to someone
    else and is left out.
    """
    if not anchors:
        return set()
    reuse = {pid: _reuse_time(leader) for pid, leader in anchors.items()}
    members: set[ProcessIdentity] = set()
    for pid in psutil.pids():
        try:  # two cheap calls per process
            groups = {os.getsid(pid), os.getpgid(pid)}
        except OSError:
            continue
        for group in groups & anchors.keys():
            leader = anchors[group]
            try:
                proc = psutil.Process(pid)
                member = ProcessIdentity.of_process(proc)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            reused_at = reuse[group]
            if member.start_time + CREATE_TIME_TOLERANCE_S < leader.start_time or (
                reused_at is not None and member.start_time >= reused_at
            ):
                continue
            members.add(member)
    return members


def related_members(known: Iterable[ProcessIdentity]) -> set[ProcessIdentity]:
    """Every live process related to ``known``, re-walked from each of its members.

    Related means: a descendant of a live known process, or a member of a session or a
    process group whose leader's PID is that of a known process (alive or not: an orphan
    keeps its session and group ids after its leader died). Repeated from each newly
    found process until nothing new appears, so that a child of a newly found process,
    or a member of a session it leads, is found too. The caller keeps what was found: a
    process seen once stays in its tree until it is verified gone.
    """
    seen = set(known)
    found: set[ProcessIdentity] = set()
    frontier = set(seen)
    while frontier:
        new: set[ProcessIdentity] = set()
        for ident in frontier:
            new |= descendants(ident)
        new |= _group_members({ident.pid: ident for ident in frontier})
        frontier = new - seen
        seen |= new
        found |= new
    return found
