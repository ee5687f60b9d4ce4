"""Fan-out within a request, pipelined requests and replicas, on real echo workers."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import EdgeError, ResourceUnavailable
from edge_core.ledger import PoolExhausted, ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Fanout, GatheredResult, Pipeline, RequestCancelled

from .conftest import GiB, OpenPipeline, echo_stage

SPLIT = "edge_echo.transforms:split_rows"


def test_a_fanout_calls_the_stage_once_per_item_and_gathers_in_item_order(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("first", scale=2.0),
        echo_stage("rows", backend="echo-preemptible", transform=SPLIT, scale=3.0,
                   delay_s=0.02),
    )
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    with pipeline.run({"x": x}) as result:
        assert isinstance(result.final, GatheredResult)
        assert result.final.items == 7
        rows = result.outputs["x"]
        assert isinstance(rows, list) and len(rows) == 7
        for index, row in enumerate(rows):
            np.testing.assert_array_equal(row, x[index:index + 1] * 6)
        assert [int(r[0]) for r in result.outputs["carry:row"]] == list(range(7))
        assert result.outputs["carry:rows"].tolist() == [7]
    runtime = pipeline.stage("rows")
    assert runtime.outstanding == 0 and runtime.slots.used == 0  # every item acknowledged


def test_a_fanout_feeds_the_next_transform_lists(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(
        echo_stage("first", scale=1.0),
        echo_stage("rows", transform=SPLIT, scale=2.0),
        echo_stage("joined", transform="edge_echo.transforms:join_rows", scale=1.0),
    )
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pipeline.run({"x": x}) as result:
        np.testing.assert_array_equal(result.outputs["x"], x * 2)


def test_an_empty_fanout_calls_nothing_and_passes_the_carry(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("first", scale=1.0),
                             echo_stage("rows", transform=SPLIT, scale=2.0))
    with pipeline.run({"x": np.zeros((0, 2), np.float32)}) as result:
        assert result.outputs == {"carry:rows": np.array([0])}


def test_cancel_in_the_middle_of_a_fanout_delivers_nothing_and_keeps_serving(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(
        echo_stage("first", scale=1.0),
        echo_stage("rows", backend="echo-preemptible", transform=SPLIT, delay_s=0.3),
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = pipeline.run({"x": np.ones((12, 2), np.float32)})
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    rows = pipeline.stage("rows")
    deadline = time.monotonic() + 10
    while rows.slots.used < 4 and time.monotonic() < deadline:  # 4 items in flight
        time.sleep(0.005)
    assert rows.slots.used == 4
    pipeline.cancel()
    worker.join(10)
    assert isinstance(outcome.get("error"), RequestCancelled), outcome
    assert "result" not in outcome
    assert rows.outstanding == 0 and pipeline.admission.used == 0
    with pipeline.run({"x": np.ones((3, 2), np.float32)}) as result:  # still serving
        assert len(result.outputs["x"]) == 3
    assert len(ledger.snapshot()["reservations"]) == 2


def test_a_failing_item_fails_the_request_with_its_typed_error(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("first", scale=1.0),
                             echo_stage("rows", transform=SPLIT, fail_at="call"))
    with pytest.raises(EdgeError, match="call failed as configured"):
        pipeline.run({"x": np.ones((3, 2), np.float32)})
    assert pipeline.stage("rows").outstanding == 0
    assert pipeline.admission.used == 0


def test_fanout_items_must_be_mappings_and_carry_names_prefixed() -> None:
    with pytest.raises(EdgeError, match=r"Fanout.items\[1\]: must be a mapping"):
        Fanout(items=[{}, [1, 2]])  # type: ignore[list-item]
    with pytest.raises(EdgeError, match=r"Fanout.carry\['boxes'\]: carried names start"):
        Fanout(items=[], carry={"boxes": 1})


def test_replicas_are_reserved_loaded_gated_and_listed(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    stage = echo_stage("work", demand=64 * 1024**2)
    stage["replicas"] = 3
    pipeline = open_pipeline(stage, name="rep")
    owners = sorted(r["owner"] for r in ledger.snapshot()["reservations"])
    assert owners == ["rep/work", "rep/work#1", "rep/work#2"]
    plan = pipeline.execution_plan()
    assert [s["replica"] for s in plan["stages"]] == [0, 1, 2]
    pids = {s["worker"]["pid"] for s in plan["stages"]}
    assert len(pids) == 3
    assert all(s["placement"]["total_nodes"] == 1 for s in plan["stages"])


def test_replicas_that_do_not_fit_are_refused_with_nothing_charged(
    plugins: PluginSet, ledger: ResourceLedger,
) -> None:
    stage = echo_stage("work", demand=3 * GiB // 2)
    stage["replicas"] = 3  # 4.5 GiB on a 4 GiB pool
    config = load_pipeline({"name": "big", "stages": [stage]})
    with pytest.raises(PoolExhausted):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()


def test_one_replica_dying_fails_its_requests_and_the_others_keep_serving(
    open_pipeline: OpenPipeline,
) -> None:
    stage = echo_stage("work", scale=2.0)
    stage["replicas"] = 2
    pipeline = open_pipeline(stage)
    victim = pipeline.execution_plan()["stages"][0]["worker"]["pid"]
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.2)  # the watchdog sees the death
    failures = 0
    for _ in range(6):
        try:
            with pipeline.run({"x": np.ones((2, 2), np.float32)}) as result:
                np.testing.assert_array_equal(result.outputs["x"], np.full((2, 2), 2.0))
        except EdgeError:
            failures += 1
    assert failures <= 1  # at most the one request sent before the death was noticed
    with pipeline.run({"x": np.ones((2, 2), np.float32)}) as result:
        assert result.outputs["x"].shape == (2, 2)


def test_admitted_requests_flow_through_the_chain_concurrently(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=0.05, scale=1.0),
                             echo_stage("b", transform="edge_echo.transforms:passthrough",
                                        delay_s=0.05, scale=2.0),
                             admission=4)
    answers: list[Any] = []
    lock = threading.Lock()

    def client(value: float) -> None:
        for _ in range(3):
            try:
                with pipeline.run({"x": np.full((1, 2), value, np.float32)}) as result:
                    got = float(result.outputs["x"][0, 0])
            except ResourceUnavailable as exc:  # must not happen: admitted requests wait
                got = exc  # type: ignore[assignment]
            with lock:
                answers.append((value, got))

    threads = [threading.Thread(target=client, args=(float(v),)) for v in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == sorted((float(v), 2.0 * v) for v in range(4) for _ in range(3))


def test_a_transform_may_take_bundles_and_return_a_call(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(
        echo_stage("a", scale=2.0),
        echo_stage("b", transform="edge_echo.transforms:call_with_bundles", scale=3.0),
    )
    with pipeline.run({"x": np.ones((1, 2), np.float32)}, params={"p": 1}) as result:
        np.testing.assert_array_equal(result.outputs["x"], np.full((1, 2), 6.0))
        assert result.outputs["carry:bundles"] == ["a", "b"]


def test_large_item_outputs_are_copied_then_their_shared_memory_acknowledged(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("first", scale=1.0),
                             echo_stage("rows", transform=SPLIT, scale=2.0))
    x = np.arange(3 * 100_000, dtype=np.float32).reshape(3, 100_000)  # 400 kB rows: shm
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # no view outlived its ack
        for _ in range(3):  # the workers reuse the acknowledged segments
            with pipeline.run({"x": x}) as result:
                rows = result.outputs["x"]
                assert all(r.flags.writeable and r.flags.owndata for r in rows)  # copies
                for index, row in enumerate(rows):
                    np.testing.assert_array_equal(row, x[index:index + 1] * 2)
    assert pipeline.stage("rows").outstanding == 0


def test_a_replica_dying_in_the_middle_of_a_fanout_fails_that_request_only(
    open_pipeline: OpenPipeline,
) -> None:
    rows = echo_stage("rows", transform=SPLIT, scale=2.0, delay_s=0.2)
    rows["replicas"] = 2
    pipeline = open_pipeline(echo_stage("first", scale=1.0), rows)
    victim = pipeline.execution_plan()["stages"][1]["worker"]["pid"]
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = pipeline.run({"x": np.ones((6, 2), np.float32)})
        except EdgeError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    runtime = pipeline.stage("rows")  # replica 0, whose worker dies
    deadline = time.monotonic() + 10
    while runtime.slots.used == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(victim, signal.SIGKILL)
    worker.join(20)
    assert "result" not in outcome and isinstance(outcome.get("error"), EdgeError), outcome
    assert pipeline.admission.used == 0
    with pipeline.run({"x": np.ones((5, 2), np.float32)}) as result:  # replica 1 serves
        assert [float(r[0, 0]) for r in result.outputs["x"]] == [2.0] * 5
