"""Closing a pipeline retires its stages' workers at once; each is still verified and settled.

Real echo workers. Each stage runtime's retirement first waits at a barrier of every
stage: a close that retired them one after another would leave the first alone at the
barrier until its (generous) timeout broke it, and that stage's retirement would fail. No
time is measured. The summary keeps the reverse data-flow order, every tree is retired
and verified, the ledger ends empty; a retirement that raises is recorded unverified and
its reservation quarantined while the others are released.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline
from edge_core.runtime.stage_runtime import StageRuntime, close_all

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

    before = psutil.Process().children(recursive=True)
    pipeline = open_pipeline(echo_stage("a"))
    workers = [p for p in psutil.Process().children(recursive=True) if p not in before]
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
