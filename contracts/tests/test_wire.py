import json
import os
import select
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    FrameTruncated,
    HeaderMalformed,
    HeaderTooLarge,
    PayloadMismatch,
    PayloadTooLarge,
    StreamClosed,
    UnknownRequiredFeature,
    VersionMismatch,
)
from edge_contracts.wire import (
    PREFIX,
    PREFIX_SIZE,
    Frame,
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    decode_frame,
    decode_prefix,
    encode_frame,
    encode_header,
    parse_header,
    read_frame,
    write_frame,
)

LIMITS = Limits(max_io_bytes=64 * 1024 * 1024)
X = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


def call(*tensors: TensorSpec, **changes: object) -> FrameHeader:
    fields: dict[str, object] = {
        "op": "call",
        "request_id": "r1",
        "stage_id": "det",
        "epoch": 3,
        "generation": 1,
        "tensors": tensors,
    }
    fields.update(changes)
    return FrameHeader(**fields)  # type: ignore[arg-type]


def joined(parts: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(part) for part in parts)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    left.settimeout(10)
    right.settimeout(10)
    with left, right:
        yield left, right


def test_prefix_is_sixteen_bytes_with_magic_and_lengths() -> None:
    header = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16))
    first = bytes(encode_frame(header, [X])[0])
    magic, header_len, payload_len = PREFIX.unpack(first[:PREFIX_SIZE])
    assert (PREFIX_SIZE, magic, payload_len) == (16, b"EDGW", 16)
    assert first[PREFIX_SIZE:] == encode_header(header)
    assert header_len == len(encode_header(header))


def test_frame_round_trips_inline_and_shared_memory_tensors() -> None:
    header = call(
        TensorSpec("x", DType.FLOAT32, (2, 2), 16),
        TensorSpec("kv", DType.FLOAT16, (4,), 8, ShmRef("edge_seg", 0, 2)),
        TensorSpec("mask", DType.BOOL, (3,), 3),
        meta={"bucket": "b1"},
        required_features=frozenset({"shm-tensors"}),
    )
    frame = decode_frame(joined(encode_frame(header, [X, b"\x01\x00\x01"])), LIMITS)
    assert frame.header == header
    views = frame.tensor_views()
    assert list(views) == ["x", "mask"]
    assert bytes(views["x"]) == X
    assert bytes(views["mask"]) == b"\x01\x00\x01"


def test_encode_keeps_payloads_as_views_of_the_callers_buffers() -> None:
    payload = bytearray(X)
    parts = encode_frame(call(TensorSpec("x", DType.FLOAT32, (2, 2), 16)), [payload])
    payload[0] ^= 0xFF
    assert bytes(parts[1])[0] == payload[0]


def test_received_tensor_views_are_writable() -> None:
    header = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16))
    frame = decode_frame(joined(encode_frame(header, [X])), LIMITS)
    view = frame.tensor_views()["x"]
    view[0] = 0xAB
    assert frame.payload[0] == 0xAB


def test_read_frame_reads_consecutive_frames_then_reports_a_clean_close(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    first = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16))
    second = call(op="event", request_id="r2")
    write_frame(left.sendmsg, encode_frame(first, [X]))
    write_frame(left.sendmsg, encode_frame(second, []))
    left.shutdown(socket.SHUT_WR)
    assert read_frame(right.recv_into, LIMITS).header == first
    assert read_frame(right.recv_into, LIMITS).header == second
    with pytest.raises(StreamClosed):
        read_frame(right.recv_into, LIMITS)


def test_a_peer_closing_mid_frame_is_a_truncation(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    data = joined(encode_frame(call(TensorSpec("x", DType.FLOAT32, (2, 2), 16)), [X]))
    left.sendall(data[:-3])
    left.shutdown(socket.SHUT_WR)
    with pytest.raises(FrameTruncated) as info:
        read_frame(right.recv_into, LIMITS)
    assert not isinstance(info.value, StreamClosed)
    assert info.value.field == "payload"


def test_oversized_payload_is_refused_from_the_prefix_alone(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    left.sendall(PREFIX.pack(b"EDGW", 100, 2**40))  # nothing else is ever sent
    with pytest.raises(PayloadTooLarge) as info:
        read_frame(right.recv_into, Limits(max_io_bytes=1024))
    assert info.value.field == "prefix.payload_len"


def test_payload_mismatch_is_refused_before_reading_the_payload(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    raw = encode_header(call(TensorSpec("x", DType.FLOAT32, (2, 2), 16)))
    left.sendall(PREFIX.pack(b"EDGW", len(raw), 1_000_000) + raw)  # no payload follows
    with pytest.raises(PayloadMismatch) as info:
        read_frame(right.recv_into, LIMITS)
    assert info.value.value == 1_000_000


def test_write_frame_resumes_partial_writes_on_a_non_blocking_socket(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, right = pair
    left.setblocking(False)
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
    big = os.urandom(4 * 1024 * 1024)
    header = call(
        TensorSpec("big", DType.UINT8, (len(big),), len(big)),
        TensorSpec("x", DType.FLOAT32, (2, 2), 16),
    )
    parts = encode_frame(header, [big, X])
    calls: list[int] = []

    def sendmsg(views: list[memoryview]) -> int:
        select.select([], [left], [], 10)
        sent = left.sendmsg(views)
        calls.append(sent)
        return sent

    received: list[Frame] = []
    reader = threading.Thread(target=lambda: received.append(read_frame(right.recv_into, LIMITS)))
    reader.start()
    written = write_frame(sendmsg, parts)
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert written == sum(len(part) for part in parts)
    assert len(calls) > 1  # the kernel took the frame in pieces
    assert bytes(received[0].tensor_views()["big"]) == big
    assert bytes(received[0].tensor_views()["x"]) == X


def test_write_frame_works_with_writev_on_a_pipe() -> None:
    read_fd, write_fd = os.pipe()
    try:
        header = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16))
        write_frame(lambda views: os.writev(write_fd, views), encode_frame(header, [X]))
        os.close(write_fd)
        write_fd = -1
        with os.fdopen(read_fd, "rb", buffering=0) as stream:
            read_fd = -1
            frame = read_frame(stream.readinto, LIMITS)  # type: ignore[arg-type]
        assert bytes(frame.tensor_views()["x"]) == X
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)


def test_encode_refuses_wrong_payload_count_size_and_layout() -> None:
    header = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16))
    with pytest.raises(PayloadMismatch) as info:
        encode_frame(header, [])
    assert info.value.field == "payloads"
    with pytest.raises(PayloadMismatch) as info:
        encode_frame(header, [X[:15]])
    assert info.value.field == "payloads[0]"
    strided = memoryview(bytearray(32))[::2]
    with pytest.raises(PayloadMismatch):
        encode_frame(header, [strided])


def test_encode_with_limits_refuses_what_the_reader_would_refuse() -> None:
    header = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16), required_features=["cancel"])
    with pytest.raises(PayloadTooLarge):
        encode_frame(header, [X], limits=Limits(max_io_bytes=8))
    with pytest.raises(HeaderTooLarge):
        encode_frame(header, [X], limits=Limits(max_io_bytes=64, max_header_bytes=32))
    with pytest.raises(UnknownRequiredFeature):
        encode_frame(header, [X], limits=Limits(max_io_bytes=64, supported_features=frozenset()))


def test_decode_prefix_checks_every_field() -> None:
    limits = Limits(max_io_bytes=100, max_header_bytes=50)
    assert decode_prefix(PREFIX.pack(b"EDGW", 50, 100), limits) == (50, 100)
    with pytest.raises(FrameTruncated):
        decode_prefix(b"EDGW", limits)
    with pytest.raises(HeaderMalformed):
        decode_prefix(PREFIX.pack(b"EDGX", 10, 0), limits)
    with pytest.raises(HeaderMalformed):
        decode_prefix(PREFIX.pack(b"EDGW", 0, 0), limits)
    with pytest.raises(HeaderTooLarge):
        decode_prefix(PREFIX.pack(b"EDGW", 51, 0), limits)
    with pytest.raises(PayloadTooLarge):
        decode_prefix(PREFIX.pack(b"EDGW", 10, 101), limits)


def test_parse_header_checks_version_before_anything_else() -> None:
    data = call(TensorSpec("x", DType.FLOAT32, (2, 2), 15 + 1)).to_dict()
    data.update(version=2, required_features=["unknown-x"], op="BAD")
    with pytest.raises(VersionMismatch):
        parse_header(json.dumps(data).encode(), LIMITS)
    data["version"] = 1
    with pytest.raises(UnknownRequiredFeature) as info:
        parse_header(json.dumps(data).encode(), LIMITS)
    assert info.value.value == ["unknown-x"]


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe",
        b"{",
        b'{"version":1,"version":1}',
        b'{"version":1,"meta":{"x":NaN}}',
        b'{"version":1,"meta":{"x":1e999}}',
        b'{"version":1,"epoch":' + b"9" * 5000 + b"}",
        b"[" * 100000 + b"]" * 100000,
    ],
)
def test_malformed_json_is_a_malformed_header(raw: bytes) -> None:
    with pytest.raises(HeaderMalformed):
        parse_header(raw, Limits(max_io_bytes=0, max_header_bytes=1 << 20))


def test_trailing_bytes_after_a_frame_are_refused() -> None:
    data = joined(encode_frame(call(), []))
    with pytest.raises(PayloadMismatch) as info:
        decode_frame(data + b"\x00", LIMITS)
    assert info.value.field == "frame"


def test_frame_checks_its_payload_length() -> None:
    header = call(TensorSpec("x", DType.FLOAT32, (2, 2), 16))
    with pytest.raises(PayloadMismatch):
        Frame(header, bytearray(15))
