"""The client's usual request path writes what the general path writes; all else falls back.

A real worker process answers on its real channel. After a first request of a kind
(packed and encoded by the general path and kept as a template,
``edge_core.host.request_kept``), a later one equal but for its request id and input
bytes is written from the template. Everything else (params, another shape or dtype, an
id of another length, another epoch, an array that is not C-contiguous or has no
dimension, input buffers alive on the channel, segment names to announce, a spin frame
to send first) goes the general way. The socket is watched: the bytes of each write are
recorded, so that what was sent is compared, not guessed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_contracts.headers import FrameHeader, Limits, prechecked_header, tensor_totals
from edge_contracts.jsonvalues import EMPTY_OBJECT
from edge_contracts.protocol import KNOWN_FEATURES, OP_ACK, OP_SPIN
from edge_contracts.requests import Operation, StageRequest
from edge_contracts.wire import BINARY_MAGIC, PREFIX, encode_frame, parse_header
from edge_contracts.worker_protocol import spin_meta
from edge_contracts.worker_transport import TensorPacker
from edge_core.host import WorkerClient
from edge_core.host.request_kept import request_template

X = np.arange(6, dtype=np.float32).reshape(2, 3)
LIMITS = Limits(max_io_bytes=1 << 20, supported_features=KNOWN_FEATURES)


class WatchedSocket:
    """The client's socket, recording the bytes of each ``sendmsg`` (all else passes)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writes: list[bytes] = []
        self.cut: int | None = None  # write only this many bytes of the next sendmsg

    def sendmsg(self, parts: list[Any]) -> int:
        data = b"".join(bytes(memoryview(part).cast("B")) for part in parts)
        if self.cut is not None:  # a real partial write: the first bytes only
            data, self.cut = data[: self.cut], None
        written = self.sock.sendmsg([data])
        self.writes.append(data[:written])
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)

    def taken(self) -> list[bytes]:
        """The writes since the last call."""
        writes, self.writes = self.writes, []
        return writes


@pytest.fixture
def watched(start: Callable[..., WorkerClient]) -> tuple[WorkerClient, WatchedSocket]:
    client = start("echo", shm_threshold=4096, shm_max_buffers=1, spin_us=0)  # no spin frames
    sock = WatchedSocket(client._sock)
    client._sock = sock  # type: ignore[assignment]
    return client, sock


def general_frame(client: WorkerClient, request: StageRequest, inputs: dict[str, Any],
                  ) -> bytes:
    """The bytes the general path writes for ``request`` (encode_frame, nothing kept)."""
    packed = TensorPacker(None, 1 << 30).pack(inputs)
    inline, total = tensor_totals(packed.specs, packed.features)
    header = prechecked_header(request.operation.value, request.request_id, request.stage_id,
                               request.epoch, client.generation, packed.specs,
                               request.params, packed.features, inline, total)  # type: ignore[arg-type]
    parts = encode_frame(header, packed.payloads, binary=True)
    return b"".join(bytes(part) for part in parts)


def run(client: WorkerClient, rid: str, x: Any = X, *, epoch: int = 0,
        **params: object) -> dict[str, Any]:
    """Send one request of stage ``s0``; its echoed outputs."""
    request = StageRequest(rid, "s0", epoch, 1, Operation.RUN, params=params)
    return dict(client.submit(request, {"x": x}).result(timeout=10))


def test_a_usual_request_is_written_as_the_general_path_writes_it(
    watched: tuple[WorkerClient, WatchedSocket],
) -> None:
    client, sock = watched
    np.testing.assert_array_equal(run(client, "r01")["x"], X)
    (first,) = sock.taken()
    # kept from the general path's frame, under the key the client builds inline
    assert list(client._kept_requests) == [(3, "x", X.dtype, X.shape, Operation.RUN, "s0", 0)]
    for index in range(2, 12):
        rid = f"r{index:02}"
        x = X + index
        np.testing.assert_array_equal(run(client, rid, x)["x"], x)
        (written,) = sock.taken()
        assert written == general_frame(client, StageRequest(rid, "s0", 0, 1, Operation.RUN),
                                        {"x": x})
        assert len(written) == len(first)
    assert len(client._kept_requests) == 1
    np.testing.assert_array_equal(run(client, "r100")["x"], X)  # another id length
    wide = np.arange(12, dtype=np.int64).reshape(3, 4)
    np.testing.assert_array_equal(run(client, "r13", wide)["x"], wide)  # another entry
    np.testing.assert_array_equal(run(client, "r14", X, epoch=3)["x"], X)  # another epoch
    assert list(client._kept_requests) == [
        (3, "x", X.dtype, X.shape, Operation.RUN, "s0", 0),
        (4, "x", X.dtype, X.shape, Operation.RUN, "s0", 0),
        (3, "x", wide.dtype, wide.shape, Operation.RUN, "s0", 0),
        (3, "x", X.dtype, X.shape, Operation.RUN, "s0", 3),
    ]
    for key, kept in client._kept_requests.items():
        assert_kept_for_key(client, key, kept)
    for rid, x, epoch in (("r101", X, 0), ("r15", wide, 0), ("r16", X, 3)):
        np.testing.assert_array_equal(run(client, rid, x, epoch=epoch)["x"], x)
    sock.taken()
    assert len(client._kept_requests) == 4
    assert client.outstanding() == 0


def assert_kept_for_key(client: WorkerClient, key: tuple[object, ...],
                        kept: tuple[bytes, bytes, int]) -> None:
    """The template kept under ``key`` is the general frame of any request with that key.

    ``key`` is read as ``(id length, name, dtype, shape, operation, stage id, epoch)``
    (``edge_core.host.request_kept``); a request is made of those fields with ids of that
    length and two arrays of that dtype and shape: if the client's key left out or changed
    what a frame depends on, the template would not be that frame.
    """
    id_length, name, dtype, shape, operation, stage_id, epoch = key
    assert isinstance(id_length, int) and isinstance(name, str)
    assert isinstance(operation, Operation) and isinstance(stage_id, str)
    assert isinstance(epoch, int)
    before, after, total = kept
    for rid, fill in (("q" * id_length, 0), ("z" * id_length, 3)):
        x = np.full(shape, fill, dtype=dtype)  # type: ignore[call-overload]
        request = StageRequest(rid, stage_id, epoch, 1, operation)
        assert before + rid.encode() + after + x.tobytes() == general_frame(
            client, request, {name: x})
        assert total == len(before) + id_length + len(after) + x.nbytes


def test_requests_that_are_not_usual_go_the_general_way(
    watched: tuple[WorkerClient, WatchedSocket],
) -> None:
    client, sock = watched
    run(client, "r1")
    sock.taken()
    scaled = run(client, "r2", scale=2.0)  # params: never kept
    np.testing.assert_array_equal(scaled["x"], X * 2)
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(run(client, "r3", strided)["x"], strided)
    scalar = np.array(5, dtype=np.float32)  # no dimension: never kept
    np.testing.assert_array_equal(run(client, "r4", scalar)["x"], scalar)
    np.testing.assert_array_equal(run(client, "r5", scalar)["x"], scalar)
    sent = [("r2", X, {"scale": 2.0}), ("r3", strided, {}), ("r4", scalar, {}),
            ("r5", scalar, {})]
    for written, (rid, x, params) in zip(sock.taken(), sent, strict=True):
        request = StageRequest(rid, "s0", 0, 1, Operation.RUN, params=params)
        assert written == general_frame(client, request, {"x": x})
    assert len(client._kept_requests) == 1
    buffer = client.input_buffer((1024,), np.float32)  # on the channel: by reference
    buffer[:] = 1.5
    np.testing.assert_array_equal(run(client, "r6", buffer)["x"], buffer)
    sock.taken()
    np.testing.assert_array_equal(run(client, "r7", X + 1)["x"], X + 1)  # a buffer alive
    assert sock.taken() == [general_frame(
        client, StageRequest("r7", "s0", 0, 1, Operation.RUN), {"x": X + 1})]
    assert client._inputs.by_id
    assert len(client._kept_requests) == 1
    del buffer
    assert client.outstanding() == 0


def test_segment_names_to_announce_and_a_spin_frame_go_first(
    watched: tuple[WorkerClient, WatchedSocket],
) -> None:
    client, sock = watched
    run(client, "r1")
    run(client, "r2")
    sock.taken()
    assert len(client._kept_requests) == 1  # r3 and r4 would be written from it
    run(client, "b1", np.ones(2048, np.float32))  # through a segment, pooled once answered
    buffer = client.input_buffer((8192,), np.float32)  # one buffer at most: that one dropped
    del buffer  # (its own segment pooled)
    assert not client._inputs.by_id
    sock.taken()
    np.testing.assert_array_equal(run(client, "r3")["x"], X)
    (written,) = sock.taken()  # the names in an ack before the request, in one write
    usual = general_frame(client, StageRequest("r3", "s0", 0, 1, Operation.RUN), {"x": X})
    assert written.endswith(usual) and len(written) > len(usual)
    magic, header_len, payload_len = PREFIX.unpack_from(written)
    ack = parse_header(written[PREFIX.size : PREFIX.size + header_len], LIMITS,
                       payload_len=payload_len, binary=magic == BINARY_MAGIC)
    assert PREFIX.size + header_len + payload_len == len(written) - len(usual)
    assert ack.op == OP_ACK and len(ack.meta["gone"]) == 1, ack
    spin = encode_frame(FrameHeader(OP_SPIN, "", "", 0, 1, meta=spin_meta(0)), [],
                        binary=True)
    client._spin_frame = spin  # as _tell_spin leaves it for the next write
    np.testing.assert_array_equal(run(client, "r4")["x"], X)
    (written,) = sock.taken()
    assert written == b"".join(bytes(part) for part in spin) + general_frame(
        client, StageRequest("r4", "s0", 0, 1, Operation.RUN), {"x": X})
    assert client._spin_frame is None
    assert client.outstanding() == 0 and client.health().state == "ready"


def test_a_partial_write_of_a_usual_request_is_resumed(
    watched: tuple[WorkerClient, WatchedSocket],
) -> None:
    client, sock = watched
    run(client, "r1")
    sock.taken()
    assert len(client._kept_requests) == 1  # r2 is written from it
    x = X + 7
    sock.cut = 30  # the first write takes 30 bytes: inside the header
    np.testing.assert_array_equal(run(client, "r2", x)["x"], x)
    writes = sock.taken()
    assert len(writes) == 2 and len(writes[0]) == 30
    assert b"".join(writes) == general_frame(
        client, StageRequest("r2", "s0", 0, 1, Operation.RUN), {"x": x})
    assert client.outstanding() == 0


def test_a_template_is_the_general_frame_cut_around_the_request_id() -> None:
    packer = TensorPacker(None, 1 << 20)
    frames = {}
    for rid in ("a1", "b2", "c345"):
        request = StageRequest(rid, "s0", 2, 5, Operation.RUN)
        header_and_payload = general_frame_of(packer, request, {"x": X})
        frames[rid] = header_and_payload
    first, payload = frames["a1"]
    kept = request_template(first, 2, X.nbytes)
    assert kept is not None
    before, after, total = kept
    other, _ = frames["b2"]
    assert before + b"b2" + after == other and total == len(other) + len(payload)
    longer, _ = frames["c345"]
    assert before + b"c345" + after != longer  # the id's length is in the fixed part
    assert request_template(b"EDGJ" + first[4:], 2, X.nbytes) is None  # not binary


def general_frame_of(packer: TensorPacker, request: StageRequest,
                     inputs: dict[str, Any]) -> tuple[bytes, bytes]:
    """The first part (prefix and header) and the payload the general path writes."""
    packed = packer.pack(inputs)
    inline, total = tensor_totals(packed.specs, packed.features)
    header = prechecked_header(request.operation.value, request.request_id, request.stage_id,
                               request.epoch, request.generation, packed.specs,
                               request.params, packed.features, inline, total)  # type: ignore[arg-type]
    first, *payloads = encode_frame(header, packed.payloads, binary=True)
    return bytes(first), b"".join(bytes(part) for part in payloads)


def ref_frame(client: WorkerClient, rid: str, buffer: np.ndarray) -> bytes:
    """The bytes the general path writes for ``buffer`` sent by reference as it is now."""
    from edge_contracts.dtypes import DType
    from edge_contracts.headers import ShmRef, TensorSpec
    from edge_contracts.protocol import FEATURE_SHM_TENSORS

    lease = client._inputs.by_id[id(buffer)].lease
    spec = TensorSpec("x", DType.FLOAT32, buffer.shape, buffer.nbytes,
                      ShmRef(lease.segment, lease.offset, lease.generation))
    features = frozenset({FEATURE_SHM_TENSORS})
    inline, total = tensor_totals((spec,), features)
    header = prechecked_header("run", rid, "s0", 0, client.generation, (spec,), EMPTY,
                               features, inline, total)
    return b"".join(bytes(part) for part in encode_frame(header, [], binary=True))


EMPTY = EMPTY_OBJECT  # a request's params when it has none


def requests_taken(sock: WatchedSocket) -> list[bytes]:
    """The writes since the last call but the acknowledgements of outputs (op ``ack``)."""
    kept = []
    for written in sock.taken():
        magic, header_len, payload_len = PREFIX.unpack_from(written)
        header = parse_header(written[PREFIX.size : PREFIX.size + header_len], LIMITS,
                              payload_len=payload_len, binary=magic == BINARY_MAGIC)
        if header.op != OP_ACK:
            kept.append(written)
    return kept


def test_a_zero_copy_request_is_written_as_the_general_path_writes_it(
    watched: tuple[WorkerClient, WatchedSocket],
) -> None:
    """An input buffer sent again is written from its kept template: the same bytes.

    Each send stamps the buffer's reference with a new generation, which the kept bytes
    take between their pieces; another id length, another buffer or a busy buffer are
    not written from it (a busy one is refused, claiming nothing).
    """
    from edge_core.host.errors import InputBufferBusy

    client, sock = watched
    buffer = client.input_buffer((1024,), np.float32)
    buffer[:] = 0.5
    np.testing.assert_array_equal(run(client, "r01", buffer)["x"], buffer)
    (first,) = requests_taken(sock)
    lease = client._inputs.by_id[id(buffer)].lease
    assert first == ref_frame(client, "r01", buffer)
    assert list(client._kept_ref_requests) == [
        (3, "x", lease.segment, lease.offset, buffer.dtype, buffer.shape, Operation.RUN,
         "s0", 0)]
    generations = [lease.generation]
    general = client._inputs.pack_claimed

    def not_this_way(*args: object) -> None:
        raise AssertionError("a kept zero-copy request went the general way")

    client._inputs.pack_claimed = not_this_way  # type: ignore[method-assign,assignment]
    for index in range(2, 10):
        rid = f"r{index:02}"
        buffer[:] = index  # writable again: the worker acknowledged it with its DONE
        np.testing.assert_array_equal(run(client, rid, buffer)["x"], np.full(1024, index))
        (written,) = requests_taken(sock)
        assert written == ref_frame(client, rid, buffer)
        generations.append(client._inputs.by_id[id(buffer)].lease.generation)
    assert generations == sorted(set(generations))  # a new generation every send
    client._inputs.pack_claimed = general  # type: ignore[method-assign]
    sock.cut = 40  # a partial write, resumed
    np.testing.assert_array_equal(run(client, "r10", buffer)["x"], buffer)
    writes = sock.taken()
    assert len(writes[0]) == 40 and b"".join(writes[:2]) == ref_frame(client, "r10", buffer)
    np.testing.assert_array_equal(run(client, "r100", buffer)["x"], buffer)  # id of 4 bytes
    assert requests_taken(sock) == [ref_frame(client, "r100", buffer)]
    assert len(client._kept_ref_requests) == 2
    # a busy buffer: refused, nothing claimed (its generation and the sends unchanged)
    held = client.submit(StageRequest("h1", "s0", 0, 1, Operation.RUN), {"x": buffer})
    sent = client._inputs.sent
    stamped = client._inputs.by_id[id(buffer)].lease.generation
    with pytest.raises(InputBufferBusy):
        client.submit(StageRequest("h2", "s0", 0, 1, Operation.RUN), {"x": buffer})
    assert client._inputs.sent == sent
    assert client._inputs.by_id[id(buffer)].lease.generation == stamped
    assert not client.in_flight("h2")
    np.testing.assert_array_equal(dict(held.result(timeout=10))["x"], buffer)
    requests_taken(sock)
    np.testing.assert_array_equal(run(client, "r11", buffer)["x"], buffer)
    assert requests_taken(sock) == [ref_frame(client, "r11", buffer)]
    del buffer
    assert client.outstanding() == 0


def test_a_zero_copy_template_is_the_general_frame_cut_around_its_id_and_generation(
) -> None:
    """``ref_request_template``: the kept pieces give the general frame of any id, generation.

    And None for what it does not keep: a frame with a payload, meta or no reference, or
    one whose reference's generation is not the one named.
    """
    from edge_contracts.dtypes import DType
    from edge_contracts.headers import ShmRef, TensorSpec
    from edge_contracts.protocol import FEATURE_SHM_TENSORS
    from edge_core.host.request_kept import ref_request_template

    features = frozenset({FEATURE_SHM_TENSORS})

    def frame(rid: str, generation: int, meta: Any = EMPTY) -> bytes:
        spec = TensorSpec("x", DType.FLOAT32, (4, 256), 4096,
                          ShmRef("edge_seg_1", 8192, generation))
        inline, total = tensor_totals((spec,), features)
        header = prechecked_header("run", rid, "s0", 2, 5, (spec,), meta, features, inline,
                                   total)
        return b"".join(bytes(part) for part in encode_frame(header, [], binary=True))

    kept = ref_request_template(frame("a1", 7), 2, 7)
    assert kept is not None
    before, middle, after = kept
    for rid, generation in (("b2", 8), ("zz", 2**63 - 1), ("a1", 0)):
        assert before + rid.encode() + middle + generation.to_bytes(8, "little") + after == (
            frame(rid, generation))
    assert ref_request_template(frame("a1", 7), 2, 8) is None  # not its generation
    assert ref_request_template(frame("a1", 7), 3, 7) is None  # not its id's length
    from edge_contracts.jsonvalues import freeze_object
    assert ref_request_template(frame("a1", 7, freeze_object({"k": 1}, "m")), 2, 7) is None
    packer = TensorPacker(None, 1 << 20)
    first, _ = general_frame_of(packer, StageRequest("a1", "s0", 2, 5, Operation.RUN), {"x": X})
    assert ref_request_template(first, 2, 0) is None  # no reference (an inline payload)
