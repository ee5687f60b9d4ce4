"""Submission: a request handed to a pipeline's request threads, and its handle.

:func:`submit` takes the pipeline's admission in the caller's thread and runs the request
on an executor; :class:`Submission` is what :meth:`Pipeline.submit
<edge_core.runtime.pipeline.Pipeline.submit>` returns: the request id, its result, its own
``cancel()`` (through the pipeline's
:class:`~edge_core.runtime.request_tracker.RequestTracker`). Its result comes through its
:class:`RequestAnswer`, set by whichever thread ends the request: the request thread, or
(a request sent from an event loop, under way on no executor) the thread that read its
reply.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from edge_contracts.validation import require_seconds
from edge_core.backend import CancelOutcome
from edge_core.errors import DeadlineExceeded
from edge_core.runtime.admission import take_slot
from edge_core.runtime.answer import Answer
from edge_core.runtime.deadlines import timer
from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.event_gate import EventGate, OnEvent
from edge_core.runtime.fence import FenceOutcome
from edge_core.runtime.request_tracker import RequestTracker

if TYPE_CHECKING:
    from edge_core.runtime.admission import SlotPool
    from edge_core.runtime.pipeline_result import PipelineResult

__all__ = ["OnEvent", "RequestAnswer", "RequestFuture", "Submission", "submit"]


class RequestFuture(Protocol):
    """What a :class:`Submission` asks of its request's own future.

    A ``concurrent.futures.Future``: a request run by an executor.
    """

    def cancel(self) -> bool:
        """Cancel it if it has not started; True if it was."""

    def cancelled(self) -> bool:
        """True if it was cancelled before it started."""

    def exception(self) -> BaseException | None:
        """Its error (None: it has a result); called once it is done."""

    def result(self) -> PipelineResult:
        """Its result; called once it is done, without an error."""

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(self)`` once it is done."""


class RequestAnswer(Answer["PipelineResult"]):
    """A submission's answer (:class:`~edge_core.runtime.answer.Answer`), with its request's id.

    Set by whichever thread ends the request: its result (:meth:`deliver`, acknowledged
    at once where the answer was set before: a fenced request's result nobody takes) or
    its error (:meth:`fail`), ``RequestCancelled`` (:meth:`give_up`) or
    ``DeadlineExceeded`` (:meth:`expire`), whichever comes first.
    """

    __slots__ = ("request_id",)

    def __init__(self, request_id: str) -> None:
        Answer.__init__(self)
        self.request_id = request_id

    def deliver(self, result: PipelineResult) -> None:
        """The request's result; acknowledged here where the answer was set (fenced)."""
        if not self.settle(result, None):
            result.ack()  # its stage slot and the admission slot go back now

    def fail(self, error: BaseException) -> None:
        """The request's error (unless the answer was set)."""
        self.settle(None, error)

    def settle_from(self, future: RequestFuture) -> None:
        """The request thread ended: its result or error becomes the answer."""
        if future.cancelled():  # never started (cancelled, or the pool shut down)
            self.give_up()
            return
        error = future.exception()
        if error is not None:
            self.settle(None, error)
        else:
            self.deliver(future.result())

    def give_up(self) -> None:
        """The answer is ``RequestCancelled`` (unless it has one already)."""
        if not self.done():
            self.settle(None, RequestCancelled(f"request {self.request_id!r}: cancelled"))

    def expire(self) -> bool:
        """The answer is ``DeadlineExceeded``; False when it had one already."""
        if self.done():
            return False
        return self.settle(None, DeadlineExceeded(
            f"request {self.request_id!r}: deadline_s expired; the request was fenced "
            "(a call a non-preemptible stage was running is left to finish)"))


class Submission:
    """A request submitted with :meth:`Pipeline.submit`: its id, its result, its cancel.

    Take the result with :meth:`result` and acknowledge it (``with`` or ``ack()``): the
    pipeline's admission slot is held until then.

    Made with the request's ``future`` on its executor (its outcome becomes the answer),
    or with None for a request under way on none, whose ``answer`` whoever ends the
    request sets (:meth:`Pipeline.submit <edge_core.runtime.pipeline.Pipeline.submit>`
    with ``loop``); either way its cancel, its deadline and its tracking work alike.
    """

    def __init__(self, request_id: str, future: RequestFuture | None, tracker: RequestTracker,
                 until: float | None, unadmit: Callable[[], None],
                 answer: RequestAnswer | None = None, gate: EventGate | None = None) -> None:
        self.request_id = request_id
        self._gate = gate  # its on_event's, closed by its cancel (None: no on_event)
        self._future = future
        self._tracker = tracker
        self._until = until
        self._unadmit = unadmit
        self._queue_lock = threading.Lock()
        self._dequeued = False  # taken out of the queue by a cancel or the deadline
        # What the caller gets: the request's outcome, or RequestCancelled at once after a
        # non-interrupting cancel (the request then still unwinds on its own). The
        # future's callback holds the answer alone, not this submission: a reference
        # back to it would make a cycle that keeps the result's arrays alive until the
        # cyclic garbage collector happens to run.
        # (``answer``: one made by :func:`submit`, whose work sets it too, or by the
        # caller that sends the request itself)
        self._answer = RequestAnswer(request_id) if answer is None else answer
        if future is not None:
            future.add_done_callback(self._answer.settle_from)

    def done(self) -> bool:
        """True once the request has a result or an error (a fenced one has at once)."""
        return self._answer.done()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once :meth:`done`: at once if it is, else in the settling thread.

        An event loop awaits a submission this way, without a thread of its own waiting
        on :meth:`result`.
        """
        self._answer.add_done_callback(callback)

    def result(self, timeout_s: float | None = None) -> PipelineResult:
        """Wait for the result (at most ``timeout_s``, else until the request's deadline).

        ``timeout_s`` is a finite number of seconds; zero or less does not wait (the
        result if it is in, else ``DeadlineExceeded`` at once). ``None`` waits until the
        request's deadline (and a second more), else for as long as the request takes.

        Raises:
            InvalidValue: ``timeout_s`` is NaN, an infinity, a bool or no number (the
                request goes on untouched).
            DeadlineExceeded: no result in time (the request itself goes on unless its
                own deadline expired, which ends it).
            RequestCancelled, RequestFailed, WorkerUnresponsive, ...: how the request ended.
        """
        if timeout_s is not None:
            wait: float | None = require_seconds(
                timeout_s, "timeout_s", reason="must be a finite number of seconds, or None "
                "to wait until the request's deadline")
        elif self._until is not None:  # the request's deadline ends it
            wait = max(0.0, self._until - time.monotonic()) + 1.0
        else:
            wait = None
        try:
            return self._answer.result(wait)
        except TimeoutError:
            if self._answer.done():  # its own DeadlineExceeded, or set as the wait ended
                return self._answer.result(0)
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

        Once it returns (or raises), whatever the outcome, the request's ``on_event`` is
        not running and is not called again: an event its thread had taken before the
        fence is dropped, and a call under way is waited for
        (:class:`~edge_core.runtime.event_gate.EventGate`), so ``on_event`` must not wait
        on the thread that cancels.

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
        try:
            dequeued = self._dequeue()
            if dequeued is None:  # taken out of the queue before: cancelled, nothing touched
                return (CancelOutcome.ALREADY_FINISHED if interrupt
                        else FenceOutcome.ALREADY_FINISHED)
            if dequeued:  # still queued: no thread has taken it
                self._unadmit()  # its tracking and the admission it took (each once)
                return CancelOutcome.NOT_STARTED if interrupt else FenceOutcome.NOT_STARTED
            if interrupt:
                return self._tracker.cancel(self.request_id)
            outcome = self._tracker.fence(self.request_id)
            if outcome is not FenceOutcome.ALREADY_FINISHED:
                self._answer.give_up()
            return outcome
        finally:
            if self._gate is not None:  # after the fence: no event accepted from now on
                self._gate.close()

    def fence_at(self, until: float) -> None:
        """At ``until`` (monotonic), fence this request instead of interrupting it.

        For a request submitted with ``interrupt_at_deadline=False``
        (:meth:`Pipeline.submit <edge_core.runtime.pipeline.Pipeline.submit>`): when its
        deadline passes before its answer, :meth:`result` raises ``DeadlineExceeded`` from
        then on and the request is fenced as :meth:`cancel` with ``interrupt=False`` does:
        no worker is retired, a call a non-preemptible stage is running is left to
        finish (its stage's slot and the pipeline's admission slot are freed at its end),
        a preemptible stage stops it in place. The timer's handle is let go once the
        answer is in.
        """
        handle = timer().schedule(until, self._expire)
        self._answer.add_done_callback(handle.cancel)

    def _expire(self) -> None:
        """The deadline passed (the timer's thread): answer DeadlineExceeded, then fence."""
        if self._gate is not None:  # before the answer (whoever reads DeadlineExceeded
            self._gate.shut()  # finds it shut; answered first, no call was left anyway),
            # without waiting for a call under way (the timer's thread)
        if not self._answer.expire():  # answered first: nothing to end
            return
        dequeued = self._dequeue()
        if dequeued is not False:  # still queued (or taken out before): no thread took it
            if dequeued:
                self._unadmit()  # its tracking and the admission it took (each once)
            return
        self._tracker.fence(self.request_id)

    def _dequeue(self) -> bool | None:
        """Take this request out of the queue: True the one time that happens.

        None where a cancel or the deadline took it out before (``Future.cancel()`` is
        True for a cancelled future too: its admission slot was given back then, and
        must not be again); False where a thread has taken it, or where it was never
        queued (under way on no executor).
        """
        if self._future is None:
            return False
        with self._queue_lock:
            if self._dequeued:
                return None
            self._dequeued = self._future.cancel()
            return self._dequeued


def submit(executor: concurrent.futures.Executor, tracker: RequestTracker, admission: SlotPool,
           run: Callable[[float | None, str], PipelineResult], request_id: str,
           until: float | None, *, admitted: bool = False,
           gate: EventGate | None = None) -> Submission:
    """Take admission now, then ``run(until, request_id)`` on ``executor``.

    Admission is taken in the caller's thread — at once, or waiting up to ``until``
    (monotonic: the request's deadline) — so that a full pipeline refuses the submission
    itself; ``run`` holds that slot. ``admitted``: the caller has begun tracking the
    request and holds its admission slot already (both are handed to ``run``).
    ``gate``: the request's ``on_event`` gate, which ``run`` calls with each event; the
    submission's cancel closes it.

    A ``KeyboardInterrupt`` (Ctrl-C) wherever CPython acts on it here leaves nothing
    held: the tracking and the slot are recorded as they are taken (given back if it
    comes before the request is handed on), and the request's submission is made before
    its work is queued, so that from then on its cancel (``interrupt=False``) ends it
    (queued or not, started or not); where it comes after, the request runs and its
    result, dropped, is acknowledged by the drain
    (:class:`~edge_core.runtime.pipeline_result.PipelineResult`).

    Raises:
        ResourceUnavailable: the pipeline is full and no deadline was given.
        DeadlineExceeded: admission did not come before the deadline.
        DuplicateRequest: ``request_id`` is in flight on this pipeline.
    """
    # What a request that never ran holds, given back once: by the cancel (or deadline)
    # that takes it out of the queue, by its request thread finding it cancelled, or at
    # the executor's shutdown (a Ctrl-C may cut any of them short)
    unadmit = partial(_never_ran, tracker, admission, request_id, [], [])
    if not admitted:
        begun: list[bool] = []  # the tracking, once begin recorded it
        taken: list[bool] = []  # the admission slot, once take_slot counted it taken
        try:
            tracker.begin(request_id, begun)
            take_slot(admission, until, taken)
        except BaseException:  # refused, or interrupted as either returned
            if taken:
                admission.release()
            if begun:
                tracker.end(request_id)
            raise
    future: concurrent.futures.Future[PipelineResult] | None = None
    submission: Submission | None = None
    answer: RequestAnswer | None = None  # the submission's, set by its work too

    def work() -> None:
        assert future is not None and submission is not None  # (made before it is queued)
        assert answer is not None
        if not future.set_running_or_notify_cancel():  # cancelled before it started:
            unadmit()  # what it held given back (once), and its answer set, whether or
            answer.give_up()  # not its cancel got that far
            return
        try:
            try:
                result = run(until, request_id)
            finally:
                tracker.end(request_id)
        except BaseException as exc:  # the request's outcome, for its submission
            future.set_exception(exc)
        else:
            future.set_result(result)

    try:
        future = concurrent.futures.Future()
        answer = RequestAnswer(request_id)
        submission = Submission(request_id, future, tracker, until, unadmit, answer, gate)
        executor.submit(work).add_done_callback(
            partial(_unqueued, submission, unadmit, answer))
    except BaseException:  # not queued (the executor shut down), or interrupted
        if submission is None:  # nothing queued yet: given back here
            unadmit()
        else:  # perhaps queued, perhaps started: its cancel ends it either way
            submission.cancel(interrupt=False)
        raise
    return submission


def _never_ran(tracker: RequestTracker, admission: SlotPool, request_id: str,
               ended: list[bool], released: list[bool]) -> None:
    """Give back what a request that never ran holds: its tracking, then its admission slot.

    Each once (``ended`` and ``released`` record it with no call between): its cancel,
    its deadline, its request thread finding it cancelled and the executor's shutdown
    may each get here, and a Ctrl-C may cut any of them short. The tracking is ended only
    once: a second end would end a later request given the same id.
    """
    tracker.end(request_id, ended)
    admission.release_once(released)


def _unqueued(submission: Submission, unadmit: Callable[[], None], answer: RequestAnswer,
              queued: concurrent.futures.Future[None]) -> None:
    """End the submission whose work the executor cancelled unrun (its shutdown).

    Its cancel marks it taken out of the queue; what it holds is given back here as well
    (once), since a cancel cut short by a Ctrl-C after taking it out gave back nothing.
    """
    if queued.cancelled():
        submission.cancel(interrupt=False)
        unadmit()
        answer.give_up()
