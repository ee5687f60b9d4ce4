"""What the controller reads of a started worker's root process, however it was started.

A spawned worker's root is the controller's child, a :class:`SpawnedProcess` (a
``subprocess.Popen``); a worker forked by the warm pool's zygote has a
:class:`~edge_core.host.pooled_process.PooledProcess` instead (the zygote, not the
controller, is its parent). Both offer :class:`StartedProcess`.
"""

from __future__ import annotations

import os
import subprocess
from typing import IO, Any, Protocol

__all__ = ["SpawnedProcess", "StartedProcess"]


class StartedProcess(Protocol):
    """The part of ``subprocess.Popen`` a worker's start, watchdog and retirement use.

    ``wait`` may give ``None``: the process has exited, its status is unknown (a pooled
    one whose zygote died first).
    """

    @property
    def pid(self) -> int:
        """The root process's PID."""

    @property
    def returncode(self) -> int | None:
        """Its exit status once known (negative: a signal)."""

    @property
    def stdin(self) -> IO[Any] | None:
        """A pipe to it, if any."""

    @property
    def stdout(self) -> IO[Any] | None:
        """A pipe from it, if any."""

    @property
    def stderr(self) -> IO[Any] | None:
        """A pipe from it, if any."""

    def poll(self) -> int | None:
        """The exit status if it has exited and it is known, else None; never blocks."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the exit; its status (see above)."""

    @property
    def ended(self) -> bool:
        """True once it is known to have exited (its status may be unknown: see above)."""

    def dup_pidfd(self) -> int | None:
        """A new ``pidfd`` of it for the caller to close; None once it has ended.

        None too where none can be opened (not Linux 5.3 or later).
        """


class SpawnedProcess(subprocess.Popen[bytes]):
    """A spawned worker's root: the controller's child, a ``Popen``, a :class:`StartedProcess`."""

    @property
    def ended(self) -> bool:
        """True once it has been reaped (its status is then known)."""
        return self.returncode is not None

    def dup_pidfd(self) -> int | None:
        """A new ``pidfd`` of it (opened while it is not reaped: this very process)."""
        if self.returncode is not None:
            return None
        try:
            return os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3
            return None
