"""Request tracking: which stage holds each request of a pipeline now, to cancel it alone.

:class:`RequestTracker` knows, per pipeline request id, which stage (a stage runtime, or
the replica set of a stage) holds the request now, so that
:meth:`~edge_core.runtime.submission.Submission.cancel` cancels that one request and says
exactly what became of it — interrupting it (:meth:`RequestTracker.cancel`) or not
(:meth:`RequestTracker.fence`, :mod:`edge_core.runtime.fence`).
"""

from __future__ import annotations

import threading
from typing import Protocol

from edge_core.backend import CancelOutcome
from edge_core.runtime.errors import DuplicateRequest, RequestCancelled
from edge_core.runtime.fence import FenceOutcome

__all__ = ["Cancellable", "RequestTracker"]


class Cancellable(Protocol):
    """Where a request can be: a stage runtime, or the replica set of a stage."""

    def cancel(self, request_id: str | None = None) -> CancelOutcome:
        """Cancel one request (or everything); its exact outcome."""
        ...

    def fence(self, request_id: str) -> FenceOutcome:
        """Cancel one request without interrupting a running call; its exact outcome."""
        ...


class _Tracked:
    __slots__ = ("cancelled", "finished", "stage")

    def __init__(self) -> None:
        self.stage: Cancellable | None = None
        self.cancelled = False
        self.finished = False


class RequestTracker:
    """Where each request of a pipeline is, for cancelling one request alone."""

    def __init__(self, pipeline: str) -> None:
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self._requests: dict[str, _Tracked] = {}

    @property
    def tracked(self) -> int:
        """How many requests are tracked now (begun and not ended)."""
        with self._lock:
            return len(self._requests)

    def begin(self, request_id: str, held: list[bool] | None = None) -> None:
        """A request was accepted (before admission).

        ``held``: appended to as the request is recorded, with no call between: a caller
        interrupted as this returns (a ``KeyboardInterrupt``) finds there whether it
        must :meth:`end` it.
        """
        with self._lock:
            if request_id in self._requests:
                raise DuplicateRequest(f"request_id: already in flight on pipeline "
                                       f"{self._pipeline!r}: {request_id!r}")
            tracked = _Tracked()
            self._requests[request_id] = tracked
            if held is not None:
                held.append(True)

    def enter(self, request_id: str, stage: Cancellable) -> None:
        """The request is about to be submitted to ``stage``; refuse if it was cancelled."""
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is not None:
                if tracked.cancelled:
                    raise RequestCancelled(f"request {request_id!r}: cancelled")
                tracked.stage = stage

    def end(self, request_id: str, once: list[bool] | None = None) -> None:
        """The request ended (delivered or failed): a later cancel finds it finished.

        ``once``: shared by the holders that may each end this request (its cancel, its
        deadline, its request thread finding it cancelled): the first ends it and
        records that, with no call between; the others end nothing, not even a later
        request given the same id.
        """
        with self._lock:
            if once:  # ended by another holder already
                return
            tracked = self._requests.get(request_id)
            if tracked is not None:  # taken out and marked without a call, then recorded
                del self._requests[request_id]
                tracked.finished = True
            if once is not None:
                once.append(True)

    def cancel(self, request_id: str) -> CancelOutcome:
        """Cancel one request; its outcome, exactly.

        ``already-finished`` when it ended; ``not-started`` when no backend is running it
        (waiting for admission, or between two stages: it is stopped before the next);
        otherwise what its current stage answered.
        """
        found, stage = self._mark(request_id)
        if not found:
            return CancelOutcome.ALREADY_FINISHED
        if stage is None:
            return CancelOutcome.NOT_STARTED
        outcome = stage.cancel(request_id)
        if outcome is CancelOutcome.ALREADY_FINISHED:  # done there, not yet sent on
            return CancelOutcome.NOT_STARTED
        return outcome

    def fence(self, request_id: str) -> FenceOutcome:
        """Cancel one request without interrupting a running call; its outcome, exactly.

        Marked cancelled at once (no further stage starts for it, and the pipeline
        delivers none of its output), then its current stage fences it
        (:meth:`StageRuntime.fence`): ``already-finished`` when it ended;
        ``not-started`` when no call of it runs (waiting for admission, between two
        stages, or its call done there and not yet sent on); ``cancelled-in-place`` or
        ``left-to-finish`` as its stage answered.
        """
        found, stage = self._mark(request_id)
        if not found:
            return FenceOutcome.ALREADY_FINISHED
        if stage is None:
            return FenceOutcome.NOT_STARTED
        outcome = stage.fence(request_id)
        if outcome is FenceOutcome.ALREADY_FINISHED:  # done there, not yet sent on
            return FenceOutcome.NOT_STARTED
        return outcome

    def _mark(self, request_id: str) -> tuple[bool, Cancellable | None]:
        """Mark a request cancelled: (whether it is still in flight, its stage)."""
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is None or tracked.finished:
                return False, None
            tracked.cancelled = True
            return True, tracked.stage

    def cancelled(self, request_id: str) -> bool:
        """True once :meth:`cancel` was called for the request."""
        with self._lock:
            tracked = self._requests.get(request_id)
            return tracked is not None and tracked.cancelled
