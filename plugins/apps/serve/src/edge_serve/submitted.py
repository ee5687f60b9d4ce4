"""One served request as :meth:`Pipeline.submit` runs it, cancellable alone from the loop.

A request's blocking part runs on the server's thread pool; it submits the request with
``Pipeline.submit`` and hands the :class:`~edge_core.runtime.submission.Submission` to a
:class:`RequestHandle` that the event loop holds. When the client disconnects (or the
server's deadline backstop fires) the loop calls :meth:`RequestHandle.cancel`, which
cancels that request alone without ever retiring a worker —
``Submission.cancel(interrupt=False)``: the request is fenced at once (nothing more of it
is produced or delivered, no further stage starts); a preemptible stage (vLLM) stops it in
place; a call that a non-preemptible stage (ort-cpu, echo) is running is left to finish
in its worker and its result discarded, so that one client hanging up cannot force a
worker restart that every other client waits out. The pipeline's admission slot is given
back when the request thread unwinds: at once, or when that call ends.

:func:`watch_disconnect` waits for the client's ``http.disconnect`` once the body has been
read (the ASGI receive channel says nothing else until then). :class:`DisconnectWatch`
starts that watch :data:`WATCH_AFTER_S` after a request began: a request answered sooner
(a small tensor request takes about a millisecond) costs no task, and a disconnect is
still seen at most that much later than it happened. The watches of one event loop are
started by one timer, armed for the earliest of them (:class:`_Starter`): a request
answered before its watch began costs an entry in a dictionary, not a timer of its own
that is cancelled and then lingers in the loop's schedule until its time. The timer is
armed again only once it has fired, so the longer :data:`WATCH_AFTER_S`, the more
requests share one: 20 ms lets a client's requests a few milliseconds apart share one
(at 5 ms, nearly each of them armed one and had it fire, a turn of the loop, often in the
middle of the next request), while a client that hangs up still has its request
cancelled within 20 ms.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable

from starlette.requests import Request

from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.submission import Submission

__all__ = ["WATCH_AFTER_S", "DisconnectWatch", "RequestHandle", "watch_disconnect"]

WATCH_AFTER_S = 0.02
"""How long after a request began its client's disconnect is watched for (seconds)."""


class RequestHandle:
    """Where the loop finds a request's submission; cancelling works before and after it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._submission: Submission | None = None
        self._cancelled = False
        #: Called once the request has taken its admission slot, or failed to (the
        #: admission queue's turn, :class:`edge_serve.queueing.Claim`).
        self.on_admitted: Callable[[], None] | None = None

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def check(self) -> None:
        """Raise ``RequestCancelled`` when the request was cancelled (before submitting)."""
        if self._cancelled:
            raise RequestCancelled(f"pipelines[{self.name}]: the client disconnected")

    def admitted(self) -> None:
        """``Pipeline.submit`` returned or raised: the queue may let the next request in."""
        if self.on_admitted is not None:
            self.on_admitted()

    def attach(self, submission: Submission) -> None:
        """Hold the submitted request; cancel it at once when the cancel came first."""
        with self._lock:
            self._submission = submission
            cancelled = self._cancelled
        if cancelled:
            submission.cancel(interrupt=False)

    def cancel(self) -> None:
        """Cancel this request alone, retiring no worker (any thread; may block briefly)."""
        with self._lock:
            self._cancelled = True
            submission = self._submission
        if submission is not None:
            submission.cancel(interrupt=False)


async def watch_disconnect(request: Request, on_gone: Callable[[], None]) -> None:
    """Call ``on_gone`` when the client goes away (call once the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_gone()
            return


class DisconnectWatch:
    """:func:`watch_disconnect` for one request, started :data:`WATCH_AFTER_S` from now.

    Made on the event loop once the request's body has been read (``loop``: that loop,
    when the caller has it at hand); :meth:`stop` ends it (or keeps it from starting)
    when the request is answered. ``after_s`` (default: :data:`WATCH_AFTER_S` as it is
    then) is how long after now it starts.
    """

    __slots__ = ("__weakref__", "_on_gone", "_request", "_starter", "_task")

    def __init__(self, request: Request, on_gone: Callable[[], None],
                 after_s: float | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._request = request
        self._on_gone = on_gone
        self._task: asyncio.Future[None] | None = None
        if loop is None:
            loop = asyncio.get_running_loop()
        starter = _starters.get(loop)
        if starter is None:
            starter = _starters[loop] = _Starter(loop)
        self._starter: _Starter | None = starter
        starter.add(self, WATCH_AFTER_S if after_s is None else after_s)

    def start(self) -> None:
        """Begin watching now (its time came)."""
        self._starter = None
        self._task = asyncio.ensure_future(watch_disconnect(self._request, self._on_gone))

    def stop(self) -> None:
        """Stop watching (the request has its answer, or gave up)."""
        starter = self._starter
        if starter is not None:  # (its discard(), inline: every request passes here)
            starter.due.pop(self, None)  # its timer, if the earliest, fires and finds it gone
            self._starter = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


class _Starter:
    """The watches of one loop still to start, and the one timer that starts them."""

    __slots__ = ("__weakref__", "_armed", "_loop", "due")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.due: dict[DisconnectWatch, float] = {}  # loop.time() each starts at
        self._armed: float | None = None  # when the timer fires, if armed

    def add(self, watch: DisconnectWatch, after_s: float) -> None:
        due = self._loop.time() + after_s
        self.due[watch] = due
        if self._armed is None or due < self._armed:
            self._arm(due)

    def _arm(self, due: float) -> None:
        self._armed = due
        self._loop.call_at(due, self._fire, due)

    def _fire(self, due: float) -> None:
        if self._armed != due:
            return  # a timer armed for an earlier watch took over
        self._armed = None
        now = self._loop.time()
        # within the clock's resolution: the loop runs a timer that close to its time
        starting = [watch for watch, at in self.due.items() if at <= now + 1e-6]
        for watch in starting:
            del self.due[watch]
        if self.due:
            self._arm(min(self.due.values()))
        for watch in starting:
            watch.start()


#: Each running loop's starter (the server has one loop; tests make many).
_starters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Starter] = \
    weakref.WeakKeyDictionary()
