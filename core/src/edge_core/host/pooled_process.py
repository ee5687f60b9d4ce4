"""A supervisor forked by a warm pool's zygote, seen from the controller like a ``Popen``.

A worker started from the warm pool (:mod:`edge_core.host.warm_pool`) runs under a
supervisor that is the zygote's child, not the controller's: the controller cannot
``waitpid`` it. The zygote reaps it and writes its exit status (as ``subprocess`` gives
it: negative for a signal) on a pipe of its own for that start, whose read end it passed
to the controller together with a ``pidfd`` of the supervisor, opened while the
supervisor was still its unreaped child (so it names that very process, never a later
one of the same PID). :class:`PooledProcess` offers what the controller's start,
watchdog, retirement and client read of a ``Popen``: ``pid``, ``returncode``,
:meth:`~PooledProcess.poll`, :meth:`~PooledProcess.wait` and ``stdin``/``stdout``/
``stderr`` (all ``None``: the worker's streams were passed as descriptors).

If the zygote dies first, the pipe ends without a status: the supervisor's exit is still
seen at once (its ``pidfd``), its status is then unknown (``None``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from typing import IO, Any

from edge_contracts.waiting import readable

__all__ = ["PooledProcess"]


class PooledProcess:
    """A supervisor process forked by a zygote; the descriptors are this object's to close.

    Args:
        pid: the supervisor's PID.
        status_fd: the read end of the zygote's status pipe for this start.
        pidfd: a ``pidfd`` of the supervisor.

    """

    stdin: IO[Any] | None = None
    stdout: IO[Any] | None = None
    stderr: IO[Any] | None = None

    def __init__(self, pid: int, status_fd: int, pidfd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd = status_fd
        self._pidfd = pidfd
        self._status = b""
        self._ended = False  # the exit is known (the status may be None: zygote gone)
        self._orphaned = False  # the pipe ended without a status: the zygote is gone
        self._lock = threading.Lock()

    @property
    def ended(self) -> bool:
        """True once the supervisor is known to have exited (its status may be unknown)."""
        return self._ended

    def exited(self) -> bool:
        """True when the supervisor has exited (reaped or not), by its ``pidfd``; never blocks."""
        with self._lock:
            if self._pidfd < 0:
                return self._ended
            return bool(readable(self._pidfd, 0.0))

    def dup_pidfd(self) -> int | None:
        """A new ``pidfd`` of the supervisor for the caller to close; None once it has ended."""
        with self._lock:
            return None if self._pidfd < 0 else os.dup(self._pidfd)

    def poll(self) -> int | None:
        """The exit status if the zygote has reported it, else None (never blocks)."""
        with self._lock:
            self._read(0.0)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the exit; its status, or None when it exited with its status unknown.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.

        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if self._read(0.05 if remaining is None else min(remaining, 0.05)):
                    return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout or 0.0)

    def _read(self, wait_s: float) -> bool:
        """Read what the status pipe holds (waiting up to ``wait_s``); True once ended."""
        if self._ended or self._pidfd < 0:
            return self._ended
        if self._orphaned:
            if readable(self._pidfd, wait_s):
                self._end(None)
            return self._ended
        if not readable(self._status_fd, wait_s):
            return False
        try:
            chunk = os.read(self._status_fd, 64)
        except OSError:
            chunk = b""
        if chunk:
            self._status += chunk
            if self._status.endswith(b"\n"):
                self._end(int(self._status))
            return self._ended
        self._orphaned = True  # the zygote died before it reaped the supervisor
        if readable(self._pidfd, 0.0):
            self._end(None)
        return self._ended

    def _end(self, status: int | None) -> None:
        self.returncode = status
        self._ended = True
        self._close()

    def _close(self) -> None:
        for fd in (self._status_fd, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._status_fd = self._pidfd = -1

    def __del__(self) -> None:
        self._close()
