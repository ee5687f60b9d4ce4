"""The worker's heartbeat: proof of life that does not depend on the handler's thread.

While the worker has work (a request or control call executing, or a streaming request
open), a daemon thread sends a ``heartbeat`` frame every :data:`HEARTBEAT_S`. The
controller's liveness monitor (``edge_core.host.liveness``) counts every frame it hears;
a busy worker that falls silent is examined and, when stopped or frozen, declared
unresponsive. An idle worker sends nothing, and a short call sends nothing either (the
first beat comes one period after the work started; its own events are heard anyway).

Standard library only, like the rest of the worker side.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["HEARTBEAT_S", "Heartbeat"]

HEARTBEAT_S = 0.2
"""Seconds between two heartbeats of a busy worker."""


class Heartbeat:
    """Calls ``beat()`` every ``interval_s`` while ``busy()`` is true, from its own thread.

    :meth:`wake` is called when work starts (cheap: it sets an event nobody may wait on);
    the thread sleeps on that event while the worker is idle.
    """

    def __init__(self, beat: Callable[[], bool], busy: Callable[[], bool],
                 interval_s: float = HEARTBEAT_S) -> None:
        self._beat = beat
        self._busy = busy
        self._interval_s = interval_s
        self._wake = threading.Event()
        self.pending = False
        """True while a wake is pending (set by :meth:`wake`, cleared when the thread
        takes it): :meth:`wake` would do nothing then."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edge-heartbeat", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Work started: beat while it lasts.

        A wake already pending is left as it is: Event.set would take its condition's
        lock and notify for nothing on every call. The thread clears the event before
        it looks at ``busy()``, so work started after that clear is seen either way.
        A caller on a per-request path may skip the call while :attr:`pending` is true.
        """
        if not self._wake.is_set():
            self.pending = True
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            # before looking at busy(): a later wake() is not lost (pending first: a
            # wake() in between sets both again)
            self.pending = False
            self._wake.clear()
            while not self._stop.wait(self._interval_s) and self._busy():
                if not self._beat():  # the channel is gone
                    return

    def stop(self) -> None:
        """Stop beating (idempotent); the thread ends at its next wake-up."""
        self._stop.set()
        self._wake.set()
