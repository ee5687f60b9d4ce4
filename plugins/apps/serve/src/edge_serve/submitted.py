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
read (the ASGI receive channel says nothing else until then).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from starlette.requests import Request

from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.submission import Submission

__all__ = ["RequestHandle", "watch_disconnect"]


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
