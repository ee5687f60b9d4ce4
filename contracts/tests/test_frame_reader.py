"""The buffered frame reader: same frames and same refusals as read_frame, fewer reads."""

from __future__ import annotations

import dis
import gc
import socket
import sys
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_contracts import errors
from edge_contracts.conformance import load_fixtures
from edge_contracts.dtypes import DType
from edge_contracts.errors import FrameTruncated, PayloadTooLarge, StreamClosed, WireError
from edge_contracts.frame_reader import FrameReader, ReceivedFirst, ReceivedFirstKept
from edge_contracts.wire import (
    PREFIX_SIZE,
    Frame,
    FrameHeader,
    Limits,
    TensorSpec,
    decode_frame,
    encode_frame,
)

LIMITS = Limits(max_io_bytes=1 << 20)


def frame_bytes(request_id: str, payload: bytes, meta: dict[str, object] | None = None) -> bytes:
    spec = TensorSpec("x", DType.UINT8, (len(payload),), len(payload))
    header = FrameHeader("run", request_id, "s0", 0, 1, tensors=(spec,), meta=meta or {})
    return b"".join(bytes(part) for part in encode_frame(header, [payload]))


def same(a: Frame, b: Frame) -> bool:
    """Frames compare by identity; these compare by header and payload."""
    return a.header == b.header and a.payload == b.payload


class Chunked:
    """A recv_into over fixed bytes that hands out at most the given chunk sizes."""

    def __init__(self, data: bytes, chunks: list[int]) -> None:
        self.data = data
        self.position = 0
        self.chunks = chunks or [1 << 30]
        self.calls = 0

    def __call__(self, view: memoryview) -> int:
        size = self.chunks[self.calls % len(self.chunks)]
        self.calls += 1
        count = min(len(view), size, len(self.data) - self.position)
        view[:count] = self.data[self.position : self.position + count]
        self.position += count
        return count


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=6),
    chunks=st.lists(st.integers(min_value=1, max_value=5000), max_size=5),
    buffer_bytes=st.sampled_from([32, 100, 512, 16384]),
)
def test_any_chunking_yields_the_frames_written_then_a_clean_close(
    payloads: list[bytes], chunks: list[int], buffer_bytes: int
) -> None:
    stream = [frame_bytes(f"r{i}", p, {"i": i}) for i, p in enumerate(payloads)]
    reader = FrameReader(Chunked(b"".join(stream), chunks), LIMITS, buffer_bytes=buffer_bytes)
    for raw in stream:
        assert same(reader.read(), decode_frame(raw, LIMITS))
    assert not reader.buffered
    with pytest.raises(StreamClosed):
        reader.read()


def read_into(reader: FrameReader) -> Frame:
    """:meth:`FrameReader.read_into`'s frame, as ``read`` returns one."""
    frames: list[Frame] = []
    reader.read_into(frames)
    assert len(frames) == 1
    return frames[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=6),
    chunks=st.lists(st.integers(min_value=1, max_value=5000), max_size=5),
    buffer_bytes=st.sampled_from([32, 100, 512, 16384]),
)
def test_read_into_yields_what_read_yields_for_any_chunking(
    payloads: list[bytes], chunks: list[int], buffer_bytes: int
) -> None:
    # read_into: the same frames (those that do not fit the buffer read as read reads them)
    stream = [frame_bytes(f"r{i}", p, {"i": i}) for i, p in enumerate(payloads)]
    reader = FrameReader(Chunked(b"".join(stream), chunks), LIMITS, buffer_bytes=buffer_bytes)
    for raw in stream:
        assert same(read_into(reader), decode_frame(raw, LIMITS))
    assert not reader.buffered
    with pytest.raises(StreamClosed):
        read_into(reader)


def test_small_frames_take_one_read_and_wait_in_the_buffer() -> None:
    stream = frame_bytes("a", b"12345678") + frame_bytes("b", b"x")
    source = Chunked(stream, [])
    reader = FrameReader(source, LIMITS)
    assert reader.read().header.request_id == "a"
    assert source.calls == 1
    assert reader.buffered  # "b" arrived with "a": poll the socket only after it
    assert reader.read().header.request_id == "b"
    assert source.calls == 1 and not reader.buffered


def test_a_large_payload_is_read_into_its_own_buffer() -> None:
    payload = bytes(range(256)) * 1024
    source = Chunked(frame_bytes("big", payload), [])
    frame = FrameReader(source, LIMITS, buffer_bytes=4096).read()
    assert bytes(frame.payload) == payload
    assert source.calls == 2  # the buffered start, then the rest straight into the payload


def test_end_of_stream_inside_a_frame_is_a_truncation() -> None:
    whole = frame_bytes("a", b"abcdef")
    for cut in (1, PREFIX_SIZE, PREFIX_SIZE + 5, len(whole) - 1):
        reader = FrameReader(Chunked(whole[:cut], [3]), LIMITS, buffer_bytes=64)
        with pytest.raises(FrameTruncated) as caught:
            reader.read()
        assert type(caught.value) is FrameTruncated


def test_a_refused_prefix_reads_no_payload() -> None:
    big = frame_bytes("big", bytes(4096))
    source = Chunked(big, [PREFIX_SIZE])
    with pytest.raises(PayloadTooLarge):
        FrameReader(source, Limits(max_io_bytes=1024), buffer_bytes=64).read()
    assert source.calls == 1


def test_recv_into_returning_a_wrong_count_is_refused() -> None:
    with pytest.raises(WireError, match="recv_into must return"):
        FrameReader(lambda view: len(view) + 1, LIMITS).read()
    with pytest.raises(WireError, match=r"reader\.buffer_bytes"):
        FrameReader(lambda view: 0, LIMITS, buffer_bytes=8)


def _conformance_cases() -> list[tuple[str, dict[str, object]]]:
    frames = load_fixtures()["frames"]
    return [("valid", case) for case in frames["valid"]] + [
        ("invalid", case) for case in frames["invalid"]
    ]


@pytest.mark.parametrize(("kind", "case"), _conformance_cases(), ids=lambda value: str(value)[:40])
def test_conformance_frames_read_as_the_fixtures_say(kind: str, case: dict[str, object]) -> None:
    data = bytes.fromhex(str(case["hex"]))
    limits = Limits.from_dict(case["limits"]) if "limits" in case else LIMITS  # type: ignore[arg-type]
    for chunks in ([], [1], [7, 3]):
        for read in (FrameReader.read, read_into):
            source = Chunked(data, chunks)
            reader = FrameReader(source, limits, buffer_bytes=64)
            if kind == "valid":
                assert same(read(reader), decode_frame(data, limits))
                assert not reader.buffered
                continue
            if case["name"].endswith("trailing bytes"):  # a stream reader leaves them
                read(reader)
                assert reader.buffered or source.position < len(data)
                continue
            with pytest.raises(WireError) as caught:
                read(reader)
            assert type(caught.value) is getattr(errors, str(case["error"])), case["name"]


def test_over_a_socket_frames_written_back_to_back_are_all_read() -> None:
    left, right = socket.socketpair()
    try:
        stream = b"".join(frame_bytes(f"r{i}", bytes([i]) * i) for i in range(50))
        left.sendall(stream)
        left.close()
        reader = FrameReader(right.recv_into, LIMITS, buffer_bytes=256)
        assert [reader.read().header.request_id for _ in range(50)] == [
            f"r{i}" for i in range(50)
        ]
        with pytest.raises(StreamClosed):
            reader.read()
    finally:
        right.close()


def test_drained_says_whether_the_last_receive_took_everything_the_stream_held():
    left, right = socket.socketpair()
    try:
        reader = FrameReader(left.recv_into, LIMITS, buffer_bytes=4096)
        assert not reader.drained  # nothing received yet
        right.sendall(frame_bytes("a", b"12") + frame_bytes("b", b"34"))
        assert reader.read().header.request_id == "a"
        assert reader.drained and reader.buffered  # one receive took both frames
        assert reader.read().header.request_id == "b"
        assert reader.drained and not reader.buffered
        # A payload larger than the buffer is read straight into its own buffer, up to
        # the frame's end: the bytes behind it are still in the stream.
        right.sendall(frame_bytes("big", bytes(10_000)) + frame_bytes("c", b"5"))
        assert reader.read().header.request_id == "big"
        assert not reader.drained
        assert reader.read().header.request_id == "c"
        assert reader.drained
    finally:
        left.close()
        right.close()


def test_bytes_received_first_are_read_before_the_socket():
    """A receive's bytes handed back (``ReceivedFirst.left``) are the reader's first."""
    a, b = socket.socketpair()
    try:
        first, second = frame_bytes("r1", b"x" * 10), frame_bytes("r2", b"y" * 20)
        b.sendall(first + second)
        taken = bytearray(len(first) + 7)  # the first frame and the start of the second
        view = memoryview(taken)
        count = a.recv_into(view)
        assert count == len(taken)
        received = ReceivedFirst(a.recv_into)
        received.left = view[:count]
        reader = FrameReader(received, LIMITS)
        frames = [reader.read(), reader.read()]
        assert [f.header.request_id for f in frames] == ["r1", "r2"]
        assert bytes(frames[1].payload) == b"y" * 20
        assert received.left is None  # all handed out; the rest came from the socket
        small = bytearray(3)
        received.left = memoryview(b"abcdef")
        assert received(memoryview(small)) == 3 and bytes(small) == b"abc"
        assert received.left is not None and bytes(received.left) == b"def"
    finally:
        a.close()
        b.close()


_CHECKED_AFTER = frozenset(dis.opmap[name] for name in (
    "CALL", "CALL_FUNCTION_EX", "FORMAT_VALUE", "JUMP_BACKWARD", "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE") if name in dis.opmap)


class _Interrupt:
    """A tracer raising KeyboardInterrupt at its k-th point where CPython acts on a signal.

    A function's start and the first instruction after a call or a backward jump (as
    ``edge_core.testing.interrupts.Interrupter``, which this distribution cannot import);
    a frame's last instruction is forgotten as it returns (a later frame at the same
    address starts afresh), so every run of the same code counts the same points.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.points = 0
        self._last: dict[int, int] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> _Interrupt:
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            self._point()
        elif event == "opcode":
            before = self._last.get(id(frame))
            self._last[id(frame)] = frame.f_code.co_code[frame.f_lasti]
            if before in _CHECKED_AFTER:
                self._point()
        elif event == "return":
            self._last.pop(id(frame), None)
        return self

    def _point(self) -> None:
        self.points += 1
        if self.points == self.k:
            raise KeyboardInterrupt


def _interrupted_reads(tracer: _Interrupt) -> tuple[bool, list[Frame]]:
    """Three small frames, the first and the start of the second received before the
    reader is given them (as the worker client hands them over), the rest in the socket;
    the first ``read_into`` under ``tracer``, then reads until all came."""
    a, b = socket.socketpair()
    try:
        stream = [frame_bytes(f"r{i}", bytes([i]) * 40, {"i": i}) for i in range(3)]
        b.sendall(b"".join(stream))
        b.shutdown(socket.SHUT_WR)
        taken = bytearray(len(stream[0]) + 7)
        view = memoryview(taken)
        count = a.recv_into(view)
        received = ReceivedFirstKept(a.recv_into)
        received.left = view[:count]
        reader = FrameReader(received, LIMITS)
        frames: list[Frame] = []
        collecting = gc.isenabled()
        gc.disable()  # (the collector's finalizers of earlier garbage would be points too)
        sys.settrace(tracer)
        try:
            reader.read_into(frames)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
            if collecting:
                gc.enable()
        while True:
            try:
                reader.read_into(frames)
            except StreamClosed:
                return interrupted, frames
    finally:
        a.close()
        b.close()


def test_read_into_interrupted_anywhere_loses_and_repeats_no_frame() -> None:
    # A KeyboardInterrupt at any point of read_into (and of the ReceivedFirstKept it
    # receives with) leaves the reader where it was: the next reads give every frame
    # once, in order
    _interrupted_reads(_Interrupt(0))  # (warm: a first read fills the parsers' caches)
    counter = _Interrupt(0)
    assert _interrupted_reads(counter)[0] is False
    expected = [f"r{i}" for i in range(3)]
    assert counter.points > 20
    windows = []
    for k in range(1, counter.points + 1):
        interrupted, frames = _interrupted_reads(_Interrupt(k))
        ids = [frame.header.request_id for frame in frames]
        if ids != expected or any(bytes(f.payload) != bytes([i]) * 40
                                  for i, f in enumerate(frames)):
            windows.append((k, interrupted, ids))
        assert interrupted  # (each point is one of read_into's)
    assert windows == []
