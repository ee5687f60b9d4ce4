"""A one-replica stage's lane (ReplicaSet.submit straight to its runtime) and the general path.

A stage of one replica is submitted to without ranking candidates: the replica set hands
the request to its runtime at once when nobody waits and a slot is free
(:meth:`ReplicaSet.submit`), and a request on the general path (two replicas) goes through
the candidates. Each scenario runs on both and must end the same way: the same results,
the same typed errors, and nothing left held — no stage slot, no admission slot, no
request entry, no pending deadline of the request's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_core.errors import DeadlineExceeded
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline
from edge_core.runtime.admission import RequestTooLarge
from edge_core.runtime.deadlines import timer
from edge_core.runtime.errors import RequestCancelled

from .conftest import OpenPipeline, echo_stage

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _open(open_pipeline: OpenPipeline, replicas: int, *, admission: int = 1,
          **options: Any) -> Pipeline:
    stage = echo_stage("s", backend="echo-preemptible", scale=2.0, **options)
    stage["replicas"] = replicas
    return open_pipeline(stage, admission=admission)


def _settled(pipeline: Pipeline) -> dict[str, Any]:
    """What a request may leave behind once it ended (all of it must be nothing)."""
    return {"admission": pipeline.admission.used,
            "slots": [stage.slots.used for stage in pipeline.stages],
            "entries": [stage.outstanding for stage in pipeline.stages]}


NOTHING_HELD = {1: {"admission": 0, "slots": [0], "entries": [0]},
                2: {"admission": 0, "slots": [0, 0], "entries": [0, 0]}}


def _outcome(call: Callable[[], Any]) -> Any:
    """The call's result (its outputs, acknowledged), or the type of what it raised."""
    try:
        result = call()
    except Exception as exc:
        return type(exc)
    with result:
        return {name: np.asarray(value).tolist() for name, value in result.outputs.items()}


@pytest.mark.parametrize("replicas", [1, 2])
def test_results_and_held_state_are_the_same_on_either_path(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, replicas: int,
) -> None:
    pipeline = _open(open_pipeline, replicas)
    before = timer().pending()
    outcomes = [_outcome(lambda k=k: pipeline.run({"x": X * k})) for k in range(4)]
    assert outcomes == [{"x": (X * k * 2.0).tolist()} for k in range(4)]
    assert _settled(pipeline) == NOTHING_HELD[replicas]
    assert timer().pending() <= before  # each call's deadline went with it


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_request_too_large_is_refused_with_nothing_held(
    open_pipeline: OpenPipeline, replicas: int,
) -> None:
    pipeline = _open(open_pipeline, replicas)
    limit = pipeline.stages[0].context.max_io_bytes
    too_large = np.zeros(limit + 1, np.uint8)
    assert _outcome(lambda: pipeline.run({"x": too_large})) is RequestTooLarge
    assert _settled(pipeline) == NOTHING_HELD[replicas]
    assert _outcome(lambda: pipeline.run({"x": X})) == {"x": (X * 2.0).tolist()}


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_send_that_fails_leaves_no_entry_slot_or_deadline(
    open_pipeline: OpenPipeline, replicas: int,
) -> None:
    pipeline = _open(open_pipeline, replicas)
    before = timer().pending()
    unsendable = np.array([object()], dtype=object)  # no wire dtype: refused by the sender
    failed = _outcome(lambda: pipeline.run({"x": unsendable}))
    assert isinstance(failed, type) and issubclass(failed, Exception)
    assert _settled(pipeline) == NOTHING_HELD[replicas]
    assert timer().pending() <= before  # the deadline scheduled with it was cancelled
    assert _outcome(lambda: pipeline.run({"x": X})) == {"x": (X * 2.0).tolist()}


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_deadline_ends_the_call_the_same_way(
    open_pipeline: OpenPipeline, replicas: int,
) -> None:
    pipeline = _open(open_pipeline, replicas, delay_s=0.5)
    assert _outcome(lambda: pipeline.run({"x": X}, deadline_s=0.1)) is DeadlineExceeded
    deadline = time.monotonic() + 5.0  # the preemptible worker ends the call in place
    while _settled(pipeline) != NOTHING_HELD[replicas] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _settled(pipeline) == NOTHING_HELD[replicas]


@pytest.mark.parametrize("replicas", [1, 2])
def test_requests_beyond_the_free_slots_wait_and_all_answer(
    open_pipeline: OpenPipeline, replicas: int,
) -> None:
    pipeline = _open(open_pipeline, replicas, admission=replicas + 2, delay_s=0.05)
    submissions = [pipeline.submit({"x": X * k}) for k in range(replicas + 2)]
    outcomes = [_outcome(lambda s=s: s.result(timeout_s=10)) for s in submissions]
    assert outcomes == [{"x": (X * k * 2.0).tolist()} for k in range(replicas + 2)]
    assert _settled(pipeline) == NOTHING_HELD[replicas]


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_request_cancelled_while_it_waits_for_a_slot_is_never_sent(
    open_pipeline: OpenPipeline, replicas: int,
) -> None:
    pipeline = _open(open_pipeline, replicas, admission=replicas + 1, delay_s=0.3)
    running = [pipeline.submit({"x": X}) for _ in range(replicas)]
    time.sleep(0.1)  # every slot taken
    waiting = pipeline.submit({"x": X})
    time.sleep(0.05)
    waiting.cancel(interrupt=False)
    assert _outcome(lambda: waiting.result(timeout_s=10)) is RequestCancelled
    for submission in running:
        assert _outcome(lambda s=submission: s.result(timeout_s=10)) == {"x": (X * 2.0).tolist()}
    assert _settled(pipeline) == NOTHING_HELD[replicas]
