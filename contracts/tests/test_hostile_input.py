"""Inputs crafted by a hostile peer: each refused with a typed error, none amplified."""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Callable

import pytest

from edge_contracts.buffers import BufferDescriptor
from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    DescriptorInvalid,
    FrameTruncated,
    HeaderMalformed,
    InvalidValue,
    UnknownRequiredFeature,
)
from edge_contracts.frame_reader import FrameReader
from edge_contracts.jsonvalues import strict_loads
from edge_contracts.manifest import ArtifactManifest
from edge_contracts.protocol import KNOWN_FEATURES
from edge_contracts.requests import Operation, StageRequest
from edge_contracts.tensors import arrays_from_frame
from edge_contracts.wire import (
    PAYLOAD_STEP,
    PREFIX,
    FrameHeader,
    Limits,
    TensorSpec,
    decode_frame,
    encode_frame,
    encode_header,
    read_frame,
)
from edge_contracts.worker_protocol import BootConfig, boot_frame, parse_ack, read_boot

MiB = 1 << 20
LIMITS = Limits(max_io_bytes=1 << 30)


class _Stalled(Exception):
    """The test's stream has nothing more to give (a peer that stopped sending)."""


def _stream(data: bytes, chunk: int = 1 << 16) -> Callable[[memoryview], int]:
    position = 0

    def recv_into(view: memoryview) -> int:
        nonlocal position
        if position == len(data):
            raise _Stalled
        count = min(len(view), chunk, len(data) - position)
        view[:count] = data[position : position + count]
        position += count
        return count

    return recv_into


def _lying_prefix_and_header(declared: int) -> bytes:
    header = FrameHeader("run", "r", "s", 0, 1, (TensorSpec("x", DType.UINT8, (declared,),
                                                             declared),))
    raw = encode_header(header)
    return PREFIX.pack(b"EDGW", len(raw), declared) + raw


def _peak(call: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(_Stalled):
            call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("reader", ["read_frame", "FrameReader"])
def test_a_consistent_length_lie_allocates_one_step_not_the_declared_payload(reader: str) -> None:
    data = _lying_prefix_and_header(1 << 30)  # 1 GiB declared, 227 bytes sent
    recv = _stream(data)
    if reader == "read_frame":
        peak = _peak(lambda: read_frame(recv, LIMITS))
    else:
        frames = FrameReader(recv, LIMITS)
        peak = _peak(frames.read)
    assert peak <= PAYLOAD_STEP + 64 * 1024, peak


@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_a_payload_grows_with_what_arrives_and_arrives_bit_exact(chunk: int) -> None:
    payload = bytes(range(256)) * (12 * MiB // 256)
    header = FrameHeader("run", "r", "s", 0, 1, (TensorSpec("x", DType.UINT8, (len(payload),),
                                                             len(payload)),))
    data = b"".join(bytes(p) for p in encode_frame(header, [payload]))
    half = len(data) - len(payload) // 2
    recv = _stream(data[:half], chunk)
    peak = _peak(lambda: FrameReader(recv, LIMITS).read())
    arrived = len(payload) // 2
    assert peak <= arrived + max(PAYLOAD_STEP, arrived // 8) + 2 * PAYLOAD_STEP, peak
    frame = FrameReader(_stream(data, chunk), LIMITS).read()
    assert frame.payload == payload
    with pytest.raises(FrameTruncated):
        decode_frame(data[:half], LIMITS)


def test_an_empty_tensor_with_an_unaddressable_dimension_is_refused_before_numpy() -> None:
    spec = {"name": "x", "dtype": "float32", "shape": [0, 2**62], "nbytes": 0, "ref": None}
    document = FrameHeader("run", "r", "s", 0, 1).to_dict() | {"tensors": [spec]}
    raw = json.dumps(document).encode()
    with pytest.raises(DescriptorInvalid, match=r"prod\(non-zero dims\)"):
        decode_frame(PREFIX.pack(b"EDGW", len(raw), 0) + raw, LIMITS)
    with pytest.raises(InvalidValue, match=r"buffer\.shape"):
        BufferDescriptor("w", 1, DType.FLOAT32, (0, 2**62), 0)
    fine = FrameHeader("run", "r", "s", 0, 1, (TensorSpec("x", DType.FLOAT32, (0, 2**60), 0),))
    frame = decode_frame(b"".join(bytes(p) for p in encode_frame(fine, [b""])), LIMITS)
    assert arrays_from_frame(frame)["x"].shape == (0, 2**60)


def test_bfloat16_travels_only_when_required_and_negotiated() -> None:
    spec = TensorSpec("x", DType.BFLOAT16, (2,), 4)
    with pytest.raises(DescriptorInvalid, match=r"needs required feature bfloat16"):
        FrameHeader("run", "r", "s", 0, 1, (spec,))
    header = FrameHeader("run", "r", "s", 0, 1, (spec,), required_features={"bfloat16"})
    data = b"".join(bytes(p) for p in encode_frame(header, [b"\0" * 4]))
    assert decode_frame(data, LIMITS).header == header
    without = Limits(max_io_bytes=64, supported_features=KNOWN_FEATURES - {"bfloat16"})
    with pytest.raises(UnknownRequiredFeature, match="bfloat16"):
        decode_frame(data, without)
    sneaky = header.to_dict() | {"required_features": []}  # a peer leaving the feature out
    raw = json.dumps(sneaky).encode()
    with pytest.raises(DescriptorInvalid, match=r"header\.tensors\[0\]\.dtype"):
        decode_frame(PREFIX.pack(b"EDGW", len(raw), 4) + raw + b"\0" * 4, without)


def test_requests_and_events_refuse_buffers_that_are_not_ready() -> None:
    pending = BufferDescriptor("w", 1, DType.UINT8, (4,), 4, ready=False)
    with pytest.raises(InvalidValue, match=r"request\.inputs\[0\]\.ready: must be true"):
        StageRequest("r", "s", 0, 1, Operation.RUN, inputs=(pending,))
    document = StageRequest("r", "s", 0, 1, Operation.RUN).to_dict()
    document["inputs"] = [pending.to_dict()]
    with pytest.raises(InvalidValue, match=r"\.ready"):
        StageRequest.from_dict(document)


def test_manifests_and_boot_configurations_refuse_duplicate_keys() -> None:
    good = {"schema_version": 1, "component": "c", "files": {"m.onnx": "0" * 64},
            "metadata": {"graph": "m.onnx"}}
    text = json.dumps(good)
    doubled = text.replace('"component": "c"', '"component": "c", "component": "d"')
    with pytest.raises(InvalidValue, match="duplicate key 'component'"):
        ArtifactManifest.from_json(doubled)
    nested = text.replace('"m.onnx": "0', '"m.onnx": "1' + "1" * 63 + '", "m.onnx": "0')
    with pytest.raises(InvalidValue, match=r"duplicate key 'm\.onnx'"):
        ArtifactManifest.from_json(nested)
    with pytest.raises(ValueError, match="duplicate key"):
        strict_loads(b'{"a": {"b": 1, "b": 2}}')
    with pytest.raises(InvalidValue, match=r"^boot"):
        BootConfig.from_json('{"token": "a", "token": "b"}')


@pytest.mark.parametrize("meta", [
    {"segments": 5}, {"segments": [["s", "1"]]}, {"segments": [["s", 1.0]]},
    {"segments": [["s", True]]}, {"unlink": [["s"]]}, {"gone": "s"}, {"gone": [None]},
])
def test_malformed_acks_are_refused_whole(meta: dict[str, object]) -> None:
    with pytest.raises(InvalidValue, match=r"^ack\."):
        parse_ack(meta)


def test_well_formed_acks_parse() -> None:
    assert parse_ack({"segments": [["a", 1]], "unlink": [("b", 2)], "gone": ["c"]}) == (
        ["c"], [("a", 1)], [("b", 2)]
    )
    assert parse_ack({}) == ([], [], [])


def test_the_worker_reads_only_a_well_formed_boot_frame_first() -> None:
    boot = BootConfig("t" * 64, "m:f", 1, "p", "q", 1, 2, 3, 4, features=("cancel",))
    good = b"".join(bytes(p) for p in encode_frame(boot_frame(boot), []))
    assert read_boot(_stream(good)) == boot
    hello = b"".join(bytes(p) for p in encode_frame(FrameHeader("hello", "", "", 0, 1), []))
    with pytest.raises(HeaderMalformed, match=r"^boot\.op"):
        read_boot(_stream(hello))
    wrong = FrameHeader("boot", "", "", 0, 1, meta=boot.to_dict() | {"generation": "1"})
    with pytest.raises(InvalidValue, match=r"^boot\.generation"):
        read_boot(_stream(b"".join(bytes(p) for p in encode_frame(wrong, []))))
