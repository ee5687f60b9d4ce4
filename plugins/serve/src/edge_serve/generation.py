"""One generate request of a served pipeline, cancellable on its own.

The request takes the pipeline's admission slot, is submitted to the generate stage, and
its tokens are handed to the event loop as they come (:class:`TokenFeed`). The handle's
:meth:`Generation.cancel` — called when the client disconnects or the deadline passes —
cancels this request alone (``PendingCall.cancel``: the stage fences it and the backend
aborts it inside the engine); other requests on the stage go on.

Served this way: pipelines whose only stage is a generate stage (a prompt carries no
tensors, so no graph stage can come before it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.stage_runtime import PendingCall
from edge_serve.outcomes import HttpRefusal

__all__ = ["Finished", "Generation", "TokenFeed"]


class Finished:
    """The end of a generation: the terminal event's data (finish reason, text, counts)."""

    __slots__ = ("data", "latency_s", "stage")

    def __init__(self, data: Mapping[str, Any], latency_s: float, stage: str) -> None:
        self.data = dict(data)
        self.latency_s = latency_s
        self.stage = stage


class TokenFeed:
    """Tokens, then a :class:`Finished` or an exception, handed to one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:
        """Hand one item over from any thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self) -> Any:
        """The next item, in order."""
        return await self._queue.get()


class Generation:
    """One generate request: run it on a thread with :meth:`run`, stop it with :meth:`cancel`."""

    def __init__(self, pipeline: Pipeline, params: Mapping[str, Any],
                 deadline_s: float | None) -> None:
        if len(pipeline.stages) != 1:
            raise HttpRefusal(400, "model", "the OpenAI-compatible routes serve pipelines "
                              "whose only stage is a generate stage", pipeline.config.name,
                              kind="InvalidValue")
        self.pipeline = pipeline
        self.params = dict(params)
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._pending: PendingCall | None = None
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel this request alone (from any thread); a no-op once it has ended."""
        with self._lock:
            self._cancelled = True
            pending = self._pending
        if pending is not None:
            pending.cancel()

    def run(self, feed: TokenFeed) -> None:
        """Take admission, submit, feed every token, then the end (or the error)."""
        try:
            feed.put(self._generate(feed))
        except BaseException as exc:
            feed.put(exc)

    def _generate(self, feed: TokenFeed) -> Finished:
        pipeline = self.pipeline
        stage = pipeline.stages[0]
        pipeline.admission.acquire(self.deadline_s)
        try:
            pending = stage.submit({}, params=self.params, deadline_s=self.deadline_s)
            with self._lock:
                self._pending = pending
                cancelled = self._cancelled
            if cancelled:
                pending.cancel()
            try:
                for event, _ in pending.events():
                    feed.put(dict(event.data))
                result = pending.result()
            except BaseException:
                pending.cancel()  # a no-op when the request already ended
                raise
            try:
                return Finished(result.events[-1].data, result.latency_s, stage.stage_id)
            finally:
                result.ack()
        finally:
            pipeline.admission.release()
