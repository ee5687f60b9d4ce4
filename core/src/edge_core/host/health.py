"""Worker health: the state a client reports, and the watchdog that notices a death at once.

The :class:`Watchdog` is one thread per worker, created at start (never per call). It
blocks on a Linux ``pidfd`` of the worker (readable the moment the process exits), so a
crash, ``kill -9`` or an out-of-memory kill is seen immediately even when a grandchild
still holds the channel open; without ``pidfd_open`` it polls every 100 ms.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable

import attrs

from edge_core.host.identity import ProcessIdentity
from edge_core.host.started_process import StartedProcess

__all__ = ["Health", "Watchdog", "describe_exit"]

READY = "ready"
LOST = "lost"
RETIRED = "retired"


@attrs.frozen
class Health:
    """What a client knows about its worker.

    Attributes:
        state: ``ready``, ``lost`` (died or broke protocol) or ``retired``.
        reason: why it is not ready (None while ready).
        exit_status: the root process's exit status once known (negative: signal).
        in_flight: requests sent and not yet ended.
        identity: the worker's verified process identity.

    """

    state: str
    reason: str | None
    exit_status: int | None
    in_flight: int
    identity: ProcessIdentity

    @property
    def ready(self) -> bool:
        """True while the worker can take requests."""
        return self.state == READY

    def to_dict(self) -> dict[str, object]:
        """Plain form for reports."""
        return {
            "state": self.state,
            "reason": self.reason,
            "exit_status": self.exit_status,
            "in_flight": self.in_flight,
            "identity": self.identity.to_dict(),
        }


def describe_exit(status: int | None) -> str:
    """Render an exit status (negative numbers are signals, as ``subprocess`` gives them)."""
    if status is None:
        return "exited (status unknown)"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = str(-status)
        return f"killed by signal {name}"
    return f"exited with status {status}"


class Watchdog:
    """Calls ``on_exit(status)`` from its own thread as soon as the worker process exits."""

    def __init__(self, popen: StartedProcess, on_exit: Callable[[int | None], None]):
        self._popen = popen
        self._on_exit = on_exit
        self._wake_r, self._wake_w = os.pipe()
        self._pidfd: int | None
        self._pidfd = popen.dup_pidfd()  # a pooled one's: the pidfd its zygote opened
        self._thread = threading.Thread(
            target=self._run, name=f"edge-watchdog-{popen.pid}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if self._pidfd is not None:
            poller.register(self._pidfd, select.POLLIN)
        while True:
            events = poller.poll(None if self._pidfd is not None else 100)
            if any(fd == self._wake_r for fd, _ in events):
                return
            if (self._pidfd is not None and events) or self._popen.poll() is not None or (
                    self._popen.ended):
                break
        try:  # the process has exited: wait() only reaps (poll() may lose a race to it)
            status = self._popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - pidfd said it exited
            status = None
        self._on_exit(status)

    def stop(self) -> None:
        """Stop watching and release the descriptors (idempotent; not from the callback)."""
        if self._wake_w < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        for fd in (self._wake_r, self._wake_w, self._pidfd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        self._pidfd = None
