"""The end of the grace period: every request still open is ended by its own route.

On SIGINT or SIGTERM the server stops accepting and lets running requests finish for
``--grace`` seconds. When they have passed, :meth:`Drain.end` calls the ending each open
request registered: a stream sends one server-sent error event in OpenAI's shape (503,
``server_shutting_down``), then ``data: [DONE]``, and closes; a request still waiting for
its answer is answered the same as JSON; each is cancelled alone (a preemptible stage
aborts it in place). uvicorn's own graceful-shutdown timeout is set
:data:`UVICORN_MARGIN_S` later, so it finds nothing left to cut: no response ends
mid-chunk and no task is cancelled into a logged exception.

Everything here runs on the server's event loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

__all__ = ["UVICORN_MARGIN_S", "Drain"]

UVICORN_MARGIN_S = 5.0
"""How long after the grace period uvicorn's own timeout cancels what is still running."""


class Drain:
    """The endings of the requests still open, called once when the grace period ends.

    Attributes:
        grace_s: The grace period (``--grace``), named in the answers it ends.
        ended: True once :meth:`end` ran; a request registering afterwards is ended at once.
    """

    def __init__(self, grace_s: float = 0.0) -> None:
        self.grace_s = grace_s
        self.ended = False
        self._open: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    def hold(self, end: Callable[[], None]) -> Callable[[], None]:
        """Register ``end`` for the request now open; returns the call that releases it."""
        if self.ended:
            end()
            return lambda: None
        key = next(self._ids)
        self._open[key] = end

        def release() -> None:
            self._open.pop(key, None)

        return release

    @property
    def open(self) -> int:
        """How many requests are registered now."""
        return len(self._open)

    def end(self) -> int:
        """End every open request (once); how many there were."""
        self.ended = True
        endings = list(self._open.values())
        self._open.clear()
        for ending in endings:
            ending()
        return len(endings)
