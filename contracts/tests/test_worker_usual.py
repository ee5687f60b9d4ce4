"""The serve loop's usual path: the same requests and events as the general path, byte for byte.

A real serve loop runs on its own thread on one end of a real socketpair; this test is
the controller on the other end, writing request frames and reading the worker's frames
raw. After a first request of a kind (checked whole by the frame reader), later equal
ones but for their request id are served from a kept template, and their DONE events
are written from one (``edge_contracts.worker_kept``); everything else (another header,
an id the parser refuses, a fenced epoch, a payload of another length, two frames in
one receive) goes through the frame reader and the general path, with its refusals.
core/tests/host runs the same loop in worker processes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import pytest

from edge_contracts.binary_header import FIXED
from edge_contracts.dtypes import DType
from edge_contracts.headers import FrameHeader, Limits, TensorSpec
from edge_contracts.protocol import (
    FEATURE_BINARY_HEADER,
    FEATURE_EVENT_FIELDS,
    KNOWN_FEATURES,
    OP_CANCEL,
    OP_EVENT,
    OP_PING,
    OP_REPLY,
    OP_RUN,
    OP_SHUTDOWN,
)
from edge_contracts.tensors import dtype_of
from edge_contracts.wire import PREFIX, encode_frame, parse_header
from edge_contracts.worker import BaseHandler, Call
from edge_contracts.worker import _Server as ServeLoop
from edge_contracts.worker_protocol import BootConfig

FEATURES = (FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS)
LIMITS = Limits(max_io_bytes=1 << 20, supported_features=KNOWN_FEATURES)
X = np.arange(6, dtype=np.float32).reshape(2, 3)


class Doubling(BaseHandler):
    """Answers ``{"y": 2 * x}`` (or what ``answer`` makes of the call); records each call."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.answer: Callable[[Call], Mapping[str, Any] | None] = lambda call: {
            "y": call.inputs["x"] * 2}
        self.cancelled: list[str] = []

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        self.calls.append(call)
        return self.answer(call)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


class Channel:
    """The controller's end: writes frames, reads the worker's raw."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def write(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read(self) -> tuple[bytes, FrameHeader, bytes]:
        """The next frame's bytes, its header, and its payload."""
        prefix = self._exactly(PREFIX.size)
        _, header_len, payload_len = PREFIX.unpack(prefix)
        raw = self._exactly(header_len)
        payload = self._exactly(payload_len)
        header = parse_header(raw, LIMITS, payload_len=payload_len,
                              binary=prefix[:4] == b"EDGB")
        return prefix + raw + payload, header, payload

    def _exactly(self, count: int) -> bytes:
        got = b""
        while len(got) < count:
            more = self.sock.recv(count - len(got))
            assert more, f"the worker closed the channel after {len(got)} of {count} bytes"
            got += more
        return got


def request(rid: str, x: np.ndarray = X, epoch: int = 0, payload: bytes | None = None,
            ) -> bytes:
    spec = TensorSpec("x", DType.FLOAT32, x.shape, x.nbytes)
    header = FrameHeader(OP_RUN, rid, "s0", epoch, 1, tensors=(spec,))
    parts = encode_frame(header, [memoryview(x).cast("B")], binary=True)
    frame = b"".join(bytes(part) for part in parts)
    if payload is not None:  # the same header, another payload (its length in the prefix)
        magic, header_len, _ = PREFIX.unpack(frame[: PREFIX.size])
        frame = (PREFIX.pack(magic, header_len, len(payload))
                 + frame[PREFIX.size : PREFIX.size + header_len] + payload)
    return frame


def control(op: str, rid: str = "", meta: dict[str, Any] | None = None) -> bytes:
    """A control frame (``ping``, ``cancel``) of stage ``s0``."""
    header = FrameHeader(op, rid, "s0", 0, 1, meta=meta or {})
    return b"".join(bytes(part) for part in encode_frame(header, []))


def with_id_bytes(frame: bytes, rid: bytes) -> bytes:
    """``frame`` with its request id's bytes replaced by ``rid`` of the same length."""
    at = PREFIX.size + FIXED.size
    assert len(frame[at : at + len(rid)].decode()) > 0
    return frame[:at] + rid + frame[at + len(rid):]


def expected_done(rid: str, seq: int, created_ns: int, outputs: dict[str, np.ndarray],
                  epoch: int = 0) -> bytes:
    """What the general path writes for this DONE (encode_frame of its FrameHeader)."""
    arrays = {}
    for name, value in outputs.items():  # the bytes the wire carries
        array = np.asarray(value)
        arrays[name] = array.astype(array.dtype.newbyteorder("<"), order="C")
    specs = tuple(TensorSpec(name, dtype_of(array), array.shape, array.nbytes)
                  for name, array in arrays.items())
    header = FrameHeader(OP_EVENT, rid, "s0", epoch, 1, tensors=specs,
                         meta={"seq": seq, "kind": "done", "created_ns": created_ns},
                         required_features=frozenset({FEATURE_EVENT_FIELDS}))
    parts = encode_frame(header, [array.tobytes() for array in arrays.values()], binary=True)
    return b"".join(bytes(part) for part in parts)


class Serving(NamedTuple):
    """A serve loop on its own thread, the controller's end, the handler, the exit status."""

    loop: ServeLoop
    channel: Channel
    handler: Doubling
    thread: threading.Thread
    status: list[int]

    def ended(self) -> bool:
        """True when the loop ended by itself, with status 0 (the channel ended)."""
        self.thread.join(timeout=10)
        return not self.thread.is_alive() and self.status == [0]


@pytest.fixture
def serving() -> Iterator[Serving]:
    """A serve loop on its own thread; shut down (and its thread joined) at teardown."""
    boot = BootConfig(token="t", entry="m:f", generation=1, shm_prefix="edge-w",
                      peer_prefix="edge-c", shm_threshold=1 << 20, shm_max_bytes=1 << 20,
                      shm_max_buffers=4, max_io_bytes=1 << 20, features=FEATURES)
    worker_end, controller_end = socket.socketpair()
    handler = Doubling()
    loop = ServeLoop(worker_end, boot, handler)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(loop.serve()), daemon=True)
    thread.start()
    try:
        yield Serving(loop, Channel(controller_end), handler, thread, status)
        if thread.is_alive():
            controller_end.sendall(b"".join(bytes(part) for part in encode_frame(
                FrameHeader(OP_SHUTDOWN, "", "", 0, 1), [])))
        thread.join(timeout=10)
        assert not thread.is_alive() and status == [0]
        assert worker_end.fileno() == -1  # closed by the loop
    finally:
        controller_end.close()
        worker_end.close()


def test_usual_requests_are_read_and_answered_as_the_general_path_does(
    serving: Serving,
) -> None:
    loop, channel, handler, _, _ = serving
    # r9 -> r10: another id length (another event template); r11 on: usual again
    rids = ["r7", "r8", "r9", "r10", "r11", "r12", "ä1"]
    for index, rid in enumerate(rids):
        x = X + index
        channel.write(request(rid, x))
        raw, header, _ = channel.read()
        assert header.request_id == rid and header.meta["kind"] == "done"
        assert raw == expected_done(rid, 0, header.meta["created_ns"], {"y": x * 2})
        call = handler.calls[-1]
        assert (call.request_id, call.stage_id, call.epoch, call.generation,
                call.operation, call.params) == (rid, "s0", 0, 1, OP_RUN, {})
        got = call.inputs["x"]
        assert got.dtype == np.float32 and got.shape == (2, 3) and not got.flags.writeable
        np.testing.assert_array_equal(got, x)
        assert call.closed
    # a template per request id length (2 and 3 bytes), of each kind
    assert len(loop._usual) == 2
    assert len([kept for kept in loop._done_frames.values() if kept is not None]) == 2
    # the loop drops a call once its DONE is sent, so the reply can be read first (seen
    # under load): wait, boundedly, for the last call to be dropped
    deadline = time.monotonic() + 10
    while loop._calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert loop._calls == {}


@pytest.mark.parametrize("rid", [
    "é" * 70,  # 140 bytes: 70 characters, accepted
], ids=["two-byte-characters"])
@pytest.mark.parametrize("bad", [
    b"\xff" * 140,  # not UTF-8
    b"a" * 139 + b"\x07",  # not printable
    b"a" * 140,  # 140 characters: over 128
], ids=["not-utf8", "not-printable", "too-long"])
def test_a_kept_request_but_for_an_id_the_parser_refuses_is_refused_as_before(
    serving: Serving, rid: str, bad: bytes,
    capsys: pytest.CaptureFixture[str],
) -> None:
    loop, channel, handler, _, _ = serving
    for _ in range(2):  # the second on the usual path
        channel.write(request(rid))
        assert channel.read()[1].request_id == rid
    assert len(loop._usual) == 1
    channel.write(with_id_bytes(request(rid), bad))
    assert channel.sock.recv(1) == b""  # the reader refused the frame: the channel ends
    assert len(handler.calls) == 2
    assert serving.ended() and loop._orphaned
    assert "edge worker: channel: refused frame: header.request_id" in capsys.readouterr().err


def test_a_kept_header_with_a_payload_of_another_length_is_refused_as_before(
    serving: Serving,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, channel, handler, _, _ = serving
    for rid in ("r1", "r2"):
        channel.write(request(rid))
        channel.read()
    channel.write(request("r3", payload=bytes(X.nbytes + 4)))
    assert channel.sock.recv(1) == b""
    assert len(handler.calls) == 2 and serving.ended()
    assert "refused frame" in capsys.readouterr().err


def test_a_fenced_epoch_is_cancelled_on_the_usual_path_too(
    serving: Serving,
) -> None:
    _, channel, handler, _, _ = serving
    for rid in ("r1", "r2"):
        channel.write(request(rid))
        assert channel.read()[1].meta["kind"] == "done"
    fence = FrameHeader(OP_CANCEL, "", "s0", 1, 1, meta={"fence_epoch": 1})
    channel.write(b"".join(bytes(part) for part in encode_frame(fence, [])))
    channel.write(request("r3"))  # equal to the kept one: epoch 0, fenced
    _, header, payload = channel.read()
    assert (header.request_id, header.meta["kind"], payload) == ("r3", "cancelled", b"")
    assert [call.request_id for call in handler.calls] == ["r1", "r2"]  # never ran
    for rid in ("r4", "r5"):  # the new epoch: its own template
        channel.write(request(rid, epoch=1))
        _, header, _ = channel.read()
        assert (header.request_id, header.epoch, header.meta["kind"]) == (rid, 1, "done")


def test_a_cancel_read_with_its_request_is_applied_before_it_runs(
    serving: Serving,
) -> None:
    _, channel, handler, _, _ = serving
    for rid in ("r1", "r2"):
        channel.write(request(rid))
        channel.read()
    cancel = FrameHeader(OP_CANCEL, "", "s0", 0, 1, meta={"target": "r3"})
    # one write: the worker's receive takes both frames, so no usual path for r3
    channel.write(request("r3"), b"".join(bytes(part) for part in encode_frame(cancel, [])),
                  request("r4"))
    answers = [channel.read()[1] for _ in range(2)]
    assert [(h.request_id, h.meta["kind"]) for h in answers] == [
        ("r3", "cancelled"), ("r4", "done")]
    assert [call.request_id for call in handler.calls] == ["r1", "r2", "r4"]


@pytest.mark.parametrize("outputs", [
    lambda x: {"y": (x * 2).T},  # not C-contiguous: copied by the packer
    lambda x: {"y": x * 2, "z": np.float32(3) * np.ones((), np.float32)},  # no dimensions
    lambda x: {"y": x[:0]},  # no bytes
    lambda x: {"y": [1.0, 2.0]},  # not an array
    lambda x: {"y": (x * 2).astype(">f4")},  # not in wire byte order
], ids=["transposed", "0-d", "empty", "list", "big-endian"])
def test_outputs_off_the_kept_template_are_sent_as_the_general_path_sends_them(
    serving: Serving,
    outputs: Callable[[np.ndarray], dict[str, Any]],
) -> None:
    _, channel, handler, _, _ = serving
    for rid in ("r1", "r2"):  # a DONE template made for {"y": (2, 3) float32}
        channel.write(request(rid))
        channel.read()
    handler.answer = lambda call: outputs(call.inputs["x"])
    for rid in ("r3", "r4"):
        channel.write(request(rid))
        raw, header, _ = channel.read()
        assert raw == expected_done(rid, 0, header.meta["created_ns"], outputs(X))


def test_outputs_over_max_io_bytes_end_the_request_with_an_error_after_a_kept_one(
    serving: Serving,
) -> None:
    _, channel, handler, _, _ = serving
    for rid in ("r1", "r2"):
        channel.write(request(rid))
        channel.read()
    handler.answer = lambda call: {"y": call.inputs["x"], "big": np.zeros(1 << 18, np.float32)}
    channel.write(request("r3"))
    _, header, payload = channel.read()
    assert header.meta["kind"] == "error" and payload == b""
    error = header.meta["error"]
    assert error["type"] == "EventTooLarge"
    assert "over the channel's max_io_bytes" in error["message"]
    handler.answer = lambda call: {"y": call.inputs["x"] * 2}
    channel.write(request("r4"))
    assert channel.read()[1].meta["kind"] == "done"


def in_flight(channel: Channel) -> int:
    """The loop's requests in flight, as its answer to a ``ping`` says."""
    channel.write(control(OP_PING, "p"))
    _, header, _ = channel.read()
    assert header.op == OP_REPLY and header.meta["ok"], header.meta
    return int(header.meta["result"]["in_flight"])


def test_a_usual_request_its_handler_hands_on_is_in_flight_until_cancelled(
    serving: Serving,
) -> None:
    loop, channel, handler, _, _ = serving
    channel.sock.settimeout(10)  # a cancel that finds no call is never answered
    channel.write(request("r1"))  # the general path; its template kept
    channel.read()
    held: list[Call] = []
    handler.answer = lambda call: held.append(call)  # handed on: submit returns None
    channel.write(request("r2"))  # alone and equal but for its id: the usual path
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        time.sleep(0.001)
    assert [call.request_id for call in held] == ["r2"]
    assert in_flight(channel) == 1
    channel.write(control(OP_CANCEL, meta={"target": "r2"}))
    _, header, payload = channel.read()
    assert (header.request_id, header.meta["kind"], payload) == ("r2", "cancelled", b"")
    assert in_flight(channel) == 0 and loop._calls == {}  # read after the cancel's end
    assert handler.cancelled == ["r2"] and held[0].closed
    assert not held[0].done({"y": X})  # its handler's late end is dropped


def test_a_usual_request_answered_before_its_handler_returns_is_not_kept_in_flight(
    serving: Serving,
) -> None:
    loop, channel, handler, _, _ = serving
    channel.write(request("r1"))
    channel.read()

    def answer_then_return_none(call: Call) -> None:
        call.done({"y": call.inputs["x"] * 2})  # as a handler's own thread may, at once

    handler.answer = answer_then_return_none
    channel.write(request("r2"))
    raw, header, _ = channel.read()
    assert raw == expected_done("r2", 0, header.meta["created_ns"], {"y": X * 2})
    assert in_flight(channel) == 0 and loop._calls == {}


def test_a_handed_on_usual_call_ended_while_its_loop_enters_it_is_not_kept_in_flight(
    serving: Serving,
) -> None:
    """The handler's thread ends the call (its DONE written, the drop finding nothing)
    before the loop enters it, and the loop enters it before that end returns: the loop
    sees the call ended and drops it (else it stayed in flight for good: busy, pinged as
    one in flight, beyond any cancel). The interleaving is forced by holding each side."""
    loop, channel, handler, _, _ = serving
    channel.sock.settimeout(10)
    channel.write(request("r1"))  # the general path; its template kept
    channel.read()
    usual = loop.send_usual
    written = threading.Event()

    def held_send_usual(call: Call, seq: int, outputs: Mapping[str, Any]) -> bool | None:
        sent = usual(call, seq, outputs)  # the DONE written, the call dropped (not in yet)
        written.set()
        deadline = time.monotonic() + 10
        while loop._executing and time.monotonic() < deadline:  # the loop enters it now
            time.sleep(0.001)
        return sent

    loop.send_usual = held_send_usual  # type: ignore[method-assign]

    def hand_on(call: Call) -> None:
        threading.Thread(target=call.done, args=({"y": call.inputs["x"] * 2},)).start()
        assert written.wait(10)  # returns (and the loop enters the call) once it is written

    handler.answer = hand_on
    channel.write(request("r2"))
    raw, header, _ = channel.read()
    assert raw == expected_done("r2", 0, header.meta["created_ns"], {"y": X * 2})
    deadline = time.monotonic() + 10
    while loop._executing and time.monotonic() < deadline:
        time.sleep(0.001)
    assert in_flight(channel) == 0 and loop._calls == {}
