"""One generate request of a served pipeline, cancellable on its own.

The request is submitted with :meth:`Pipeline.submit` (which takes the pipeline's
admission slot) and the final stage's tokens are handed to the event loop as they come
(``on_event`` → :class:`TokenFeed`). :meth:`Generation.cancel` — called when the client
disconnects or the deadline passes — cancels this request alone
(``Submission.cancel(interrupt=False)``: the stage holding it fences it; a preemptible
backend such as vLLM aborts it inside the engine, and a non-preemptible one is left to
finish it, its worker kept); other requests on the stage go on.

Served this way: pipelines whose last stage is a generate stage. With one stage the
request's parameters carry the prompt (or the chat); with graph stages before it, an
image from the chat goes through the pipeline's ``prepare`` to the first stage, the
chat's text goes to the transforms as the input ``carry:messages``, and the transform
before the generate stage builds the prompt, merged over the caller's sampling
parameters (:mod:`edge_serve.openai_api` maps the request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from edge_core.runtime.results import StageResult
from edge_serve.outcomes import HttpRefusal
from edge_serve.served import ServedPipeline
from edge_serve.submitted import RequestHandle

__all__ = ["CHAT_CARRY", "Finished", "Generation", "ImagePart", "TokenFeed"]

CHAT_CARRY = "carry:messages"
"""The pipeline input that hands a chat's text to the transforms of a multi-stage pipeline."""


class ImagePart:
    """An image a chat sent (decoded from its ``data:`` URL), for the pipeline's ``prepare``."""

    __slots__ = ("data", "field", "suffix")

    def __init__(self, data: bytes, suffix: str, field: str) -> None:
        self.data = data
        self.suffix = suffix
        self.field = field


class Finished:
    """The end of a generation: the terminal event's data and each stage's latency.

    The data: finish reason, text, token counts; latencies in seconds by stage id; the
    request's placement receipt.
    """

    __slots__ = ("data", "latencies", "placement")

    def __init__(self, data: Mapping[str, Any], latencies: Mapping[str, float],
                 placement: Sequence[Mapping[str, Any]] = ()) -> None:
        self.data = dict(data)
        self.latencies = dict(latencies)
        self.placement = [dict(stage) for stage in placement]


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
    """One generate request: run it on a thread with :meth:`run`, stop it with :meth:`cancel`.

    Args:
        served: The pipeline; its last stage generates.
        params: The caller's parameters for the final stage (sampling, and for a
            one-stage pipeline the prompt or ``messages``).
        deadline_s: Bound on the whole request, or None.
        image: For a pipeline with graph stages: the image its ``prepare`` reads.
        chat: For a pipeline with graph stages: the chat's text, as ``carry:messages``.
    """

    def __init__(self, served: ServedPipeline, params: Mapping[str, Any],
                 deadline_s: float | None, *, image: ImagePart | None = None,
                 chat: list[dict[str, str]] | None = None) -> None:
        self.served = served
        self.params = dict(params)
        self.deadline_s = deadline_s
        self.image = image
        self.chat = chat
        self.handle = RequestHandle(served.name)

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self.handle.cancelled

    def cancel(self) -> None:
        """Cancel this request alone (from any thread); a no-op once it has ended."""
        self.handle.cancel()

    def run(self, feed: TokenFeed) -> None:
        """Prepare, submit, feed every token, then the end (or the error)."""
        try:
            feed.put(self._generate(feed))
        except BaseException as exc:
            feed.put(exc)

    def _generate(self, feed: TokenFeed) -> Finished:
        inputs: dict[str, Any] = {}
        if self.image is not None:
            inputs = self.served.prepared(self.image.data, self.image.suffix,
                                          self.image.field)
        if self.chat is not None:
            inputs[CHAT_CARRY] = [dict(message) for message in self.chat]
        submission = self.served.submit(  # tells the admission queue, attaches the handle
            inputs, self.params, self.deadline_s, self.handle,
            on_event=lambda event, _: feed.put(dict(event.data)))
        with submission.result() as result:
            self.handle.check()
            final = result.final
            if not isinstance(final, StageResult):
                raise HttpRefusal(500, "model", "the generate stage was fed a fan-out; "
                                  "its items' answers are not served here", self.served.name,
                                  kind="UnsupportedFanout")
            return Finished(final.events[-1].data, result.latencies, result.placement)
