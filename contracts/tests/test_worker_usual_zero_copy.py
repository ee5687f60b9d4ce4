"""The serve loop's usual zero-copy path: the same requests and events as the general path.

A real serve loop runs on its own thread on one end of a real socketpair, with shared
memory on: this test is the controller on the other end, leasing its input segments from
a real :class:`SegmentProducer` (its own prefix), writing request frames that reference
them, reading the worker's frames raw, mapping the worker's output segments with a real
:class:`SegmentConsumer` and acknowledging them. After a first request of a kind (checked
whole by the frame reader), later ones equal but for their request id and their
references' generations are served from a kept template; their DONE, its output in the
handler's output buffer, is written from one, and the controller's acknowledgements are
applied from the receive (``edge_contracts.worker_kept``). Everything else (a stale
generation, another segment, an offset out of range, a fenced epoch, a cancel, the
handler's error, an output not in an output buffer, a segment name to announce) is
answered as the general path answers it, and what the general path refuses (a request id
the parser refuses, a payload longer than the kept one's, an acknowledgement with a
payload or a meta count one short) ends the channel as before; a DONE whose write fails
gives its output leases back, one whose header would be over the channel's limit is not
written; nothing is left in shared memory.
core/tests/host runs the same loop in worker processes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from edge_contracts.call_frames import encode_ack_frame
from edge_contracts.dtypes import DType
from edge_contracts.headers import FrameHeader, Limits, ShmRef, TensorSpec
from edge_contracts.protocol import (
    FEATURE_BINARY_HEADER,
    FEATURE_EVENT_FIELDS,
    FEATURE_SHM_TENSORS,
    KNOWN_FEATURES,
    OP_CANCEL,
    OP_EVENT,
    OP_PING,
    OP_REPLY,
    OP_RUN,
    OP_SHUTDOWN,
)
from edge_contracts.shm import SegmentConsumer, SegmentProducer, new_prefix, segment_names
from edge_contracts.wire import PREFIX, encode_frame, parse_header
from edge_contracts.worker import BaseHandler, Call
from edge_contracts.worker import _Server as ServeLoop
from edge_contracts.worker_protocol import BootConfig

FEATURES = (FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS, FEATURE_SHM_TENSORS)
LIMITS = Limits(max_io_bytes=1 << 20, supported_features=KNOWN_FEATURES)
SHAPE = (32, 64)  # float32: 8 KiB, over the threshold below
NBYTES = 32 * 64 * 4
THRESHOLD = 4096
DONE_FEATURES = frozenset({FEATURE_EVENT_FIELDS, FEATURE_SHM_TENSORS})


def _joined(parts: list[Any]) -> bytes:
    return b"".join(bytes(part) for part in parts)


class InPlace(BaseHandler):
    """Answers ``{"y": 2 * x}`` written into an output buffer (or what ``answer`` makes)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.cancelled: list[str] = []
        self.answer: Callable[[Call], Mapping[str, Any] | None] = self.in_place

    @staticmethod
    def in_place(call: Call) -> Mapping[str, Any]:
        x = call.inputs["x"]
        out = call.output_buffer(x.shape, x.dtype)
        out[...] = x * 2
        return {"y": out}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        self.calls.append(call)
        return self.answer(call)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


class Controller:
    """The controller's end: its input segments, its frames, the worker's frames raw."""

    def __init__(self, sock: socket.socket, producer: SegmentProducer,
                 consumer: SegmentConsumer) -> None:
        self.sock = sock
        self.producer = producer
        self.consumer = consumer

    def write(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read(self) -> tuple[bytes, FrameHeader]:
        """The next frame's bytes and its header (the worker's frames carry no payload)."""
        prefix = self._exactly(PREFIX.size)
        _, header_len, payload_len = PREFIX.unpack(prefix)
        raw = self._exactly(header_len)
        payload = self._exactly(payload_len)
        header = parse_header(raw, LIMITS, payload_len=payload_len,
                              binary=prefix[:4] == b"EDGB")
        return prefix + raw + payload, header

    def _exactly(self, count: int) -> bytes:
        got = b""
        while len(got) < count:
            more = self.sock.recv(count - len(got))
            assert more, f"the worker closed the channel after {len(got)} of {count} bytes"
            got += more
        return got

    def lease(self, value: float) -> tuple[str, int, int]:
        """An input segment holding ``value`` everywhere: (segment, offset, generation)."""
        lease = self.producer.lease(NBYTES)
        np.frombuffer(lease.view, np.float32)[...] = value
        return lease.segment, lease.offset, lease.generation

    def sync(self) -> None:
        """A ping answered: every frame written before it was read by the worker."""
        self.write(_joined(encode_frame(FrameHeader(OP_PING, "p", "s0", 0, 1), [])))
        _, header = self.read()
        assert header.op == OP_REPLY and header.meta["ok"], header.meta

    def ack(self, header: FrameHeader) -> None:
        """Acknowledge a DONE's outputs (and release the inputs it acknowledges)."""
        for segment, generation in header.meta.get("acks", ()):
            self.producer.release(segment, generation)
        refs = [[spec.ref.segment, spec.ref.generation] for spec in header.tensors if spec.ref]
        if refs:
            self.write(encode_ack_frame(1, refs))


def request(rid: str, ref: tuple[str, int, int], epoch: int = 0,
            bias: np.ndarray | None = None) -> bytes:
    """A ``run`` frame of stage ``s0`` whose input ``x`` lies in the segment ``ref`` names
    (and, with ``bias``, an inline input ``b`` before it)."""
    specs = [TensorSpec("x", DType.FLOAT32, SHAPE, NBYTES, ShmRef(*ref))]
    payloads = []
    if bias is not None:
        specs.insert(0, TensorSpec("b", DType.FLOAT32, bias.shape, bias.nbytes))
        payloads.append(memoryview(bias.tobytes()))
    header = FrameHeader(OP_RUN, rid, "s0", epoch, 1, tensors=tuple(specs),
                         required_features=frozenset({FEATURE_SHM_TENSORS}))
    return _joined(encode_frame(header, payloads, binary=True))


def expected_done(rid: str, header: FrameHeader, acks: list[list[Any]],
                  gone: list[str] | None = None) -> bytes:
    """What the general path's encoder writes for this DONE (its output entry as read)."""
    meta: dict[str, Any] = {"seq": 0, "kind": "done", "created_ns": header.meta["created_ns"]}
    if acks:
        meta["acks"] = acks
    if gone:
        meta["gone"] = gone
    done = FrameHeader(OP_EVENT, rid, "s0", header.epoch, 1, tensors=header.tensors,
                       meta=meta, required_features=DONE_FEATURES)
    return _joined(encode_frame(done, [], binary=True))


class Serving:
    """A serve loop on its own thread, the controller's end, the handler; what the loop's
    usual paths did, recorded before it was answered: the ids of the requests they ran,
    the frames they wrote, and whether each acknowledgement was applied usually (read it
    after a ping's answer: that follows the acknowledgement's application)."""

    def __init__(self, loop: ServeLoop, controller: Controller, handler: InPlace) -> None:
        self.loop = loop
        self.controller = controller
        self.handler = handler
        self.usual_runs: list[str] = []
        self.usual_writes: list[bytes] = []
        self.usual_acks: list[bool] = []
        self.thread: threading.Thread | None = None  # the loop's (set by the fixture)
        run_usual = loop._run_usual
        usual_write = loop._sendmsg
        ack_usually = loop._ack_usually

        def recorded_run(call: Call) -> None:
            self.usual_runs.append(call.request_id)
            run_usual(call)

        def recorded_write(parts: list[Any]) -> int:
            self.usual_writes.append(_joined(parts))
            return usual_write(parts)

        def recorded_ack(raw: bytes) -> bool:
            self.usual_acks.append(ack_usually(raw))
            return self.usual_acks[-1]

        loop._run_usual = recorded_run  # type: ignore[method-assign]
        loop._sendmsg = recorded_write  # type: ignore[assignment]
        loop._ack_usually = recorded_ack  # type: ignore[method-assign]

    def call(self, rid: str, value: float, epoch: int = 0) -> tuple[bytes, FrameHeader,
                                                                     tuple[str, int, int]]:
        """One request (its input leased now) and its answer: raw, header, the input."""
        ref = self.controller.lease(value)
        self.controller.write(request(rid, ref, epoch))
        raw, header = self.controller.read()
        return raw, header, ref

    def output(self, header: FrameHeader) -> np.ndarray:
        """A DONE's ``y``, read from the worker's segment at the generation it names."""
        (spec,) = header.tensors
        assert spec.ref is not None
        view = self.controller.consumer.view(spec.ref.segment, spec.ref.offset,
                                             spec.ref.generation, spec.nbytes)
        return np.frombuffer(view, np.float32).reshape(spec.shape).copy()

    def settled(self, retained: int = 0) -> None:
        """Wait (boundedly) until the worker holds ``retained`` output segments: the
        acknowledgements written were applied, with no other frame written after them
        (which the worker might read in the same receive)."""
        producer = self.loop._producer
        assert producer is not None
        deadline = time.monotonic() + 10
        while producer.retained_buffers != retained and time.monotonic() < deadline:
            time.sleep(0.001)
        assert producer.retained_buffers == retained
        self.controller.sync()  # (the acknowledgements' usual path returned)

    def warm(self, count: int = 2) -> None:
        """``count`` requests answered and acknowledged (templates made, then used)."""
        for index in range(count):
            _, header, _ = self.call(f"w{index}", float(index))
            assert header.meta["kind"] == "done", header.meta
            self.controller.ack(header)
            self.settled()


@contextlib.contextmanager
def serve_loop(max_header_bytes: int = 65536) -> Iterator[Serving]:
    """A serve loop with shared memory (its headers at most ``max_header_bytes``); shut
    down, its thread joined and every segment of either side gone at the end."""
    worker_prefix, controller_prefix = new_prefix(), new_prefix()
    boot = BootConfig(token="t", entry="m:f", generation=1, shm_prefix=worker_prefix,
                      peer_prefix=controller_prefix, shm_threshold=THRESHOLD,
                      shm_max_bytes=1 << 22, shm_max_buffers=16, max_io_bytes=1 << 20,
                      max_header_bytes=max_header_bytes, features=FEATURES)
    worker_end, controller_end = socket.socketpair()
    controller_end.settimeout(10)
    producer = SegmentProducer(controller_prefix)
    consumer = SegmentConsumer(worker_prefix)
    try:
        handler = InPlace()
        loop = ServeLoop(worker_end, boot, handler)
        assert loop.use_shm and not loop.sealed
        serving = Serving(loop, Controller(controller_end, producer, consumer), handler)
        status: list[int] = []
        thread = threading.Thread(target=lambda: status.append(loop.serve()), daemon=True)
        serving.thread = thread
        thread.start()
        yield serving
        handler.calls.clear()  # their inputs map the controller's segments: unmapped at close
        if thread.is_alive():  # (a frame refused ended the loop, and its end, already)
            controller_end.sendall(_joined(encode_frame(FrameHeader(OP_SHUTDOWN, "", "", 0,
                                                                    1), [])))
        thread.join(timeout=10)
        assert not thread.is_alive() and status == [0]
    finally:
        consumer.close()
        producer.close()
        controller_end.close()
        worker_end.close()
    assert segment_names(worker_prefix) == [] and segment_names(controller_prefix) == []


@pytest.fixture
def serving() -> Iterator[Serving]:
    """:func:`serve_loop` with the default header limit."""
    with serve_loop() as loop:
        yield loop


def test_zero_copy_requests_are_served_on_the_usual_path_as_the_general_path_serves_them(
    serving: Serving,
) -> None:
    loop, controller, handler = serving.loop, serving.controller, serving.handler
    segments = set()
    for index in range(8):
        rid = f"r{index}"
        raw, header, ref = serving.call(rid, float(index))
        segment, _, generation = ref
        assert header.request_id == rid and header.meta["kind"] == "done", header.meta
        assert [list(pair) for pair in header.meta["acks"]] == [[segment, generation]]
        assert raw == expected_done(rid, header, [[segment, generation]])
        assert serving.usual_writes[-1] == raw  # written by the usual DONE's path
        np.testing.assert_array_equal(serving.output(header), np.full(SHAPE, 2.0 * index))
        call = handler.calls[-1]
        assert (call.request_id, call.stage_id, call.epoch, call.generation,
                call.operation, call.params) == (rid, "s0", 0, 1, OP_RUN, {})
        x = call.inputs["x"]
        assert x.dtype == np.float32 and x.shape == SHAPE and not x.flags.writeable
        assert call.closed
        segments.add(header.tensors[0].ref.segment)  # type: ignore[union-attr]
        del x, call
        controller.ack(header)
        serving.settled()  # the acknowledgement read alone, before the next request
    # the first request read by the frame reader (its template kept), the rest usual;
    # every DONE written from a template; every acknowledgement but the first (kept) usual
    assert serving.usual_runs == [f"r{index}" for index in range(1, 8)]
    assert len(serving.usual_writes) == 8
    assert serving.usual_acks == [True] * 7
    assert len(segments) == 1  # acknowledged: the worker's output segment reused
    assert loop._producer is not None and loop._producer.retained_buffers == 0
    assert loop._calls == {}


def test_an_acknowledgement_and_a_request_in_one_receive_are_both_served_usually(
    serving: Serving,
) -> None:
    controller = serving.controller
    serving.warm()
    _, header, _ = serving.call("r1", 1.0)
    for index in range(2, 6):  # the previous DONE's acknowledgement written with the request
        for segment, generation in header.meta["acks"]:
            controller.producer.release(segment, generation)
        (spec,) = header.tensors
        ack = encode_ack_frame(1, [[spec.ref.segment, spec.ref.generation]])  # type: ignore[union-attr]
        ref = controller.lease(float(index))
        controller.write(ack + request(f"r{index}", ref))
        raw, header = controller.read()
        assert raw == expected_done(f"r{index}", header, [[ref[0], ref[2]]])
        assert serving.usual_writes[-1] == raw
        np.testing.assert_array_equal(serving.output(header), np.full(SHAPE, 2.0 * index))
    assert serving.usual_runs[-4:] == ["r2", "r3", "r4", "r5"]
    assert serving.usual_acks[-4:] == [True] * 4
    controller.ack(header)
    serving.settled()


def test_an_inline_input_beside_a_shared_memory_one_is_read_on_the_usual_path_too(
    serving: Serving,
) -> None:
    controller, handler = serving.controller, serving.handler

    def biased(call: Call) -> Mapping[str, Any]:
        x, b = call.inputs["x"], call.inputs["b"]
        out = call.output_buffer(x.shape, x.dtype)
        out[...] = x * 2 + b.sum()
        return {"y": out}

    handler.answer = biased
    for index in range(4):
        rid = f"r{index}"
        bias = np.arange(2 * index, 2 * index + 6, dtype=np.float32).reshape(2, 3)
        ref = controller.lease(float(index))
        controller.write(request(rid, ref, bias=bias))
        raw, header = controller.read()
        assert raw == expected_done(rid, header, [[ref[0], ref[2]]])
        np.testing.assert_array_equal(serving.output(header),
                                      np.full(SHAPE, 2.0 * index + bias.sum()))
        b = handler.calls[-1].inputs["b"]
        assert b.shape == (2, 3) and not b.flags.writeable
        np.testing.assert_array_equal(b, bias)
        del b
        controller.ack(header)
        serving.settled()
    assert serving.usual_runs == ["r1", "r2", "r3"]


def test_two_outputs_in_output_buffers_are_written_usually_as_the_general_path_writes_them(
    serving: Serving,
) -> None:
    controller, handler = serving.controller, serving.handler

    def two(call: Call) -> Mapping[str, Any]:
        x = call.inputs["x"]
        y = call.output_buffer(x.shape, x.dtype)
        z = call.output_buffer((x.size,), np.int32)
        y[...] = x * 2
        z[...] = 7
        return {"y": y, "z": z}

    handler.answer = two
    for index in range(3):
        rid = f"r{index}"
        raw, header, ref = serving.call(rid, float(index))
        assert [spec.name for spec in header.tensors] == ["y", "z"]
        assert raw == expected_done(rid, header, [[ref[0], ref[2]]])
        assert serving.usual_writes[-1] == raw
        controller.ack(header)
        serving.settled()


def _error(header: FrameHeader) -> tuple[str, str]:
    assert header.meta["kind"] == "error", header.meta
    error = header.meta["error"]
    return error["type"], error["message"]


def test_a_stale_generation_is_refused_as_before(serving: Serving) -> None:
    controller, handler = serving.controller, serving.handler
    serving.warm()
    old = controller.lease(1.0)  # an input segment read by r1, then released
    controller.write(request("r1", old))
    _, header = controller.read()
    controller.ack(header)
    serving.settled()
    fresh = controller.lease(2.0)  # the same segment again, at a new generation
    assert fresh[0] == old[0] and fresh[2] > old[2]
    controller.write(request("r2", old))  # r1's frame again: the generation is stale
    _, header = controller.read()
    kind, message = _error(header)
    assert kind == "ShmRefused" and "shm.generation" in message and "stale" in message
    assert [list(pair) for pair in header.meta["acks"]] == [[old[0], old[2]]]
    assert serving.usual_runs[-1] == "r1"  # tried, refused: the general path's answer
    assert [call.request_id for call in handler.calls][-1] == "r1"  # r2 never ran
    controller.write(request("r3", fresh))  # the fresh one: usual again
    _, header = controller.read()
    assert header.meta["kind"] == "done" and serving.usual_runs[-1] == "r3"
    np.testing.assert_array_equal(serving.output(header), np.full(SHAPE, 4.0))
    controller.ack(header)
    serving.settled()


@pytest.mark.parametrize("change", ["foreign-segment", "offset-out-of-range"])
def test_another_segment_or_an_offset_out_of_range_is_refused_as_before(
    serving: Serving, change: str,
) -> None:
    controller, handler = serving.controller, serving.handler
    serving.warm()
    other = SegmentProducer(new_prefix())  # another producer's segment, of a valid name
    try:
        segment, _, generation = controller.lease(1.0)
        if change == "foreign-segment":
            lease = other.lease(NBYTES)
            ref = (lease.segment, lease.offset, lease.generation)
            field, why = "shm.segment", "must belong to producer"
        else:
            ref = (segment, 0, generation)  # the segment's own header page
            field, why = "shm.offset", "must lie in"
        controller.write(request("r1", ref))
        _, header = controller.read()
        kind, message = _error(header)
        assert kind == "ShmRefused" and field in message and why in message, message
        assert [list(pair) for pair in header.meta["acks"]] == [[ref[0], ref[2]]]
        assert [call.request_id for call in handler.calls] == ["w0", "w1"]
        controller.producer.release(segment, generation)
        _, header, _ = serving.call("r2", 3.0)  # the worker serves on
        assert header.meta["kind"] == "done" and serving.usual_runs[-1] == "r2"
        assert "r1" not in serving.usual_runs
        controller.ack(header)
        serving.settled()
    finally:
        other.close()


def test_a_fenced_zero_copy_request_is_cancelled_with_its_acknowledgement(
    serving: Serving,
) -> None:
    controller, handler = serving.controller, serving.handler
    serving.warm()
    fence = FrameHeader(OP_CANCEL, "", "s0", 1, 1, meta={"fence_epoch": 1})
    controller.write(_joined(encode_frame(fence, [])))
    _, header, ref = serving.call("r1", 1.0)  # equal to the kept one: epoch 0, fenced
    assert (header.request_id, header.meta["kind"], header.tensors) == ("r1", "cancelled", ())
    assert [list(pair) for pair in header.meta["acks"]] == [[ref[0], ref[2]]]
    assert [call.request_id for call in handler.calls] == ["w0", "w1"]  # never ran
    controller.ack(header)
    _, header, _ = serving.call("r2", 2.0, epoch=1)  # the new epoch
    assert (header.epoch, header.meta["kind"]) == (1, "done")
    controller.ack(header)
    serving.settled()


def test_a_cancelled_zero_copy_request_ends_once_and_its_buffer_is_announced_gone(
    serving: Serving,
) -> None:
    controller, handler = serving.controller, serving.handler
    serving.warm()
    held: list[tuple[Call, Any]] = []

    def hand_on(call: Call) -> None:  # its output buffer made, then handed on
        held.append((call, call.output_buffer(SHAPE, np.float32)))

    handler.answer = hand_on
    ref = controller.lease(1.0)
    controller.write(request("r1", ref))
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:  # handed on (read alone: usual)
        time.sleep(0.001)
    controller.write(_joined(encode_frame(
        FrameHeader(OP_CANCEL, "", "s0", 0, 1, meta={"target": "r1"}), [])))
    _, header = controller.read()
    assert (header.request_id, header.meta["kind"]) == ("r1", "cancelled")
    assert [list(pair) for pair in header.meta["acks"]] == [[ref[0], ref[2]]]
    assert serving.usual_runs[-1] == "r1"
    deadline = time.monotonic() + 10
    while not handler.cancelled and time.monotonic() < deadline:  # told after CANCELLED
        time.sleep(0.001)
    assert handler.cancelled == ["r1"]
    call, buffer = held[0]
    buffer[...] = 5.0
    assert not call.done({"y": buffer})  # the handler's late end is dropped
    controller.ack(header)
    # its buffer was unlinked (a handler thread may still write it): the next DONE says so,
    # as the general path writes it
    handler.answer = InPlace.in_place
    raw, header, ref = serving.call("r2", 2.0)
    assert len(header.meta["gone"]) == 1
    assert raw == expected_done("r2", header, [[ref[0], ref[2]]], list(header.meta["gone"]))
    assert raw not in serving.usual_writes  # not the usual DONE: a name to announce
    controller.ack(header)
    serving.settled()


def test_the_handlers_error_ends_a_usual_zero_copy_request_and_takes_its_buffer_back(
    serving: Serving,
) -> None:
    controller, handler = serving.controller, serving.handler
    serving.warm()

    def fail(call: Call) -> None:
        call.output_buffer(SHAPE, np.float32)  # made, never sent
        raise RuntimeError("the model failed")

    handler.answer = fail
    _, header, ref = serving.call("r1", 1.0)
    assert _error(header) == ("RuntimeError", "the model failed")
    assert [list(pair) for pair in header.meta["acks"]] == [[ref[0], ref[2]]]
    assert serving.usual_runs[-1] == "r1"
    controller.ack(header)
    serving.settled()  # its buffer taken back
    handler.answer = InPlace.in_place
    raw, header, _ = serving.call("r2", 2.0)
    assert header.meta["kind"] == "done" and serving.usual_writes[-1] == raw
    controller.ack(header)
    serving.settled()


@pytest.mark.parametrize("answer", [
    lambda call: {"y": call.inputs["x"] * 2},  # a private array: the packer copies it
    lambda call: {"y": InPlace.in_place(call)["y"],  # another buffer made, not sent
                  "z": call.output_buffer(SHAPE, np.float32)[:1]},
    lambda call: (call.output_buffer(SHAPE, np.float32),  # another buffer, never sent
                  InPlace.in_place(call))[1],
], ids=["private-array", "buffer-and-a-view", "a-buffer-not-sent"])
def test_outputs_not_all_in_output_buffers_are_sent_as_the_general_path_sends_them(
    serving: Serving, answer: Callable[[Call], Mapping[str, Any]],
) -> None:
    controller, handler = serving.controller, serving.handler
    serving.warm()
    handler.answer = answer
    for rid in ("r1", "r2"):
        raw, header, ref = serving.call(rid, 3.0)
        assert header.meta["kind"] == "done" and raw not in serving.usual_writes
        meta = {"seq": 0, "kind": "done", "created_ns": header.meta["created_ns"],
                "acks": [[ref[0], ref[2]]]}
        done = FrameHeader(OP_EVENT, rid, "s0", 0, 1, tensors=header.tensors, meta=meta,
                           required_features=header.required_features)
        payloads = [raw[len(raw) - header.inline_nbytes:]] if header.inline_nbytes else []
        assert raw == _joined(encode_frame(done, payloads, binary=True))
        controller.ack(header)
        serving.settled()


def test_a_usual_acknowledgement_frees_what_the_general_path_frees(
    serving: Serving,
) -> None:
    loop, controller = serving.loop, serving.controller
    serving.warm()
    producer = loop._producer
    assert producer is not None
    _, header, _ = serving.call("r1", 1.0)
    for segment, generation in header.meta["acks"]:
        controller.producer.release(segment, generation)
    (spec,) = header.tensors
    assert spec.ref is not None and producer.retained_buffers == 1
    for stale in ([[spec.ref.segment, spec.ref.generation - 1]],  # a stale generation
                  [[spec.ref.segment + "0", spec.ref.generation]]):  # no such segment
        controller.write(encode_ack_frame(1, stale))
        controller.sync()
        assert serving.usual_acks[-1] is True and producer.retained_buffers == 1
    controller.write(encode_ack_frame(1, [[spec.ref.segment, spec.ref.generation]]))
    controller.sync()
    assert serving.usual_acks[-1] is True and producer.retained_buffers == 0


@pytest.mark.parametrize("warm", [0, 2], ids=["first-request", "usual-request"])
def test_one_output_buffer_under_two_names_is_sent_as_the_general_path_sends_it(
    serving: Serving, warm: int,
) -> None:
    """The same buffer as two outputs (and another made, not sent): a reference and a copy.

    Not the usual DONE (its outputs are not each their own buffer): the general path
    writes the first by reference and copies the second into another segment, and takes
    the unsent buffer back; the loop serves on (it raised as it wrote such a DONE from a
    template before).
    """
    controller, handler = serving.controller, serving.handler
    serving.warm(warm)

    def aliased(call: Call) -> Mapping[str, Any]:
        x = call.inputs["x"]
        out = call.output_buffer(x.shape, x.dtype)
        call.output_buffer(x.shape, x.dtype)  # made, never sent
        out[...] = 2 * x
        return {"y": out, "z": out}

    handler.answer = aliased
    raw, header, _ = serving.call("r1", 1.5)
    assert header.meta["kind"] == "done" and raw not in serving.usual_writes
    refs = [spec.ref for spec in header.tensors]
    assert [spec.name for spec in header.tensors] == ["y", "z"] and None not in refs
    assert len({(r.segment, r.offset) for r in refs if r is not None}) == 2
    for spec in header.tensors:
        assert spec.ref is not None
        view = controller.consumer.view(spec.ref.segment, spec.ref.offset,
                                        spec.ref.generation, spec.nbytes)
        np.testing.assert_array_equal(np.frombuffer(view, np.float32), np.full(NBYTES // 4, 3.0))
        del view
    controller.ack(header)
    serving.settled()  # both given back, the unsent buffer too
    handler.answer = InPlace.in_place
    _, header, _ = serving.call("r2", 2.0)  # the loop serves on
    assert header.meta["kind"] == "done"
    controller.ack(header)
    serving.settled()


def test_an_acknowledgement_with_ids_is_not_taken_as_the_usual_ones_form(
    serving: Serving,
) -> None:
    """The usual acknowledgement is learned from one of nothing but its fixed part and meta.

    An ack whose header also holds a request id (which the parser reads, and the general
    path applies) is not kept as the usual form: else a later one, its meta length
    covering the id's bytes, would be read as meta the parser refuses.
    """
    from edge_contracts.binary_header import encode_binary_header
    from edge_contracts.wire import BINARY_MAGIC

    loop, controller = serving.loop, serving.controller
    _, done, _ = serving.call("r0", 1.0)
    for segment, generation in done.meta["acks"]:
        controller.producer.release(segment, generation)
    assert loop._usual_ack is None  # none read yet
    (spec,) = done.tensors
    assert spec.ref is not None
    header = FrameHeader("ack", '{"s', "", 0, 1,
                         meta={"segments": [[spec.ref.segment, spec.ref.generation]]})
    raw = encode_binary_header(header)
    controller.write(PREFIX.pack(BINARY_MAGIC, len(raw), 0) + raw)
    serving.settled()  # applied (alone in its receive: nothing written after it meanwhile)
    assert loop._usual_ack is None  # read by the general path, not learned
    serving.warm(2)  # a plain one is learned then
    assert loop._usual_ack is not None


def _ended(serving: Serving) -> bool:
    """Whether the loop ended (a frame refused: the general path ends the channel)."""
    assert serving.thread is not None
    serving.thread.join(5)
    return not serving.thread.is_alive()


def test_a_usual_zero_copy_request_whose_id_the_parser_refuses_is_refused_as_before(
    serving: Serving,
) -> None:
    """A request equal to a kept one but for an id that is not printable: not run.

    The usual path checks the id as the parser does; the frame then goes to the reader,
    which refuses it, and the loop ends the channel, as for any refused frame.
    """
    serving.warm()
    ref = serving.controller.lease(1.0)
    frame = bytearray(request("r7", ref))
    at = PREFIX.size + 34  # the request id, after the prefix and the fixed part
    assert frame[at:at + 2] == b"r7"
    frame[at + 1] = 0x07
    serving.controller.write(bytes(frame))
    assert _ended(serving)
    assert "r\x07" not in serving.usual_runs
    assert all(call.request_id != "r\x07" for call in serving.handler.calls)
    serving.controller.producer.release(ref[0], ref[2])


def test_a_usual_zero_copy_request_with_a_payload_too_long_is_refused_as_before(
    serving: Serving,
) -> None:
    """A request equal to a kept one but for 8 bytes of payload more: not run, refused."""
    serving.warm()
    ref = serving.controller.lease(1.0)
    frame = bytearray(request("r8", ref))
    magic, header_len, payload_len = PREFIX.unpack_from(frame)
    PREFIX.pack_into(frame, 0, magic, header_len, payload_len + 8)
    serving.controller.write(bytes(frame) + bytes(8))
    assert _ended(serving)
    assert "r8" not in serving.usual_runs
    serving.controller.producer.release(ref[0], ref[2])


def test_a_usual_acknowledgement_with_a_payload_is_refused_as_before(serving: Serving) -> None:
    """An ack of the usual form but with 8 bytes of payload: not applied, refused."""
    loop, controller = serving.loop, serving.controller
    serving.warm()
    assert loop._usual_ack is not None
    _, header, _ = serving.call("r1", 1.0)
    for segment, generation in header.meta["acks"]:
        controller.producer.release(segment, generation)
    (spec,) = header.tensors
    assert spec.ref is not None
    ack = bytearray(encode_ack_frame(1, [[spec.ref.segment, spec.ref.generation]]))
    magic, header_len, _ = PREFIX.unpack_from(ack)
    PREFIX.pack_into(ack, 0, magic, header_len, 8)
    acks = len(serving.usual_acks)
    controller.write(bytes(ack) + bytes(8))
    assert _ended(serving)
    assert len(serving.usual_acks) == acks  # not taken for the usual form: refused


def test_a_usual_in_place_done_whose_write_fails_gives_its_buffers_back(
    serving: Serving,
) -> None:
    """The channel breaks as the usual DONE is written: its output leases are taken back."""
    loop, controller = serving.loop, serving.controller
    serving.warm()
    written = loop._sendmsg

    def broken(parts: list[Any]) -> int:
        raise BrokenPipeError("the channel broke")

    loop._sendmsg = broken  # type: ignore[assignment]
    ref = controller.lease(1.0)
    controller.write(request("r1", ref))
    producer = loop._producer
    assert producer is not None
    deadline = time.monotonic() + 5
    while "r1" not in serving.usual_runs and time.monotonic() < deadline:
        time.sleep(0.001)
    assert serving.usual_runs[-1] == "r1"
    while loop._calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert producer.retained_buffers == 0  # the DONE's output lease taken back
    loop._sendmsg = written  # type: ignore[assignment]
    controller.producer.release(ref[0], ref[2])


def inline_request(rid: str, value: float) -> bytes:
    """A ``run`` frame of stage ``s0`` whose input ``x`` is inline (no acknowledgement due)."""
    x = np.full(SHAPE, value, np.float32)
    header = FrameHeader(OP_RUN, rid, "s0", 0, 1,
                         tensors=(TensorSpec("x", DType.FLOAT32, SHAPE, NBYTES),))
    return _joined(encode_frame(header, [memoryview(x.tobytes())], binary=True))


def test_a_usual_in_place_done_over_the_header_limit_is_not_written_as_before() -> None:
    """A DONE whose acknowledgement would make its header too long is not written.

    With headers limited to 150 bytes here, a request (116) and its in-place DONE without
    acknowledgements (inline inputs: 133) fit, and such DONEs are written from a template;
    a DONE acknowledging a shared-memory input (180) does not: the usual path leaves it to
    the general one, which writes no frame the controller would refuse (here not even its
    ``EventTooLarge`` ERROR fits: the request gets no event, as before) and takes the
    output buffer back; the loop serves on.
    """
    with serve_loop(max_header_bytes=150) as serving:
        controller = serving.controller
        for index in range(3):  # templates made, then used
            controller.write(inline_request(f"i{index}", float(index)))
            raw, header = controller.read()
            assert header.meta["kind"] == "done" and PREFIX.unpack_from(raw)[1] <= 150
            controller.ack(header)
            serving.settled()
        assert raw in serving.usual_writes  # the usual DONE does run here
        written = len(serving.usual_writes)
        ref = controller.lease(1.0)
        ping = _joined(encode_frame(FrameHeader(OP_PING, "p", "s0", 0, 1), []))
        controller.write(request("r1", ref) + ping)  # the handler answers before the ping
        raw, header = controller.read()
        assert header.op == OP_REPLY and header.request_id == "p", (raw[:200], header)
        assert len(serving.usual_writes) == written  # nothing written from the template
        serving.handler.calls.clear()  # (r1's input maps the controller's segment)
        controller.producer.release(ref[0], ref[2])  # no event acknowledged it
        serving.settled()  # r1's output buffer was taken back
        controller.write(inline_request("i9", 9.0))  # serves on
        _, header = controller.read()
        assert header.meta["kind"] == "done"
        controller.ack(header)
        serving.settled()


def test_a_usual_acknowledgement_whose_meta_length_is_wrong_is_refused_as_before(
    serving: Serving,
) -> None:
    """An ack of the usual form but for its meta count one short: not applied, refused.

    Its header then holds a byte after the meta the count names, which the parser
    refuses (the loop ends the channel, as for any refused frame); the usual path, which
    reads the meta up to the header's end, must not take it for the usual form.
    """
    loop, controller = serving.loop, serving.controller
    serving.warm()
    assert loop._usual_ack is not None
    _, header, _ = serving.call("r1", 1.0)
    for segment, generation in header.meta["acks"]:
        controller.producer.release(segment, generation)
    (spec,) = header.tensors
    assert spec.ref is not None
    ack = bytearray(encode_ack_frame(1, [[spec.ref.segment, spec.ref.generation]]))
    at = PREFIX.size + 14  # the fixed part's meta byte count (u32)
    count = int.from_bytes(ack[at:at + 4], "little")
    ack[at:at + 4] = (count - 1).to_bytes(4, "little")
    acks = len(serving.usual_acks)
    controller.write(bytes(ack))
    assert _ended(serving)
    assert serving.usual_acks[acks:] == [False]  # looked at, not taken for the usual form
