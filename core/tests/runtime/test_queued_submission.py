"""A submission still queued for a request thread: what it holds is given back once.

``edge_core.runtime.submission.submit`` takes the request's tracking and an admission
slot, then queues its work on the executor. A request cancelled (or past its deadline)
before a thread takes it never runs: its cancel gives both back, and so does its work
when the executor reaches it and finds it cancelled, and so does the executor's shutdown
(``Pipeline.close``) for work it drops unrun; each of them may be cut short by a Ctrl-C.
Between them everything is given back exactly once. Real executor, tracker and slot pool;
the request's own work is the test's (a pipeline is not needed to hold a thread).
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from edge_core.backend import CancelOutcome
from edge_core.runtime.admission import SlotPool
from edge_core.runtime.fence import FenceOutcome
from edge_core.runtime.request_tracker import RequestTracker
from edge_core.runtime.submission import Submission, submit

WAIT_S = 5.0


@pytest.fixture
def one_thread() -> Iterator[tuple[concurrent.futures.ThreadPoolExecutor, threading.Event]]:
    """An executor of one thread, held by a request until the event is set."""
    executor = concurrent.futures.ThreadPoolExecutor(1)
    gate = threading.Event()
    executor.submit(gate.wait, WAIT_S)
    yield executor, gate
    gate.set()
    executor.shutdown(wait=True)


def _released(admission: SlotPool) -> Any:
    """A request's work that gives its admission slot back as its result would."""
    def run(until: float | None, request_id: str) -> None:
        admission.release()
    return run


def test_a_cancelled_queued_request_never_ends_a_later_one_of_the_same_id(
        one_thread: tuple[concurrent.futures.ThreadPoolExecutor, threading.Event]) -> None:
    executor, gate = one_thread
    tracker, admission = RequestTracker("p"), SlotPool(4, "pipelines[p].admission")
    first = submit(executor, tracker, admission, _released(admission), "x", None)
    assert first.cancel(interrupt=False) is FenceOutcome.NOT_STARTED
    assert (tracker.tracked, admission.used) == (0, 0)
    running, finish = threading.Event(), threading.Event()

    def retried(until: float | None, request_id: str) -> Any:
        running.set()
        finish.wait(WAIT_S)
        admission.release()

    second = submit(executor, tracker, admission, retried, "x", None)  # the same id again
    gate.set()  # the thread reaches the cancelled work first, then the retry
    assert running.wait(WAIT_S)
    try:
        # the cancelled work, reached, gave back nothing more: the retry is still tracked
        assert (tracker.tracked, admission.used) == (1, 1)
        assert second.cancel(interrupt=False) is not FenceOutcome.ALREADY_FINISHED
    finally:
        finish.set()
    executor.shutdown(wait=True)
    assert (tracker.tracked, admission.used) == (0, 0)


def test_a_queued_request_whose_cancel_was_interrupted_is_ended_by_the_shutdown(
        one_thread: tuple[concurrent.futures.ThreadPoolExecutor, threading.Event]) -> None:
    executor, gate = one_thread
    tracker, admission = RequestTracker("p"), SlotPool(4, "pipelines[p].admission")
    queued = submit(executor, tracker, admission, _released(admission), "a", None)
    cancel_code = Submission.cancel.__code__

    def interrupting(frame: FrameType, event: str, arg: Any) -> Any:
        """Raise KeyboardInterrupt in the cancel once the request is out of the queue."""
        if frame.f_code is not cancel_code:
            return None

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line" and frame.f_locals.get("dequeued") is True:
                sys.settrace(None)
                frame.f_trace = None
                raise KeyboardInterrupt
            return local
        return local

    sys.settrace(interrupting)
    try:
        with pytest.raises(KeyboardInterrupt):
            queued.cancel(interrupt=False)
    finally:
        sys.settrace(None)
    assert (tracker.tracked, admission.used) == (1, 1)  # the cancel cut short
    executor.shutdown(wait=False, cancel_futures=True)  # what Pipeline.close does
    gate.set()
    executor.shutdown(wait=True)
    assert (tracker.tracked, admission.used) == (0, 0)
    assert queued.cancel() is CancelOutcome.ALREADY_FINISHED
