"""Races and restarts: cancel against delivery, cancel between stages, acks after restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edge_contracts.requests import EventKind, StageEvent, StageRequest
from edge_core.backend import BackendInfo, CancelOutcome
from edge_core.binding import OwnerBinding
from edge_core.config import load_pipeline
from edge_core.errors import EdgeError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import AckOutcome, Pipeline, RequestCancelled, StageRuntime
from edge_core.stage import StageContext

from .conftest import MiB, OpenPipeline, echo_stage
from .test_flow_and_cancel import Unverifiable

X = {"x": np.ones((2, 2), np.float32)}


def _binding(call: Any) -> OwnerBinding:
    def unused(*_: Any) -> Any:
        raise AssertionError("not called")

    return OwnerBinding(
        backend=BackendInfo(name="fake", kinds=["graph"], preemptible=True, max_concurrency=1),
        plugin="fake", config_defaults=unused, validate_stage=unused, reserve=unused,
        load=unused, warmup_placement=unused, call=call,
        cancel=lambda *_: CancelOutcome.CANCELLED_IN_PLACE, retire=unused,
        conformance_stage=unused,
    )


def test_a_cancel_that_lands_just_before_the_final_event_wins() -> None:
    runtime: list[StageRuntime] = []

    def call(loaded: Any, request: StageRequest, inputs: Any) -> Iterator[Any]:
        runtime[0].cancel(request.request_id)  # another thread cancels right now
        yield StageEvent(request.request_id, request.stage_id, request.epoch,
                         request.generation, 0, EventKind.DONE, True), {"y": np.ones(2)}

    context = StageContext(pipeline="p", stage_id="s", backend="fake")
    runtime.append(StageRuntime(_binding(call), context, object()))
    pending = runtime[0].submit({})
    with pytest.raises(RequestCancelled):
        pending.result()
    assert runtime[0].outstanding == 0
    assert runtime[0].slots.used == 0


def test_a_pipeline_cancel_between_two_stages_delivers_nothing(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a", backend="echo-preemptible"),
        echo_stage("b", backend="echo-preemptible",
                   transform="edge_echo.transforms:slow_passthrough"),
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = pipeline.run(X)
        except EdgeError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.25)  # inside the slow transform
    pipeline.cancel()
    worker.join(10)
    assert isinstance(outcome.get("error"), RequestCancelled), outcome
    assert pipeline.admission.used == 0
    assert [s.outstanding for s in pipeline.stages] == [0, 0]


def test_an_ack_after_a_restart_still_frees_the_admission_slot(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    held = pipeline.run(X)
    stage = pipeline.stage("a")
    stage.restart()  # from READY: the held result's generation is gone
    assert held.ack() is AckOutcome.STALE
    with pipeline.run(X) as again:  # the admission slot was freed all the same
        assert again.final.key.generation == 2


class _SendFailsAfterRestart:
    """A stage's binding whose next call blocks until released, then fails its send."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = True
        self.registered = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def call(self, loaded: Any, request: StageRequest, inputs: Any) -> Any:
        if self.armed:
            self.armed = False
            self.registered.set()  # registered (its slot held): the restart runs now
            assert self.go.wait(30)
            raise ConnectionError("the send failed")
        return self.inner.call(loaded, request, inputs)


def test_a_send_that_fails_after_a_restart_took_its_entry_frees_no_second_slot(
    open_pipeline: OpenPipeline,
) -> None:
    """The restart drops the registered request and frees its slot; the send's failure
    then finds no entry and must not free a slot again (the next request's, which then
    raised an untyped RuntimeError at its acknowledgement)."""
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", scale=2.0),
                             admission=4)
    runtime = pipeline.stage("a")
    binding = runtime.binding = _SendFailsAfterRestart(runtime.binding)  # type: ignore[assignment]
    failed: list[BaseException] = []

    def first() -> None:
        try:
            runtime.submit(X)
        except BaseException as exc:  # what the test reads
            failed.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert binding.registered.wait(10)
    runtime.restart()
    assert (runtime.slots.used, runtime.outstanding) == (0, 0)
    second = runtime.submit(X)  # served by the new worker, its result held
    binding.go.set()
    thread.join(10)
    assert [type(exc) for exc in failed] == [ConnectionError]
    assert (runtime.slots.used, runtime.outstanding) == (1, 1)  # the second's, still held
    result = second.result()
    np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert result.ack() is AckOutcome.ACKNOWLEDGED
    assert (runtime.slots.used, runtime.outstanding) == (0, 0)


def test_restarting_a_ready_stage_quarantines_an_unverified_retirement(
    ledger: ResourceLedger,
) -> None:
    plugins = load_plugins(objects={"unverifiable": Unverifiable()},
                           env={"EDGE_PLUGINS": "echo"})
    pipeline = Pipeline.open(load_pipeline({"name": "q", "stages": [echo_stage("a")]}),
                             plugins, ledger)
    pipeline.stage("a").restart()
    snapshot = ledger.snapshot()["pools"]["machine:ram"]
    assert snapshot["quarantined"] == 256 * MiB  # the old worker's
    assert snapshot["reserved"] == 2 * 256 * MiB  # plus the new one's, reserved afresh
    pipeline.close()
    for token in ledger.quarantined():
        ledger.release(token, verified=True)
    assert ledger.is_empty()


def test_a_failed_load_settles_with_the_retirement_the_plugin_reports(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [echo_stage("a", fail_at="load")]})
    with pytest.raises(EdgeError) as info:
        Pipeline.open(config, plugins, ledger)
    assert info.value.retire_outcome.verified is True  # type: ignore[attr-defined]
    assert ledger.is_empty()


def test_two_pipelines_with_the_same_stage_names_share_one_ledger(
    open_pipeline: OpenPipeline, ledger: ResourceLedger
) -> None:
    open_pipeline(echo_stage("a"), name="one")
    open_pipeline(echo_stage("a"), name="two")
    owners = sorted(token.owner for token in ledger.holdings())
    assert owners == ["one/a", "two/a"]
