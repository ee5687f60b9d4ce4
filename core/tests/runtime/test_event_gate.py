"""A submitted request's ``on_event``: never called once its cancel has returned.

The stage fences a cancelled request (it accepts no event read after the fence), but the
request thread may hold an event it accepted just before; the request's gate
(:class:`~edge_core.runtime.event_gate.EventGate`) drops it, and a cancel waits for a
call under way. Real workers (the echo backend's streaming mode); the request thread is
held between the stage's acceptance of an event and its delivery by a wrapper around the
stage runtime's own ``accept``, so the window is hit every time, not by chance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from edge_contracts.requests import StageEvent
from edge_core.backend import CancelOutcome
from edge_core.errors import DeadlineExceeded
from edge_core.runtime import Pipeline, RequestCancelled
from edge_core.runtime.event_gate import EventGate
from edge_core.runtime.fence import FenceOutcome
from edge_core.runtime.submission import Submission

from .conftest import OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), np.float32)}
BOUND_S = 10.0  # a wait that only a broken runtime reaches


class Calls:
    """An ``on_event`` that records each call: (its event's seq, when it began)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.first = threading.Event()

    def __call__(self, event: StageEvent, _tensors: Mapping[str, Any]) -> None:
        self.calls.append((event.seq, time.monotonic_ns()))
        self.first.set()


def _streaming(open_pipeline: OpenPipeline, admission: int = 1) -> Pipeline:
    return open_pipeline(echo_stage("a", backend="echo-preemptible", stream_chunks=40,
                                    chunk_rate_hz=40.0), admission=admission)


def _hold_second_accepted(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
                          ) -> tuple[threading.Event, threading.Event]:
    """Hold the request thread after the stage accepted its second event: (held, go on)."""
    stage = pipeline.stage("a")
    accept = stage.accept
    held, go_on = threading.Event(), threading.Event()
    accepted: list[int] = []

    def holding(request_id: str, serial: int, event: StageEvent | None) -> bool:
        verdict = accept(request_id, serial, event)
        if verdict and event is not None and not event.terminal:
            accepted.append(event.seq)
            if len(accepted) == 2:
                held.set()
                assert go_on.wait(BOUND_S)
        return verdict

    monkeypatch.setattr(stage, "accept", holding)
    return held, go_on


def _held_request(open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch,
                  **options: Any) -> tuple[Pipeline, threading.Event, threading.Event, Calls,
                                           Submission]:
    """A streaming request (``options`` to submit) whose thread will hold its 2nd event."""
    pipeline = _streaming(open_pipeline)
    held, go_on = _hold_second_accepted(pipeline, monkeypatch)
    calls = Calls()
    return pipeline, held, go_on, calls, pipeline.submit(X, on_event=calls, **options)


def _nothing_held(pipeline: Pipeline) -> None:
    stage = pipeline.stage("a")
    deadline = time.monotonic() + BOUND_S
    while (stage.outstanding or pipeline.admission.used) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stage.outstanding == 0 and pipeline.admission.used == 0


@pytest.mark.parametrize("interrupt", [True, False], ids=["cancel", "fence"])
def test_an_event_accepted_before_the_fence_is_not_delivered_after_cancel_returns(
        open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch, interrupt: bool) -> None:
    pipeline, held, go_on, calls, submission = _held_request(open_pipeline, monkeypatch)
    try:
        assert held.wait(BOUND_S)  # the second event accepted, not yet handed on
        outcome = submission.cancel(interrupt=interrupt)
        returned = time.monotonic_ns()
    finally:
        go_on.set()
    assert outcome in (CancelOutcome.CANCELLED_IN_PLACE, FenceOutcome.CANCELLED_IN_PLACE)
    with pytest.raises(RequestCancelled):  # (a fenced one's at once: its thread goes on)
        submission.result(timeout_s=BOUND_S)
    _nothing_held(pipeline)  # the request thread has ended the request
    assert [seq for seq, _ in calls.calls] == [calls.calls[0][0]]  # the first event alone
    assert all(began < returned for _, began in calls.calls)
    # the pipeline serves on, and a request's own gate does not touch the next's
    monkeypatch.undo()
    nxt = Calls()
    with pipeline.submit(X, on_event=nxt).result(timeout_s=BOUND_S):
        assert len(nxt.calls) == 40


def test_the_pipelines_cancel_closes_every_submitted_requests_calls(
        open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline, held, go_on, calls, submission = _held_request(open_pipeline, monkeypatch)
    try:
        assert held.wait(BOUND_S)
        answers = pipeline.cancel()
        returned = time.monotonic_ns()
    finally:
        go_on.set()
    assert answers == {"a": CancelOutcome.CANCELLED_IN_PLACE.value}
    with pytest.raises(RequestCancelled):
        submission.result(timeout_s=BOUND_S)
    _nothing_held(pipeline)
    assert len(calls.calls) == 1 and calls.calls[0][1] < returned


def test_the_pipelines_cancel_leaves_a_request_waiting_for_admission_its_calls(
        open_pipeline: OpenPipeline) -> None:
    pipeline = _streaming(open_pipeline)  # admission 1
    first, waiting = Calls(), Calls()
    running = pipeline.submit(X, on_event=first)
    assert first.first.wait(BOUND_S)
    box: list[Any] = []
    submitter = threading.Thread(target=lambda: box.append(
        pipeline.submit(X, on_event=waiting, deadline_s=BOUND_S)))
    submitter.start()
    end = time.monotonic() + BOUND_S
    while not pipeline.admission.waiters and time.monotonic() < end:
        time.sleep(0.005)
    assert pipeline.admission.waiters == 1  # the second waits for the first's slot
    assert pipeline.cancel() == {"a": CancelOutcome.CANCELLED_IN_PLACE.value}
    with pytest.raises(RequestCancelled):
        running.result(timeout_s=BOUND_S)
    submitter.join(BOUND_S)
    (admitted,) = box  # admitted once the cancelled request gave its slot back
    with admitted.result(timeout_s=BOUND_S):
        assert len(waiting.calls) == 40  # started under the new epoch: not cancelled
    _nothing_held(pipeline)


def test_a_deadline_that_fences_the_request_drops_an_event_taken_before_it(
        open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline, held, go_on, calls, submission = _held_request(
        open_pipeline, monkeypatch, deadline_s=0.5, interrupt_at_deadline=False)
    try:
        assert held.wait(BOUND_S)
        with pytest.raises(DeadlineExceeded):  # the gate shut before this is raised
            submission.result(timeout_s=BOUND_S)
    finally:
        go_on.set()
    _nothing_held(pipeline)
    assert len(calls.calls) == 1


def test_a_cancel_that_raises_still_closes_the_calls(
        open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline, held, go_on, calls, submission = _held_request(open_pipeline, monkeypatch)

    def failing(request_id: str) -> CancelOutcome:
        raise RuntimeError(f"the tracker failed to cancel {request_id!r}")

    monkeypatch.setattr(pipeline.requests, "cancel", failing)
    try:
        assert held.wait(BOUND_S)
        with pytest.raises(RuntimeError, match="failed to cancel"):
            submission.cancel()
    finally:
        go_on.set()
    with submission.result(timeout_s=BOUND_S) as result:  # never fenced: it ends whole
        assert result.final.data["num_tokens"] == 40  # its 40 chunks, each one token
    assert len(calls.calls) == 1  # no call after the cancel raised
    _nothing_held(pipeline)


def test_cancel_waits_for_a_call_under_way_and_none_begins_after(
        open_pipeline: OpenPipeline) -> None:
    pipeline = _streaming(open_pipeline)
    inside, leave = threading.Event(), threading.Event()
    began: list[int] = []

    def slow(event: StageEvent, _tensors: Mapping[str, Any]) -> None:
        began.append(time.monotonic_ns())
        if len(began) == 1:
            inside.set()
            assert leave.wait(BOUND_S)

    submission = pipeline.submit(X, on_event=slow)
    assert inside.wait(BOUND_S)
    ended: list[int] = []
    cancelling = threading.Thread(
        target=lambda: (submission.cancel(), ended.append(time.monotonic_ns())))
    cancelling.start()
    try:
        cancelling.join(0.5)
        assert cancelling.is_alive() and not ended  # held by the call under way
    finally:
        leave.set()
    cancelling.join(BOUND_S)
    assert ended and len(began) == 1
    with pytest.raises(RequestCancelled):
        submission.result(timeout_s=BOUND_S)
    _nothing_held(pipeline)


def test_a_callback_that_cancels_its_own_request_gets_no_later_call(
        open_pipeline: OpenPipeline) -> None:
    # (the fence alone keeps later events out; this shows the gate's lock lets the
    # callback's own cancel close it: a plain lock would deadlock the request thread)
    pipeline = _streaming(open_pipeline)
    seen: list[int] = []
    outcomes: list[object] = []
    box: list[Any] = []
    ready = threading.Event()

    def cancelling(event: StageEvent, _tensors: Mapping[str, Any]) -> None:
        seen.append(event.seq)
        if len(seen) == 3:
            assert ready.wait(BOUND_S)
            outcomes.append(box[0].cancel())  # on the request thread, inside the call

    box.append(pipeline.submit(X, on_event=cancelling))
    ready.set()
    with pytest.raises(RequestCancelled):
        box[0].result(timeout_s=BOUND_S)
    assert outcomes == [CancelOutcome.CANCELLED_IN_PLACE] and len(seen) == 3
    _nothing_held(pipeline)


def test_the_gate_alone_calls_while_open_and_close_waits_for_a_call() -> None:
    received: list[int] = []
    inside, leave = threading.Event(), threading.Event()

    def on_event(event: Any, _tensors: Mapping[str, Any]) -> None:
        received.append(event)
        if event == 1:
            inside.set()
            assert leave.wait(BOUND_S)

    gate = EventGate(on_event)
    caller = threading.Thread(target=gate, args=(1, {}))
    caller.start()
    assert inside.wait(BOUND_S)
    closer = threading.Thread(target=gate.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and gate.open  # waits for the call under way
    leave.set()
    for thread in (caller, closer):
        thread.join(BOUND_S)
        assert not thread.is_alive()
    gate(2, {})
    assert received == [1] and not gate.open
