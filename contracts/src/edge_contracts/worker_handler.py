"""The handler a worker's route entry returns: :class:`Handler` and its defaults.

See :mod:`edge_contracts.worker` (which re-exports both) for the calling rules of the
serve loop. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from edge_contracts.worker_call import Call

__all__ = ["BaseHandler", "Handler"]


class Handler(Protocol):
    """What a route's factory returns; see the module docstring for the calling rules."""

    def versions(self) -> Mapping[str, str]:
        """Runtime versions for the hello, e.g. ``{"onnxruntime": "1.22.0"}``."""
        ...

    def required_features(self) -> frozenset[str]:
        """Protocol features this handler cannot work without (e.g. ``stream-events``)."""
        ...

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Load the artifact described by ``config``; return a JSON report."""
        ...

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run the warm-up bucket; return a JSON report (e.g. node -> provider)."""
        ...

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Serve one request: return outputs (graph) or None and emit later (streaming)."""
        ...

    def cancel(self, request_id: str) -> None:
        """Abort one request in place; its CANCELLED event has already been sent."""
        ...

    def close(self) -> None:
        """Release everything; the process exits afterwards."""
        ...


class BaseHandler:
    """Defaults for every :class:`Handler` method but :meth:`submit`."""

    #: Whether the worker process ends at once after :meth:`close` (``os._exit`` once the
    #: serve loop has closed its channel and segments and flushed its output), skipping
    #: the interpreter's own teardown: ``atexit`` handlers and the final garbage
    #: collections. For a handler whose ``close`` already released everything its runtime
    #: holds (child processes included) and whose interpreter would only spend time
    #: collecting objects (vLLM's: 2-5 s). Read with ``getattr``: a handler without the
    #: attribute exits normally.
    exit_after_close: bool = False

    def versions(self) -> Mapping[str, str]:
        """Report no runtime versions."""
        return {}

    def required_features(self) -> frozenset[str]:
        """Require no protocol feature."""
        return frozenset()

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Load nothing."""
        return {}

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Warm nothing up."""
        return {}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Refuse: a handler must implement this."""
        raise NotImplementedError(f"{type(self).__name__}.submit")

    def query(self, question: Mapping[str, Any]) -> Mapping[str, Any]:
        """Answer a ``query`` frame: a question about the loaded model that takes no slot.

        Optional (the serve loop looks it up with ``getattr``; a handler without it
        answers an error). Called on the loop thread as soon as the frame is read —
        between requests, ahead of those still waiting in the worker, while streaming
        requests go on — so it must be quick and must not wait for a request. The
        question and the answer are JSON objects whose meaning the backend's own stage
        and handler agree on; a generate backend answers how many tokens a prompt is with
        the model's own tokenizer, so that its stage refuses a prompt over the context
        before admission (``LoadedStage.check_params``). An exception is the reply's
        error. This default has no answer to give.
        """
        raise NotImplementedError(f"{type(self).__name__}.query: this handler answers no "
                                  f"query: {sorted(question)}")

    def cancel(self, request_id: str) -> None:
        """Nothing to abort."""

    def close(self) -> None:
        """Nothing to release."""
