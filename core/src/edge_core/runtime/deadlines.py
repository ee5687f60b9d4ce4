"""Deadlines: every call is bounded, and an expired one is ended from outside its thread.

Two bounds apply to a stage call:

* the request's ``deadline_s`` (``Pipeline.run``/``arun``/``stream``/``submit``): one
  absolute time for the whole request, admission to result, waiting included;
* the stage option ``call_timeout_s``: the most one stage call may take, its sending
  included; its default follows the backend's kind (:func:`default_call_timeout`): 120 s
  for a graph stage, 600 s for a generate stage (a long stream).

A stage call is bounded by the earlier of the two. The waiting thread cannot time itself
out (it may be blocked inside a plugin's iterator), so the :class:`DeadlineTimer` thread
ends the call when its time comes: the request is fenced and cancelled through the normal
cancel path — in place on a preemptible backend; on a non-preemptible one the worker is
retired (verified) and the stage marked ``failed`` — and the caller, woken by the cancel,
raises :class:`~edge_core.errors.DeadlineExceeded` naming the bound that expired.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_core.backend import StageKind

__all__ = [
    "GENERATE_CALL_TIMEOUT_S",
    "GRAPH_CALL_TIMEOUT_S",
    "DeadlineTimer",
    "TimerHandle",
    "deadline_until",
    "default_call_timeout",
    "no_action",
    "timer",
]

GRAPH_CALL_TIMEOUT_S = 120.0
"""Default ``call_timeout_s`` of a stage whose backend serves graph calls."""

GENERATE_CALL_TIMEOUT_S = 600.0
"""Default ``call_timeout_s`` of a stage whose backend only generates (streams)."""

_LONGEST_WAIT_S = min(threading.TIMEOUT_MAX, 86400.0)
"""The longest the timer thread sleeps at once: a later deadline is slept towards in steps
(``Condition.wait`` refuses a timeout above ``threading.TIMEOUT_MAX``)."""


def default_call_timeout(kinds: Iterable[StageKind]) -> float:
    """The default bound on one stage call, chosen by the backend's declared kinds."""
    kinds = frozenset(kinds)
    if StageKind.GENERATE in kinds and StageKind.GRAPH not in kinds:
        return GENERATE_CALL_TIMEOUT_S
    return GRAPH_CALL_TIMEOUT_S


class TimerHandle:
    """One scheduled action, ``action(*args)``; :meth:`cancel` before it runs and it never will.

    Made by :meth:`DeadlineTimer.schedule` alone, which sets its time, action and
    arguments: a handle is made per stage call, and a class called with no ``__init__``
    of its own costs about half as much to make. ``cancelled`` is False until it is
    cancelled (on the class: not set per handle).
    """

    cancelled = False
    when: float
    action: Callable[..., None]
    args: tuple[Any, ...]

    def cancel(self) -> None:
        """Do not run the action (harmless after it ran); what it would have used is let go.

        A cancelled handle may stay in the timer's heap until its time comes: the action
        (and whatever it holds, a request's result say) is dropped now, not then.
        """
        self.cancelled = True
        self.action = no_action  # before the arguments: see DeadlineTimer._run
        self.args = ()


def no_action(*args: object) -> None:
    """The action of a cancelled handle (:meth:`TimerHandle.cancel` sets it); takes any arguments.

    Code that cancels a handle without the call sets it too: the action dropped at once
    frees what it holds, rather than when the timer next empties its inbox.
    """


def _run_inline(action: Callable[..., None], args: tuple[Any, ...]) -> None:
    """Run an expired deadline's action on the timer's own thread, its error reported.

    Where no thread can be started for it: the later deadlines wait while it runs, but
    they still fire; its error is reported as a thread's uncaught one would be.
    """
    try:
        action(*args)
    except Exception:
        kind, error, trace = sys.exc_info()
        threading.excepthook(threading.ExceptHookArgs(
            [kind, error, trace, threading.current_thread()]))


class DeadlineTimer:
    """Runs actions at ``time.monotonic()`` deadlines, each on a short-lived thread.

    One thread per controller process keeps a heap of pending deadlines and sleeps until
    the earliest. Scheduling takes no lock: the handle goes into an inbox (a deque) that
    the thread empties into its heap whenever it wakes, dropping what was cancelled
    meanwhile (most calls end long before their bound). The scheduling thread wakes it
    only when the new deadline is earlier than the one it sleeps towards, or when the
    inbox has grown to :attr:`drain_at` handles (so that memory stays bounded while it
    sleeps). The thread starts with the first deadline and again in a forked child
    (which has none). An expired action runs on a thread of its own, because it may
    retire a worker (seconds); expiries are rare, calls are not. Where no thread can be
    started (the process at its thread limit), it runs on the timer's thread instead:
    later deadlines wait for it, but the timer goes on.

    Why no wake-up is lost: the thread sets the time it will sleep until, then looks at
    the inbox once more, both holding its lock, and only then waits (which releases the
    lock). A handle put in after that look finds that time set, and a wake-up it sends
    takes the lock, so it reaches the thread once it waits.
    """

    #: Inbox size at which a schedule wakes the thread to empty it.
    drain_at = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._inbox: collections.deque[TimerHandle] = collections.deque()
        self._order = itertools.count()
        self._wake_at = float("-inf")  # what the thread sleeps towards (-inf: not asleep)
        self._started = False  # the thread runs (in this process) from then on

    def schedule(self, when: float, action: Callable[..., None], *args: Any) -> TimerHandle:
        """Run ``action(*args)`` at monotonic time ``when`` unless the handle is cancelled first.

        (The arguments given here rather than bound in a partial: one object fewer per
        stage call.)

        Raises:
            ValueError: ``when`` is NaN (nothing scheduled). Kept in the heap, it would
                never compare due, and every later deadline of the process would wait
                behind it for good.
        """
        if when != when:
            raise ValueError(f"DeadlineTimer.schedule: when must be a monotonic time, "
                             f"not {when!r}")
        handle = TimerHandle()  # (its fields set here: see TimerHandle)
        handle.when = when
        handle.action = action
        handle.args = args
        inbox = self._inbox
        inbox.append(handle)
        if not self._started:
            self._start()
        elif when < self._wake_at or len(inbox) >= self.drain_at:
            with self._lock:
                self._cond.notify()
        return handle

    def _start(self) -> None:
        with self._lock:
            if not self._started:
                threading.Thread(target=self._run, name="edge-deadlines", daemon=True).start()
                self._started = True

    def forked(self) -> None:
        """In a forked child: no thread runs there; the next :meth:`schedule` starts one.

        The parent's deadlines are not the child's: they are dropped.
        """
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap = []
        self._inbox = collections.deque()
        self._wake_at = float("-inf")
        self._started = False

    def _drain(self) -> None:
        """Move the inbox into the heap, leaving out what was cancelled (holding the lock)."""
        heap, inbox = self._heap, self._inbox
        while inbox:
            handle = inbox.popleft()
            if not handle.cancelled:
                heapq.heappush(heap, (handle.when, next(self._order), handle))
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)  # cancelled entries leave lazily
        if len(heap) >= self.drain_at:  # mostly cancelled ones below the top: compact
            kept = [entry for entry in heap if not entry[2].cancelled]
            if len(kept) < len(heap):
                heapq.heapify(kept)
                self._heap = kept

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    self._wake_at = float("-inf")
                    self._drain()
                    heap = self._heap
                    left = heap[0][0] - time.monotonic() if heap else None
                    if left is not None and left <= 0:
                        handle = heapq.heappop(heap)[2]
                        break
                    self._wake_at = heap[0][0] if heap else float("inf")
                    if self._inbox:  # put in before the time was set: take it first
                        continue
                    # a bound centuries away (call_timeout_s = 1e10) is slept towards in
                    # steps a lock's wait accepts: past TIMEOUT_MAX it raises OverflowError
                    self._cond.wait(None if left is None else min(left, _LONGEST_WAIT_S))
            if not handle.cancelled:
                # The arguments read before the action: a cancel meanwhile sets the action
                # (no_action, which takes any) before it drops the arguments, so that the
                # action read is never given the arguments of another.
                args = handle.args
                action = handle.action
                try:
                    threading.Thread(target=action, args=args,
                                     name="edge-deadline-expired", daemon=True).start()
                except RuntimeError:  # no thread to be had (the process is at its limit):
                    # run here rather than die: an uncaught error would end this thread,
                    # and no deadline of the process would fire again
                    _run_inline(action, args)

    def backlog(self) -> tuple[int, int]:
        """Handles in the inbox, and heap entries (cancelled ones included): what it holds."""
        return len(self._inbox), len(self._heap)

    def pending(self) -> int:
        """Deadlines not yet expired nor cancelled (for tests and reports)."""
        with self._cond:
            return (sum(1 for _, _, h in self._heap if not h.cancelled)
                    + sum(1 for h in list(self._inbox) if not h.cancelled))


_TIMER = DeadlineTimer()
if hasattr(os, "register_at_fork"):  # POSIX: the child has no timer thread
    os.register_at_fork(after_in_child=_TIMER.forked)


def timer() -> DeadlineTimer:
    """The controller process's one deadline timer."""
    return _TIMER


def deadline_until(deadline_s: float, field: str = "deadline_s") -> float:
    """The monotonic time a request's ``deadline_s`` ends at (from now).

    Zero or a negative number is a deadline already passed (the request then ends with
    ``DeadlineExceeded`` before anything is sent); ``None`` is the caller's "no
    deadline" and never reaches here.

    Raises:
        InvalidValue: ``deadline_s`` is not a number of seconds (a bool, a string, ...)
            or not finite (NaN, which no time compares with, or an infinity, which no
            timer or wait can be given: pass ``None`` for no deadline).
    """
    if (isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float)
            or not math.isfinite(deadline_s)):
        raise InvalidValue(field, deadline_s, "must be a finite number of seconds, or None "
                           "for no deadline")
    return time.monotonic() + deadline_s
