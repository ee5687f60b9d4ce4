"""``Pipeline.close()`` from another thread while requests are in flight or waiting.

Real echo workers. Every request under way when another thread closes the pipeline ends
soon with its result or a typed error, whichever way it was made (``run``, ``submit``,
``submit(loop=...)``, ``arun``, ``stream``) and wherever it was (running on a stage,
waiting for a stage's slot, between two stages, waiting for admission); nothing stays
charged and every worker is retired (the conftest's leak check counts processes,
segments and descriptors; the ledger is checked here).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest

from edge_core.errors import EdgeError, StageClosed
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline, PipelineResult
from edge_core.runtime import pipeline as pipeline_module

from .conftest import OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), np.float32)}
ENDS_WITHIN_S = 10.0


def _outcome(make: Callable[[], Any]) -> Any:
    """What one request ended with: ``"result"``, or its error."""
    try:
        answer = make()
    except BaseException as exc:  # the test judges what came back
        return exc
    if isinstance(answer, PipelineResult):
        answer.ack()
        return "result"
    return answer


async def _submitted_on_the_loop(pipeline: Pipeline) -> Any:
    submission = pipeline.submit(X, deadline_s=30.0, loop=asyncio.get_running_loop())
    return await asyncio.to_thread(submission.result)


def _first_event(pipeline: Pipeline) -> str:
    for _ in pipeline.stream(X, deadline_s=30.0):
        pass
    return "result"


REQUESTS: dict[str, Callable[[Pipeline], Any]] = {
    "run": lambda pipeline: pipeline.run(X),
    "run-with-deadline": lambda pipeline: pipeline.run(X, deadline_s=30.0),
    "submit": lambda pipeline: pipeline.submit(X).result(),
    "submit-on-a-loop": lambda pipeline: asyncio.run(_submitted_on_the_loop(pipeline)),
    "arun": lambda pipeline: asyncio.run(pipeline.arun(X, deadline_s=30.0)),
    "stream": _first_event,
}


def _close_while(pipeline: Pipeline, requests: dict[str, Callable[[Pipeline], Any]],
                 settle_s: float = 0.3) -> dict[str, Any]:
    """Start every request on a thread of its own, close from another; their outcomes."""
    outcomes: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda n=name, r=request: outcomes.__setitem__(
        n, _outcome(lambda: r(pipeline))), name=f"request-{name}")
        for name, request in requests.items()]
    for thread in threads:
        thread.start()
    time.sleep(settle_s)  # each is running, waiting for a slot or between stages now
    closer = threading.Thread(target=pipeline.close, name="closer")
    closer.start()
    ends = time.monotonic() + ENDS_WITHIN_S
    for thread in [*threads, closer]:
        thread.join(max(0.0, ends - time.monotonic()))
    hung = [thread.name for thread in [*threads, closer] if thread.is_alive()]
    assert not hung, f"still waiting {ENDS_WITHIN_S} s after close(): {hung}"
    return outcomes


def _assert_typed(outcomes: dict[str, Any]) -> None:
    for name, outcome in outcomes.items():
        assert outcome == "result" or isinstance(outcome, EdgeError), (name, outcome)


def _assert_nothing_charged(pipeline: Pipeline, ledger: ResourceLedger) -> None:
    assert pipeline.admission.used == 0
    assert [stage.outstanding for stage in pipeline.stages] == [0] * len(pipeline.stages)
    assert ledger.holdings() == ()
    assert all(stage.state.value in ("retired", "lost") for stage in pipeline.stages), [
        (stage.name, stage.state) for stage in pipeline.stages]


@pytest.mark.parametrize("backend", ["echo", "echo-preemptible"])
def test_requests_in_flight_on_one_stage_end_when_another_thread_closes(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, backend: str,
) -> None:
    # echo: one slot, so all but one request wait for it; echo-preemptible: four
    pipeline = open_pipeline(echo_stage("s", backend=backend, delay_s=2.0),
                             admission=len(REQUESTS))
    outcomes = _close_while(pipeline, REQUESTS)
    assert set(outcomes) == set(REQUESTS)
    _assert_typed(outcomes)
    _assert_nothing_charged(pipeline, ledger)


def test_requests_in_a_chain_end_when_another_thread_closes(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a", backend="echo-preemptible", delay_s=0.1),
        echo_stage("b", backend="echo", delay_s=2.0,
                   transform="edge_echo.transforms:slow_passthrough"),
        admission=len(REQUESTS))
    # after 0.3 s: each request is in the transform (0.5 s) or waiting for b's one slot
    outcomes = _close_while(pipeline, REQUESTS)
    assert set(outcomes) == set(REQUESTS)
    _assert_typed(outcomes)
    _assert_nothing_charged(pipeline, ledger)


def test_a_request_waiting_for_admission_ends_at_close_not_at_its_deadline(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"), admission=1)
    held = pipeline.run(X)  # the one admission slot, held by a result not acknowledged
    waiting = {name: REQUESTS[name] for name in ("run-with-deadline", "arun", "stream")}
    waiting["submit-with-deadline"] = lambda p: p.submit(X, deadline_s=30.0).result()
    started = time.monotonic()
    outcomes = _close_while(pipeline, waiting)
    assert time.monotonic() - started < 5.0  # not the 30 s deadline
    for name, outcome in outcomes.items():
        assert isinstance(outcome, StageClosed), (name, outcome)
        assert str(outcome) == "pipelines[t]: closed", (name, outcome)  # as after the close
    with held:  # the result held over the close still reads, and acknowledges
        assert held.outputs["x"].shape == (2, 2)
    _assert_nothing_charged(pipeline, ledger)


@pytest.mark.parametrize("stages", [1, 2])
def test_a_request_made_after_close_is_refused_naming_the_pipeline_as_closed(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, stages: int,
) -> None:
    chain = [echo_stage("s", backend="echo-preemptible")]
    if stages == 2:
        chain.append(echo_stage("u", transform="edge_echo.transforms:passthrough"))
    pipeline = open_pipeline(*chain, admission=2)
    with pipeline.run(X) as result:  # served before the close
        assert result.outputs["x"].shape == (2, 2)
    pipeline.close()
    for name, request in REQUESTS.items():
        for _ in range(2):  # refused alike the second time: nothing was taken the first
            outcome = _outcome(lambda r=request: r(pipeline))
            assert isinstance(outcome, StageClosed), (name, outcome)  # as callers catch it
            assert str(outcome) == "pipelines[t]: closed", (name, outcome)
            _assert_nothing_charged(pipeline, ledger)


def _streamed(pipeline: Pipeline, deadline_s: float | None = None) -> str:
    for _ in pipeline.stream(X, deadline_s=deadline_s):
        pass
    return "result"


async def _submitted_on_the_loop_now(pipeline: Pipeline) -> Any:
    return pipeline.submit(X, loop=asyncio.get_running_loop()).result(0)


def test_a_closed_pipeline_whose_admission_is_full_refuses_naming_the_pipeline(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    # Every way of making a request, with and without a deadline, after a close that
    # left the one admission slot held (by a result not acknowledged): one wording, the
    # pipeline's (a run with a deadline, a stream and a submission on a loop named the
    # admission pool: pipelines[t].admission: closed)
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"), admission=1)
    held = pipeline.run(X)
    pipeline.close()
    requests: dict[str, Callable[[Pipeline], Any]] = {
        **REQUESTS,
        "submit-with-deadline": lambda p: p.submit(X, deadline_s=30.0).result(),
        "stream-with-deadline": lambda p: _streamed(p, 30.0),
        "stream-without": _streamed,
        "submit-on-a-loop-now": lambda p: asyncio.run(_submitted_on_the_loop_now(p)),
    }
    for name, request in requests.items():
        outcome = _outcome(partial(request, pipeline))
        assert isinstance(outcome, StageClosed), (name, outcome)
        assert str(outcome) == "pipelines[t]: closed", (name, outcome)
        assert pipeline.admission.used == 1 and pipeline.requests.tracked == 0, name
    held.ack()
    _assert_nothing_charged(pipeline, ledger)


def test_a_submit_a_close_overtakes_is_refused_as_closed_with_nothing_charged(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the close comes after submit's check of closed, before its request goes to the
    # request threads (shut down by the close): StageClosed as any later request gets,
    # not the executor's RuntimeError, and its admission given back
    pipeline = open_pipeline(echo_stage("s"), admission=2)
    with pipeline.submit(X).result():  # the request threads exist
        pass
    submit = pipeline_module.submit

    def overtaken(*args: Any, **kwargs: Any) -> Any:
        pipeline.close()
        return submit(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "submit", overtaken)
    with pytest.raises(StageClosed, match=r"^pipelines\[t\]: closed$"):
        pipeline.submit(X)
    _assert_nothing_charged(pipeline, ledger)
