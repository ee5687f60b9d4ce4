"""A stage's shared memory holds what its ``max_io_bytes`` allows, and a full one is waited
for only while calls in flight will give memory back.

Real echo workers and real shared memory. Each channel's producers (the controller's for
inputs, the worker's for outputs) are capped at room for one frame of the stage's
``max_io_bytes`` (:func:`~edge_contracts.shm.retained_cap_for`). Before, the cap stayed at
64 MiB whatever ``max_io_bytes`` said, so a larger request was refused by the cap, and the
replica set took that refusal for a slot taken meanwhile: it tried again at once, for
ever, at full CPU.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from edge_contracts.shm import DEFAULT_MAX_BYTES, retained_cap_for
from edge_core.host.errors import TransportCapExceeded
from edge_core.ledger import ResourceLedger

from .conftest import MiB, OpenPipeline, echo_stage


def _client(pipeline: Any) -> Any:
    return pipeline.stages[0].loaded.client


def _producer(pipeline: Any) -> Any:
    return _client(pipeline)._producer


def test_a_request_over_the_default_cap_goes_through_a_stage_that_allows_it(
    open_pipeline: OpenPipeline,
) -> None:
    stage = echo_stage("big", scale=2.0)
    stage["max_io_bytes"] = "80MiB"
    pipeline = open_pipeline(stage)
    cap = retained_cap_for(80 * MiB)
    assert _producer(pipeline).max_bytes == cap > DEFAULT_MAX_BYTES
    x = np.arange(72 * MiB // 4, dtype=np.float32)  # over 64 MiB, one frame each way
    with pipeline.run({"x": x}, deadline_s=30.0) as result:
        assert np.array_equal(result.outputs["x"], 2 * x)
    with pipeline.run({"x": x[:5]}, deadline_s=30.0) as result:  # and it serves on
        assert np.array_equal(result.outputs["x"], 2 * x[:5])


def test_a_frame_of_max_io_bytes_in_many_odd_arrays_fits_the_cap(
    open_pipeline: OpenPipeline,
) -> None:
    """Each array's segment is rounded up to whole pages: the cap leaves room for that."""
    pipeline = open_pipeline(echo_stage("odd", scale=1.0))
    sizes = [4 * MiB + 2048] * 15  # each a page and a half over 4 MiB
    sizes.append(64 * MiB - sum(sizes))  # 64 MiB in all: the stage's max_io_bytes
    inputs = {f"x{i}": np.full(size, i, np.uint8) for i, size in enumerate(sizes)}
    assert sum(v.nbytes for v in inputs.values()) == 64 * MiB
    with pipeline.run(inputs, deadline_s=30.0) as result:
        for name, value in inputs.items():
            assert np.array_equal(result.outputs[name], value)


def test_a_request_waits_without_spinning_for_the_memory_of_calls_in_flight(
    open_pipeline: OpenPipeline,
) -> None:
    """Two 40 MiB requests on a 64 MiB stage: the second waits for the first's end, asleep."""
    pipeline = open_pipeline(echo_stage("slow", backend="echo-preemptible", scale=1.0, delay_s=0.8),
                             admission=2)
    x = np.ones(40 * MiB, np.uint8)
    assert _producer(pipeline).max_bytes < 2 * x.nbytes  # one at a time
    first_ended = threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with pipeline.run({"x": x}, deadline_s=30.0):
                pass
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            first_ended.set()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        until = time.monotonic() + 10.0
        while not _client(pipeline)._calls:  # the first is in flight
            assert time.monotonic() < until and not first_ended.is_set(), errors
            time.sleep(0.005)
        y = x + 1
        cpu, began = time.thread_time(), time.monotonic()
        with pipeline.run({"x": y}, deadline_s=30.0) as result:
            waited_cpu, waited_s = time.thread_time() - cpu, time.monotonic() - began
            assert np.array_equal(result.outputs["x"], y)
    finally:
        thread.join()
    assert not errors, errors
    # The same request again, with nothing to wait for: what the request itself costs
    # here (copies, page faults of its segments: more on a loaded machine)
    cpu = time.thread_time()
    with pipeline.run({"x": y}, deadline_s=30.0):
        alone_cpu = time.thread_time() - cpu
    # Asleep while it waited for the first call's end (about 0.8 s): trying again at once,
    # as before, spent all of that on the CPU.
    assert waited_cpu - alone_cpu < 0.3, (
        f"waited {waited_s:.3f} s at {waited_cpu:.3f} s of CPU; the request alone took "
        f"{alone_cpu:.3f} s of CPU")


def test_memory_held_by_the_caller_is_refused_at_once_naming_the_cap(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """Input buffers fill the cap and nothing is in flight: waiting could never help."""
    pipeline = open_pipeline(echo_stage("held", scale=1.0))
    charged = ledger.snapshot()
    held = pipeline.input_buffer("x", (60 * MiB,), np.uint8)
    x = np.ones(8 * MiB, np.uint8)
    started = time.monotonic()
    with pytest.raises(TransportCapExceeded, match=r"shm\.retained_bytes") as caught:
        pipeline.run({"x": x}, deadline_s=20.0)
    assert caught.value.clears is False
    assert time.monotonic() - started < 10.0  # refused, not waited out to the deadline
    assert pipeline.stages[0].slots.free == pipeline.stages[0].slots.limit
    assert pipeline.admission.free == pipeline.admission.limit
    assert ledger.snapshot() == charged
    del held  # the caller lets its buffer go: the same request now fits
    with pipeline.run({"x": x}, deadline_s=30.0) as result:
        assert np.array_equal(result.outputs["x"], x)
