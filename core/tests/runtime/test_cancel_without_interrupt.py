"""A per-request cancel that never interrupts a running call, with real echo workers.

``Submission.cancel(interrupt=False)`` fences the request at once (the caller gets
``RequestCancelled``, no further stage starts) and leaves a call that a non-preemptible
stage is running to finish: the worker is kept, and the call's result is discarded when it
arrives, its worker memory given back and its slots freed then. A deadline submitted with
``interrupt_at_deadline=False`` fences the same way when it passes (the caller gets
``DeadlineExceeded``); one that has passed before a call is sent sends nothing. The
autouse ``no_leaks`` fixture checks processes, shared-memory segments and descriptors
after each test.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import numpy as np
import pytest

from edge_core.errors import DeadlineExceeded
from edge_core.ledger import ResourceLedger
from edge_core.runtime import FenceOutcome, Pipeline, RequestCancelled, StageState
from edge_core.runtime.admission import SlotPool
from edge_core.runtime.request_tracker import RequestTracker
from edge_core.runtime.submission import Submission, submit

from .conftest import MiB, OpenPipeline, echo_stage
from .test_faults import pid_of, wait_for

X = {"x": np.ones((2, 2), np.float32)}
BIG = {"x": np.ones(40 * MiB // 4, np.float32)}  # 40 MiB out, under a 64 MiB worker cap


def _sent_to(stage: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The request ids ``stage.submit`` is called with from now on (a spy around it)."""
    sent: list[Any] = []
    submit = stage.submit

    def spy(*args: Any, **kwargs: Any) -> Any:
        sent.append(kwargs.get("request_id"))
        return submit(*args, **kwargs)

    monkeypatch.setattr(stage, "submit", spy)
    return sent


def test_a_running_non_preemptible_call_is_left_to_finish_and_the_worker_kept(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a", scale=3.0))
    stage = pipeline.stage("a")
    pid = pid_of(pipeline)
    submission = pipeline.submit(BIG, params={"delay_s": 3.0})
    wait_for(lambda: stage.outstanding == 1)  # sent: the worker sleeps in the call
    assert submission.cancel(interrupt=False) is FenceOutcome.LEFT_TO_FINISH
    assert submission.done()
    with pytest.raises(RequestCancelled):  # at once: the call still runs
        submission.result(timeout_s=0.5)
    # Nothing was retired; the call holds its stage slot and the admission slot until
    # it ends, honestly accounted.
    _left_to_finish(pipeline, pid, submission, ledger)


def _left_to_finish(pipeline: Pipeline, pid: int, submission: Submission,
                    ledger: ResourceLedger) -> None:
    """The fenced BIG call of stage ``a`` runs on in worker ``pid``, and ends cleanly.

    Right after the fence it still holds the stage's slot and the admission slot; then it
    ends in the same worker, nothing retired, its 40 MiB output given back undelivered
    (two more fit the worker's 64 MiB cap), and the pipeline closes with the ledger empty.
    """
    stage = pipeline.stage("a")
    assert stage.state is StageState.READY and stage.last_retire is None
    assert pipeline.admission.used == 1 and stage.outstanding == 1
    wait_for(lambda: pipeline.admission.used == 0 and stage.outstanding == 0)
    assert pid_of(pipeline) == pid and stage.generation == 1
    assert stage.state is StageState.READY and stage.last_retire is None
    for _ in range(2):
        with pipeline.run(BIG) as result:
            assert float(result.outputs["x"][0]) == 3.0
    assert submission.cancel(interrupt=False) is FenceOutcome.ALREADY_FINISHED
    pipeline.close()
    assert ledger.is_empty()


def test_a_request_between_two_stages_never_reaches_the_next(
    open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a"),
        echo_stage("b", transform="edge_echo.transforms:slow_passthrough"),
    )
    first, second = pipeline.stage("a"), pipeline.stage("b")
    pids = (pid_of(pipeline, "a"), pid_of(pipeline, "b"))
    sent = _sent_to(second, monkeypatch)  # counts the calls of stage b
    submission = pipeline.submit(X)
    # stage a's result delivered (the transform sleeps 0.5 s before stage b)
    wait_for(lambda: any(e.delivered for e in first._entries.values()))
    assert submission.cancel(interrupt=False) is FenceOutcome.NOT_STARTED
    with pytest.raises(RequestCancelled):
        submission.result()
    wait_for(lambda: pipeline.admission.used == 0)
    assert sent == [] and first.outstanding == 0 and second.outstanding == 0
    assert (pid_of(pipeline, "a"), pid_of(pipeline, "b")) == pids
    with pipeline.run(X) as result:  # the spy sees the next request: it can fail
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 4)
    assert len(sent) == 1
    pipeline.close()
    assert ledger.is_empty()


def test_a_preemptible_stage_still_cancels_in_place(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=5.0))
    stage = pipeline.stage("a")
    pid = pid_of(pipeline)
    submission = pipeline.submit(X)
    wait_for(lambda: stage.outstanding == 1)
    assert submission.cancel(interrupt=False) is FenceOutcome.CANCELLED_IN_PLACE
    with pytest.raises(RequestCancelled, match=r"request '[^']+': cancelled"):
        submission.result()
    wait_for(lambda: pipeline.admission.used == 0 and stage.outstanding == 0, timeout_s=4.0)
    assert pid_of(pipeline) == pid and stage.state is StageState.READY


def test_a_queued_submission_is_not_started(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=1.0), admission=2)
    stage = pipeline.stage("a")
    first = pipeline.submit(X)
    wait_for(lambda: stage.outstanding == 1)
    second = pipeline.submit(X, deadline_s=10.0)  # waits for stage a's only slot
    assert second.cancel(interrupt=False) is FenceOutcome.NOT_STARTED
    with pytest.raises(RequestCancelled):
        second.result()
    with first.result() as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    wait_for(lambda: pipeline.admission.used == 0 and stage.outstanding == 0)
    assert stage.state is StageState.READY


@pytest.mark.parametrize("how", ["cancel-twice", "expire-then-cancel", "cancel-then-expire"])
def test_a_queued_request_gives_its_admission_back_once(how: str) -> None:
    # Future.cancel() is True again for a future already cancelled: a second cancel, or
    # a cancel after the deadline took the request out of the queue (or the other way
    # round), gave the slot back twice: the pool under-counted what was held
    admission = SlotPool(2, "pipelines[p].admission")
    tracker = RequestTracker("p")
    executor = concurrent.futures.ThreadPoolExecutor(1)
    busy = threading.Event()
    executor.submit(busy.wait)  # the one request thread is taken: the next request queues
    try:
        admission.acquire()  # another request's slot
        queued = submit(executor, tracker, admission, lambda until, rid: None, "r1", None)
        assert admission.used == 2
        outcomes = []
        for step in how.split("-then-") if "then" in how else ["cancel", "cancel"]:
            if step == "cancel":
                outcomes.append(queued.cancel(interrupt=False))
            else:
                queued.fence_at(time.monotonic())
                wait_for(lambda: queued.done())
                time.sleep(0.05)  # the timer's thread has ended it
            assert admission.used == 1, (how, step)
        # the first cancel of a queued request did not start it; one after it was taken
        # out (by a cancel or its deadline) finds it ended, nothing touched
        expected = {"cancel-twice": [FenceOutcome.NOT_STARTED, FenceOutcome.ALREADY_FINISHED],
                    "expire-then-cancel": [FenceOutcome.ALREADY_FINISHED],
                    "cancel-then-expire": [FenceOutcome.NOT_STARTED]}[how]
        assert outcomes == expected
        admission.release()
        assert admission.used == 0
    finally:
        busy.set()
        executor.shutdown()


def test_a_fan_out_on_a_non_preemptible_stage_leaves_its_item_and_sends_no_more(
    open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = open_pipeline(
        echo_stage("first"),
        echo_stage("rows", delay_s=1.0, transform="edge_echo.transforms:split_rows"),
    )
    rows = pipeline.stage("rows")
    pid = pid_of(pipeline, "rows")
    sent = _sent_to(rows, monkeypatch)  # counts the items sent to stage rows
    submission = pipeline.submit({"x": np.ones((3, 2), np.float32)})
    wait_for(lambda: rows.outstanding >= 1)  # an item runs (request_id#i)
    in_flight = rows.outstanding
    assert submission.cancel(interrupt=False) is FenceOutcome.LEFT_TO_FINISH
    with pytest.raises(RequestCancelled):
        submission.result()
    wait_for(lambda: pipeline.admission.used == 0 and rows.outstanding == 0)
    assert len(sent) == in_flight == 1  # echo takes one call at a time; none sent after
    assert all(rid.startswith(submission.request_id + "#") for rid in sent)
    assert pid_of(pipeline, "rows") == pid and rows.state is StageState.READY


def test_a_done_callback_runs_once_the_request_settles_or_at_once_after(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """``Submission.add_done_callback``: how an event loop awaits a request (edge serve)."""
    import threading

    pipeline = open_pipeline(echo_stage("a", scale=2.0))
    settled = threading.Event()
    submission = pipeline.submit(X, params={"delay_s": 0.3})
    submission.add_done_callback(settled.set)
    assert settled.wait(30.0) and submission.done()
    with submission.result() as result:
        assert float(result.outputs["x"][0, 0]) == 2.0
    late: list[bool] = []
    submission.add_done_callback(lambda: late.append(True))  # already done: called at once
    assert late == [True]
    fenced = threading.Event()  # a fenced request settles at once, its call still running
    slow = pipeline.submit(X, params={"delay_s": 2.0})
    slow.add_done_callback(fenced.set)
    wait_for(lambda: pipeline.stage("a").outstanding == 1)
    assert slow.cancel(interrupt=False) is FenceOutcome.LEFT_TO_FINISH
    assert fenced.is_set()
    wait_for(lambda: pipeline.admission.used == 0)
    pipeline.close()
    assert ledger.is_empty()


# -- a deadline that fences (interrupt_at_deadline=False, what edge serve submits) ----------


def test_a_fencing_deadline_leaves_the_running_call_to_finish_and_keeps_the_worker(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a", scale=3.0))
    pid = pid_of(pipeline)
    submission = pipeline.submit(BIG, params={"delay_s": 3.0}, deadline_s=0.3,
                                 interrupt_at_deadline=False)
    with pytest.raises(DeadlineExceeded, match="deadline_s expired; the request was fenced"):
        submission.result()
    # Answered while the call still runs (3 s in the worker), which nothing interrupted.
    _left_to_finish(pipeline, pid, submission, ledger)


def test_an_interrupting_deadline_still_retires_the_worker_by_default(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=3.0))
    stage = pipeline.stage("a")
    submission = pipeline.submit(X, deadline_s=0.3)
    with pytest.raises(DeadlineExceeded):
        submission.result()
    wait_for(lambda: stage.last_retire is not None)
    assert stage.state is not StageState.READY


def test_a_fencing_deadline_stops_a_request_before_its_next_stage(
    open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a"),
        echo_stage("b", transform="edge_echo.transforms:slow_passthrough"),
    )
    second = pipeline.stage("b")
    pids = (pid_of(pipeline, "a"), pid_of(pipeline, "b"))
    sent = _sent_to(second, monkeypatch)  # counts the calls of stage b
    # the transform before stage b sleeps 0.5 s: the deadline passes in it
    submission = pipeline.submit(X, deadline_s=0.25, interrupt_at_deadline=False)
    with pytest.raises(DeadlineExceeded):
        submission.result()
    wait_for(lambda: pipeline.admission.used == 0)
    assert sent == [] and pipeline.stage("a").outstanding == 0 and second.outstanding == 0
    assert (pid_of(pipeline, "a"), pid_of(pipeline, "b")) == pids
    with pipeline.run(X) as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 4)
    assert len(sent) == 1
    pipeline.close()
    assert ledger.is_empty()


def test_a_fencing_deadline_takes_a_request_waiting_for_a_stage_slot_out_unsent(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=1.5), admission=2)
    stage = pipeline.stage("a")
    pid = pid_of(pipeline)
    first = pipeline.submit(X)
    wait_for(lambda: stage.outstanding == 1)
    second = pipeline.submit(X, deadline_s=0.3, interrupt_at_deadline=False)
    with pytest.raises(DeadlineExceeded):  # it waited for stage a's only slot
        second.result()
    with first.result() as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    wait_for(lambda: pipeline.admission.used == 0 and stage.outstanding == 0)
    assert stage.state is StageState.READY and pid_of(pipeline) == pid
    assert stage.generation == 1


def test_a_deadline_passed_before_the_send_sends_nothing_and_retires_nothing(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a", scale=2.0))
    stage = pipeline.stage("a")
    pid = pid_of(pipeline)
    with pytest.raises(DeadlineExceeded, match="expired before it was sent"):
        stage.submit(X, until=time.monotonic() - 1.0, wait_for_slot=False)
    assert stage.outstanding == 0 and stage.slots.used == 0
    assert stage.state is StageState.READY and stage.last_retire is None
    with pipeline.run(X) as result:  # the worker saw nothing of it
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert pid_of(pipeline) == pid and stage.generation == 1
    pipeline.close()
    assert ledger.is_empty()
