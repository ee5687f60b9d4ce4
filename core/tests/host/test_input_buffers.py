"""Input buffers: filled in place in the controller's shared memory, sent by reference."""

from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest

from edge_contracts.requests import EventKind, Operation, StageRequest
from edge_contracts.shm import segment_names
from edge_core.host import CallCancelled, WorkerGone
from edge_core.host.errors import InputBufferBusy

SIZE = 512 * 1024  # above the default shared-memory threshold (256 KiB)


def request(rid: str, **params: object) -> StageRequest:
    return StageRequest(rid, "s0", 0, 1, Operation.RUN, params=params)


def test_a_filled_buffer_travels_by_reference_and_is_reused(start) -> None:
    client = start()
    producer = client._producer
    buf = client.input_buffer((SIZE,), np.uint8)
    assert producer.retained_buffers == 1 and buf.flags.writeable
    held = producer.held_bytes
    for value in (3, 7):
        buf[:] = value
        # the worker sleeps before answering: it still holds the buffer when we look
        call = client.submit(request(f"r{value}", sleep_s=0.5), {"x": buf})
        assert not buf.flags.writeable  # the worker holds it until the request ends
        with pytest.raises(ValueError, match="read-only"):
            buf[0] = 1
        with pytest.raises(InputBufferBusy, match=r"inputs\.x: still held by the worker"):
            client.submit(request(f"again{value}"), {"x": buf})
        out = call.result(timeout=10)
        assert (out["x"] == value).all()  # the second send carries the new bytes
        assert buf.flags.writeable
    assert producer.held_bytes == held  # no copy segment was leased: the same one twice
    del buf
    gc.collect()
    assert producer.retained_buffers == 0  # the collected buffer went back to the pool


def test_a_small_buffer_is_a_private_array(start) -> None:
    client = start()
    buf = client.input_buffer((4,), np.float32)
    buf[:] = 1.5
    np.testing.assert_array_equal(client.submit(request("r1"), {"x": buf}).result()["x"], buf)
    assert client._producer.retained_buffers == 0


def test_a_cancelled_request_gives_the_buffer_back(start) -> None:
    client = start()
    buf = client.input_buffer((SIZE,), np.uint8)
    call = client.submit(request("slow", sleep_s=0.3), {"x": buf})
    call.cancel()
    with pytest.raises(CallCancelled):
        call.result(timeout=10)
    assert client.ping()["in_flight"] == 0  # the worker has ended the request
    client.ping()  # its terminal event (with the acknowledgement) was read before
    assert buf.flags.writeable
    out = client.submit(request("after"), {"x": buf}).result(timeout=10)
    assert out["x"].nbytes == SIZE
    kinds = [d.kind for d in client.submit(request("last"), {"x": buf})]
    assert kinds == [EventKind.DONE]


def test_nothing_is_left_when_the_worker_dies_holding_a_buffer(start) -> None:
    client = start()
    buf = client.input_buffer((SIZE,), np.uint8)
    prefix = client._producer.prefix
    call = client.submit(request("held", sleep_s=5), {"x": buf})
    os.kill(client.identity.pid, signal.SIGKILL)
    with pytest.raises(WorkerGone):
        call.result(timeout=10)
    assert client.retire().verified
    assert segment_names(prefix) == []  # the buffer's segment went with the producer
    assert buf.nbytes == SIZE  # the caller's array is still valid memory ...
    del buf, call
    gc.collect()  # ... until the caller lets it go: then its mapping closes too
