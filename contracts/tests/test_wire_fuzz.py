"""Fuzzing the frame decoder: every refusal is a WireError, and none allocates the payload."""

import contextlib
import dataclasses
import json
import math
import struct
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_contracts.binary_header import BINARY_OPS, encode_binary_header
from edge_contracts.dtypes import DType
from edge_contracts.errors import HeaderMalformed, UnknownRequiredFeature, WireError
from edge_contracts.frame_reader import FrameReader
from edge_contracts.wire import (
    BINARY_MAGIC,
    PREFIX,
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    decode_frame,
    encode_frame,
    encode_header,
)

LIMITS = Limits(max_io_bytes=8 * 1024 * 1024, max_tensors=16)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
ids = st.text(
    alphabet=st.characters(
        min_codepoint=32, max_codepoint=0x2FF, exclude_categories=("Cc", "Zl", "Zp")
    ),
    min_size=1,
    max_size=16,
).filter(str.isprintable)


@st.composite
def valid_frames(draw: st.DrawFn) -> tuple[FrameHeader, list[bytes]]:
    specs: list[TensorSpec] = []
    payloads: list[bytes] = []
    features: set[str] = set()
    for index in range(draw(st.integers(min_value=0, max_value=4))):
        dtype = draw(st.sampled_from(list(DType)))
        if dtype is DType.BFLOAT16:
            features.add("bfloat16")
        shape = tuple(draw(st.lists(st.integers(min_value=0, max_value=4), max_size=3)))
        nbytes = math.prod(shape) * dtype.itemsize
        if draw(st.booleans()) and index % 2:
            ref = ShmRef(f"edge_seg{index}", draw(st.integers(0, 2**20)), draw(st.integers(0, 9)))
            features.add("shm-tensors")
            specs.append(TensorSpec(f"t{index}", dtype, shape, nbytes, ref))
        else:
            specs.append(TensorSpec(f"t{index}", dtype, shape, nbytes))
            payloads.append(draw(st.binary(min_size=nbytes, max_size=nbytes)))
    header = FrameHeader(
        op=draw(st.sampled_from(["call", "event", "hello", "cancel"])),
        request_id=draw(ids | st.just("")),
        stage_id=draw(ids),
        epoch=draw(st.integers(min_value=0, max_value=2**63 - 1)),
        generation=draw(st.integers(min_value=0, max_value=2**32)),
        tensors=tuple(specs),
        meta=draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4)),
        required_features=frozenset(
            features | draw(st.sets(st.sampled_from(["cancel", "bfloat16"])))
        ),
    )
    return header, payloads


def frame_bytes(header: FrameHeader, payloads: list[bytes]) -> bytes:
    return b"".join(bytes(part) for part in encode_frame(header, payloads))


def decode_or_refuse(data: bytes, limits: Limits = LIMITS) -> None:
    with contextlib.suppress(WireError):
        decode_frame(data, limits)


@FUZZ
@given(valid_frames())
def test_valid_frames_round_trip_bit_exact(case: tuple[FrameHeader, list[bytes]]) -> None:
    header, payloads = case
    frame = decode_frame(frame_bytes(header, payloads), LIMITS)
    assert frame.header == header
    assert [bytes(view) for view in frame.tensor_views().values()] == payloads


@FUZZ
@given(valid_frames())
def test_assembled_header_bytes_equal_the_plain_json_encoding(
    case: tuple[FrameHeader, list[bytes]],
) -> None:
    header, _ = case
    for _ in range(2):  # the second time from the tensor-list cache
        expected = json.dumps(header.to_dict(), separators=(",", ":"), allow_nan=False)
        assert encode_header(header) == expected.encode()


@FUZZ
@given(valid_frames(), st.data())
def test_cached_tensor_entries_equal_freshly_validated_ones(
    case: tuple[FrameHeader, list[bytes]], data: st.DataObject
) -> None:
    header, _ = case
    for spec in header.tensors:
        if spec.ref is None:
            shape = list(spec.shape)
            assert TensorSpec.inline(spec.name, spec.dtype.value, shape, spec.nbytes) == spec
            assert TensorSpec.from_dict(spec.to_dict()) == spec
    TensorSpec.inline("t", "uint8", [1], 1)  # cached: equal-hashing 1.0 and True must miss
    dims = data.draw(
        st.lists(st.sampled_from([1.0, True, -1, 2**64, "2"]), min_size=1, max_size=2)
    )
    with contextlib.suppress(WireError):  # a float, bool or out-of-range dimension
        TensorSpec.inline("t", "uint8", dims, 1)
        raise AssertionError(f"accepted shape {dims!r}")


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_fail_only_with_wire_errors(data: bytes) -> None:
    decode_or_refuse(data)


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes_behind_a_valid_prefix_fail_only_with_wire_errors(data: bytes) -> None:
    decode_or_refuse(PREFIX.pack(b"EDGW", len(data), 0) + data)


@FUZZ
@given(valid_frames(), st.data())
def test_mutated_frames_fail_only_with_wire_errors(
    case: tuple[FrameHeader, list[bytes]], data: st.DataObject
) -> None:
    original = bytearray(frame_bytes(*case))
    mutation = data.draw(st.sampled_from(["flip", "truncate", "splice", "extend"]))
    at = data.draw(st.integers(min_value=0, max_value=len(original) - 1))
    if mutation == "flip":
        original[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    elif mutation == "truncate":
        del original[at:]
    elif mutation == "splice":
        end = data.draw(st.integers(min_value=at, max_value=len(original)))
        original[at:end] = data.draw(st.binary(max_size=16))
    else:
        original += data.draw(st.binary(min_size=1, max_size=16))
    decode_or_refuse(bytes(original))


@FUZZ
@given(valid_frames(), st.data())
def test_mutated_header_fields_fail_only_with_wire_errors(
    case: tuple[FrameHeader, list[bytes]], data: st.DataObject
) -> None:
    header, payloads = case
    document: dict[str, Any] = header.to_dict()
    target: dict[str, Any] = document
    if document["tensors"] and data.draw(st.booleans()):
        target = data.draw(st.sampled_from(document["tensors"]))
    key = data.draw(st.sampled_from(sorted(target)))
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        target[key] = data.draw(json_values)
    elif action == "delete":
        del target[key]
    else:
        target[data.draw(st.text(max_size=6))] = data.draw(json_values)
    raw = json.dumps(document).encode()
    payload = b"".join(payloads)
    decode_or_refuse(PREFIX.pack(b"EDGW", len(raw), len(payload)) + raw + payload)


def _peak_during(call: Any) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_frames(), st.integers(min_value=1 << 20, max_value=8 << 20), st.data())
def test_refused_frames_never_allocate_their_declared_payload(
    case: tuple[FrameHeader, list[bytes]], declared: int, data: st.DataObject
) -> None:
    header, _ = case
    raw = bytearray(encode_header(header))
    if raw and data.draw(st.booleans()):
        at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    frame = PREFIX.pack(b"EDGW", len(raw), declared) + bytes(raw)
    refusal: list[WireError] = []

    def decode() -> None:
        try:
            decode_frame(frame, LIMITS)
        except WireError as exc:
            refusal.append(exc)

    peak = _peak_during(decode)
    assert refusal, "a frame without its declared payload cannot decode"
    # The whole refusal stays within the reader's declared limits ...
    assert peak <= LIMITS.max_io_bytes + LIMITS.max_header_bytes + (64 << 10)
    # ... and only a header that checked out completely gets its payload allocated.
    if refusal[0].field != "payload":
        assert peak < 256 << 10 < declared, (refusal[0], peak)


def test_refused_header_with_a_gigantic_declared_payload_allocates_almost_nothing() -> None:
    header = FrameHeader("call", "r", "s", 0, 0, (TensorSpec("x", DType.UINT8, (4,), 4),))
    raw = encode_header(header)
    data = PREFIX.pack(b"EDGW", len(raw), 8 << 20) + raw + struct.pack("<I", 0)
    peak = _peak_during(lambda: decode_or_refuse(data))
    assert peak < 64 << 10


# -- the binary header of per-request frames (edge_contracts.binary_header) -------------


@st.composite
def valid_binary_frames(draw: st.DrawFn) -> tuple[FrameHeader, list[bytes]]:
    header, payloads = draw(valid_frames())
    op = draw(st.sampled_from(sorted(BINARY_OPS)))
    return dataclasses.replace(header, op=op), payloads


def binary_frame_bytes(header: FrameHeader, payloads: list[bytes]) -> bytes:
    parts = encode_frame(header, payloads, binary=True)
    assert bytes(parts[0][:4]) == BINARY_MAGIC
    return b"".join(bytes(part) for part in parts)


@FUZZ
@given(valid_binary_frames())
def test_valid_binary_frames_round_trip_bit_exact(case: tuple[FrameHeader, list[bytes]]) -> None:
    header, payloads = case
    data = binary_frame_bytes(header, payloads)
    frame = decode_frame(data, LIMITS)
    assert frame.header == header
    assert [bytes(view) for view in frame.tensor_views().values()] == payloads
    # the same frame read through the buffered reader, in small pieces
    position = 0

    def recv_into(view: memoryview) -> int:
        nonlocal position
        count = min(len(view), len(data) - position, 7)
        view[:count] = data[position : position + count]
        position += count
        return count

    assert FrameReader(recv_into, LIMITS).read().header == header


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_behind_a_binary_prefix_fail_only_with_wire_errors(data: bytes) -> None:
    decode_or_refuse(PREFIX.pack(BINARY_MAGIC, len(data), 0) + data)
    decode_or_refuse(PREFIX.pack(BINARY_MAGIC, max(1, len(data)), 16) + data + bytes(16))


@FUZZ
@given(valid_binary_frames(), st.data())
def test_mutated_binary_frames_fail_only_with_wire_errors(
    case: tuple[FrameHeader, list[bytes]], data: st.DataObject
) -> None:
    original = bytearray(binary_frame_bytes(*case))
    mutation = data.draw(st.sampled_from(["flip", "truncate", "splice", "extend"]))
    at = data.draw(st.integers(min_value=0, max_value=len(original) - 1))
    if mutation == "flip":
        original[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    elif mutation == "truncate":
        del original[at:]
    elif mutation == "splice":
        end = data.draw(st.integers(min_value=at, max_value=len(original)))
        original[at:end] = data.draw(st.binary(max_size=16))
    else:
        original += data.draw(st.binary(min_size=1, max_size=16))
    decode_or_refuse(bytes(original))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_binary_frames(), st.integers(min_value=1 << 20, max_value=8 << 20), st.data())
def test_refused_binary_frames_never_allocate_their_declared_payload(
    case: tuple[FrameHeader, list[bytes]], declared: int, data: st.DataObject
) -> None:
    header, _ = case
    raw = bytearray(encode_binary_header(header))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    frame = PREFIX.pack(BINARY_MAGIC, len(raw), declared) + bytes(raw)
    refusal: list[WireError] = []

    def decode() -> None:
        try:
            decode_frame(frame, LIMITS)
        except WireError as exc:
            refusal.append(exc)

    peak = _peak_during(decode)
    assert refusal, "a frame without its declared payload cannot decode"
    assert peak <= LIMITS.max_io_bytes + LIMITS.max_header_bytes + (64 << 10)
    if refusal[0].field != "payload":
        assert peak < 256 << 10 < declared, (refusal[0], peak)


def test_binary_header_is_refused_by_a_reader_without_the_feature() -> None:
    header = FrameHeader("run", "r", "s", 0, 0, (TensorSpec("x", DType.UINT8, (4,), 4),))
    data = binary_frame_bytes(header, [b"abcd"])
    without = Limits(max_io_bytes=1024, supported_features=frozenset({"shm-tensors"}))
    with pytest.raises(UnknownRequiredFeature) as caught:
        decode_frame(data, without)
    assert caught.value.field == "prefix.magic"
    with pytest.raises(UnknownRequiredFeature):  # and a sender checking those limits
        encode_frame(header, [b"abcd"], binary=True, limits=without)


def test_control_frames_keep_the_json_header_when_binary_is_asked() -> None:
    hello = FrameHeader("hello", "", "", 0, 1, meta={"x": 1})
    parts = encode_frame(hello, [], binary=True)
    assert bytes(parts[0][:4]) == b"EDGW"
    with pytest.raises(HeaderMalformed) as caught:
        encode_binary_header(hello)
    assert caught.value.field == "header.op"


def test_a_feature_without_a_bit_keeps_the_json_header() -> None:
    limits = Limits(max_io_bytes=1024, supported_features=frozenset({"binary-header", "x-new"}))
    header = FrameHeader("run", "r", "s", 0, 0, required_features=frozenset({"x-new"}))
    parts = encode_frame(header, [], binary=True)
    assert bytes(parts[0][:4]) == b"EDGW"
    assert decode_frame(b"".join(bytes(part) for part in parts), limits).header == header
