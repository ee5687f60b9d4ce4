"""A request's interruptions while it waits: its client gone, the server's grace period over.

Both are set on the event loop (by :func:`edge_serve.submitted.watch_disconnect` and by
the drain); whoever waits registers a wake-up call instead of a task per event, so a
request that is never interrupted costs no more than two flags and a list.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Signals"]


class Signals:
    """``gone`` (the client disconnected) and ``drained`` (the grace period ended).

    Attributes:
        gone: True once the client has disconnected.
        drained: True once the server's grace period ended with the request still open.
    """

    __slots__ = ("_wakers", "drained", "gone")

    def __init__(self) -> None:
        self.gone = False
        self.drained = False
        self._wakers: list[Callable[[], None]] = []

    @property
    def set(self) -> bool:
        """True once either happened."""
        return self.gone or self.drained

    def on_change(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` when either happens (at once if one has); returns the undo."""
        if self.gone or self.drained:  # (self.set, without the property's call)
            wake()
        self._wakers.append(wake)

        def forget() -> None:
            if wake in self._wakers:
                self._wakers.remove(wake)

        return forget

    def client_gone(self) -> None:
        """The client disconnected."""
        self.gone = True
        self._wake()

    def drain(self) -> None:
        """The grace period ended."""
        self.drained = True
        self._wake()

    def _wake(self) -> None:
        for wake in list(self._wakers):
            wake()
