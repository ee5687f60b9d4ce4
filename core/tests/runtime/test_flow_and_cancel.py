"""Serving: bounded admission, acknowledgements, epochs, cancellation, restart."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import psutil
import pytest

from edge_contracts.errors import InvalidValue
from edge_core import hookimpl
from edge_core.backend import CancelOutcome
from edge_core.config import load_pipeline
from edge_core.errors import ConfigError, DeadlineExceeded, ResourceUnavailable, StageClosed
from edge_core.fanout import Call, Fanout
from edge_core.host.retire import RetireOutcome
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.runtime import (
    AckOutcome,
    DuplicateRequest,
    Pipeline,
    RequestCancelled,
    StageState,
    TransformFailed,
    TransformReturnInvalid,
)

from .conftest import MiB, OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), np.float32)}


def test_a_hundred_extra_requests_are_refused_until_an_ack_then_one_is_admitted(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"))
    stage = pipeline.stage("a")
    pending = [stage.submit(X) for _ in range(4)]  # max_concurrency of echo-preemptible
    results = [p.result() for p in pending]  # delivered: slots still held
    for _ in range(100):
        with pytest.raises(ResourceUnavailable, match=r"stages\[a\]\.in_flight: all 4"):
            stage.submit(X)
    assert stage.outstanding == 4  # none of the hundred took a slot
    assert results[0].ack() is AckOutcome.ACKNOWLEDGED
    admitted = stage.submit(X).result()
    with pytest.raises(ResourceUnavailable):
        stage.submit(X)
    for result in [*results[1:], admitted]:
        assert result.ack() is AckOutcome.ACKNOWLEDGED
    assert stage.outstanding == 0


def test_a_stale_ack_frees_nothing_and_says_so(open_pipeline: OpenPipeline) -> None:
    stage = open_pipeline(echo_stage("a", backend="echo-preemptible")).stage("a")
    first = stage.submit(X, request_id="r1").result()
    assert first.ack() is AckOutcome.ACKNOWLEDGED
    assert first.ack() is AckOutcome.STALE


def test_an_old_ack_cannot_release_a_reused_request_id(open_pipeline: OpenPipeline) -> None:
    stage = open_pipeline(echo_stage("a", backend="echo-preemptible")).stage("a")
    old = stage.submit(X, request_id="same").result()
    old.ack()
    new = stage.submit(X, request_id="same").result()
    assert old.ack() is AckOutcome.STALE
    assert stage.outstanding == 1  # the new delivery still holds its slot
    assert new.ack() is AckOutcome.ACKNOWLEDGED
    assert stage.outstanding == 0


def test_a_request_id_in_flight_cannot_be_reused(open_pipeline: OpenPipeline) -> None:
    stage = open_pipeline(echo_stage("a", backend="echo-preemptible")).stage("a")
    held = stage.submit(X, request_id="dup").result()
    with pytest.raises(DuplicateRequest, match="'dup'"):
        stage.submit(X, request_id="dup")
    held.ack()


def test_pipeline_admission_waits_up_to_the_callers_deadline(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=1)
    first = pipeline.run(X)
    with pytest.raises(ResourceUnavailable, match=r"pipelines\[t\]\.admission"):
        pipeline.run(X)
    timer = threading.Timer(0.2, first.ack)
    timer.start()
    started = time.monotonic()
    with pipeline.run(X, deadline_s=5.0) as second:
        assert time.monotonic() - started >= 0.15
        np.testing.assert_array_equal(second.outputs["x"], X["x"] * 2)
    timer.join()


def test_cancelling_a_preemptible_call_stops_it_in_place_and_keeps_the_worker(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=5.0))
    stage = pipeline.stage("a")
    pid = stage.loaded.describe()["pid"]
    pending = stage.submit(X)
    time.sleep(0.1)
    started = time.monotonic()
    assert pending.cancel() is CancelOutcome.CANCELLED_IN_PLACE
    with pytest.raises(RequestCancelled):
        pending.result()
    assert time.monotonic() - started < 1.0
    assert stage.state is StageState.READY
    assert psutil.pid_exists(pid) and stage.loaded.describe()["pid"] == pid
    assert stage.outstanding == 0


def test_cancelling_a_running_non_preemptible_call_retires_its_worker(
    open_pipeline: OpenPipeline, ledger: ResourceLedger
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=5.0))
    stage = pipeline.stage("a")
    pid = stage.loaded.describe()["pid"]
    pending = stage.submit(X)
    time.sleep(0.1)
    started = time.monotonic()
    assert pipeline.cancel() == {"a": "retire-required"}
    with pytest.raises(RequestCancelled):
        pending.result()
    assert time.monotonic() - started < 4.0  # retire deadline 3 s, well under the 5 s call
    assert not psutil.pid_exists(pid)
    assert stage.state is StageState.NEEDS_RESTART
    assert stage.last_retire.verified is True
    assert ledger.is_empty()  # released after the verified retirement
    with pytest.raises(StageClosed, match="restart"):
        stage.submit(X)
    stage.restart()
    assert stage.generation == 2
    assert stage.loaded.describe()["generation"] == 2
    assert ledger.reserved("machine:ram") == 256 * MiB
    result = stage.submit(X).result()
    assert result.key.generation == 2
    result.ack()


def test_cancelling_a_completed_call_keeps_the_worker(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    stage = pipeline.stage("a")
    pending = stage.submit(X)
    result = pending.result()
    assert pending.cancel() is CancelOutcome.ALREADY_FINISHED
    assert stage.state is StageState.READY
    result.ack()


def test_no_output_of_a_fenced_epoch_is_delivered(open_pipeline: OpenPipeline) -> None:
    stage = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=0.3)).stage("a")
    pending = [stage.submit(X) for _ in range(3)]
    assert stage.cancel() is CancelOutcome.CANCELLED_IN_PLACE
    for call in pending:
        with pytest.raises(RequestCancelled):
            call.result()
    assert stage.epoch == 1
    fresh = stage.submit(X).result()
    assert fresh.key.epoch == 1
    fresh.ack()


class Unverifiable:
    """Fault injection: every retirement is reported unverified (the worker does exit).

    The outcome names no process, so nothing can show the tree gone: the quarantine
    stays until a verified release (test_quarantine_heal.py covers healing).
    """

    EDGE_CONTRACT = "1.0"

    @hookimpl(wrapper=True)
    def edge_retire(self, loaded: object, deadline_s: float) -> object:
        yield
        return RetireOutcome(verified=False, reason="injected: identity could not be checked")


def test_unverified_retirement_keeps_the_reservation_quarantined(
    ledger: ResourceLedger,
) -> None:
    plugins = load_plugins(objects={"unverifiable": Unverifiable()},
                           env={"EDGE_PLUGINS": "echo"})
    config = load_pipeline({"name": "q", "stages": [echo_stage("a")]})
    pipeline = Pipeline.open(config, plugins, ledger)
    summary = pipeline.close()
    assert summary["a"]["release"] == "quarantined"
    assert ledger.reserved("machine:ram") == 256 * MiB
    (token,) = ledger.quarantined()
    assert ledger.release(token, verified=True).value == "released"
    assert ledger.is_empty()


def test_the_async_api_runs_and_cancels(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"))

    async def main() -> None:
        result = await pipeline.arun(X)
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
        result.ack()
        assert await pipeline.acancel() == {"a": "already-finished"}

    asyncio.run(main())


def test_a_failing_transform_acknowledges_the_previous_result(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a", backend="echo-preemptible"),
        echo_stage("b", transform="edge_echo.transforms:explode"),
    )
    with pytest.raises(TransformFailed, match="exploded") as info:
        pipeline.run(X)
    assert isinstance(info.value.__cause__, ValueError)  # the transform's own error, kept
    assert pipeline.stage("a").outstanding == 0
    assert pipeline.admission.used == 0


class SlowSend:
    """Fault injection: handing a request to the backend takes 80 ms (before it is sent)."""

    EDGE_CONTRACT = "1.0"

    @hookimpl(wrapper=True)
    def edge_call(self, loaded: object, request: object, inputs: object) -> object:
        time.sleep(0.08)
        return (yield)


def test_a_stage_latency_counts_from_before_the_request_is_sent(
    ledger: ResourceLedger,
) -> None:
    plugins = load_plugins(objects={"slow": SlowSend()}, env={"EDGE_PLUGINS": "echo"})
    config = load_pipeline({"name": "l", "stages": [echo_stage("a")]})
    with Pipeline.open(config, plugins, ledger) as pipeline, pipeline.run(X) as result:
        assert result.latencies["a"] >= 0.08


def test_a_receipt_names_the_generation_that_served_its_request_when_read_later(
    open_pipeline: OpenPipeline,
) -> None:
    """The receipt is built when read, from the generations recorded when the request ended."""
    pipeline = open_pipeline(echo_stage("a"),
                             echo_stage("b", transform="edge_echo.transforms:passthrough"),
                             name="two")
    single = open_pipeline(echo_stage("s"), name="one")
    for opened, restarted in ((single, "s"), (pipeline, "b")):
        first = opened.run(X, params={"tag": 1})
        first.ack()
        opened.stage(restarted).restart()
        with opened.run(X) as second:
            assert {s["stage"]: s["generation"] for s in second.placement}[restarted] == 2
        receipt = first.placement  # read only now, after the restart
        assert {s["stage"]: s["generation"] for s in receipt}[restarted] == 1
        assert first.placement is receipt  # built once
        receipt[-1]["generation"] = 99  # the caller's copy: the kept receipt is unchanged
        with opened.run(X) as third:
            assert third.placement[-1]["generation"] == 2
            assert [s["decision"] for s in third.placement] == ["only"] * len(third.placement)


def test_a_one_stage_pipeline_leaves_carried_inputs_out_and_frees_its_slots(
    open_pipeline: OpenPipeline,
) -> None:
    """The one-stage path does what the chain does: carry:* inputs are not sent."""
    pipeline = open_pipeline(echo_stage("s"))
    with pipeline.run({**X, "carry:page": np.zeros(3)}) as result:
        assert set(result.outputs) == {"x"}
    submission = pipeline.submit({**X}, request_id="r1")
    assert submission.result().ack() is AckOutcome.ACKNOWLEDGED
    assert pipeline.admission.used == 0 and pipeline.stage("s").outstanding == 0


#: What a transform returns wrong, the value its refusal names and what it says was wrong.
BAD_RETURNS = [
    (lambda previous: {**previous, 1: previous["x"]}, 1, "a mapping with a key that is no "
     "input name (a str), not int"),
    (lambda previous: {"x": previous["x"], ("x",): 0}, ("x",), "not tuple"),
    (lambda previous: None, None, "returned a NoneType, not a mapping of input names"),
    (lambda previous: [("x", previous["x"])], "the return", "returned a list, not a mapping"),
    (lambda previous: Fanout([{"x": previous["x"]}, {2: previous["x"]}]), 2,
     "returned Fanout.items[1] with a key that is no input name (a str), not int"),
    (lambda previous: Call({3: previous["x"]}), 3,
     "returned Call.inputs with a key that is no input name (a str), not int"),
]


def test_a_transform_that_returns_no_mapping_of_input_names_is_refused_naming_it(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"),
                             echo_stage("b", transform="edge_echo.transforms:returns_carried",
                                        backend="echo-preemptible"), admission=2)
    workers = [(stage.generation, stage.state) for stage in pipeline.stages]
    held = ledger.holdings()

    async def on_a_loop(inputs: dict[str, object]) -> object:
        return await pipeline.arun(inputs)

    calls = [
        pipeline.run,
        lambda inputs: pipeline.submit(inputs).result(5.0),
        lambda inputs: next(pipeline.stream(inputs)),
        lambda inputs: asyncio.run(on_a_loop(inputs)),
    ]
    for returns, value, reason in BAD_RETURNS:
        for call in calls:
            with pytest.raises(TransformReturnInvalid) as info:
                call({**X, "carry:returns": returns})
            assert not isinstance(info.value, ValueError)  # the pipeline's fault: no 400
            assert info.value.path == "pipelines[t].stages[b].input_transform"
            assert "transform edge_echo.transforms:returns_carried returned " in str(info.value)
            assert reason in str(info.value)
            if value == "the return":
                assert isinstance(info.value.value, list)
            else:
                assert info.value.value == value
            assert pipeline.admission.used == 0
            assert [(s.outstanding, s.slots.used) for s in pipeline.stages] == [(0, 0)] * 2
    assert ledger.holdings() == held
    assert [(stage.generation, stage.state) for stage in pipeline.stages] == workers
    with pipeline.run({**X, "carry:returns": dict}) as result:  # the same workers serve on
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 4)
    assert [(s.outstanding, s.slots.used) for s in pipeline.stages] == [(0, 0)] * 2


class ContextTooLong(ValueError):
    """An error type a transform raises that declares itself the request's fault."""

    request_fault = "context_length_exceeded"


def _bad_fanout(previous: dict[str, object]) -> object:
    return Fanout([previous["x"]])  # items must be mappings: the transform's own bug


def _missing(previous: dict[str, object]) -> object:
    return {"x": previous["no such output"]}


def _raises(error: Exception) -> object:
    def transform(previous: dict[str, object]) -> object:
        raise error

    return transform


#: What a transform raises that is its own failure: the type its ``TransformFailed`` names
#: and the original message.
OWN_FAILURES = [
    (_bad_fanout, "ConfigError", "Fanout.items[0]: must be a mapping of inputs: 'ndarray'"),
    (_raises(ConfigError("labels", "must not be empty", [])), "ConfigError",
     "labels: must not be empty: []"),
    (_missing, "KeyError", "'no such output'"),
    (_raises(ValueError("crop outside the page")), "ValueError", "crop outside the page"),
]

#: What a transform raises that passes unchanged: typed refusals of the request's input,
#: and edge-core's own server-side errors.
PASSED = [
    InvalidValue("inputs['x']", -1, "must be >= 0"),
    ContextTooLong("prompt: 5000 tokens, the stage takes 4096"),
    DeadlineExceeded("pipelines[t]: deadline_s expired in the transform"),
]


def test_a_transform_that_raises_fails_the_request_as_the_pipelines_fault_naming_it(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """A transform that raised ``ConfigError`` (a ``Fanout`` built wrong, say) failed the
    request with that ``ConfigError`` (a ``ValueError``), naming neither the stage nor the
    transform: ``edge serve`` answered it 400 (the client's fault) and ``edge run`` exited
    2 (a usage problem). It is ``TransformFailed`` now (no ``ValueError``), naming the
    stage's ``input_transform``, the transform, and the original error's type and message
    (kept as ``__cause__``); a typed refusal of the request's input, or an edge-core error
    of the server's side, passes unchanged. Nothing stays charged either way, and the same
    workers serve on."""
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"),
                             echo_stage("b", transform="edge_echo.transforms:returns_carried",
                                        backend="echo-preemptible"), admission=2)
    workers = [(stage.generation, stage.state) for stage in pipeline.stages]
    held = ledger.holdings()

    async def on_a_loop(inputs: dict[str, object]) -> object:
        return await pipeline.arun(inputs)

    calls = [
        pipeline.run,
        lambda inputs: pipeline.submit(inputs).result(5.0),
        lambda inputs: next(pipeline.stream(inputs)),
        lambda inputs: asyncio.run(on_a_loop(inputs)),
    ]

    def clean() -> None:
        assert pipeline.admission.used == 0
        assert [(s.outstanding, s.slots.used) for s in pipeline.stages] == [(0, 0)] * 2

    for transform, kind, message in OWN_FAILURES:
        for call in calls:
            with pytest.raises(TransformFailed) as info:
                call({**X, "carry:returns": transform})
            failed = info.value
            assert not isinstance(failed, ValueError)  # the pipeline's fault: no 400, no exit 2
            assert failed.path == "pipelines[t].stages[b].input_transform"
            assert failed.reason == (
                f"transform edge_echo.transforms:returns_carried raised {kind}")
            assert str(failed) == f"{failed.path}: {failed.reason}: {message}"
            assert type(failed.__cause__).__name__ == kind and failed.error is failed.__cause__
            clean()
    for error in PASSED:
        for call in calls:
            with pytest.raises(type(error)) as passed:
                call({**X, "carry:returns": _raises(error)})
            assert passed.value is error
            clean()
    assert ledger.holdings() == held
    assert [(stage.generation, stage.state) for stage in pipeline.stages] == workers
    with pipeline.run({**X, "carry:returns": dict}) as result:  # the same workers serve on
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 4)
    clean()


def test_a_call_or_fanout_carrying_a_name_that_is_no_str_is_refused_naming_it() -> None:
    for made in (lambda: Call({}, carry={4: 0}), lambda: Fanout([], carry={4: 0})):
        with pytest.raises(ConfigError) as info:
            made()
        assert info.value.path.endswith(".carry[4]")
        assert info.value.value == 4


def test_a_one_stage_request_waiting_for_its_stage_slot_ends_when_the_pipeline_is_cancelled(
    open_pipeline: OpenPipeline,
) -> None:
    """Its abandoned() (made once per pipeline epoch) turns True at the cancel, and the next
    epoch's requests get one of their own: they are served."""
    pipeline = open_pipeline(echo_stage("a"), admission=2)
    held = pipeline.run(X)  # holds the stage's one slot until acknowledged
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = pipeline.run(X, deadline_s=30.0)
        except Exception as exc:  # what it ended with is the test's
            outcome["error"] = exc

    waiting = threading.Thread(target=run)
    waiting.start()
    time.sleep(0.3)  # admitted, waiting for the stage's slot
    pipeline.cancel()
    waiting.join(10)
    assert isinstance(outcome.get("error"), RequestCancelled), outcome
    held.ack()
    for _ in range(3):  # the next epoch: served
        with pipeline.run(X) as again:
            np.testing.assert_array_equal(again.outputs["x"], X["x"] * 2)
    assert pipeline.admission.used == 0
    assert [s.outstanding for s in pipeline.stages] == [0]
