"""What the liveness monitor asks of a worker client: its PID, what it owes, a verdict.

Kept apart from :mod:`edge_core.host.client` (which mixes :class:`LivenessHooks` in):
the :class:`~edge_core.host.liveness.Watched` side of a
:class:`~edge_core.host.client.WorkerClient` — the PID to examine, how many answers the
worker still owes, whether bytes wait unread, the ``unresponsive`` verdict, and the
listeners told once when the worker is lost.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_core.host.errors import WorkerUnresponsive
from edge_core.host.health import READY

if TYPE_CHECKING:
    from edge_contracts.frame_reader import FrameReader
    from edge_core.host.calls import Call
    from edge_core.host.identity import ProcessIdentity

__all__ = ["LivenessHooks"]


class LivenessHooks:
    """The liveness half of a :class:`~edge_core.host.client.WorkerClient`."""

    identity: ProcessIdentity
    _lock: threading.Lock
    _state: str
    _calls: dict[str, Call]
    _replies: dict[str, Call]
    _owed: set[str]
    _frames: FrameReader
    _sock: socket.socket
    _listeners: list[Callable[[BaseException], None]]

    def _lost(self, reason: str, error: BaseException) -> None:
        raise NotImplementedError

    def _gone_error(self) -> Exception:
        raise NotImplementedError

    @property
    def liveness_pid(self) -> int:
        """The worker's PID, for the liveness monitor."""
        return self.identity.pid

    def outstanding(self) -> int:
        """Calls, control calls and cancelled calls whose last event the worker owes."""
        busy = len(self._calls) + len(self._replies) + len(self._owed)
        return busy if self._state == READY else 0

    def unread(self) -> bool:
        """True when bytes from the worker wait to be read (it spoke; this side is slow)."""
        if self._frames.buffered:
            return True
        try:
            return bool(select.select([self._sock], [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile
            return False

    def unresponsive(self, reason: str) -> None:
        """The liveness monitor's verdict: fail everything in flight with WorkerUnresponsive."""
        pid = self.identity.pid
        self._lost(f"worker: unresponsive: {reason}: pid {pid}",
                   WorkerUnresponsive("worker", f"unresponsive: {reason}", pid))

    def on_lost(self, listener: Callable[[BaseException], None]) -> None:
        """Call ``listener(error)`` once, from the thread that notices, when the worker is lost.

        Also when it is retired (the error then says ``retired``); listeners must be quick.
        A worker lost already is reported at once.
        """
        with self._lock:
            if self._state == READY:
                self._listeners.append(listener)
                return
        listener(self._gone_error())
