"""Submission: checks a request passes before it is sent, and handles on submitted requests.

* :func:`check_request_size` refuses, before anything is sent or charged, a request whose
  tensors exceed the stage's ``max_io_bytes`` (the worker would refuse the frame and drop
  its channel; refused here, the stage keeps serving).
* :class:`RequestTracker` knows, per pipeline request id, which stage holds the request
  now, so that :meth:`Submission.cancel` cancels that one request and says exactly what
  became of it — interrupting it (:meth:`RequestTracker.cancel`) or not
  (:meth:`RequestTracker.fence`, :mod:`edge_core.runtime.fence`).
* :class:`Submission` is what :meth:`Pipeline.submit` returns: the request id, its
  result, its own ``cancel()``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from edge_contracts.requests import StageEvent
from edge_core.backend import CancelOutcome
from edge_core.errors import DeadlineExceeded, EdgeError
from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.fence import FenceOutcome
from edge_core.runtime.flow import take_slot

if TYPE_CHECKING:
    from edge_core.runtime.flow import SlotPool
    from edge_core.runtime.pipeline_result import PipelineResult


class Cancellable(Protocol):
    """Where a request can be: a stage runtime, or the replica set of a stage."""

    def cancel(self, request_id: str | None = None) -> CancelOutcome:
        """Cancel one request (or everything); its exact outcome."""
        ...

    def fence(self, request_id: str) -> FenceOutcome:
        """Cancel one request without interrupting a running call; its exact outcome."""
        ...


#: Called with each non-terminal event (a token) of a submitted request's final stage.
OnEvent = Callable[[StageEvent, Mapping[str, Any]], None]

__all__ = ["OnEvent", "RequestTooLarge", "RequestTracker", "Submission", "check_request_size",
           "request_bytes", "submit"]


class RequestTooLarge(EdgeError, ValueError):
    """A request's tensors exceed the stage's ``max_io_bytes``; nothing was sent."""


def request_bytes(inputs: Mapping[str, Any]) -> int:
    """Total tensor bytes of a request's inputs (arrays and other buffer-like values)."""
    total = 0
    for value in inputs.values():
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
        elif isinstance(value, bytes | bytearray | memoryview):
            total += len(value)
    return total


def check_request_size(stage_id: str, inputs: Mapping[str, Any], limit: int) -> None:
    """Refuse a request larger than ``limit`` bytes, naming stage, bytes and limit."""
    total = request_bytes(inputs)
    if total > limit:
        raise RequestTooLarge(
            f"stages[{stage_id}].max_io_bytes: a request of {total} bytes exceeds the "
            f"limit: {limit}"
        )


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

    def begin(self, request_id: str) -> None:
        """A request was accepted (before admission)."""
        with self._lock:
            if request_id in self._requests:
                from edge_core.runtime.errors import DuplicateRequest

                raise DuplicateRequest(f"request_id: already in flight on pipeline "
                                       f"{self._pipeline!r}: {request_id!r}")
            self._requests[request_id] = _Tracked()

    def enter(self, request_id: str, stage: Cancellable) -> None:
        """The request is about to be submitted to ``stage``; refuse if it was cancelled."""
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is not None:
                if tracked.cancelled:
                    raise RequestCancelled(f"request {request_id!r}: cancelled")
                tracked.stage = stage

    def end(self, request_id: str) -> None:
        """The request ended (delivered or failed): a later cancel finds it finished."""
        with self._lock:
            tracked = self._requests.pop(request_id, None)
            if tracked is not None:
                tracked.finished = True

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


class Submission:
    """A request submitted with :meth:`Pipeline.submit`: its id, its result, its cancel.

    Take the result with :meth:`result` and acknowledge it (``with`` or ``ack()``): the
    pipeline's admission slot is held until then.
    """

    def __init__(self, request_id: str, future: concurrent.futures.Future[PipelineResult],
                 tracker: RequestTracker, until: float | None,
                 unadmit: Callable[[], None]) -> None:
        self.request_id = request_id
        self._future = future
        self._tracker = tracker
        self._until = until
        self._unadmit = unadmit
        # What the caller gets: the request thread's outcome, or RequestCancelled at once
        # after a non-interrupting cancel (the thread then still unwinds on its own).
        self._lock = threading.Lock()
        self._answer: concurrent.futures.Future[PipelineResult] = concurrent.futures.Future()
        future.add_done_callback(self._settle)

    def _settle(self, future: concurrent.futures.Future[PipelineResult]) -> None:
        """Hand the request thread's outcome to the caller; discard it when fenced."""
        if future.cancelled():  # never started (cancelled, or the pool shut down)
            self._give_up()
            return
        error = future.exception()
        with self._lock:
            if self._answer.done():  # fenced meanwhile: nobody takes this result
                result = None if error is not None else future.result()
            else:
                if error is not None:
                    self._answer.set_exception(error)
                else:
                    self._answer.set_result(future.result())
                return
        if result is not None:
            result.ack()  # its stage slot and the admission slot go back now

    def _give_up(self) -> None:
        """The caller's answer is ``RequestCancelled`` (unless it has one already)."""
        with self._lock:
            if not self._answer.done():
                self._answer.set_exception(
                    RequestCancelled(f"request {self.request_id!r}: cancelled"))

    def done(self) -> bool:
        """True once the request has a result or an error (a fenced one has at once)."""
        return self._answer.done()

    def result(self, timeout_s: float | None = None) -> PipelineResult:
        """Wait for the result (at most ``timeout_s``, else until the request's deadline).

        Raises:
            DeadlineExceeded: no result in time (the request itself goes on unless its
                own deadline expired, which ends it).
            RequestCancelled, RequestFailed, WorkerUnresponsive, ...: how the request ended.
        """
        wait = timeout_s
        if wait is None and self._until is not None:  # the request's deadline ends it
            wait = max(0.0, self._until - time.monotonic()) + 1.0
        try:
            return self._answer.result(wait)
        except concurrent.futures.TimeoutError:
            if self._answer.done():  # the request's own DeadlineExceeded, a TimeoutError too
                raise
            raise DeadlineExceeded(f"request {self.request_id!r}: no result within the "
                                   f"wait: {wait}") from None

    @overload
    def cancel(self, *, interrupt: Literal[True] = ...) -> CancelOutcome: ...

    @overload
    def cancel(self, *, interrupt: Literal[False]) -> FenceOutcome: ...

    @overload
    def cancel(self, *, interrupt: bool) -> CancelOutcome | FenceOutcome: ...

    def cancel(self, *, interrupt: bool = True) -> CancelOutcome | FenceOutcome:
        """Cancel this request alone.

        ``interrupt=True`` (the default) stops it wherever it is: a running call of a
        non-preemptible stage retires that stage's worker
        (:meth:`RequestTracker.cancel`; :class:`~edge_core.backend.CancelOutcome`).

        ``interrupt=False`` never retires a worker (:meth:`RequestTracker.fence`;
        :class:`~edge_core.runtime.fence.FenceOutcome`): the request is fenced at once
        and :meth:`result` raises ``RequestCancelled`` from now on; a call a
        non-preemptible stage is running is left to finish (``left-to-finish``), and
        its result is discarded when it arrives, which is when the stage's slot and
        the pipeline's admission slot are freed. A preemptible stage still stops it in
        place.
        """
        if self._future.cancel():  # still queued: no thread has taken it
            self._tracker.end(self.request_id)
            self._unadmit()  # the admission it took at submission
            return CancelOutcome.NOT_STARTED if interrupt else FenceOutcome.NOT_STARTED
        if interrupt:
            return self._tracker.cancel(self.request_id)
        outcome = self._tracker.fence(self.request_id)
        if outcome is not FenceOutcome.ALREADY_FINISHED:
            self._give_up()
        return outcome


def submit(executor: concurrent.futures.Executor, tracker: RequestTracker, admission: SlotPool,
           run: Callable[[float | None, str], PipelineResult], request_id: str,
           deadline_s: float | None) -> Submission:
    """Take admission now, then ``run(until, request_id)`` on ``executor``.

    Admission is taken in the caller's thread — at once, or waiting up to ``deadline_s``
    — so that a full pipeline refuses the submission itself; ``run`` holds that slot.

    Raises:
        ResourceUnavailable: the pipeline is full and no deadline was given.
        DeadlineExceeded: admission did not come before the deadline.
        DuplicateRequest: ``request_id`` is in flight on this pipeline.
    """
    until = None if deadline_s is None else time.monotonic() + deadline_s
    tracker.begin(request_id)
    try:
        take_slot(admission, until)
    except BaseException:
        tracker.end(request_id)
        raise

    def work() -> PipelineResult:
        try:
            return run(until, request_id)
        finally:
            tracker.end(request_id)

    try:
        future = executor.submit(work)
    except BaseException:
        admission.release()
        tracker.end(request_id)
        raise
    return Submission(request_id, future, tracker, until, admission.release)
