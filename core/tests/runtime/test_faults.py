"""Lifecycle under faults, with real echo workers: deadlines, liveness, stage health,
the restart policy, oversize requests, exact cancel outcomes, worker tracebacks.

Timing bounds carry margins for a loaded host; the bounds the runtime promises
(typed error within deadline + 0.5 s, an unresponsive worker noticed within 2 s) are
what the numbers in the assertions stand for.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import numpy as np
import psutil
import pytest

from edge_core import hookimpl
from edge_core.backend import CancelOutcome
from edge_core.config import load_pipeline
from edge_core.errors import EdgeError, ResourceUnavailable, StageClosed
from edge_core.host.errors import WorkerGone
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool
from edge_core.runtime import (
    DeadlineExceeded,
    Pipeline,
    RequestCancelled,
    RequestFailed,
    RequestTooLarge,
    StageState,
    WorkerUnresponsive,
)

from .conftest import GiB, MiB, OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), np.float32)}
SLACK_S = 1.0  # extra room for a loaded host on top of each promised bound


def wait_for(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.02)


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once no process ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def pid_of(pipeline: Pipeline, stage_id: str = "a") -> int:
    return int(str(pipeline.stage(stage_id).loaded.describe()["pid"]))


# -- deadlines -----------------------------------------------------------------------------


def test_a_deadline_on_a_non_preemptible_call_retires_the_worker_and_fails_the_stage(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=10.0))
    pid = pid_of(pipeline)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="deadline_s expired") as caught:
        pipeline.run(X, deadline_s=1.0)
    assert time.monotonic() - started < 1.0 + 0.5 + SLACK_S
    assert isinstance(caught.value, EdgeError) and isinstance(caught.value, TimeoutError)
    stage = pipeline.stage("a")
    wait_for(lambda: stage.last_retire is not None)
    assert stage.state is StageState.FAILED
    assert stage.last_retire.verified is True
    assert gone(pid)
    assert ledger.is_empty()  # released after the verified retirement
    assert pipeline.health()["stages"]["a"]["state"] == "failed"
    with pytest.raises(StageClosed, match="failed"):
        pipeline.run(X)


def test_a_deadline_on_a_preemptible_call_cancels_in_place_and_keeps_the_worker(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=10.0))
    pid = pid_of(pipeline)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        pipeline.run(X, deadline_s=0.5)
    assert time.monotonic() - started < 0.5 + 0.5 + SLACK_S
    stage = pipeline.stage("a")
    assert stage.state is StageState.READY and pid_of(pipeline) == pid
    assert stage.outstanding == 0


def test_call_timeout_s_bounds_a_stage_call_without_a_deadline(
    open_pipeline: OpenPipeline,
) -> None:
    stage_config = echo_stage("a", backend="echo-preemptible", delay_s=10.0)
    stage_config["call_timeout_s"] = 0.5
    pipeline = open_pipeline(stage_config)
    assert pipeline.stage("a").call_timeout_s == 0.5
    with pytest.raises(DeadlineExceeded, match=r"call_timeout_s expired: 0\.5"):
        pipeline.stage("a").submit(X).result()


def test_a_nan_call_timeout_s_set_on_a_stage_refuses_its_calls_and_deadlines_still_fire(
    open_pipeline: OpenPipeline,
) -> None:
    """``call_timeout_s`` set to NaN on a running stage (the attribute is not checked
    again): its calls are refused before anything is sent, nothing stays charged, and
    the process's deadlines still fire (a NaN bound in the deadline timer stopped every
    later one in the process)."""
    import math

    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=10.0))
    stage = pipeline.stage("a")
    stage.call_timeout_s = math.nan
    with pytest.raises(ValueError, match="not nan"):
        stage.submit(X)
    assert stage.slots.used == 0 and stage.request_ids() == [] and stage.outstanding == 0
    stage.call_timeout_s = 0.5
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"call_timeout_s expired: 0\.5"):
        stage.submit(X).result()
    assert time.monotonic() - started < 5.0


def test_the_call_timeout_default_follows_the_backends_kind(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    assert pipeline.stage("a").call_timeout_s == 120.0  # a graph backend


def test_waiting_for_admission_past_the_deadline_raises_deadline_exceeded(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=1)
    held = pipeline.run(X)
    with pytest.raises(ResourceUnavailable):  # no deadline: refused at once, as before
        pipeline.run(X)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"pipelines\[t\]\.admission"):
        pipeline.run(X, deadline_s=0.3)
    assert 0.25 <= time.monotonic() - started < 0.3 + 0.5 + SLACK_S
    held.ack()


# -- liveness --------------------------------------------------------------------------


def test_a_worker_stopped_mid_call_is_unresponsive_within_two_seconds(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    pid = pid_of(pipeline)
    stage = pipeline.stage("a")
    pending = stage.submit(X, params={"delay_s": 30.0})  # this call only: not the restart's
    time.sleep(0.3)  # the worker is inside the call (and beating)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        with pytest.raises(WorkerUnresponsive, match="stopped"):
            pending.result()
        assert time.monotonic() - stopped < 2.0 + SLACK_S
        wait_for(lambda: stage.last_retire is not None)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGCONT)
    assert stage.state is StageState.FAILED
    assert "unresponsive" in (stage.closed_reason or "")
    assert stage.last_retire.verified is True
    assert gone(pid)
    assert ledger.is_empty()
    stage.restart()  # the default policy ("never"): back only by hand
    with stage.submit(X).result() as result:
        assert result.key.generation == 2


def test_a_ping_the_worker_does_not_answer_is_a_typed_error(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    client = pipeline.stage("a").loaded.client  # type: ignore[attr-defined]
    os.kill(client.identity.pid, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerUnresponsive, match=r"no answer within 0\.3 s"):
            client.ping(timeout_s=0.3)
    finally:
        os.kill(client.identity.pid, signal.SIGCONT)


def test_a_long_call_keeps_beating_and_is_not_declared_unresponsive(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=3.0))
    with pipeline.run(X) as result:  # three seconds silent but for heartbeats
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert pipeline.stage("a").state is StageState.READY


# -- stage health and the restart policy ---------------------------------------------------


def test_with_the_default_policy_a_dead_worker_fails_the_stage_until_restart(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=10.0))
    stage = pipeline.stage("a")
    pending = stage.submit(X)
    time.sleep(0.2)
    os.kill(pid_of(pipeline), signal.SIGKILL)
    with pytest.raises(WorkerGone):  # the request in flight: a typed error, no output
        pending.result()
    assert stage.state is StageState.FAILED  # already when the caller sees the error
    with pytest.raises(StageClosed):
        stage.submit(X)
    wait_for(lambda: stage.last_retire is not None)
    time.sleep(0.3)
    assert stage.state is StageState.FAILED  # "never": no automatic restart
    assert ledger.is_empty()
    health = pipeline.health()
    assert health["state"] == "degraded"
    assert health["stages"]["a"]["policy"]["restart"] == "never"
    with pytest.raises(StageClosed, match=r"failed.*restart"):
        stage.submit(X)


def test_on_failure_a_dead_worker_is_restarted_through_the_whole_gate(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    config = echo_stage("a", delay_s=10.0)
    config.update(restart="on-failure", max_restarts=2, restart_backoff_s=0.0)
    pipeline = open_pipeline(config)
    stage = pipeline.stage("a")
    old = pid_of(pipeline)
    pending = stage.submit(X)
    time.sleep(0.2)
    os.kill(old, signal.SIGKILL)
    with pytest.raises(WorkerGone):
        pending.result()
    wait_for(lambda: stage.state is StageState.READY and stage.generation == 2)
    assert pid_of(pipeline) != old and gone(old)
    assert ledger.reserved("machine:ram") == 256 * MiB  # reserved again
    assert pipeline.health()["stages"]["a"]["restarts"] == 1
    stage.call_timeout_s = 5.0
    stage_fast = stage.submit(X, deadline_s=0.5)
    with pytest.raises(DeadlineExceeded):  # still slow: the deadline fails it again
        stage_fast.result()
    wait_for(lambda: stage.state is StageState.READY and stage.generation == 3)


class FailingReloads:
    """Fault injection: every load after the first fails (the worker starts, then refuses)."""

    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.loads = 0

    @hookimpl(wrapper=True)
    def edge_load(self, stage: object) -> object:
        self.loads += 1
        loaded = yield
        if self.loads > 1:
            outcome = loaded.retire(3.0)  # type: ignore[attr-defined]
            error = RuntimeError("injected: reload refused")
            error.retire_outcome = outcome  # type: ignore[attr-defined]
            raise error
        return loaded


def test_on_failure_gives_up_after_max_restarts_and_leaves_nothing_charged(
    ledger: ResourceLedger,
) -> None:
    faults = FailingReloads()
    plugins = load_plugins(objects={"failing-reloads": faults}, env={"EDGE_PLUGINS": "echo"})
    config = echo_stage("a")
    config.update(restart="on-failure", max_restarts=2, restart_backoff_s=0.05)
    pipeline = Pipeline.open(load_pipeline({"name": "r", "stages": [config]}), plugins,
                             ledger, retire_deadline_s=3.0)
    try:
        stage = pipeline.stage("a")
        os.kill(pid_of(pipeline), signal.SIGKILL)
        wait_for(lambda: faults.loads == 3 and stage.state is StageState.FAILED
                 and not (stage.restarter._thread and stage.restarter._thread.is_alive()))
        assert "restart 2 of 2 failed" in (stage.closed_reason or "")
        assert pipeline.health()["stages"]["a"]["restarts"] == 2
        assert ledger.is_empty()
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_on_failure_a_cancel_retired_stage_serves_again_after_the_automatic_restart(
    open_pipeline: OpenPipeline,
) -> None:
    config = echo_stage("a", delay_s=10.0)
    config.update(restart="on-failure", restart_backoff_s=0.0)
    pipeline = open_pipeline(config)
    stage = pipeline.stage("a")
    pending = stage.submit(X)
    time.sleep(0.2)
    assert pending.cancel() is CancelOutcome.RETIRE_REQUIRED
    with pytest.raises(RequestCancelled):
        pending.result()
    wait_for(lambda: stage.state is StageState.READY and stage.generation == 2)


# -- submission ------------------------------------------------------------------------


def test_an_oversize_request_is_refused_at_submit_and_the_stage_keeps_serving(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    config = echo_stage("a")
    config["max_io_bytes"] = 1024
    pipeline = open_pipeline(config)
    pid = pid_of(pipeline)
    big = {"x": np.ones(512, np.float32)}  # 2 KiB
    with pytest.raises(RequestTooLarge,
                       match=r"stages\[a\]\.max_io_bytes: a request of 2048 bytes .*: 1024"):
        pipeline.run(big)
    assert pipeline.admission.used == 0 and pipeline.stage("a").outstanding == 0
    with pipeline.run(X) as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert pid_of(pipeline) == pid and pipeline.stage("a").state is StageState.READY


def test_outputs_over_max_io_bytes_fail_their_request_and_the_stage_keeps_serving(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    # The worker refuses to send them (the controller's reader would refuse the frame and
    # lose the channel): the request fails with EventTooLarge, the same worker serves on.
    config = echo_stage("a")
    config["max_io_bytes"] = 4096
    pipeline = open_pipeline(config)
    pid, charged = pid_of(pipeline), ledger.reserved("machine:ram")
    with pytest.raises(RequestFailed) as failed:
        pipeline.run(X, params={"pad_output_bytes": 8192})  # 16 + 8192 bytes of outputs
    assert failed.value.error_type == "EventTooLarge", failed.value
    assert failed.value.error_message.startswith(
        "event.outputs: the done event's output tensors are 8208 bytes, over the channel's "
        "max_io_bytes 4096; the largest is outputs['pad'], 8192 bytes")
    # the error's field, reason and value, as the worker sent them: typed, not parsed
    detail = failed.value.error_detail
    assert detail is not None and (detail.field, detail.value) == ("event.outputs", 8208)
    assert failed.value.error_message == f"{detail.field}: {detail.reason}: {detail.value}"
    assert pipeline.admission.used == 0 and pipeline.stage("a").outstanding == 0
    assert ledger.reserved("machine:ram") == charged  # nothing released or charged again
    with pipeline.run(X, params={"pad_output_bytes": 4096 - 16}) as result:  # exactly 4096
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert pid_of(pipeline) == pid and pipeline.stage("a").state is StageState.READY


def test_a_submission_cancels_its_own_request_alone(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=1.0),
                             admission=2)
    first = pipeline.submit(X, request_id="first")
    second = pipeline.submit(X)
    assert first.request_id == "first" and second.request_id != "first"
    time.sleep(0.3)
    assert first.cancel() is CancelOutcome.CANCELLED_IN_PLACE
    with pytest.raises(RequestCancelled):
        first.result()
    with second.result() as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert second.cancel() is CancelOutcome.ALREADY_FINISHED


def test_cancel_between_two_stages_is_not_started_and_retires_nothing(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("a"),
        echo_stage("b", transform="edge_echo.transforms:slow_passthrough"),
    )
    pids = (pid_of(pipeline, "a"), pid_of(pipeline, "b"))
    submission = pipeline.submit(X)
    time.sleep(0.25)  # stage a has answered; the transform sleeps
    assert submission.cancel() is CancelOutcome.NOT_STARTED
    with pytest.raises(RequestCancelled):
        submission.result()
    assert (pid_of(pipeline, "a"), pid_of(pipeline, "b")) == pids
    with pipeline.run(X) as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 4)


def test_cancel_of_a_request_finished_in_the_worker_is_already_finished(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    stage = pipeline.stage("a")
    client = stage.loaded.client  # type: ignore[attr-defined]
    pending = stage.submit(X)
    wait_for(lambda: not client.in_flight(pending.request_id))  # done in the worker
    assert pipeline.cancel() == {"a": "already-finished"}  # was "cancelled-in-place"
    assert stage.state is StageState.READY
    with pytest.raises(RequestCancelled):  # fenced all the same: nothing delivered
        pending.result()


def test_an_error_event_carries_the_workers_traceback(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", fail_at="call"))
    with pytest.raises(RequestFailed) as caught:
        pipeline.run(X)
    trace = caught.value.traceback or ""
    assert "InjectedFailure" in trace and "edge_echo" in trace and "submit" in trace
    assert "worker traceback" in str(caught.value)
    # a one-line report's split (the command line's): the traceback is the detail alone
    assert caught.value.detail == caught.value.traceback
    assert caught.value.summary.endswith("InjectedFailure: call failed as configured")
    assert "\n" not in caught.value.summary and "Traceback" not in caught.value.summary
    assert pipeline.stage("a").state is StageState.READY


def test_a_demanded_pool_without_an_observed_figure_is_recorded_unobserved(
    plugins: PluginSet,
) -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * GiB),
                             Pool(name="machine:vram:gpu-test", total=4 * GiB)])
    config = echo_stage("a")
    config["resources"] = {"demands": {"machine:ram": 256 * MiB,
                                       "machine:vram:gpu-test": 64 * MiB}}
    with Pipeline.open(load_pipeline({"name": "u", "stages": [config]}), plugins,
                       ledger) as pipeline:
        (stage,) = pipeline.execution_plan()["stages"]
        # the echo worker observes host RAM only: the VRAM demand is never "passed"
        assert stage["memory_check"] == {"machine:ram": "checked",
                                         "machine:vram:gpu-test": "unobserved"}
    assert ledger.is_empty()


def test_the_deadline_timer_forgets_calls_that_ended_in_time(
    open_pipeline: OpenPipeline,
) -> None:
    from edge_core.runtime.deadlines import timer

    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"))
    before = timer().pending()
    for _ in range(20):
        pipeline.run(X).ack()
    assert timer().pending() <= before


def test_health_of_an_open_pipeline_is_ready(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a"))
    health = pipeline.health()
    assert health["state"] == "ready"
    stage = health["stages"]["a"]
    assert stage["state"] == "ready" and stage["generation"] == 1
    assert stage["worker"]["state"] == "ready"
    pipeline.close()
    assert pipeline.health()["state"] == "closed"


def test_waiting_on_a_submission_past_a_timeout_is_deadline_exceeded(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=1.0))
    submission = pipeline.submit(X)
    with pytest.raises(DeadlineExceeded, match="no result within the wait"):
        submission.result(timeout_s=0.1)  # the request itself goes on
    with submission.result() as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert pipeline.admission.used == 0


def test_a_submission_cancels_every_item_of_its_fan_out_in_place(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("first"),
        echo_stage("rows", backend="echo-preemptible", delay_s=5.0,
                   transform="edge_echo.transforms:split_rows"),
    )
    submission = pipeline.submit({"x": np.ones((3, 2), np.float32)})
    rows = pipeline.stage("rows")
    wait_for(lambda: rows.outstanding == 3)  # the items, as request_id#0..2
    assert all(rid.startswith(submission.request_id + "#") for rid in rows.request_ids())
    assert submission.cancel() is CancelOutcome.CANCELLED_IN_PLACE
    with pytest.raises(RequestCancelled):
        submission.result()
    wait_for(lambda: rows.outstanding == 0)
    assert rows.state is StageState.READY


def test_a_replica_restarted_by_its_policy_serves_again(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    config = echo_stage("a", backend="echo-preemptible")
    config.update(replicas=2, restart="on-failure", restart_backoff_s=0.0)
    pipeline = open_pipeline(config)
    first, _ = pipeline.stages
    os.kill(int(str(first.loaded.describe()["pid"])), signal.SIGKILL)
    wait_for(lambda: first.state is StageState.READY and first.generation == 2)
    health = pipeline.health()
    assert set(health["stages"]) == {"a", "a#1"} and health["state"] == "ready"
    assert ledger.reserved("machine:ram") == 2 * 256 * MiB
    served = set()
    for _ in range(8):  # both replicas take calls again
        with pipeline.run(X) as result:
            served.add(result.final.key.generation)
    assert served == {1, 2}


def test_a_stopped_preemptible_worker_is_noticed_after_its_call_was_cancelled_in_place(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible", delay_s=30.0))
    pid = pid_of(pipeline)
    pending = pipeline.stage("a").submit(X)
    time.sleep(0.2)
    os.kill(pid, signal.SIGSTOP)
    try:
        # cancelled here at once; the worker owes its own end of the request
        assert pending.cancel() is CancelOutcome.CANCELLED_IN_PLACE
        with pytest.raises(RequestCancelled):
            pending.result()
        wait_for(lambda: pipeline.stage("a").state is StageState.FAILED, timeout_s=2.0 + SLACK_S)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGCONT)
    assert "unresponsive" in (pipeline.stage("a").closed_reason or "")
