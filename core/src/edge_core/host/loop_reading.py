"""An asyncio event loop that reads a worker channel itself while its calls are open.

A request sent from an event loop (:meth:`Pipeline.submit
<edge_core.runtime.pipeline.Pipeline.submit>` with ``loop``) is not waited for by any
thread. Its reply could be read by the channel's background reader, which would then
wake the loop: two wake-ups after the worker's. :class:`LoopReading` instead has the loop
watch the channel's socket (``loop.add_reader``) while such calls are open, and read
what arrives itself (:meth:`ChannelReader.read_ready
<edge_core.host.reading.ChannelReader.read_ready>`): the loop is the thread the kernel
wakes, and the background reader stands aside meanwhile (:meth:`ChannelReader.elsewhere
<edge_core.host.reading.ChannelReader.elsewhere>`). A caller that waits in a thread
still leads the reading as before: the loop then finds the read role taken and leaves
the frame to it.

The loop watches a duplicate of the socket's descriptor, which only the loop closes, so
that the number it watches is never another file's, whatever the channel's own closing
does. Once the channel has ended (the worker died, or it was retired) the loop stops
watching and closes the duplicate at once. Once the last open call ended it keeps
watching :data:`LINGER_S` more (one timer per idle turn, none per call), so that a loop
serving one request after another pays the watch (a ``dup``, an ``epoll_ctl`` each way,
a ``close`` and the background reader's hand-over) once per busy spell rather than once
per request; a loop closed meanwhile stops the watch and closes the duplicate as it
closes (:func:`~edge_core.host.loop_calls.call_later_once`), so that a loop closed after
its last request leaves nothing open, and another loop that takes the channel over
meanwhile (:meth:`LoopReading.leave`) ends it on the next turn of the loop it belongs to.

A loop that stops running (or is closed) while its calls are open reads nothing more:
the background reader then reads in its place (:meth:`ChannelReader.elsewhere
<edge_core.host.reading.ChannelReader.elsewhere>` is given the loop's ``is_running``),
and a call that ends meanwhile stops the watch from the thread that ended it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

from edge_core.host.loop_calls import call_later_once, call_soon_once, run_then_flush
from edge_core.host.reading import ChannelReader

if TYPE_CHECKING:  # typing only: edge run imports no asyncio
    import asyncio

__all__ = ["LINGER_S", "LoopReading"]

LINGER_S = 1.0
"""How long, in seconds, a loop keeps watching a channel after its last open call ended."""


class LoopReading:
    """One event loop reading one worker channel while calls settled on it are open.

    Args:
        loop: The event loop; made on its thread, where its methods are called, but
            :meth:`closed`, which may come from any thread.
        reader: The channel's reader.
        fd: The channel's socket descriptor (duplicated while watched).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, reader: ChannelReader, fd: int) -> None:
        self.loop = loop
        self._reader = reader
        self._fd = fd
        self._lock = threading.Lock()
        self._open = 0
        self._watched: int | None = None  # the duplicate descriptor the loop watches
        self._lingering = False  # a stop is scheduled LINGER_S after the last call ended
        self._thread = threading.get_ident()

    @property
    def idle(self) -> bool:
        """True while no call settled on the loop is open."""
        return self._open == 0

    def opened(self) -> None:
        """A call settled on the loop was sent (on the loop's thread): watch the channel."""
        with self._lock:
            self._open += 1
            if self._watched is not None or self._reader.ended or self._reader.closing:
                return  # watched already, or nothing more to read (its calls have failed)
            watched = os.dup(self._fd)
            self._watched = watched
        self._reader.elsewhere(1, self.loop.is_running)
        self.loop.add_reader(watched, self._read)

    def closed(self) -> None:
        """An opened call ended (from any thread); after the last, the watch stops.

        On the loop's own thread while it runs, it stops :data:`LINGER_S` later unless a
        call is open then (a call opened meanwhile finds the channel watched); from
        another thread, as soon as the loop can stop it.
        """
        with self._lock:
            self._open -= 1
            if self._open > 0 or self._watched is None:
                return
        if threading.get_ident() == self._thread and self.loop.is_running():
            if not self._lingering:
                self._lingering = True
                call_later_once(self.loop, LINGER_S, self._linger_ended)
            return
        self._stop_soon()

    def leave(self) -> None:
        """Stop watching as soon as the loop can, if no call is open (any thread).

        For a channel another loop takes over while this one lingers after its last call.
        """
        if self.idle:
            self._stop_soon()

    def _stop_soon(self) -> None:
        if threading.get_ident() == self._thread:
            self._stop_if_idle()
            return
        if self.loop.is_closed():  # nothing watches any more
            with self._lock:
                if self._open > 0:
                    return
            self._stop(remove=False)
            return
        if not self.loop.is_running():  # stopped: it may be closed before it runs again,
            self._stop_if_idle()  # dropping a callback and the duplicate with it
            return
        # Once, whatever the loop does: where it closes meanwhile (the loop refuses it, or
        # is stopped and closed with it queued), here or in the thread that closes it.
        call_soon_once(self.loop, self._stop_if_idle)

    def _linger_ended(self) -> None:
        """:data:`LINGER_S` after a last call ended (or the loop dropped the timer)."""
        self._lingering = False
        self._stop_if_idle()


    def _read(self) -> None:
        """The socket is readable: read what is there, unless another thread reads.

        The calls it ends are settled right after the read, in this turn of the loop
        (:func:`~edge_core.host.loop_calls.run_then_flush`).
        """
        reader = self._reader
        if not run_then_flush(self.loop, reader.read_ready) and (reader.ended or reader.closing):
            self._stop()  # the channel is gone: its calls have failed

    def _stop_if_idle(self) -> None:
        with self._lock:
            if self._open > 0:
                return
        self._stop()

    def _stop(self, *, remove: bool = True) -> None:
        with self._lock:
            watched, self._watched = self._watched, None
        if watched is None:
            return
        if remove:
            with contextlib.suppress(RuntimeError, ValueError):  # a closed loop
                self.loop.remove_reader(watched)
        os.close(watched)
        self._reader.elsewhere(-1, self.loop.is_running)
