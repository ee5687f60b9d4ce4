"""Closing a pipeline retires its stages' workers at once; each is still verified and settled.

Real echo workers. Each stage runtime's retirement first waits at a barrier of every
stage: a close that retired them one after another would leave the first alone at the
barrier until its (generous) timeout broke it, and that stage's retirement would fail. No
time is measured. The summary keeps the reverse data-flow order, every tree is retired
and verified, the ledger ends empty; a retirement that raises is recorded unverified and
its reservation quarantined while the others are released.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline
from edge_core.runtime.stage_runtime import StageRuntime, close_all
from edge_core.testing.leaks import descendants

from .conftest import OpenPipeline, echo_stage

BARRIER_TIMEOUT_S = 60.0  # a bound for a loaded machine, never a speed assertion


def _meet_before_retiring(pipeline: Pipeline) -> list[str]:
    """Make every stage's retirement wait for all the others to have begun theirs."""
    runtimes = pipeline.stages
    barrier = threading.Barrier(len(runtimes), timeout=BARRIER_TIMEOUT_S)
    entered: list[str] = []

    for runtime in runtimes:
        original = runtime.retire

        def retire(original: Any = original, name: str = runtime.name) -> Any:
            entered.append(name)
            barrier.wait()  # BrokenBarrierError when the others never come
            return original()

        runtime.retire = retire  # type: ignore[method-assign]
    return entered


def test_close_retires_every_stage_at_once_and_settles_in_reverse_order(
        open_pipeline: OpenPipeline, ledger: ResourceLedger) -> None:
    pipeline = open_pipeline(
        echo_stage("a"),
        {**echo_stage("b", transform="edge_echo.transforms:passthrough"), "replicas": 2},
        echo_stage("c", transform="edge_echo.transforms:passthrough"))
    entered = _meet_before_retiring(pipeline)
    summary = pipeline.close()
    assert sorted(entered) == ["a", "b", "b#1", "c"]
    assert list(summary) == ["c", "b#1", "b", "a"]
    for name, entry in summary.items():
        assert entry["retire"]["verified"] is True, (name, entry)
        assert entry["release"] == "released", (name, entry)
    assert ledger.is_empty()
    assert pipeline.close() is not None  # idempotent: nothing retired twice


def test_a_retirement_that_raises_is_unverified_and_the_others_released(
        open_pipeline: OpenPipeline, ledger: ResourceLedger) -> None:
    pipeline = open_pipeline(echo_stage("a"),
                             echo_stage("b", transform="edge_echo.transforms:passthrough"))
    failing = pipeline.stage("b")
    original = failing.retire

    def broken() -> Any:
        original()  # the worker really goes; the backend then reports a failure
        raise RuntimeError("retire exploded")

    failing.retire = broken  # type: ignore[method-assign]
    summary = pipeline.close()
    assert summary["a"]["release"] == "released"
    assert summary["b"]["release"] == "quarantined"
    assert summary["b"]["retire"] is not None
    assert "retire exploded" in str(summary["b"]["retire"])
    (token,) = ledger.quarantined()  # b's alone; its worker did go (the leak check)
    assert token.owner.endswith("b")
    assert ledger.release(token, verified=True).value == "released"
    assert ledger.is_empty()


def test_close_all_gives_each_outcome_in_order_and_hands_back_an_interruption() -> None:
    class Fake:
        def __init__(self, name: str, outcome: Any) -> None:
            self.name = name
            self.outcome = outcome
            self.closed = 0

        def close(self) -> Any:
            self.closed += 1
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

    error = ValueError("no")
    fakes = [Fake("a", "A"), Fake("b", error), Fake("c", "C")]
    runtimes: list[StageRuntime | None] = [*fakes, None]  # type: ignore[list-item]
    assert close_all(runtimes) == (["A", error, "C", None], None)
    interruption = KeyboardInterrupt()
    interrupted = [Fake("a", "A"), Fake("b", interruption)]
    outcomes, raised = close_all(interrupted)  # type: ignore[arg-type]
    assert outcomes == ["A", interruption] and raised is interruption  # the caller raises it
    assert [fake.closed for fake in interrupted] == [1, 1]  # both were closed first


@pytest.mark.parametrize("moment", ["before", "after"])
def test_an_interrupted_close_of_a_lone_stage_retires_and_settles_it_then_goes_on(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, moment: str) -> None:
    """Ctrl-C (or SIGTERM) as a lone stage closes, on the caller's thread.

    ``before`` its retirement starts, or ``after`` it, before it is settled: the stage
    is still retired and its reservation released before the interruption goes on.
    Before, ``close`` raised it at once: the worker was left running (to the exit hook,
    after ``edge run`` had said it was interrupted) and its reservation charged.
    """
    import psutil

    before = descendants()
    pipeline = open_pipeline(echo_stage("a"))
    workers = [p for p in descendants() if p not in before]
    (runtime,) = pipeline.stages
    close, calls = runtime.close, []

    def interrupted() -> Any:
        calls.append(moment)
        if len(calls) == 1:
            if moment == "after":
                close()
            raise KeyboardInterrupt
        return close()

    runtime.close = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        pipeline.close()
    assert len(calls) == 2  # the interrupted retirement was run again to its end
    assert ledger.is_empty()
    assert workers and not [p for p in workers
                            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def ctrl_c() -> Iterator[Callable[[], None]]:
    """Send this process a real SIGINT, raised as ``KeyboardInterrupt`` where it lands."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda: os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def _started(before: list[Any]) -> list[Any]:

    return [p for p in descendants() if p not in before]


def _running(workers: list[Any]) -> list[Any]:
    import psutil

    return [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_ctrl_c_as_serving_stops_still_retires_and_settles_every_stage(
        open_pipeline: OpenPipeline, ledger: ResourceLedger,
        ctrl_c: Callable[[], None]) -> None:
    """A real SIGINT in the close before any stage retires (the policy's stop).

    Before, ``close`` raised it at once: no stage was retired or settled (every worker
    left to the exit hook, every reservation charged). Now the stop is run again to its
    end, every stage retired and settled, then the interruption goes on.
    """

    before = descendants()
    pipeline = open_pipeline(
        echo_stage("a"),
        {**echo_stage("b", transform="edge_echo.transforms:passthrough"), "replicas": 2})
    workers = _started(before)
    stop, calls = pipeline.policy.stop, []

    def interrupted() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            ctrl_c()  # raised here, at the next instruction
        stop()

    pipeline.policy.stop = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        pipeline.close()
    assert calls == [0, 1]  # the stop it cut short was run again to its end
    assert ledger.is_empty()
    assert workers and not _running(workers)
    assert {s.release_outcome for s in pipeline._slots} == {"released"}


def test_a_ctrl_c_as_the_first_stage_is_settled_still_settles_the_others(
        open_pipeline: OpenPipeline, ledger: ResourceLedger,
        ctrl_c: Callable[[], None]) -> None:
    """A real SIGINT once every stage retired, as the first is settled (none in flight).

    Before, the settling loop was cut short there: the stages after it stayed charged
    in the ledger, their workers gone. Now each is settled, then it goes on.
    """

    before = descendants()
    pipeline = open_pipeline(echo_stage("a"),
                             echo_stage("b", transform="edge_echo.transforms:passthrough"),
                             echo_stage("c", transform="edge_echo.transforms:passthrough"))
    workers = _started(before)
    release, calls = ledger.release, []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].owner)
        released = release(*args, **kwargs)
        if len(calls) == 1:
            ctrl_c()
        return released

    ledger.release = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        pipeline.close()
    # c's settle, cut short after its release, run again; then b's and a's
    assert [owner.split("/")[-1] for owner in calls] == ["c", "c", "b", "a"]
    assert ledger.is_empty()
    assert [s.release_outcome for s in pipeline._slots] == ["released"] * 3
    assert workers and not _running(workers)


def test_a_ctrl_c_that_keeps_a_replica_from_starting_its_close_closes_it_here(
        open_pipeline: OpenPipeline, ledger: ResourceLedger, ctrl_c: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGINT as the close starts its replicas' threads: the second never starts.

    Before, it escaped ``close_all`` there: the first replica's thread went on alone,
    the second was never retired, and nothing was settled. Now the one whose thread did
    not start is closed on the caller's thread, the other waited for, both settled.
    """

    before = descendants()
    pipeline = open_pipeline({**echo_stage("a"), "replicas": 2})
    workers = _started(before)
    closed_on: dict[str, str] = {}
    for runtime in pipeline.stages:
        def close(runtime: Any = runtime, original: Any = runtime.close) -> Any:
            closed_on.setdefault(runtime.name, threading.current_thread().name)
            return original()

        runtime.close = close  # type: ignore[method-assign]
    start, starts = threading.Thread.start, []

    def interrupted_start(thread: threading.Thread) -> None:
        if thread.name.startswith("edge-close-"):
            starts.append(thread.name)
            if len(starts) == 2:
                ctrl_c()  # raised here: this thread is never started
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        pipeline.close()
    monkeypatch.undo()
    # closed in reverse order: a#1's thread started, a's did not (closed on this thread)
    assert closed_on == {"a#1": "edge-close-a#1", "a": threading.current_thread().name}
    assert ledger.is_empty()
    assert [s.release_outcome for s in pipeline._slots] == ["released"] * 2
    assert workers and not _running(workers)
