"""The admission queue: requests wait their turn for a pipeline's admission, in order.

A pipeline admits ``admission`` requests at once (its :class:`SlotPool`). When every slot
is taken, a request does not fail: it waits in this queue, first come first served, until
a slot frees — at most :attr:`QueuePolicy.wait_s` seconds, and never past its own deadline
(``deadline_s``). The queue holds at most :attr:`QueuePolicy.length` waiting requests:

* a request that finds the queue full is refused at once: 429 with a ``Retry-After`` that
  estimates when a place frees (the recent time a request held its slot, times the
  requests ahead, over the admission; at least 1 s);
* a request whose deadline (or the queue's wait limit) passes while it waits is answered
  504 and leaves the queue;
* a request whose client disconnects while it waits leaves the queue (499, counted
  ``cancelled``); one still waiting when the server's grace period ends is answered 503.

A request is handed a :class:`Claim` when its turn comes: the claim stands for the slot
until the request has taken it with :meth:`Pipeline.submit` (or given up before), so that
the next request is let in only when a slot is really free — the queue follows the
pipeline's own slot pool (its release listeners), so a request still unwinding after a
cancel, or taken by another route, is never counted twice. Everything but
:meth:`Claim.settle` and the slot listener runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge_core.runtime.admission import SlotPool
from edge_serve.outcomes import HttpRefusal, server_stopping
from edge_serve.signals import Signals

__all__ = ["DEFAULT_LENGTH", "DEFAULT_WAIT_S", "AdmissionQueue", "Claim", "QueuePolicy"]

DEFAULT_LENGTH = 64
"""Requests that may wait for a pipeline's admission at once (``--queue-length``)."""

DEFAULT_WAIT_S = 30.0
"""Longest wait for admission of a request without a shorter deadline (``--queue-wait``)."""

#: Weight of the newest hold time in the running estimate behind ``Retry-After``.
_SMOOTHING = 0.2

#: Why a request left the queue without being admitted (``edge_queue_refusals_total``).
REASONS = ("full", "deadline", "disconnected", "stopping")

#: ``observe(pipeline, outcome, waited_s)``: one request left the queue; ``outcome`` is
#: ``"admitted"`` or one of :data:`REASONS`.
Observer = Callable[[str, str, float], None]


@dataclass(frozen=True)
class QueuePolicy:
    """How many requests may wait for a pipeline's admission, and for how long.

    Attributes:
        length: Requests that may wait at once (0: none; a full pipeline refuses at once).
        wait_s: Longest wait of a request, unless its own deadline is shorter.
    """

    length: int = DEFAULT_LENGTH
    wait_s: float = DEFAULT_WAIT_S

    def __post_init__(self) -> None:
        if self.length < 0:
            raise ValueError(f"queue length: must be >= 0: {self.length!r}")
        if not self.wait_s > 0 or math.isinf(self.wait_s):
            raise ValueError(f"queue wait: must be a finite number of seconds > 0: "
                             f"{self.wait_s!r}")


class Claim:
    """A turn for one request: it stands for an admission slot until the request took it.

    :meth:`settle` is called once the request's ``Pipeline.submit`` returned or raised
    (from any thread), or when the request ended without submitting; only the first call
    counts. :meth:`finished` is called when the request's work ended, with how long it
    held its turn (for the ``Retry-After`` estimate).
    """

    __slots__ = ("_lock", "_queue", "_settled", "started")

    def __init__(self, queue: AdmissionQueue) -> None:
        self._queue = queue
        self._lock = threading.Lock()
        self._settled = False
        self.started = time.monotonic()

    def settle(self) -> None:
        """The request took its slot (or never will): the next one may be let in."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
        self._queue.settled()

    def finished(self) -> None:
        """The request's work ended (on the loop): its hold time feeds the estimate."""
        if not self._settled:  # (usually settled when it submitted)
            self.settle()
        self._queue.held(time.monotonic() - self.started)


class AdmissionQueue:
    """The FIFO of requests waiting for one pipeline's admission slots.

    Args:
        pipeline: The pipeline's name (in answers and metrics).
        slots: The pipeline's admission slots (``Pipeline.admission``).
        policy: The queue's length and longest wait.
    """

    def __init__(self, pipeline: str, slots: SlotPool, policy: QueuePolicy) -> None:
        self.pipeline = pipeline
        self.slots = slots
        self.policy = policy
        #: Called as each request leaves the queue (the server's metrics).
        self.observer: Observer | None = None
        self._waiters: collections.deque[asyncio.Future[Claim]] = collections.deque()
        self._claimed = 0  # turns handed out whose request has not yet taken its slot
        self._hold_s: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        slots.listeners.append(self._slot_freed)

    # -- figures -----------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    def retry_after_s(self) -> int:
        """Seconds until a place in a full queue is likely to free (at least 1)."""
        hold = self._hold_s if self._hold_s is not None else 1.0
        ahead = self.waiting + 1
        return max(1, math.ceil(hold * ahead / self.slots.limit))

    # -- entering ----------------------------------------------------------------------------

    async def enter(self, deadline_s: float | None, signals: Signals) -> Claim:
        """Wait for this request's turn; its :class:`Claim` (settle it after submitting).

        Raises:
            HttpRefusal: 429 the queue is full; 504 the request's deadline (or the queue's
                wait limit) passed while it waited; 499 its client disconnected; 503 the
                server's grace period ended.
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        if (not self._waiters or not self.waiting) and self.slots.free > self._claimed:
            return self._admit(0.0)  # (a slot free: _free() > 0)
        if self.waiting >= self.policy.length:
            self._observe("full", 0.0)
            raise self._full()
        waiter: asyncio.Future[Claim] = self._loop.create_future()
        self._waiters.append(waiter)
        started = time.monotonic()
        limit = self.policy.wait_s if deadline_s is None else min(deadline_s,
                                                                  self.policy.wait_s)
        woken: asyncio.Future[None] = self._loop.create_future()

        def wake(*_: object) -> None:
            if not woken.done():
                woken.set_result(None)

        waiter.add_done_callback(wake)
        forget = signals.on_change(wake)
        timer = self._loop.call_later(max(limit, 0.0), wake)
        try:
            await woken
        except BaseException:
            self._leave(waiter)
            raise
        finally:
            timer.cancel()
            forget()
        waited = time.monotonic() - started
        if waiter.done() and not waiter.cancelled() and not signals.set:
            self._observe("admitted", waited)
            return waiter.result()
        self._leave(waiter)
        if signals.gone:
            self._observe("disconnected", waited)
            raise HttpRefusal(499, "request", "the client disconnected while the request "
                              "waited for admission", kind="ClientDisconnected")
        if signals.drained:
            self._observe("stopping", waited)
            raise server_stopping(0.0)
        self._observe("deadline", waited)
        if deadline_s is not None and deadline_s <= self.policy.wait_s:
            raise HttpRefusal(504, "deadline_s", f"pipelines[{self.pipeline}]: the deadline "
                              f"passed while the request waited for admission "
                              f"({self.waiting} waiting)", deadline_s,
                              kind="DeadlineExceeded", param="deadline_s")
        raise HttpRefusal(504, "queue.wait_s", f"pipelines[{self.pipeline}]: no admission "
                          f"within the queue's wait limit (--queue-wait)", self.policy.wait_s,
                          kind="DeadlineExceeded", param=None)

    def _full(self) -> HttpRefusal:
        return HttpRefusal(429, "admission", f"full, and {self.waiting} request(s) already "
                           f"wait (the queue's length, --queue-length)",
                           self.policy.length, kind="QueueFull",
                           headers={"Retry-After": str(self.retry_after_s())})

    def _free(self) -> int:
        return self.slots.free - self._claimed

    def _admit(self, waited: float) -> Claim:
        self._claimed += 1
        observer = self.observer  # (_observe, inline: every request passes here)
        if observer is not None:
            observer(self.pipeline, "admitted", waited)
        return Claim(self)

    def _leave(self, waiter: asyncio.Future[Claim]) -> None:
        """Take ``waiter`` out; a turn it was handed meanwhile goes to the next one."""
        if waiter.done() and not waiter.cancelled():
            waiter.result().settle()
        else:
            waiter.cancel()
        with contextlib.suppress(ValueError):  # handed a turn: already taken out
            self._waiters.remove(waiter)

    def _observe(self, outcome: str, waited: float) -> None:
        if self.observer is not None:
            self.observer(self.pipeline, outcome, waited)

    # -- turns -------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Hand turns to the longest-waiting requests while slots are free (on the loop)."""
        while self._waiters and self._free() > 0:
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self._claimed += 1
            waiter.set_result(Claim(self))

    def _on_loop(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the server's loop: now on its own thread, else soon."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            call()
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(call)

    def settled(self) -> None:
        """A claim was settled (any thread): its turn is no longer counted."""
        if threading.get_ident() == self._loop_thread:  # on the loop (a request sent
            self._claimed -= 1                           # from it): no closure, no hop
            if self._waiters:
                self._pump()
            return

        def unclaim() -> None:
            self._claimed -= 1
            self._pump()

        self._on_loop(unclaim)

    def held(self, seconds: float) -> None:
        """A request held its turn ``seconds`` (on the loop): update the estimate."""
        self._hold_s = seconds if self._hold_s is None else \
            (1 - _SMOOTHING) * self._hold_s + _SMOOTHING * seconds

    def _slot_freed(self) -> None:
        """The pipeline freed a slot (any thread)."""
        if self._waiters:
            self._on_loop(self._pump)
