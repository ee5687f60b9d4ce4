"""The in-process API used carelessly: what a caller abandons or gets wrong is given back.

Real echo workers. Each test checks that nothing stays charged afterwards: the
pipeline's admission, the stage's in-flight slots (and, through the autouse leak
check, processes and shared-memory segments).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_core.errors import DeadlineExceeded
from edge_core.runtime import Pipeline

from .conftest import OpenPipeline, echo_stage

X = np.ones((2, 2), np.float32)


def _charged(pipeline: Pipeline) -> tuple[int, int]:
    """(admission slots taken, requests the stage still holds)."""
    stage = pipeline.stage("s")
    return pipeline.admission.used, stage.outstanding


def test_a_stream_closed_half_way_gives_back_its_stage_slot(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible", stream_chunks=20,
                                        chunk_rate_hz=50), admission=2)
    for _ in range(3):  # each closed after its first token (explicitly, or abandoned)
        stream = pipeline.stream({"x": X})
        next(stream)
        stream.close()
    abandoned = pipeline.stream({"x": X})
    next(abandoned)
    del abandoned  # never closed: the generator's finalizer closes it
    assert _charged(pipeline) == (0, 0)
    assert pipeline.health()["stages"]["s"]["state"] == "ready"
    with pipeline.run({"x": X}, params={"stream_chunks": 0}) as result:  # still serves
        assert result.outputs["x"].shape == (2, 2)
    assert _charged(pipeline) == (0, 0)


@pytest.mark.parametrize("deadline_s", [math.nan, math.inf, -math.inf, "1", True, None])
def test_a_deadline_that_is_no_finite_number_is_refused_naming_deadline_s(
    open_pipeline: OpenPipeline, deadline_s: Any,
) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"), admission=2)
    if deadline_s is None:  # the control: None is "no deadline", served
        with pipeline.run({"x": X}, deadline_s=deadline_s) as result:
            assert result.outputs["x"].shape == (2, 2)
        return
    calls = [
        lambda: pipeline.run({"x": X}, deadline_s=deadline_s),
        lambda: pipeline.submit({"x": X}, deadline_s=deadline_s),
        lambda: next(pipeline.stream({"x": X}, deadline_s=deadline_s)),
        lambda: asyncio.run(pipeline.arun({"x": X}, deadline_s=deadline_s)),
        lambda: pipeline.stage("s").submit({"x": X}, deadline_s=deadline_s),
    ]
    for call in calls:
        with pytest.raises(InvalidValue) as info:
            call()
        assert info.value.field == "deadline_s"
        assert "finite number of seconds" in str(info.value)
    assert _charged(pipeline) == (0, 0)
    with pipeline.run({"x": X}) as result:  # nothing was taken
        assert result.outputs["x"].shape == (2, 2)


def test_many_threads_with_a_passed_deadline_each_get_deadline_exceeded(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"), admission=2)

    def call(deadline_s: float) -> str:
        try:
            pipeline.run({"x": X}, deadline_s=deadline_s).ack()
        except DeadlineExceeded:
            return "expired"
        return "served"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, [0.0, -1.0, -1e300, 0.0] * 16))
    assert set(answers) == {"expired"}
    assert _charged(pipeline) == (0, 0)


def _settles(pipeline: Pipeline, within_s: float = 5.0) -> tuple[int, int]:
    """What stays charged once the background acknowledgements had time to run."""
    ends = time.monotonic() + within_s
    while _charged(pipeline) != (0, 0) and time.monotonic() < ends:
        time.sleep(0.01)
    return _charged(pipeline)


def test_a_result_dropped_unacknowledged_is_acknowledged_with_a_warning(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("s"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):  # admission 1: each run needs the one before given back
            pipeline.run({"x": X}, deadline_s=5.0)  # the result dropped at once
            gc.collect()
        assert _settles(pipeline) == (0, 0)
    assert any(issubclass(w.category, ResourceWarning) and "without ack()" in str(w.message)
               for w in seen)
    with pipeline.run({"x": X}) as result:  # no deadline: admitted at once
        assert result.outputs["x"].shape == (2, 2)


def test_an_arun_cancelled_in_flight_gives_its_slots_back(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible", delay_s=0.3))

    async def cancel_in_flight() -> None:
        task = asyncio.ensure_future(pipeline.arun({"x": X}))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        asyncio.run(cancel_in_flight())
        time.sleep(0.5)  # the request's thread finishes it; nobody takes the result
        gc.collect()
        assert _settles(pipeline) == (0, 0)
    with pipeline.run({"x": X}) as result:
        assert result.outputs["x"].shape == (2, 2)


def _taken(pipeline: Pipeline) -> tuple[int, tuple[int, ...]]:
    """(admission slots taken, requests each stage still holds)."""
    return pipeline.admission.used, tuple(stage.outstanding for stage in pipeline.stages)


async def _submitted_on_the_loop(pipeline: Pipeline, inputs: Any) -> Any:
    """``submit(loop=...)`` from the loop's thread, its result taken off the loop."""
    submission = pipeline.submit(inputs, loop=asyncio.get_running_loop())
    return await asyncio.to_thread(submission.result, 5.0)


def _stream_once(pipeline: Pipeline, inputs: Any) -> None:
    """The stream's first event (its inputs are read when it starts)."""
    next(pipeline.stream(inputs))


#: Inputs that are no mapping of input names to arrays, and the value each refusal names.
MALFORMED_INPUTS = [
    ({1: X}, 1),
    ({"x": X, ("x",): X}, ("x",)),  # a bad key after a good one
    (None, None),
    ("x", "x"),
    ([("x", X)], "the inputs"),
]


#: Every way of making a request, each taking the pipeline and the inputs.
CALLS: list[Callable[[Pipeline, Any], Any]] = [
    lambda pipeline, inputs: pipeline.run(inputs),
    lambda pipeline, inputs: pipeline.run(inputs, deadline_s=5.0),
    lambda pipeline, inputs: pipeline.submit(inputs).result(5.0),
    lambda pipeline, inputs: asyncio.run(_submitted_on_the_loop(pipeline, inputs)),
    _stream_once,
    lambda pipeline, inputs: asyncio.run(pipeline.arun(inputs)),
    lambda pipeline, inputs: pipeline.stage("s").submit(inputs),  # a stage on its own
]


@pytest.mark.parametrize("stages", [1, 2])
def test_inputs_that_are_no_mapping_of_names_are_refused_naming_inputs(
    open_pipeline: OpenPipeline, ledger: Any, stages: int,
) -> None:
    chain = [echo_stage("s")]
    if stages == 2:
        chain.append(echo_stage("t", transform="edge_echo.transforms:passthrough"))
    pipeline = open_pipeline(*chain, admission=2)
    workers = [(stage.generation, stage.state) for stage in pipeline.stages]
    held = ledger.holdings()
    for inputs, value in MALFORMED_INPUTS:
        for call in CALLS:
            with pytest.raises(InvalidValue) as info:
                call(pipeline, inputs)
            assert info.value.field == "inputs"
            if value == "the inputs":
                assert info.value.value is inputs
            else:
                assert info.value.value == value
            assert f"not {type(info.value.value).__name__}: " in str(info.value)
            assert _taken(pipeline) == (0, (0,) * stages)
            assert [stage.slots.used for stage in pipeline.stages] == [0] * stages
    assert ledger.holdings() == held
    assert [(stage.generation, stage.state) for stage in pipeline.stages] == workers
    with pipeline.run({"x": X}) as result:  # the same workers serve on
        assert result.outputs["x"].shape == (2, 2)
    with pipeline.stage("s").submit({"x": X}).result() as served:  # the stage on its own too
        assert served.outputs["x"].shape == (2, 2)
    assert _taken(pipeline) == (0, (0,) * stages)


@pytest.mark.parametrize("timeout_s", [math.nan, math.inf, -math.inf, "1", True])
def test_a_result_wait_that_is_no_finite_number_is_refused_naming_timeout_s(
    open_pipeline: OpenPipeline, timeout_s: Any,
) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"))
    submission = pipeline.submit({"x": X}, params={"delay_s": 0.3})
    for _ in range(2):  # in flight, then done: refused either way
        with pytest.raises(InvalidValue) as info:
            submission.result(timeout_s)
        assert info.value.field == "timeout_s"
        assert "finite number of seconds" in str(info.value)
        with submission.result(5.0) as result:  # the request itself went on
            assert result.outputs["x"].shape == (2, 2)
    assert _charged(pipeline) == (0, 0)


def test_a_result_wait_of_zero_or_less_does_not_wait(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"))
    submission = pipeline.submit({"x": X}, params={"delay_s": 0.5})
    for timeout_s in (0.0, -1.0, -1e300):  # as deadline_s: a wait already over
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            submission.result(timeout_s)
        assert time.monotonic() - started < 0.2
    with submission.result(5.0) as result:
        assert result.outputs["x"].shape == (2, 2)
    with submission.result(-1.0) as result:  # done: the result, without waiting
        assert result.outputs["x"].shape == (2, 2)
    assert _charged(pipeline) == (0, 0)


def test_an_arun_cancelled_while_it_waits_for_a_stage_slot_gives_admission_back_at_once(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("s"), admission=2)  # echo: one stage slot
    held = pipeline.run({"x": X})  # the stage's one slot, held unacknowledged

    async def cancel_while_waiting() -> tuple[int, int]:
        try:
            task = asyncio.ensure_future(pipeline.arun({"x": X}))
            await asyncio.sleep(0.3)  # admitted, waiting for the slot (no deadline)
            assert pipeline.admission.used == 2
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            ends = time.monotonic() + 2.0  # not when the slot frees: the request is fenced
            while pipeline.admission.used != 1 and time.monotonic() < ends:
                await asyncio.sleep(0.01)
            return _charged(pipeline)
        finally:
            held.ack()  # else a request thread would wait for the slot for good

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # nothing left to a finalizer
        assert asyncio.run(cancel_while_waiting()) == (1, 1)  # the held result's alone
        gc.collect()
        assert _settles(pipeline) == (0, 0)
    with pipeline.run({"x": X}) as result:
        assert result.outputs["x"].shape == (2, 2)


def test_an_arun_cancelled_while_it_waits_for_admission_never_runs(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible"), admission=1)
    held = pipeline.run({"x": X})  # the one admission slot

    async def cancel_while_waiting() -> None:
        try:
            task = asyncio.ensure_future(pipeline.arun({"x": X}, deadline_s=20.0))
            await asyncio.sleep(0.3)  # waiting for admission
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:  # admission frees: the cancelled request takes it, is fenced, gives it back
            held.ack()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # no result left to a finalizer
        started = time.monotonic()
        asyncio.run(cancel_while_waiting())  # its end waits for the thread: not 20 s
        assert time.monotonic() - started < 5.0
        gc.collect()
        assert _settles(pipeline) == (0, 0)
    assert pipeline.requests.cancel("t-1") is not None  # the tracker let every id go
    with pipeline.run({"x": X}) as result:
        assert result.outputs["x"].shape == (2, 2)
