"""The gate between a request's stream of events and its ``on_event`` callback.

A cancel fences the request at its stage (:meth:`StageRuntime.accept
<edge_core.runtime.stage_runtime.StageRuntime.accept>` refuses every event read after
it), but the request thread may hold an event it accepted just before: without more,
that event would reach ``on_event`` after ``cancel()`` returned. The gate closes that
window: each callback runs under its lock, and the cancel closes it after the fence, so
once ``cancel()`` returns no ``on_event`` call is running and none begins. The price:
a cancel waits for a call under way, so ``on_event`` must not wait on the thread that
cancels (a callback may cancel its own request: the lock is re-entrant).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from edge_contracts.requests import StageEvent

#: Called with each non-terminal event (a token) of a submitted request's final stage.
OnEvent = Callable[[StageEvent, Mapping[str, Any]], None]

__all__ = ["EventGate", "OnEvent"]


class EventGate:
    """``on_event`` of one request, called while the gate is open; :meth:`close` ends it.

    Called as the callback itself (the request thread passes each event through). The
    lock is re-entrant: a callback that cancels its own request closes the gate from
    inside a call, and the calls after it are dropped. ``epoch``: the pipeline's epoch
    the request started under (None until it started), which tells
    :meth:`Pipeline.cancel <edge_core.runtime.pipeline.Pipeline.cancel>` the requests it
    cancels from those it does not (one still waiting for admission runs on).
    """

    __slots__ = ("__weakref__", "_lock", "_on_event", "epoch", "open")

    def __init__(self, on_event: OnEvent) -> None:
        self._on_event = on_event
        self._lock = threading.RLock()
        self.open = True
        self.epoch: int | None = None

    def __call__(self, event: StageEvent, tensors: Mapping[str, Any]) -> None:
        """Hand one event to the callback, unless the gate was closed."""
        with self._lock:
            if self.open:
                self._on_event(event, tensors)

    def close(self) -> None:
        """Close the gate: waits for a call under way to return; no call begins after."""
        with self._lock:
            self.open = False

    def shut(self) -> None:
        """Close the gate without waiting (a timer's thread): a call under way goes on."""
        self.open = False
