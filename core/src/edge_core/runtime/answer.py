"""A request's answer: a result or an error, set once, awaited by callbacks or by threads.

What a :class:`~edge_core.runtime.submission.Submission` hands its caller. It is set
once, by whichever thread ends the request (a request thread, the event loop that read
its reply, a channel's reader, the deadline timer's thread, a cancelling thread), and
awaited either by callbacks — each run once, in the thread that sets it, or at once in
the thread that adds it where it is set already — or by threads in
:meth:`Answer.result`, with a timeout or without.

What a submission relied on of ``concurrent.futures.Future`` (set once, ``result(timeout)``
raising ``TimeoutError`` when the time is up, callbacks run once, a callback's error
logged and the callbacks after it still run), without what that costs per request: no
``threading.Condition`` (one lock of C code; a lock to block on is made only for a thread
that does wait), no running or cancelled state (a submission keeps its own), and the
callbacks let go once run (a callback that holds the submission makes no lasting cycle).

A ``KeyboardInterrupt`` in the thread that sets it, acted on once the outcome is set,
still wakes every waiting thread and starts every callback once (those after the point it
cut short run as the interrupt goes by; the callback it cut short is not run again); one
in a thread waiting in :meth:`Answer.result` leaves the answer as it was (the wait's lock
taken off its list, or released when the answer is set).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Answer"]

T = TypeVar("T")

_LOG = logging.getLogger(__name__)
_LONGEST_WAIT_S = threading.TIMEOUT_MAX
"""A lock's wait refuses a longer timeout (``OverflowError``): a wait that long is capped."""


class Answer(Generic[T]):
    """A result or an error, set once; callbacks and waiting threads told once it is.

    Any thread may set it (:meth:`settle`, :meth:`set_result`, :meth:`set_exception`),
    add a callback or wait for it.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_lock", "_result", "_waiters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._result: T | None = None
        self._error: BaseException | None = None
        # Made when first needed (most answers have one callback and no waiting thread)
        self._callbacks: list[Callable[[], object]] | None = None
        self._waiters: list[threading.Lock] | None = None  # each held until it is set

    def done(self) -> bool:
        """True once it is set."""
        return self._done

    def holds(self, result: object) -> bool:
        """True once it is set to ``result`` itself (not to an equal one, nor an error)."""
        return self._done and self._error is None and self._result is result

    def settle(self, result: T | None, error: BaseException | None) -> bool:
        """Set it to ``result`` (``error`` None) or ``error``, unless it is set already.

        True where this set it: the threads waiting in :meth:`result` are woken and the
        callbacks are run, here, in the order they were added (a callback's ``Exception``
        is logged and the next one still runs). False where it was set before: nothing
        changes.
        """
        mine = False  # this call set it (a Ctrl-C in a losing call tells nobody)
        try:
            with self._lock:
                if self._done:
                    return False
                self._result = result
                self._error = error
                self._done = mine = True  # (no point between the two stores)
            if self._waiters is not None or self._callbacks is not None:
                self._tell()
        except BaseException:  # cut short (a Ctrl-C) once set here: whom it owes, told
            if mine:
                self._tell()
            raise
        return True

    def set_result(self, result: T) -> None:
        """Set its result (:meth:`settle`); ``RuntimeError`` where it was set already."""
        if not self.settle(result, None):
            raise RuntimeError("Answer: it is set already")

    def set_exception(self, error: BaseException) -> None:
        """Set its error (:meth:`settle`); ``RuntimeError`` where it was set already."""
        if not self.settle(None, error):
            raise RuntimeError("Answer: it is set already")

    def add_done_callback(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once it is set: in the thread that sets it, or here at once.

        An ``Exception`` the callback raises is logged (as ``concurrent.futures`` does),
        not raised to the thread that set the answer.
        """
        if not self._done:
            with self._lock:
                if not self._done:
                    if self._callbacks is None:
                        self._callbacks = [callback]
                    else:
                        self._callbacks.append(callback)
                    return
        _call(callback, self)

    def result(self, timeout: float | None = None) -> T:
        """Its result, or its error raised; waits for it at most ``timeout`` seconds.

        ``None`` waits for as long as it takes; zero or less does not wait.

        Raises:
            TimeoutError: not set within ``timeout`` (an error it is set to may be a
                ``TimeoutError`` too: :meth:`done` tells them apart).
        """
        if not self._done:
            self._wait(timeout)
        if self._error is not None:
            try:
                raise self._error
            finally:  # the traceback's frame holds no reference back to this answer
                self = None  # type: ignore[assignment]
        return self._result  # type: ignore[return-value]  # (set: T)

    def _wait(self, timeout: float | None) -> None:
        """Block until it is set, at most ``timeout``; ``TimeoutError`` if it is not then."""
        if timeout is not None and timeout <= 0:
            raise TimeoutError("Answer.result: not set, and no wait")
        got = False
        with self._lock:
            if self._done:
                return
            waiter = threading.Lock()
            waiter.acquire()  # (a lock just made: taken at once)
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
        try:
            if timeout is None:
                got = waiter.acquire()
            else:
                got = waiter.acquire(True, min(timeout, _LONGEST_WAIT_S))
        finally:
            if not got:  # timed out or interrupted: off the list, unless it was set
                with self._lock:  # (once set, only the setting thread changes the list)
                    waiters = self._waiters
                    if not self._done and waiters is not None and waiter in waiters:
                        waiters.remove(waiter)
        if not self._done:
            raise TimeoutError(f"Answer.result: not set within {timeout} s")

    def _tell(self) -> None:
        """Wake the waiting threads and run the callbacks, each once (it is set).

        Each is taken off its list by a ``del`` (no point between it and its use where a
        signal is acted on), so that a second pass after an interrupt tells only whom the
        first did not; a callback the interrupt cut short is not run again.
        """
        waiters = self._waiters
        if waiters is not None:
            while waiters:
                waiter = waiters[-1]
                del waiters[-1]
                waiter.release()
        callbacks = self._callbacks
        if callbacks is not None:
            while callbacks:
                callback = callbacks[0]
                del callbacks[0]
                try:
                    callback()
                except Exception:
                    _LOG.exception("exception calling a callback of %r", self)
            self._callbacks = None  # let go: no lasting cycle through a callback


def _call(callback: Callable[[], object], answer: Answer[T]) -> None:
    """Run one callback; an ``Exception`` from it is logged."""
    try:
        callback()
    except Exception:
        _LOG.exception("exception calling a callback of %r", answer)
