"""Input buffers on a stage with replicas, on real echo workers: by reference to the owner."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

from edge_contracts.shm import segment_names
from edge_core.host.errors import InputBufferBusy
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline

from .conftest import OpenPipeline, echo_stage

ROWS = 128 * 1024  # float32: 512 KiB, above the default shared-memory threshold (256 KiB)


def _replicas(open_pipeline: OpenPipeline, admission: int = 4, **options: Any) -> Pipeline:
    stage = echo_stage("work", scale=2.0, **options)
    stage["replicas"] = 2
    return open_pipeline(stage, admission=admission)


def _producer(runtime: Any) -> Any:
    return runtime.loaded.client._producer


def test_buffers_spread_over_replicas_and_every_request_goes_by_reference(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = _replicas(open_pipeline, delay_s=0.01)
    replicas = pipeline.stages
    assert len(replicas) == 2
    buffers = [pipeline.input_buffer("x", (ROWS,), np.float32) for _ in range(4)]
    assert [r.input_buffer_counts()["buffers"] for r in replicas] == [2, 2]
    owners = [next(i for i, r in enumerate(replicas) if r.owns_input_buffer(b))
              for b in buffers]
    assert sorted(owners) == [0, 0, 1, 1]
    held = [_producer(r).held_bytes for r in replicas]
    prefixes = [_producer(r).prefix for r in replicas]
    answers: list[Any] = []
    lock = threading.Lock()

    def client(index: int, buffer: np.ndarray) -> None:
        for turn in range(5):
            value = float(10 * index + turn)
            buffer[:] = value
            try:
                with pipeline.run({"x": buffer}) as result:
                    ok = bool((result.outputs["x"] == 2 * value).all())
                got: Any = (ok, buffer.flags.writeable)  # writable again once it ended
            except BaseException as exc:  # reported below, with the others
                got = exc
            with lock:
                answers.append(got)

    threads = [threading.Thread(target=client, args=(i, b)) for i, b in enumerate(buffers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == [(True, True)] * 20
    # no copy segment was leased on either replica: every request went by reference ...
    assert [_producer(r).held_bytes for r in replicas] == held
    sent = [r.input_buffer_counts()["sent"] for r in replicas]
    assert sent == [10, 10]  # ... to the replica owning its buffer: both served
    assert pipeline.input_buffer_counts() == {"buffers": 4, "sent": 20}
    del buffers, threads, thread
    gc.collect()
    assert pipeline.input_buffer_counts()["buffers"] == 0  # back to the producers' pools
    pipeline.close()
    assert all(segment_names(p) == [] for p in prefixes)
    assert ledger.is_empty()


def test_a_busy_buffer_is_refused_at_once_whichever_replica_is_free(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = _replicas(open_pipeline)
    buffer = pipeline.input_buffer("x", (ROWS,), np.float32)
    buffer[:] = 1.0
    slow = pipeline.submit({"x": buffer}, params={"delay_s": 0.5})
    end = time.monotonic() + 10
    while buffer.flags.writeable and time.monotonic() < end:  # until it is sent
        time.sleep(0.005)
    assert not buffer.flags.writeable
    started = time.monotonic()
    with pytest.raises(InputBufferBusy, match=r"inputs\.x: still held by the worker"):
        pipeline.run({"x": buffer})  # the other replica is free: still refused
    assert time.monotonic() - started < 0.4  # at once, not after the slow request
    with slow.result(timeout_s=10) as result:
        assert (result.outputs["x"] == 2.0).all()
    assert buffer.flags.writeable
    buffer[:] = 3.0
    with pipeline.run({"x": buffer}) as result:
        assert (result.outputs["x"] == 6.0).all()
    assert pipeline.input_buffer_counts()["sent"] == 2  # the refused one was not sent


def test_a_buffer_whose_replica_died_goes_to_another_by_copy(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = _replicas(open_pipeline)
    replicas = pipeline.stages
    buffer = pipeline.input_buffer("x", (ROWS,), np.float32)
    owner = next(r for r in replicas if r.owns_input_buffer(buffer))
    other = next(r for r in replicas if r is not owner)
    held = _producer(other).held_bytes
    os.kill(owner.loaded.client.identity.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    time.sleep(0.2)  # the watchdog sees the death
    buffer[:] = 4.0
    with pipeline.run({"x": buffer}) as result:
        assert (result.outputs["x"] == 8.0).all()
    assert _producer(other).held_bytes > held  # the other replica leased a copy
    assert other.input_buffer_counts()["sent"] == 0
    del buffer
    gc.collect()
