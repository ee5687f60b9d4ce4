"""Keeping a spinning controller thread off the CPU its worker runs on.

A spin pays only when the two ends of a channel run on separate CPUs. Where a blocking
ping-pong made the kernel put both on one CPU (it does that where waking a process on
the same CPU is cheap: a sleeper woken with a sync hint is placed beside its waker), a
controller that spins holds the very CPU its worker needs to answer: the reply comes
only once the spin has run out (hundreds of µs a round trip instead of tens), every
spinning window then measures spinning as slower than blocking, and the kernel's load
balancing leaves two busy, cache-hot processes where they are. The spin would never pay
there again, though the machine has a free CPU.

:class:`Apart` breaks that up from the controller's side only (the worker never moves,
so the two cannot both move onto one CPU): when its wait is about to begin a run of
spinning waits, and when a spin ran out without a reply, it reads the CPU the calling
thread and the worker's main thread last ran on (``/proc``), and where they are one it
moves the calling thread to another CPU it may use, by setting the thread's affinity
without that CPU and at once back to what it was (the thread's mask is unchanged after;
only its place is). Checks are at most one per :data:`CHECK_EVERY_S`. Where the thread
may use only that CPU, or ``/proc`` or thread affinity is missing (not Linux), nothing
moves. Standard library only; the governor (:mod:`edge_core.host.spinning`) gives each
governed wait one.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["CHECK_EVERY_S", "Apart", "last_cpu"]

CHECK_EVERY_S = 0.001
"""The least time between two checks of one wait (a check reads two ``/proc`` files)."""

_PROCESSOR = 36  # "processor" (field 39 of stat) counted from the state, after the name


def last_cpu(stat_path: str) -> int | None:
    """The CPU a task last ran on, from its ``stat`` file; None when it cannot be read."""
    try:
        with open(stat_path, "rb") as file:
            raw = file.read()
        return int(raw[raw.rindex(b")") + 2 :].split()[_PROCESSOR])
    except (OSError, ValueError, IndexError):
        return None


class Apart:
    """Moves the waiting controller thread off its worker's CPU (see the module).

    Callable without arguments: the hook a :class:`~edge_contracts.waiting.ReadableWait`
    calls (its ``apart``). Thread-safe enough for its use: a channel has one waiting
    thread at a time, and the counters are for reports.

    Args:
        peer_pid: the worker's process id (its main thread waits and computes).

    Attributes:
        checks: how often the two CPUs were compared.
        moves: how often the calling thread was moved.

    """

    __slots__ = ("_next", "_peer_stat", "checks", "moves")

    def __init__(self, peer_pid: int) -> None:
        if type(peer_pid) is not int or peer_pid < 1:
            raise ValueError(f"peer_pid: must be a positive integer: {peer_pid!r}")
        self._peer_stat = f"/proc/{peer_pid}/stat"
        self._next = 0.0
        self.checks = 0
        self.moves = 0

    def __call__(self) -> bool:
        """Check once (unless one was made within :data:`CHECK_EVERY_S`); True when moved."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + CHECK_EVERY_S
        self.checks += 1
        theirs = last_cpu(self._peer_stat)
        if theirs is None or last_cpu("/proc/thread-self/stat") != theirs:
            return False
        return self._move(theirs)

    def _move(self, cpu: int) -> bool:
        try:
            mask = os.sched_getaffinity(0)  # the calling thread's own mask on Linux
        except (AttributeError, OSError):
            return False
        others = mask - {cpu}
        if not others:
            return False
        try:
            os.sched_setaffinity(0, others)  # moves this running thread off ``cpu`` now
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):  # the mask was ours a moment ago
                os.sched_setaffinity(0, mask)
        self.moves += 1
        return True

