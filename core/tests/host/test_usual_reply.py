"""The client's usual reply path delivers what the general path delivers; all else falls back.

A real worker process answers on its real channel. After a first DONE of a kind (read
whole by the frame reader and kept as a template, ``edge_core.host.reply_kept``), a
later equal one but for its request id and event block, alone in its receive, is
delivered from the template without the frame reader. Everything else (a heartbeat, an
error event, another output shape, two frames in one receive, an event of another kind,
an id that names no call in flight or that the parser refuses) goes through the frame
reader and the general path. The frame reader is watched: each frame it reads is
recorded by op, so that which path read a reply is seen, not guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_contracts.binary_header import BINARY_MAGIC, event_block
from edge_contracts.buffers import BufferDescriptor
from edge_contracts.call_frames import encode_call_frame
from edge_contracts.dtypes import DType
from edge_contracts.errors import ContractError
from edge_contracts.frame_reader import FrameReader
from edge_contracts.headers import FrameHeader, Limits, TensorSpec
from edge_contracts.protocol import FEATURE_EVENT_FIELDS, KNOWN_FEATURES, OP_EVENT, OP_HEARTBEAT
from edge_contracts.requests import EventKind, Operation, StageEvent, StageRequest
from edge_contracts.tensors import dtype_of
from edge_contracts.wire import PREFIX, Frame, parse_header
from edge_core.host import WorkerClient
from edge_core.host.calls import Delivery
from edge_core.host.errors import ProtocolViolation, RemoteError
from edge_core.host.reply_kept import reply_key, reply_template

from .conftest import request

LIMITS = Limits(max_io_bytes=1 << 20, supported_features=KNOWN_FEATURES)
X = np.arange(6, dtype=np.float32).reshape(2, 3)
SAME = ("stage_id", "epoch", "generation", "seq", "kind", "terminal", "data", "error",
        "retained")


class WatchedReads:
    """The client's frame reader, recording the op of each frame it reads.

    Also what each receive of the client's own held (:meth:`received`): the usual path
    takes a reply only when it came alone in one.
    """

    def __init__(self, frames: FrameReader) -> None:
        self.frames = frames
        self.ops: list[str] = []
        self.receives: list[list[tuple[str, str] | None]] = []

    def read_into(self, frames: list[Frame]) -> None:
        self.frames.read_into(frames)
        self.ops.append(frames[-1].header.op)

    def has_buffered(self) -> bool:
        return self.frames.has_buffered()

    @property
    def buffered(self) -> bool:
        return self.frames.buffered

    def taken(self) -> list[str]:
        """The ops read since the last call."""
        ops, self.ops = self.ops, []
        return ops

    def received(self, data: bytes) -> None:
        """Record the frames of one receive: op and request id (None: cut off, or refused)."""
        frames: list[tuple[str, str] | None] = []
        at = 0
        while at < len(data):
            if at + PREFIX.size > len(data):
                frames.append(None)
                break
            magic, header_len, payload_len = PREFIX.unpack_from(data, at)
            end = at + PREFIX.size + header_len + payload_len
            if end > len(data):
                frames.append(None)
                break
            try:
                header = parse_header(data[at + PREFIX.size : end - payload_len], LIMITS,
                                      binary=magic == BINARY_MAGIC)
            except ContractError:  # the client's reader refuses it: not this record's part
                frames.append(None)
            else:
                frames.append((header.op, header.request_id))
            at = end
        self.receives.append(frames)

    def alone(self, request_id: str) -> bool:
        """Whether an event of ``request_id`` came alone in a receive of the client's own."""
        return [(OP_EVENT, request_id)] in self.receives


@pytest.fixture
def watched(start: Callable[..., WorkerClient]) -> tuple[WorkerClient, WatchedReads]:
    client = start("replies")
    reads = WatchedReads(client._frames)
    client._frames = reads  # type: ignore[assignment]
    receive = client._recv_into

    def recv_into(view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        count = receive(view, nbytes, flags)  # (MSG_DONTWAIT: the reader's read_now)
        reads.received(bytes(view[:count]))
        return count

    client._receive_with(recv_into)
    return client, reads


def run(client: WorkerClient, rid: str, x: Any = X, **params: object) -> list[Delivery]:
    """The deliveries of one request, to its terminal one."""
    call = client.submit(request(rid, **params), {"x": x})
    deliveries = []
    while not deliveries or not deliveries[-1].terminal:
        deliveries.append(call.next(timeout=10))
    return deliveries


def assert_alike(usual: Delivery, general: Delivery) -> None:
    """The two deliveries are equal but for their request id and created_ns."""
    for name in SAME:
        assert getattr(usual, name) == getattr(general, name), name
        assert type(getattr(usual, name)) is type(getattr(general, name)), name
    assert usual.data is general.data
    assert type(usual.request_id) is str and type(usual.created_ns) is int
    assert usual.created_ns > 0
    assert list(usual.arrays) == list(general.arrays)
    for name, array in usual.arrays.items():
        other = general.arrays[name]
        np.testing.assert_array_equal(array, other)
        assert (array.dtype, array.shape, array.strides) == (other.dtype, other.shape,
                                                             other.strides)
        assert array.flags == other.flags  # read-only views of a copy
        assert type(array.base) is type(other.base)
        assert not array.flags.writeable
    event, other_event = usual.event, general.event
    assert event.outputs == other_event.outputs
    assert (event.kind, event.seq, event.terminal) == (other_event.kind, other_event.seq,
                                                        other_event.terminal)
    assert event.request_id == usual.request_id


def test_a_usual_reply_is_delivered_as_the_general_path_delivers_it(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    client, reads = watched
    (first,) = run(client, "r01")
    assert reads.taken() == [OP_EVENT]  # read whole, kept
    usual = [run(client, f"r{index:02}")[0] for index in range(2, 12)]
    assert reads.taken() == []  # every one from the template (ids of one length)
    (longer,) = run(client, "r100")
    assert reads.taken() == [OP_EVENT]  # an id of another length: another header
    client._usual.clear()
    (general,) = run(client, "r12")
    assert reads.taken() == [OP_EVENT]
    assert_alike(longer, general)
    for delivery, rid in zip(usual, range(2, 12), strict=True):
        assert delivery.request_id == f"r{rid:02}"
        assert_alike(delivery, general)
        assert_alike(delivery, first)
        np.testing.assert_array_equal(delivery.arrays["x"], X)
    assert client.outstanding() == 0


def test_another_shape_an_error_and_a_heartbeat_go_the_general_way(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    client, reads = watched
    run(client, "a1")
    run(client, "a2")
    assert reads.taken() == [OP_EVENT]
    wide = np.arange(12, dtype=np.float32).reshape(3, 4)
    (other,) = run(client, "b1", wide)  # another shape: another header
    assert reads.taken() == [OP_EVENT]
    np.testing.assert_array_equal(other.arrays["x"], wide)
    (again,) = run(client, "b2", wide)
    assert reads.taken() == []  # kept too now
    np.testing.assert_array_equal(again.arrays["x"], wide)
    with pytest.raises(RemoteError, match="asked to fail"):
        client.submit(request("c1", **{"raise": "no"}), {"x": X}).result(timeout=10)
    assert reads.taken() == [OP_EVENT]  # an ERROR event: read whole
    (slow,) = run(client, "d1", sleep_s=0.5)  # heartbeats while the worker sleeps
    ops = reads.taken()
    assert OP_HEARTBEAT in ops and set(ops) <= {OP_HEARTBEAT, OP_EVENT}, ops
    # the DONE itself: usual when it came alone in its receive; where this side read late
    # and a heartbeat came in the same receive (the worker's sleep ran into another beat,
    # on a loaded machine) the frame reader reads both
    assert (OP_EVENT in ops) != reads.alone("d1"), (ops, reads.receives[-3:])
    np.testing.assert_array_equal(slow.arrays["x"], X)
    assert slow.kind is EventKind.DONE
    (last,) = run(client, "d2")
    ops = reads.taken()  # (a beat sent as d1 ended may come first, or with it)
    assert set(ops) <= {OP_HEARTBEAT, OP_EVENT}, ops
    assert (OP_EVENT in ops) != reads.alone("d2"), (ops, reads.receives[-3:])
    assert len(client._usual) == 2
    assert client.outstanding() == 0 and client.health().state == "ready"
    del last


def test_a_usual_reply_is_taken_as_its_event_and_arrays_without_a_delivery(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    client, reads = watched
    (first,) = run(client, "r1")
    call = client.submit(request("r2"), {"x": X})
    taken = call.take(timeout=10)
    assert reads.taken() == [OP_EVENT]  # the first DONE only: this one from the template
    assert isinstance(taken, tuple)
    event, arrays = taken
    assert event == StageEvent("r2", "s0", 0, 1, first.seq, EventKind.DONE, True, None,
                               first.event.outputs, {}, event.created_ns)
    assert list(arrays) == ["x"] and not arrays["x"].flags.writeable
    np.testing.assert_array_equal(arrays["x"], X)
    assert call.ended
    with pytest.raises(StopIteration):
        call.take(timeout=10)
    (general,) = run(client, "r3")  # taken by next: a Delivery made of the pair
    assert type(general) is Delivery and reads.taken() == []
    assert_alike(general, first)
    assert client.outstanding() == 0


def test_two_frames_in_one_receive_are_read_by_the_frame_reader(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    client, reads = watched
    (first,) = run(client, "r1")
    reads.taken()
    (both,) = run(client, "r2", script="done_and_heartbeat")
    ops = reads.taken()
    assert ops[:1] == [OP_EVENT]  # the DONE: read whole
    assert_alike(both, first)
    (after,) = run(client, "r3")  # the heartbeat left in the reader's buffer is read
    (last,) = run(client, "r4")  # first (by this or the background reader), then r3
    assert ops + reads.taken() == [OP_EVENT, OP_HEARTBEAT]  # r3 and r4: by the template
    assert_alike(after, first)
    assert_alike(last, first)
    assert client.outstanding() == 0


def test_a_reply_of_another_kind_or_for_no_call_in_flight_is_read_whole(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    client, reads = watched
    (first,) = run(client, "r1")
    reads.taken()
    output, done = run(client, "r2", script="output_first")  # same header but the kind
    assert output.kind is EventKind.OUTPUT and not output.terminal
    assert done.kind is EventKind.DONE
    ops = reads.taken()
    assert ops[0] == OP_EVENT and len(ops) <= 2, ops  # the OUTPUT read whole
    np.testing.assert_array_equal(output.arrays["x"], X)
    (own,) = run(client, "r3", script="stranger_first")  # "r~" names no call: dropped
    assert reads.taken()[:1] == [OP_EVENT]
    assert_alike(own, first)
    assert own.request_id == "r3"
    assert len(client._usual) == 1  # the same header: no other template
    (after,) = run(client, "r4")
    assert reads.taken() == []
    assert client.outstanding() == 0 and client.health().state == "ready"
    del after


class WatchedCalls(dict[str, Any]):
    """The client's calls in flight, recording which ids were taken out (popped)."""

    def __init__(self) -> None:
        super().__init__()
        self.popped: list[str] = []

    def pop(self, key: str, *default: Any) -> Any:
        found = super().pop(key, *default)
        if found is not None:
            self.popped.append(key)
        return found


def test_a_usual_reply_of_an_earlier_epoch_leaves_its_ids_call_in_place(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    # A DONE like the template (epoch 0) but for a call of epoch 1: the usual path
    # must not take the call out (taken out and put back, a call of its id registered
    # in between would have displaced it); the general path drops the stale reply and
    # the call gets its own DONE
    client, _ = watched
    run(client, "r1")  # the template: epoch 0
    calls = WatchedCalls()
    client._calls = calls  # type: ignore[assignment]
    call = client.submit(StageRequest("r2", "s0", 1, 1, Operation.RUN,
                                      params={"script": "earlier_epoch_first"}), {"x": X})
    (done,) = [call.next(timeout=10)]
    assert done.kind is EventKind.DONE and done.epoch == 1 and done.terminal
    np.testing.assert_array_equal(done.arrays["x"], X)
    assert calls.popped == ["r2"]  # once: by its own DONE, not by the stale one
    assert client.outstanding() == 0 and client.health().state == "ready"


def test_an_id_the_parser_refuses_fails_the_channel_as_the_general_path_does(
    watched: tuple[WorkerClient, WatchedReads],
) -> None:
    client, reads = watched
    run(client, "r1")
    reads.taken()
    call = client.submit(request("r2", script="bad_id"), {"x": X})
    with pytest.raises(ProtocolViolation, match="request_id"):
        call.next(timeout=10)
    assert reads.ops == []  # refused inside the reader, before a frame came out
    health = client.health()
    assert health.state == "lost", health
    assert client.outstanding() == 0


def _event(request_id: str, seq: int, kind: str = "done", *, generation: int = 1,
           dtype: Any = np.float32, error: bytes = b"") -> tuple[bytes, FrameHeader]:
    """An event frame's binary header as the serve loop encodes it, and its parse."""
    x = np.zeros((2, 3), dtype=dtype)
    spec = TensorSpec.inline("x", dtype_of(x), x.shape, x.nbytes)
    parts = encode_call_frame(
        OP_EVENT, request_id, "s0", 0, generation, (spec,), [memoryview(x).cast("B")],
        frozenset({FEATURE_EVENT_FIELDS}), event_meta=error,
        event_block=event_block(seq, kind, 7 + seq), keep=False)
    frame = b"".join(bytes(part) for part in parts)
    _, header_len, payload_len = PREFIX.unpack_from(frame)
    raw = frame[PREFIX.size : PREFIX.size + header_len]
    return raw, parse_header(raw, LIMITS, payload_len=payload_len, binary=True)


def test_a_template_is_kept_of_a_plain_done_only_and_keyed_without_id_and_stamp() -> None:
    raw, header = _event("r01", 0)
    found = reply_template(raw, header, 1)
    assert found is not None
    key, (payload_len, stage_id, epoch, generation, layout, outputs) = found
    assert (payload_len, stage_id, epoch, generation) == (24, "s0", 0, 1)
    assert [(name, count, offset, shape) for name, _, count, offset, shape in layout] == [
        ("x", 6, 0, (2, 3))]
    assert outputs == (BufferDescriptor("worker-g1", 1, DType.FLOAT32, (2, 3), 24),)
    other = _event("r99", 5)[0]  # another id of the same length, another seq and created_ns
    assert other != raw and reply_key(other) == key
    assert reply_key(_event("r100", 0)[0]) != key  # an id of another length
    assert reply_key(_event("r01", 0, "output")[0]) != key  # the kind: in the key
    assert reply_template(*_event("r01", 0, "output"), 1) is None
    assert reply_template(raw, header, 2) is None  # not the client's generation
    assert reply_template(*_event("r01", 0, dtype=np.bool_), 1) is None  # values checked
    error = b'{"error":{"type":"E","message":"m"}}'
    assert reply_template(*_event("r01", 0, "error", error=error), 1) is None
    assert reply_template(*_event("r01", 0, error=b'{"data":{"a":1}}'), 1) is None  # data
