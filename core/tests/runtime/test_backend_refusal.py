"""A backend's own refusal of a call ("not now") is waited out asleep, never spun on.

Real echo workers. Each stage's bound ``edge_call`` (the echo plugin's real hook) is
wrapped to refuse with ``ResourceUnavailable`` until a time the test sets, as a backend
whose device is busy would, and to call the real hook after. The replica set used to
take any ``ResourceUnavailable`` from a stage for a slot taken meanwhile and try again at
once; the refused try's own slot release woke it, so it never slept. Now only the slot
pool's refusal (``SlotsTaken``) is a slot taken; a refusal after the slot waits for the
next release (or the recheck), bounded by the request's deadline, and nothing stays
charged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest

from edge_core.errors import DeadlineExceeded, ResourceUnavailable
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline
from edge_core.runtime.admission import SlotPool, SlotsTaken

from .conftest import OpenPipeline, echo_stage

X = {"x": np.arange(4, dtype=np.float32)}


def refusing_until(pipeline: Pipeline, until: float) -> list[int]:
    """Make every replica's ``edge_call`` refuse before ``until``; return the refusal count."""
    refused = [0]
    for runtime in pipeline.stages:
        real: Callable[..., Any] = runtime.binding.call

        def call(loaded: Any, request: Any, inputs: Any, real: Callable[..., Any] = real) -> Any:
            if time.monotonic() < until:
                refused[0] += 1
                raise ResourceUnavailable(f"stages[{request.stage_id}].backend: not now")
            return real(loaded, request, inputs)

        runtime.binding = attrs.evolve(runtime.binding, call=call)
    return refused


def _serves(pipeline: Pipeline) -> None:
    assert pipeline.admission.used == 0
    for stage in pipeline.stages:
        assert stage.slots.used == 0 and stage.outstanding == 0
    with pipeline.run(X, deadline_s=10.0) as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"])


def test_a_slot_pool_says_its_slots_are_taken_with_its_own_class() -> None:
    pool = SlotPool(1, "stages[s].in_flight")
    pool.acquire(None)
    with pytest.raises(SlotsTaken, match=r"stages\[s\]\.in_flight: all 1 slot\(s\) taken"):
        pool.acquire(None)
    assert issubclass(SlotsTaken, ResourceUnavailable)  # callers catching that still do
    pool.release()


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_refusal_that_passes_is_waited_out_asleep(
    open_pipeline: OpenPipeline, replicas: int,
) -> None:
    stage = echo_stage("busy", scale=1.0)
    stage["replicas"] = replicas
    pipeline = open_pipeline(stage)
    refuse_s = 0.6
    refused = refusing_until(pipeline, time.monotonic() + refuse_s)
    started, cpu = time.monotonic(), time.thread_time()
    with pipeline.run(X, deadline_s=20.0) as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"])
    waited, spent = time.monotonic() - started, time.thread_time() - cpu
    assert refused[0] >= 1 and waited >= refuse_s * 0.9  # it was refused until then
    # Asleep meanwhile (a recheck every 50 ms): trying again at once, as before, spent
    # the whole wait on the CPU.
    assert spent < 0.3, (spent, refused)
    assert refused[0] < 100, refused
    _serves(pipeline)


def test_a_refusal_that_lasts_ends_at_the_deadline_and_leaves_nothing_charged(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("busy", scale=1.0))
    charged = ledger.snapshot()
    refusing_until(pipeline, time.monotonic() + 2.0)
    cpu = time.thread_time()
    with pytest.raises(DeadlineExceeded):
        pipeline.run(X, deadline_s=0.8)
    assert time.thread_time() - cpu < 0.3
    assert ledger.snapshot() == charged
    time.sleep(max(0.0, 2.0 - 0.8))  # the backend takes calls again
    _serves(pipeline)
