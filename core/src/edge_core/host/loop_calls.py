"""A callback handed to an asyncio event loop that runs once, even if the loop drops it.

Work that must happen once a call ends — settling a request and giving back what it
holds, closing a watched descriptor — is handed to the event loop it belongs to, so that
it runs on the loop's thread. A loop can lose it two ways: ``call_soon_threadsafe``
raises ``RuntimeError`` once the loop is closed, and a loop stopped and closed with the
callback still queued throws it away unrun (``loop.close()`` clears its ready queue;
``loop.stop()`` leaves callbacks queued by the last batch unrun). :func:`call_soon_once`
hands it over so that it runs in every case: on the loop; here, when the loop refuses
it or closed while it was handed over; or in the thread that drops the queued callback
(the one closing the loop, or collecting it) — once, except that one a Ctrl-C cuts short
as it begins is called again (a callback handed over must do nothing the second time).

A loop callback that may end calls — the loop's read of a worker channel
(:class:`~edge_core.host.loop_reading.LoopReading`) — runs as :func:`run_then_flush`:
what :func:`call_soon_once` is handed on the loop's own thread meanwhile runs right after
that callback's work, in the same turn of the loop, rather than in a turn of its own (one
pass of the loop and its ``epoll_wait`` fewer per request settled there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # typing only: edge run imports no asyncio
    import asyncio

__all__ = ["call_later_once", "call_soon_once", "run_then_flush"]

T = TypeVar("T")

_flushing = threading.local()
"""Per thread: ``(loop, callbacks)`` while :func:`run_then_flush` runs work there."""


class _Once:
    """``callback`` run at most once: by the loop, or when the loop drops it unrun."""

    __slots__ = ("_pending",)

    def __init__(self, callback: Callable[[], object]) -> None:
        self._pending = [callback]

    def __call__(self) -> None:
        pending = self._pending
        if not pending:
            return
        # Taken off with no point between (the loop, this thread and the finalizer may
        # race: no thread switch either), so that a Ctrl-C cannot drop it taken but not run
        callback = pending[-1]
        del pending[-1]
        try:
            callback()
        except BaseException as exc:  # a Ctrl-C perhaps cut it short as it began: again,
            if not isinstance(exc, Exception):  # to its end (it must tolerate that)
                callback()
            raise

    def __del__(self) -> None:  # dropped unrun: a loop closed (or collected) with it queued
        self()


def call_soon_once(loop: asyncio.AbstractEventLoop, callback: Callable[[], object], *,
                   threadsafe: bool = True) -> None:
    """Have ``loop`` call ``callback()`` soon; it runs exactly once even if the loop closes.

    ``threadsafe=False`` only on the loop's own thread while it runs (``call_soon``).
    Where the loop refuses it (closed), or closed while it was handed over, it is called
    here; where the loop drops it queued (stopped, then closed), in the thread that drops
    it. ``callback`` must not raise (an error there is reported as unraisable, not
    raised to anyone). A ``KeyboardInterrupt`` that cuts it short (as it begins,
    perhaps: before any of its code ran) has it called once more before it is raised:
    ``callback`` must tolerate that (a second call, once it began, doing nothing).
    """
    if not threadsafe:
        batch = getattr(_flushing, "batch", None)
        if batch is not None and batch[0] is loop:  # run_then_flush runs it after its work
            batch[1].append(callback)
            return
    once = _Once(callback)
    try:
        if threadsafe:
            loop.call_soon_threadsafe(once)
        else:
            loop.call_soon(once)
    except RuntimeError:  # the loop is closed: nothing will run it there
        once()
        return
    if loop.is_closed():  # closed while it was queued (after the clear, or before it)
        once()


def call_later_once(loop: asyncio.AbstractEventLoop, delay_s: float,
                    callback: Callable[[], object]) -> None:
    """Have ``loop`` call ``callback()`` in ``delay_s`` seconds; it runs exactly once.

    Call on the loop's own thread while it runs. Where the loop is closed before the time
    comes (``loop.close()`` drops what is scheduled), it is called in the thread that
    drops it. ``callback`` must not raise, as for :func:`call_soon_once`.
    """
    once = _Once(callback)
    try:
        loop.call_later(delay_s, once)
    except RuntimeError:  # the loop is closed: nothing will run it there
        once()


def run_then_flush(loop: asyncio.AbstractEventLoop, work: Callable[[], T]) -> T:
    """Run ``work()`` (a callback of ``loop``, on its thread), then what it handed the loop.

    What :func:`call_soon_once` is handed for ``loop`` on this thread (``threadsafe=False``)
    while ``work`` runs is called here once ``work`` has returned or raised, in the order
    handed over, instead of in a later turn of the loop: after ``work``, not inside it, as
    the loop would call it, and exactly once. A callback that raises is reported to the
    loop's exception handler, as the loop reports a callback's error, and the rest still run.
    A ``KeyboardInterrupt`` there has every one of them called again (each tolerates it,
    as :func:`call_soon_once` asks), then is raised.
    """
    previous = getattr(_flushing, "batch", None)
    callbacks: list[Callable[[], object]] = []
    _flushing.batch = (loop, callbacks)
    try:
        return work()
    finally:
        _flushing.batch = previous
        try:
            for callback in callbacks:  # what these hand over goes to the loop, as usual
                try:
                    callback()
                except Exception as exc:  # as the loop reports an error in a callback
                    loop.call_exception_handler({
                        "message": f"Exception in callback {callback!r}", "exception": exc})
        except BaseException:  # a Ctrl-C: every one called again (each must tolerate
            _run_reported(loop, callbacks)  # that: one begun does nothing), then raised
            raise


def _run_reported(loop: asyncio.AbstractEventLoop, callbacks: list[Callable[[], object]]) -> None:
    """Call each of ``callbacks``; an ``Exception`` is reported as the loop reports one."""
    for callback in callbacks:  # what these hand over goes to the loop, as usual
        try:
            callback()
        except Exception as exc:  # as the loop reports an error in a callback
            loop.call_exception_handler({"message": f"Exception in callback {callback!r}",
                                         "exception": exc})
