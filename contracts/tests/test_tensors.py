import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edge_contracts.dtypes import DType
from edge_contracts.errors import DescriptorInvalid, InvalidValue
from edge_contracts.headers import tensor_features
from edge_contracts.tensors import (
    array_from_buffer,
    arrays_from_frame,
    arrays_to_wire,
    dtype_of,
    numpy_dtype,
)
from edge_contracts.wire import (
    Frame,
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    decode_frame,
    encode_frame,
)

SRC = Path(__file__).resolve().parents[1] / "src"
LIMITS = Limits(max_io_bytes=1 << 26)
NUMPY_TYPES = ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"]


def round_trip(arrays: dict[str, np.ndarray], dtypes: dict[str, DType] | None = None) -> Frame:
    specs, payloads = arrays_to_wire(arrays, dtypes)
    header = FrameHeader("call", "r1", "s1", 0, 0, specs, required_features=tensor_features(specs))
    data = b"".join(bytes(part) for part in encode_frame(header, payloads))
    return decode_frame(data, LIMITS)


def same_bits(left: np.ndarray, right: np.ndarray) -> bool:
    return (
        left.shape == right.shape
        and np.ascontiguousarray(left).tobytes() == np.ascontiguousarray(right).tobytes()
    )


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(NUMPY_TYPES).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    ),
    st.sampled_from(["as-is", "big-endian", "strided", "fortran"]),
)
def test_round_trip_is_bit_exact_for_every_layout(array: np.ndarray, form: str) -> None:
    if form == "big-endian":
        array = array.astype(array.dtype.newbyteorder(">"))
    elif form == "strided" and array.ndim:
        array = np.repeat(array, 2, axis=-1)[..., ::2]
    elif form == "fortran":
        array = np.asfortranarray(array)
    decoded = arrays_from_frame(round_trip({"a": array}))["a"]
    expected = array.astype(array.dtype.newbyteorder("<"))
    assert decoded.dtype == numpy_dtype(dtype_of(array))
    assert same_bits(decoded, expected)
    assert np.array_equal(decoded, array, equal_nan=array.dtype.kind == "f")


def test_zero_d_and_empty_arrays_keep_their_shapes() -> None:
    arrays = {"scalar": np.array(7, dtype=np.int64), "empty": np.zeros((0, 3), dtype=np.float16)}
    decoded = arrays_from_frame(round_trip(arrays))
    assert decoded["scalar"].shape == ()
    assert decoded["scalar"] == 7
    assert decoded["empty"].shape == (0, 3)
    assert decoded["empty"].dtype == np.float16


def test_decoded_arrays_are_writable_views_over_the_frame_payload() -> None:
    frame = round_trip({"a": np.arange(6, dtype=np.int32).reshape(2, 3)})
    decoded = arrays_from_frame(frame)["a"]
    assert decoded.flags.writeable
    decoded[1, 2] = -1
    assert np.frombuffer(frame.payload, dtype="<i4")[5] == -1


def test_bool_travels_as_one_byte_and_other_bytes_are_refused() -> None:
    specs, payloads = arrays_to_wire({"m": np.array([True, False, True])})
    assert specs[0].dtype is DType.BOOL
    assert bytes(payloads[0]) == b"\x01\x00\x01"
    with pytest.raises(DescriptorInvalid) as info:
        array_from_buffer(TensorSpec("m", DType.BOOL, (2,), 2), bytearray(b"\x01\x02"))
    assert info.value.field == "tensors.m"


def test_raw_uint16_bits_may_be_sent_as_bfloat16() -> None:
    bits = np.array([0x3FC0, 0xC000], dtype=np.uint16)  # 1.5, -2.0
    specs, payloads = arrays_to_wire({"w": bits}, {"w": DType.BFLOAT16})
    assert specs[0].dtype is DType.BFLOAT16
    assert bytes(payloads[0]) == bytes.fromhex("c03f00c0")


def test_bfloat16_decodes_to_ml_dtypes_when_installed() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.5, -2.0, 0.0078125], dtype=ml_dtypes.bfloat16)
    assert dtype_of(values) is DType.BFLOAT16
    decoded = arrays_from_frame(round_trip({"w": values}))["w"]
    assert decoded.dtype == ml_dtypes.bfloat16
    assert same_bits(decoded, values)
    assert decoded.astype(np.float32).tolist() == [1.5, -2.0, 0.0078125]


def test_bfloat16_decodes_to_raw_bits_without_ml_dtypes() -> None:
    script = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np\n"
        "from edge_contracts.dtypes import DType\n"
        "from edge_contracts.tensors import arrays_from_frame, arrays_to_wire\n"
        "from edge_contracts.wire import FrameHeader, Limits, decode_frame, encode_frame\n"
        "bits = np.array([0x3FC0, 0xC000], dtype=np.uint16)\n"
        "specs, payloads = arrays_to_wire({'w': bits}, {'w': DType.BFLOAT16})\n"
        "header = FrameHeader('call', 'r', 's', 0, 0, specs, required_features={'bfloat16'})\n"
        "data = b''.join(bytes(p) for p in encode_frame(header, payloads))\n"
        "out = arrays_from_frame(decode_frame(data, Limits(max_io_bytes=64)))['w']\n"
        "print(out.dtype.str, out.tolist())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"PYTHONPATH": str(SRC)},
    )
    assert result.stdout.split(maxsplit=1) == ["<u2", "[16320, 49152]\n"]


@pytest.mark.parametrize(
    "array",
    [
        np.zeros(2, dtype=np.complex64),
        np.array(["a"]),
        np.array([object()]),
        np.zeros(2, dtype=np.longdouble),
        np.zeros(2, dtype="datetime64[s]"),
        np.zeros(2, dtype=[("a", "<i4")]),
    ],
)
def test_unsupported_dtypes_are_refused(array: np.ndarray) -> None:
    with pytest.raises(InvalidValue) as info:
        arrays_to_wire({"x": array})
    assert info.value.field == "arrays.x.dtype"


def test_overrides_must_match_the_array_or_be_bfloat16_bits() -> None:
    with pytest.raises(InvalidValue) as info:
        arrays_to_wire({"x": np.zeros(2, dtype=np.float32)}, {"x": DType.INT32})
    assert info.value.field == "dtypes.x"
    with pytest.raises(InvalidValue):
        arrays_to_wire({"x": np.zeros(2, dtype=np.int16)}, {"x": DType.BFLOAT16})
    with pytest.raises(InvalidValue) as info:
        arrays_to_wire({"x": np.zeros(2)}, {"y": DType.FLOAT64})
    assert info.value.field == "dtypes.y"


def test_more_than_32_dimensions_are_refused() -> None:
    with pytest.raises(DescriptorInvalid):
        arrays_to_wire({"x": np.zeros((1,) * 33, dtype=np.uint8)})


def test_shared_memory_tensors_are_read_through_the_given_resolver() -> None:
    segment = bytearray(np.arange(4, dtype="<f4").tobytes())
    specs, payloads = arrays_to_wire({"ids": np.array([1, 2], dtype=np.uint8)})
    kv = TensorSpec("kv", DType.FLOAT32, (2, 2), 16, ShmRef("edge_seg", 0, 1))
    header = FrameHeader(
        "call", "r", "s", 0, 0, (kv, *specs), required_features=frozenset({"shm-tensors"})
    )
    frame = decode_frame(b"".join(bytes(p) for p in encode_frame(header, payloads)), LIMITS)
    with pytest.raises(DescriptorInvalid) as info:
        arrays_from_frame(frame)
    assert info.value.field == "tensors.kv.ref"
    arrays = arrays_from_frame(frame, lambda spec: memoryview(segment)[: spec.nbytes])
    assert arrays["kv"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert arrays["ids"].tolist() == [1, 2]
    arrays["kv"][0, 0] = 9.0
    assert np.frombuffer(segment, "<f4")[0] == 9.0


def test_a_buffer_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(DescriptorInvalid):
        array_from_buffer(TensorSpec("x", DType.FLOAT32, (2,), 8), bytearray(7))


def test_numpy_dtypes_are_explicitly_little_endian() -> None:
    for member in DType:
        if member is not DType.BFLOAT16:
            assert numpy_dtype(member).str[0] in ("<", "|")
            assert numpy_dtype(member).itemsize == member.itemsize
