"""A zero-copy DONE read from a kept header still gets every check of the general path.

A real worker (``CountingInPlace``) answers requests whose input is an input buffer sent
by reference with its output written in place in one of its segments: the DONE carries
a shared-memory entry (segment, offset, generation) and acknowledges the input in its
meta. After the first, the controller's reader builds each such header from a kept one
(``edge_contracts.binary_header``: kept without the references' generations and the
meta), so every later reply takes that path. Here the bytes a receive took are changed
before the client reads them, as a faulty worker would have sent them: a stale
generation and a segment of another name are refused as the general path refuses them
(the channel fails with a ``ProtocolViolation`` naming the check, before any byte of
the segment is read), and another shape of the same size is delivered as that shape.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from edge_contracts import binary_header
from edge_contracts.requests import Operation, StageRequest
from edge_core.host import WorkerClient
from edge_core.host.calls import Delivery
from edge_core.host.errors import ProtocolViolation, WorkerGone

SHAPE = (64, 64)  # float32: 16 KiB, over the threshold below
THRESHOLD = 4096


class Faulty:
    """Rewrites the next receive that holds a zero-copy DONE with ``change`` (then stops)."""

    def __init__(self, client: WorkerClient) -> None:
        self.change: Callable[[bytearray], None] | None = None
        receive = client._recv_into

        def recv_into(view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
            count = receive(view, nbytes, flags)
            if self.change is not None and bytes(view[:4]) == binary_header.BINARY_MAGIC:
                taken = bytearray(view[:count])
                if b"edge_" in taken:  # a reply with a shared-memory entry
                    self.change(taken)
                    view[:count] = taken
                    self.change = None
            return count

        client._receive_with(recv_into)


def _ref_at(taken: bytearray) -> tuple[int, int]:
    """Where the output's segment name and its generation's 8 bytes begin."""
    segment = taken.index(b"edge_")  # the first: the entry's (the acks come after, in meta)
    return segment, segment - 8


@pytest.fixture
def zero_copy(start: Callable[..., WorkerClient]) -> Iterator[tuple[WorkerClient, Faulty,
                                                                    Callable[[int], object]]]:
    client = start("counting_in_place", spin_us=0, shm_threshold=THRESHOLD)
    faulty = Faulty(client)
    held = [client.input_buffer(SHAPE, np.float32)]  # dropped at the end (its segment)

    def call(i: int) -> object:
        held[0][...] = i
        request = StageRequest(f"r{i:03}", "s0", 0, client.generation, Operation.RUN)
        delivery = client.submit(request, {"x": held[0]}).next(timeout=10)
        assert delivery.terminal and delivery.retained, delivery
        y = delivery.arrays["y"]
        shape, first = y.shape, float(y.flat[0])
        del y
        delivery.release()
        return shape, first

    for i in range(5):  # the DONE's header kept after the first, later ones built from it
        assert call(i) == (SHAPE, float(i))
    assert binary_header._KEPT_REFS  # (kept: the replies below are built from it)
    yield client, faulty, call
    held.clear()


def _refused(client: WorkerClient, call: Callable[[int], object], field: str) -> None:
    with pytest.raises((ProtocolViolation, WorkerGone)):
        call(99)
    health = client.health()
    assert field in str(health.reason), health


Started = tuple[WorkerClient, Faulty, Callable[[int], object]]


def test_a_stale_generation_in_a_kept_reply_is_refused(zero_copy: Started) -> None:
    client, faulty, call = zero_copy

    def stale(taken: bytearray) -> None:
        _, at = _ref_at(taken)
        (generation,) = struct.unpack_from("<Q", taken, at)
        struct.pack_into("<Q", taken, at, generation - 1)

    faulty.change = stale
    _refused(client, call, "shm.generation")


def test_a_segment_of_another_name_in_a_kept_reply_is_refused(zero_copy: Started) -> None:
    client, faulty, call = zero_copy

    def other(taken: bytearray) -> None:
        segment, _ = _ref_at(taken)
        last = segment + taken[segment:].index(b"{") - 1  # the name's last character
        taken[last] = ord("0") if taken[last] != ord("0") else ord("1")

    faulty.change = other
    _refused(client, call, "shm")


def test_another_shape_in_a_kept_reply_is_delivered_as_that_shape(zero_copy: Started) -> None:
    client, faulty, call = zero_copy

    def reshaped(taken: bytearray) -> None:
        at = taken.index(struct.pack("<QQ", *SHAPE))
        struct.pack_into("<QQ", taken, at, 32, 128)  # the same bytes, another shape

    faulty.change = reshaped
    assert call(7) == ((32, 128), 7.0)
    assert call(8) == (SHAPE, 8.0)
    assert client.health().state == "ready"


class CountingReader:
    """The client's frame reader, the ops of the frames it read recorded (all else passes)."""

    def __init__(self, frames: object) -> None:
        self.frames = frames
        self.ops: list[str] = []

    def read_into(self, frames: list[object]) -> None:
        self.frames.read_into(frames)  # type: ignore[attr-defined]
        self.ops.append(frames[-1].header.op)  # type: ignore[attr-defined]

    def has_buffered(self) -> bool:
        return bool(self.frames.has_buffered())  # type: ignore[attr-defined]

    @property
    def buffered(self) -> bool:
        return bool(self.frames.buffered)  # type: ignore[attr-defined]


def test_a_zero_copy_reply_alone_in_its_receive_skips_the_frame_reader(
    zero_copy: Started,
) -> None:
    """Its kept header is built by the client itself; the delivery is the reader's own.

    A receive that held one whole zero-copy DONE (no other frame, nothing cut off) is not
    handed to the frame reader: the client looks the header up in the kept ones and makes
    the frame as the reader makes it. Each DONE that came with other bytes is read by the
    reader (counted per receive, so that a loaded machine's merged receives do not make
    the count lie). With the kept headers dropped, the same reply is read by the frame
    reader, and delivered alike.
    """
    from edge_contracts.protocol import OP_EVENT
    from edge_contracts.wire import PREFIX

    client, _, _ = zero_copy
    reader = CountingReader(client._frames)
    client._frames = reader  # type: ignore[assignment]
    alone: list[bool] = []  # per receive that held a DONE's bytes: whether it held just it
    receive = client._recv_into

    def recv_into(view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        count = receive(view, nbytes, flags)
        if count >= PREFIX.size and b"edge_" in bytes(view[:count]):
            _, header_len, payload_len = PREFIX.unpack_from(view)
            alone.append(PREFIX.size + header_len + payload_len == count)
        return count

    client._receive_with(recv_into)
    held = [client.input_buffer(SHAPE, np.float32)]  # dropped at the end (its segment)

    def done(i: int) -> Delivery:
        held[0][...] = i
        request = StageRequest(f"q{i:03}", "s0", 0, client.generation, Operation.RUN)
        delivery = client.submit(request, {"x": held[0]}).next(timeout=10)
        assert delivery.terminal and delivery.retained
        return delivery

    kept = []
    for i in range(10):
        delivery = done(i)
        kept.append((delivery.event, delivery.arrays["y"].copy()))
        delivery.release()
    assert len(alone) == 10 and any(alone)
    assert reader.ops.count(OP_EVENT) == alone.count(False), (reader.ops, alone)
    binary_header._KEPT_REFS.clear()  # the next header is parsed whole: by the reader
    alone.clear()
    general = done(10)
    assert reader.ops.count(OP_EVENT) == alone.count(False) + 1
    event = general.event
    for usual_event, y in kept:
        for name in ("stage_id", "epoch", "generation", "kind", "terminal", "error", "data",
                     "outputs"):
            assert getattr(usual_event, name) == getattr(event, name), name
        assert y.shape == general.arrays["y"].shape and y.dtype == general.arrays["y"].dtype
        assert not general.arrays["y"].flags.writeable
    np.testing.assert_array_equal(general.arrays["y"], np.full(SHAPE, 10, np.float32))
    general.release()
    held.clear()
    assert client.health().state == "ready"
