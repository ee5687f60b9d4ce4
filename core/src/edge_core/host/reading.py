"""Who reads a worker channel: the thread that waits for it, else a background reader.

A request's caller waits for its reply anyway, so it reads the channel itself instead of
waiting for another thread to read the frame and wake it: handing a frame from a reader
thread to a blocked caller costs one more scheduler wake-up per event (tens of µs on a
virtual machine), more than the rest of the round trip. :class:`ChannelReader` therefore
implements *leader/follower* reading:

* a waiting thread first takes what is already in its own queue;
* otherwise, if nobody is reading, it becomes the **leader**: it waits for the socket
  (:class:`~edge_contracts.waiting.ReadableWait`: a bounded adaptive spin, then a blocking
  poll; a plain wait first receives at once, see :data:`READ_NOW_SKIP_MAX`), reads one
  frame at a time and dispatches each to whichever call it belongs to,
  until its own queue has something; it then gives the role up and wakes the other
  waiters (a :data:`HANDOVER` marker in their queues) so that one of them leads next;
* while someone else leads, a waiter is a **follower** blocked on its own queue; the
  leader puts its frames there. Only followers are listed (a leader that found the role
  free never is): the waiters a leader hands the role to.

When nobody has waited for :data:`LINGER_S`, a background thread reads instead, so that
frames nobody waits for yet (stream events, acknowledgements, a worker's protocol
violation) are still taken off the socket, and a worker never blocks on a full channel.
It polls the socket and a wake-up pipe and parks on a condition while a caller leads or
follows; the first waiter after an idle period wakes it out of its poll through the pipe.

Only one thread reads at a time (the read lock); every frame is dispatched by
``read_one``, the client's single frame handler, whichever thread runs it.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from edge_contracts.validation import require_seconds
from edge_contracts.waiting import ReadableWait
from edge_core.host.spinning import governor

__all__ = ["HANDOVER", "LINGER_S", "READ_NOW_SKIP_MAX", "ChannelReader"]

LINGER_S = 0.05
"""How long after the last waiter the background reader takes over the socket."""

READ_NOW_SKIP_MAX = 64
"""Most leading waits that poll first after a read before the poll found nothing.

Where the worker answers on the caller's CPU (both ends of the channel on one CPU: its
wake-up runs it at once, before the caller polls), the reply is in the socket when the
leader would poll: it reads at once, one system call fewer. A read that finds nothing
(the worker on another CPU, still working) costs one system call more: the next wait
polls first, and each miss in a row doubles how many do (1, 2, 4 … up to this), so that
a channel whose replies come later pays for about one read in this many waits.
"""


class _Handover:
    """Type of :data:`HANDOVER`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HANDOVER"


HANDOVER: Final = _Handover()
"""Put into a follower's queue when the leader gives up the read role; never delivered."""


def take_nowait(inbox: queue.SimpleQueue[Any]) -> Any | None:
    """Return the next item of ``inbox`` that is not :data:`HANDOVER`, else None."""
    while not inbox.empty():  # only the inbox's owner takes from it: get cannot block
        item = inbox.get_nowait()
        if item is not HANDOVER:
            return item
    return None


class ChannelReader:
    """Leader/follower reading of one channel (see the module docstring).

    Args:
        fd: the channel's socket descriptor.
        read_one: reads and dispatches exactly one frame; returns whether bytes of another
            frame wait in the client's read buffer (they are read before the socket is
            polled: the socket may have nothing more), None once the channel has ended
            (the client has then failed every call it knows of).
        gone: builds the error raised to a waiter when the channel has ended and its
            queue is empty.
        spin_us: spin budget of each wait for the socket (0: never spin); None: the
            process's :func:`~edge_core.host.spinning.governor` sizes it, counting this
            channel as one of its workers until :meth:`close`.
        name: the background thread's name.
        peer_pid: the process that answers on ``fd`` (a worker): a governed wait's
            spinning thread keeps off its CPU (:mod:`edge_core.host.apart`).
        read_now: ``read_one``, but returning False at once when the socket holds nothing
            (nothing read). A leader whose wait is plain reads with it before it polls
            while the replies it waits for are there by then (see :data:`READ_NOW_SKIP_MAX`).

    """

    def __init__(
        self,
        fd: int,
        read_one: Callable[[], bool | None],
        gone: Callable[[], BaseException],
        *,
        spin_us: int | None,
        name: str,
        peer_pid: int | None = None,
        read_now: Callable[[], bool | None] | None = None,
        buffered: Callable[[], bool | None] | None = None,
    ) -> None:
        self._fd = fd
        # Whether a frame waits in the reader's buffer now (what read_one answers), asked
        # only where a KeyboardInterrupt came as read_one returned, before its answer was
        # kept: the next leader then reads it before it polls (else it would wait for
        # the socket with a frame, perhaps a call's end, already read into the buffer)
        self._buffered = buffered
        self._read_one = read_one
        self._read_now = read_now
        # Leading waits left that poll before they read (read_now found nothing for the
        # last that tried it), and how many the next such miss makes (under the role)
        self._read_now_skip = 0 if read_now is not None else -1
        self._read_now_after_miss = 1
        self._gone = gone
        self._more: bool | None = False  # read_one's last answer (under the read role)
        self._socket_ready = [(fd, select.POLLIN)]  # the usual wake-up's poll events
        self._nudge_r, self._nudge_w = os.pipe()
        os.set_blocking(self._nudge_r, False)
        os.set_blocking(self._nudge_w, False)
        self._lead_wait = ReadableWait(fd, spin_us or 0, wake_fd=self._nudge_r)
        poller = select.poll()  # what the lead wait polls, for its plain waits made here
        poller.register(fd, select.POLLIN)
        poller.register(self._nudge_r, select.POLLIN)
        self._poll = poller.poll
        self._governed = spin_us is None
        if self._governed:
            governor().attach(self._lead_wait, peer_pid)
        # The read role: an RLock, which records its owner itself. A KeyboardInterrupt is
        # acted on as a call returns, so also right after acquire(False) returned True,
        # before the caller noted that it leads: only the owner can release it then
        # (_drop_role), and it still can.
        self._role = threading.RLock()
        # Taken directly, never through the Condition's own __enter__ (a Python function):
        # a KeyboardInterrupt acted on as its acquire returned would leave it held for good
        self._guard = threading.Lock()
        self._cv = threading.Condition(self._guard)
        self._waiting: list[queue.SimpleQueue[Any]] = []
        self._last_active = float("-inf")
        self._listened = 0  # calls whose end a callback awaits, no thread waiting for it
        self._elsewhere = 0  # event loops reading this channel (read_ready) for their calls
        self._loops_running: list[Callable[[], bool]] = []  # each such loop's is_running
        self._polling = False
        self._closing = False
        self._quiet = False
        self._ended = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._background, name=name, daemon=True)
        self._thread.start()

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closing

    @property
    def governed(self) -> bool:
        """True when the process's spin governor sizes this channel's budget."""
        return self._governed

    @property
    def lead_wait(self) -> ReadableWait:
        """The wait a leading caller spends for the socket (its budget, its history)."""
        return self._lead_wait

    @property
    def ended(self) -> bool:
        """True once a read found the channel ended."""
        return self._ended

    # -- waiting callers -------------------------------------------------------------

    def wait(self, inbox: queue.SimpleQueue[Any], timeout_s: float | None) -> Any:
        """Return the next item of ``inbox``, reading the channel while nobody else does.

        Raises:
            TimeoutError: nothing arrived within ``timeout_s``.
            InvalidValue: nothing is in ``inbox`` and ``timeout_s`` is no finite number.
            BaseException: ``gone()`` when the channel ended and ``inbox`` is empty.

        """
        # take_nowait, written out here (twice): one call fewer per wait on the per-call path
        while not inbox.empty():  # only the inbox's owner takes from it: get cannot block
            item = inbox.get_nowait()
            if item is not HANDOVER:
                return item
        # A timeout that is no finite number is refused here, before this caller waits
        # (a NaN deadline would never pass): the caller's call goes on untouched.
        deadline = None if timeout_s is None else time.monotonic() + require_seconds(
            timeout_s, "timeout_s", reason="must be a finite number of seconds, or None")
        # A caller that finds the role free leads at once, unregistered (the usual case:
        # nobody else reads or waits): the background reader stands aside while the role
        # is held. One that finds it taken registers in _waiting, so that whoever gives it
        # up hands it over, tries it once more (its holder may have given it up before it
        # saw this inbox) and then follows, blocked on its inbox.
        leading = False  # this thread holds the read role
        registered = False  # inbox is in _waiting
        try:
            while True:
                if self._ended and inbox.empty():
                    raise self._gone()
                if self._role.acquire(False):  # (positional: a keyword costs a parse)
                    leading = True
                    if self._polling and not self._closing:  # the pipes are open while the
                        with contextlib.suppress(OSError):  # role is held; a full one: a
                            os.write(self._wake_w, b"\0")  # wake-up is pending anyway
                    # Read at once (see READ_NOW_SKIP_MAX) with a plain wait only: a
                    # spinning one measures how long its replies take to come.
                    skip = self._read_now_skip
                    if skip:  # (-1: no read_now)
                        now = False
                        if skip > 0:
                            self._read_now_skip = skip - 1
                    else:
                        now = self._lead_wait.plain
                    # Read frames until inbox has an item or the channel ends.
                    while inbox.empty() and not self._ended:
                        if not self._more:  # else a frame waits in the client's buffer
                            if now:
                                now = False
                                more = self._more = self._read_now()  # type: ignore[misc]
                                if more is None:
                                    self._ended = True
                                elif not inbox.empty():  # its item: taken below
                                    self._read_now_after_miss = 1
                                    break
                                else:  # nothing for it yet: polls first from now on
                                    after = self._read_now_after_miss
                                    self._read_now_skip = after
                                    self._read_now_after_miss = min(2 * after,
                                                                    READ_NOW_SKIP_MAX)
                                continue
                            # polls once even when no time is left
                            if not self._lead_wait.plain:  # a spin budget, or measured
                                events = self._lead_wait.wait(None if deadline is None else max(
                                    0.0, deadline - time.monotonic()))
                            elif deadline is None:  # the wait's plain poll, made here
                                events = self._poll()
                            else:
                                events = self._poll(max(0, math.ceil(
                                    (deadline - time.monotonic()) * 1000)))
                            if events != self._socket_ready:  # else the usual wake-up
                                if not events:
                                    raise TimeoutError
                                readable = False
                                fd = self._fd
                                for ready, _ in events:
                                    if ready == fd:
                                        readable = True
                                    else:
                                        with contextlib.suppress(OSError):
                                            os.read(self._nudge_r, 4096)
                                if not readable:
                                    continue
                        more = self._more = self._read_one()
                        if more is None:
                            self._ended = True
                    while not inbox.empty():  # the usual way out: the role is given up below
                        item = inbox.get_nowait()
                        if item is not HANDOVER:
                            return item
                    leading = False
                    self._give_up(inbox)
                    continue
                if not registered:
                    # Noted before the inbox is listed (no point between where a Ctrl-C can
                    # act): the leaving below takes it out if it is there (_leave), and
                    # hands the role over if this wait is cut short
                    cut = False
                    registered = True
                    with self._guard:
                        self._waiting.append(inbox)
                        if self._polling and not self._closing:  # the pipe is open while we
                            with contextlib.suppress(OSError):  # hold _cv; a full pipe: a
                                os.write(self._wake_w, b"\0")  # wake-up is pending anyway
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                try:
                    item = inbox.get(timeout=left)
                except queue.Empty:
                    raise TimeoutError from None
                if item is not HANDOVER:
                    return item
        except BaseException:  # (a KeyboardInterrupt: read_one's answer asked again)
            cut = True  # (first: nothing before it where a Ctrl-C can act)
            if leading and self._buffered is not None:
                self._more = self._buffered()
            raise
        finally:
            if not registered:  # the usual case: nothing to take back under the guard
                # The role goes first: a KeyboardInterrupt acted on after any call made
                # before its release here (time.monotonic()) would leave it held.
                if leading:
                    try:  # (a NOP on 3.11: nothing on the usual way)
                        self._role.release()
                        self._last_active = time.monotonic()
                        # Read after the release: a follower that registered too late to
                        # be seen here finds the role free.
                        if self._waiting:
                            for other in list(self._waiting):
                                other.put(HANDOVER)
                        if self._listened and not self._waiting:  # read on for them at once
                            with self._guard:  # (a count raised after this read notifies)
                                self._cv.notify_all()
                    except BaseException:  # cut short (a Ctrl-C) after the role's release:
                        try:  # the followers are handed it (_leave: nothing held given
                            self._leave(inbox, True)  # twice, an unlisted inbox passed over)
                        except BaseException:  # cut short itself: again, to its end
                            self._leave(inbox, True)
                        raise
                else:  # (only ever left on an exception): perhaps the role, not noted as
                    try:  # held (acquired, or _give_up entered), the followers owed it
                        self._leave(inbox, True)
                    except BaseException:  # cut short (a Ctrl-C): again, to its end
                        self._leave(inbox, True)
                        raise
            else:
                # Leaving: the role (if led) and the registration are given up together,
                # under one acquisition of the guard; the role handed over where it was
                # held, or where the wait was cut short (perhaps in _give_up, between the
                # role's release and its hand-over). Cut short itself: again, to its end.
                try:
                    self._leave(inbox, cut)
                except BaseException:
                    self._leave(inbox, True)
                    raise

    def listening(self, change: int) -> None:
        """Count calls whose end a callback awaits instead of a waiting thread (+1, -1).

        While any is counted the background reader does not linger after the last
        waiter: it reads whenever no caller leads, so that their replies are read.
        """
        with self._guard:
            self._listened += change
            if change > 0:
                self._cv.notify_all()

    def elsewhere(self, change: int, running: Callable[[], bool] | None = None) -> None:
        """Count event loops that read this channel themselves (+1, -1): see :meth:`read_ready`.

        While any is counted the background reader stands aside: a loop that watches the
        socket reads what arrives when no caller leads. After the last it stays aside
        :data:`LINGER_S` more, as after the last waiting caller. ``running`` (the loop's
        ``is_running``, given with both changes) is asked every :data:`LINGER_S` while
        the reader stands aside: while no counted loop runs (each was stopped, or closed
        behind its open calls) the background reader reads, so that those calls end.
        """
        with self._guard:
            self._elsewhere += change
            if running is not None:
                if change > 0:
                    self._loops_running.append(running)
                else:
                    with contextlib.suppress(ValueError):
                        self._loops_running.remove(running)
            if change > 0 and self._polling and not self._closing:
                with contextlib.suppress(OSError):  # full pipe: a wake-up is pending anyway
                    os.write(self._wake_w, b"\0")
            elif change < 0:  # not woken: it takes the socket back LINGER_S from now, so
                self._last_active = time.monotonic()  # a loop's next request finds it parked

    def read_ready(self) -> bool:
        """Read and dispatch the frames ready now, without waiting, if nobody else reads.

        For an event loop watching the socket (:class:`~edge_core.host.loop_reading.
        LoopReading`): the frames buffered, and those the socket holds, read until the
        buffer is empty. The socket is asked once whether it holds any (another thread
        may have read what the loop was woken for) and not again after: the loop's watch
        of the socket, level-triggered, calls this again while it holds more. False when
        another thread holds the read role (it reads them) or the channel has ended or
        is closing.
        """
        if self._ended or self._closing or not self._role.acquire(blocking=False):
            return False
        try:
            fd = self._fd
            if self._more or any(ready == fd for ready, _ in self._lead_wait.ready()):
                while not self._ended:
                    if (more := self._read_one()) is None:
                        self._ended = True
                    self._more = more
                    if not more:  # the buffer is empty: the loop's watch tells of the rest
                        break
        finally:
            self._give_up(None)
        return True

    def nudge(self) -> None:
        """Wake the leader out of its wait: call after delivering to a queue off the socket.

        (A cancelled call's CANCELLED, for instance, is put in its queue by the
        cancelling thread while the call's own thread may be leading.)
        """
        with self._guard:
            if self._closing:  # the pipe may be closed (and its number reused) any time
                return
            with contextlib.suppress(OSError):  # full pipe: a wake-up is pending anyway
                os.write(self._nudge_w, b"\0")

    def _drop_role(self) -> bool:
        """Release the read role if this thread holds it; return whether it did.

        A ``KeyboardInterrupt`` acted on right after ``acquire(False)`` returned True,
        before the caller set its flag (or as :meth:`_give_up` was entered) leaves the role
        with its owner: released here. Held by another thread, or by nobody, the RLock
        refuses (``RuntimeError``) and nothing changes.
        """
        try:
            self._role.release()
        except RuntimeError:
            return False
        return True

    def _leave(self, inbox: queue.SimpleQueue[Any], hand_over: bool) -> None:
        """Give up a waiter's place: the role if this thread holds it, and ``inbox``'s entry.

        The role is handed over to every other waiter where this thread held it, or with
        ``hand_over``. Each step tolerates having been done already (the entry may be
        gone, or never made: see :meth:`wait`), so that one cut short by a
        ``KeyboardInterrupt`` is run again to its end with ``hand_over`` (a
        :data:`HANDOVER` more than needed only makes a follower try the role once more).
        """
        if self._drop_role():
            hand_over = True
        with self._guard:
            waiting = self._waiting
            if inbox in waiting:  # (else never listed, or taken out before a Ctrl-C)
                waiting.remove(inbox)
            self._last_active = time.monotonic()
            others = list(waiting) if waiting and hand_over else None
            if self._listened and not waiting:  # read on for them at once
                self._cv.notify_all()
        if others:
            for other in others:
                other.put(HANDOVER)

    def _role_taken(self) -> bool:
        """True while a thread holds the read role (an RLock has no ``locked()`` on 3.11)."""
        if not self._role.acquire(False):
            return True
        self._role.release()
        return False

    def _give_up(self, inbox: queue.SimpleQueue[Any] | None) -> None:
        """Release the read role and wake every other waiter to take it over."""
        self._role.release()
        with self._guard:
            waiting = self._waiting
            if not waiting or (len(waiting) == 1 and waiting[0] is inbox):  # the usual
                return  # cases: nobody waits (a loop's read), or nobody else
            others = [other for other in waiting if other is not inbox]
        for other in others:
            other.put(HANDOVER)

    # -- background reader -----------------------------------------------------------

    def _background(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            with self._guard:
                while not self._closing and (
                    self._waiting or self._role_taken()  # callers wait, or one leads
                    or (self._elsewhere and self._a_loop_reads()) or (
                        not self._listened and time.monotonic() - self._last_active < LINGER_S)
                ):
                    self._cv.wait(LINGER_S)
                if self._closing or self._ended:
                    return
                buffered = self._more  # a hint: re-checked holding the role
                self._polling = not buffered
            if buffered:
                events = [(self._fd, select.POLLIN)]
            else:
                try:
                    events = poller.poll()
                finally:
                    with self._guard:
                        self._polling = False
            if any(fd == self._wake_r for fd, _ in events):
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            if self.closing:
                return
            if not any(fd == self._fd for fd, _ in events):
                continue
            if not self._role.acquire(blocking=False):
                continue  # a caller leads; the loop parks until it is done
            try:
                ready: bool | None = self._more or any(
                    fd == self._fd for fd, _ in self._lead_wait.ready()
                )
                while not self._ended and ready:
                    if (more := self._read_one()) is None:
                        self._ended = True
                    ready = self._more = more  # never poll with a frame in the buffer
            finally:
                self._give_up(None)
            if self._ended:
                return

    def _a_loop_reads(self) -> bool:
        """True while an event loop counted by :meth:`elsewhere` runs (holding ``_cv``)."""
        loops = self._loops_running
        if len(loops) < self._elsewhere:  # counted without a way to ask: assumed running
            return True
        return any(running() for running in loops)

    def close(self) -> bool:
        """Stop reading for good (after the socket was shut down); idempotent.

        Stops the background reader and waits (bounded) until no thread is inside a read,
        then keeps the read role so that nobody reads again. Returns True when that
        happened: only then may the caller close the socket without another thread
        touching a reused descriptor number.
        """
        with self._guard:
            if self._closing:
                return self._quiet
            if self._governed:
                governor().detach(self._lead_wait)
            self._closing = True
            self._ended = True
            self._cv.notify_all()
            for fd in (self._wake_w, self._nudge_w):  # wake the reader and any leader
                with contextlib.suppress(OSError):
                    os.write(fd, b"\0")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        self._quiet = self._role.acquire(timeout=2.0) and not self._thread.is_alive()
        if self._quiet:  # else a thread may still poll them: leave them to the process
            for fd in (self._wake_r, self._wake_w, self._nudge_r, self._nudge_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        return self._quiet
