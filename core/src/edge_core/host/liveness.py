"""Liveness: noticing, from a thread of its own, that a worker stopped answering.

The :class:`~edge_core.host.health.Watchdog` sees a worker *die*; this module sees one
that is alive but no longer answers (stopped with ``SIGSTOP``, frozen, stuck in the
kernel) while work is outstanding. A call's own thread cannot be the judge — it is the
one that waits — so one :class:`LivenessMonitor` thread per controller process checks
every watched worker each :data:`TICK_S`.

What the check relies on:

* a worker that negotiated :data:`~edge_contracts.protocol.FEATURE_HEARTBEAT` sends a
  ``heartbeat`` frame every :data:`~edge_contracts.worker_heartbeat.HEARTBEAT_S` while it
  has work, from a thread that is not its handler's, so a long model call still beats;
  every frame heard from the worker (events, replies, heartbeats) counts;
* the states of the worker's threads (``/proc/PID/task/*/stat`` on Linux).

Silence is measured by this side's reading; a worker whose frames wait unread on the
channel (a loaded controller) is not silent. A worker with calls outstanding that has
been silent for :data:`SILENCE_S` is declared
**unresponsive** when one of its threads is stopped (``T``/``t``: ``SIGSTOP``, a
debugger), or — when it heartbeats — when none of its threads has been runnable at any
look for :data:`NOT_RUNNABLE_S` (it should have beaten and is not even waiting for a
CPU: stuck in the kernel, frozen; one look is not enough, as every thread of a busy
worker on a loaded host can be asleep at one instant). A
heartbeating worker whose threads are runnable but silent for :data:`STARVED_SILENCE_S`
(a loaded machine delays threads; a C extension that holds the GIL starves its heartbeat)
is declared unresponsive too. A worker without heartbeats is judged only by the stopped
state. Detection therefore takes at most ``SILENCE_S + TICK_S`` (1.2 s) for a stopped
worker, ``SILENCE_S + NOT_RUNNABLE_S + TICK_S`` (1.8 s) for a frozen one. What a hung
handler thread does inside a living worker is not this module's business: each call's
``call_timeout_s`` bounds that.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "NOT_RUNNABLE_S",
    "SILENCE_S",
    "STARVED_SILENCE_S",
    "TICK_S",
    "LivenessMonitor",
    "Watched",
    "monitor",
    "thread_states",
]

TICK_S = 0.2
"""How often the monitor looks at the workers that have work outstanding."""

SILENCE_S = 1.0
"""Silence (no frame) after which a busy worker's thread states are examined."""

NOT_RUNNABLE_S = 0.6
"""How long a silent heartbeating worker must show no runnable thread, at every look,
before that makes it unresponsive (a busy vLLM worker waiting on its engine process was
once seen with every thread asleep 1.18 s into a silence on a loaded 2-core host)."""

STARVED_SILENCE_S = 5.0
"""Silence after which a heartbeating worker is unresponsive whatever its threads' states."""


class Watched(Protocol):
    """What the monitor needs of a worker client."""

    @property
    def liveness_pid(self) -> int:
        """The worker's process id."""
        ...

    @property
    def last_heard(self) -> float:
        """``time.monotonic()`` of the last frame read from the worker."""
        ...

    @property
    def heartbeats(self) -> bool:
        """Whether the worker sends heartbeats while busy."""
        ...

    def outstanding(self) -> int:
        """Calls and control calls waiting for the worker (0: nothing to watch)."""
        ...

    def unread(self) -> bool:
        """True when the worker's bytes wait on the channel, not yet read by this side."""
        ...

    def unresponsive(self, reason: str) -> None:
        """Called once the worker is judged unresponsive (from the monitor's thread)."""
        ...


def thread_states(pid: int) -> set[str] | None:
    """The one-letter scheduler states of the process's threads; None when unknown."""
    states: set[str] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii") as handle:
                stat = handle.read()
        except OSError:  # the thread ended meanwhile
            continue
        states.add(stat[stat.rindex(")") + 2 :][:1])
    return states or None


def judge(silent_s: float, heartbeats: bool, states: set[str] | None,
          not_runnable_s: float) -> str | None:
    """Why a busy worker silent for ``silent_s`` is unresponsive, or None if it is not.

    ``not_runnable_s``: how long every look at its threads during this silence, this
    one included, found none runnable (0 when this look did find one).
    """
    if silent_s < SILENCE_S:
        return None
    if states is not None and states & {"T", "t"}:
        return f"stopped (thread states {''.join(sorted(states))})"
    if not heartbeats:
        return None
    if states is not None and "R" not in states and not_runnable_s >= NOT_RUNNABLE_S:
        return (f"no heartbeat and no runnable thread for {not_runnable_s:.2f} s "
                f"(thread states {''.join(sorted(states))})")
    if silent_s >= STARVED_SILENCE_S:
        return "no heartbeat although its threads are runnable"
    return None


class _Entry:
    __slots__ = ("busy_since", "client", "not_runnable_since")

    def __init__(self, client: weakref.ref[Watched]) -> None:
        self.client = client
        self.busy_since: float | None = None
        self.not_runnable_since: float | None = None  # first look of a run finding no R


class LivenessMonitor:
    """One daemon thread that checks every watched worker each :data:`TICK_S`.

    The thread starts with the first :meth:`watch` and parks while nothing is watched.
    A worker is reported once (its client then fails every call with
    :class:`~edge_core.host.errors.WorkerUnresponsive` and stops being watched).
    """

    def __init__(self, tick_s: float = TICK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tick_s = tick_s
        self._clock = clock
        self._cond = threading.Condition()
        self._entries: dict[int, _Entry] = {}
        self._thread: threading.Thread | None = None

    def watch(self, client: Watched) -> None:
        """Watch ``client`` until :meth:`forget` (held weakly)."""
        with self._cond:
            self._entries[id(client)] = _Entry(weakref.ref(client))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="edge-liveness",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def forget(self, client: Watched) -> None:
        """Stop watching ``client`` (idempotent)."""
        with self._cond:
            self._entries.pop(id(client), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._entries:
                    self._cond.wait()
                entries = list(self._entries.items())
            for key, entry in entries:
                self._check(key, entry)
            time.sleep(self._tick_s)

    def _check(self, key: int, entry: _Entry) -> None:
        client = entry.client()
        if client is None:
            self.forget_key(key)
            return
        if client.outstanding() == 0:
            entry.busy_since = entry.not_runnable_since = None
            return
        now = self._clock()
        if entry.busy_since is None:
            entry.busy_since = now
        silent_s = now - max(client.last_heard, entry.busy_since)
        if silent_s < SILENCE_S or client.unread():  # unread: it spoke, we are slow
            entry.not_runnable_since = None
            return
        states = thread_states(client.liveness_pid)
        if states is None or "R" in states:
            entry.not_runnable_since = None
        elif entry.not_runnable_since is None:
            entry.not_runnable_since = now
        not_runnable_s = (0.0 if entry.not_runnable_since is None
                          else now - entry.not_runnable_since)
        reason = judge(silent_s, client.heartbeats, states, not_runnable_s)
        if reason is not None:
            self.forget_key(key)
            client.unresponsive(f"silent for {silent_s:.2f} s with work outstanding: {reason}")

    def forget_key(self, key: int) -> None:
        """Stop watching the client registered under ``key``."""
        with self._cond:
            self._entries.pop(key, None)


_MONITOR = LivenessMonitor()


def monitor() -> LivenessMonitor:
    """The controller process's one monitor."""
    return _MONITOR
