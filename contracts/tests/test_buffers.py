import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_contracts.buffers import BufferDescriptor, Layout, MemoryDomain
from edge_contracts.dtypes import DType
from edge_contracts.errors import InvalidValue

shapes = st.lists(st.integers(min_value=0, max_value=64), max_size=6).map(tuple)


def make(**changes: object) -> BufferDescriptor:
    fields: dict[str, object] = {
        "owner": "w1",
        "generation": 0,
        "dtype": DType.FLOAT32,
        "shape": (2, 3),
        "nbytes": 24,
    }
    fields.update(changes)
    return BufferDescriptor(**fields)  # type: ignore[arg-type]


def test_defaults_are_ready_host_memory_in_c_layout() -> None:
    buffer = make()
    assert buffer.domain is MemoryDomain.HOST
    assert buffer.layout is Layout.C
    assert buffer.ready is True


@given(st.sampled_from(list(DType)), shapes)
def test_for_shape_computes_exact_nbytes_and_round_trips(
    dtype: DType, shape: tuple[int, ...]
) -> None:
    buffer = BufferDescriptor.for_shape("w1", 7, dtype, shape)
    assert buffer.nbytes == math.prod(shape) * dtype.itemsize
    assert BufferDescriptor.from_dict(buffer.to_dict()) == buffer


@pytest.mark.parametrize("nbytes", [23, 25, 0])
def test_nbytes_must_match_shape_exactly(nbytes: int) -> None:
    with pytest.raises(InvalidValue) as info:
        make(nbytes=nbytes)
    assert info.value.field == "buffer.nbytes"
    assert "24" in info.value.reason


def test_thirty_two_dimensions_pass_and_thirty_three_fail() -> None:
    assert make(shape=(1,) * 32, nbytes=4).shape == (1,) * 32
    with pytest.raises(InvalidValue) as info:
        make(shape=(1,) * 33, nbytes=4)
    assert info.value.field == "buffer.shape"
    assert "32" in info.value.reason


@pytest.mark.parametrize("dim", [-1, True, 2.0, "2", None])
def test_each_dimension_is_a_non_negative_int(dim: object) -> None:
    with pytest.raises(InvalidValue) as info:
        make(shape=(2, dim), nbytes=8)
    assert info.value.field == "buffer.shape[1]"


def test_empty_and_zero_d_shapes_are_valid() -> None:
    assert make(shape=(0, 5), nbytes=0).nbytes == 0
    assert make(shape=(), nbytes=4).shape == ()


def test_totals_beyond_int64_are_refused() -> None:
    with pytest.raises(InvalidValue) as info:
        BufferDescriptor.for_shape("w1", 0, "float64", (2**31, 2**31, 4))
    assert info.value.field == "buffer.shape"


def test_strings_are_parsed_into_enums_and_lists_into_tuples() -> None:
    buffer = make(dtype="bfloat16", shape=[3], nbytes=6, domain="host", layout="C")
    assert buffer.dtype is DType.BFLOAT16
    assert buffer.shape == (3,)
    assert buffer.domain is MemoryDomain.HOST


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"domain": "cuda"}, "buffer.domain"),
        ({"layout": "F"}, "buffer.layout"),
        ({"dtype": "float"}, "buffer.dtype"),
        ({"generation": -1}, "buffer.generation"),
        ({"generation": False}, "buffer.generation"),
        ({"owner": ""}, "buffer.owner"),
        ({"owner": "x" * 129}, "buffer.owner"),
        ({"owner": "tab\there"}, "buffer.owner"),
        ({"ready": 1}, "buffer.ready"),
    ],
)
def test_invalid_fields_are_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as info:
        make(**change)
    assert info.value.field == field


def test_descriptors_are_frozen_and_hashable() -> None:
    buffer = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        buffer.nbytes = 0  # type: ignore[misc]
    assert len({buffer, make()}) == 1


def test_from_dict_names_unknown_and_missing_keys_under_the_callers_path() -> None:
    data = make().to_dict()
    with pytest.raises(InvalidValue) as info:
        BufferDescriptor.from_dict({**data, "device": "gpu0"}, "request.inputs[2]")
    assert info.value.field == "request.inputs[2].device"
    del data["nbytes"]
    with pytest.raises(InvalidValue) as info:
        BufferDescriptor.from_dict(data, "request.inputs[2]")
    assert info.value.field == "request.inputs[2].nbytes"


def test_from_dict_rebases_value_errors_onto_the_callers_path() -> None:
    data = {**make().to_dict(), "nbytes": 25}
    with pytest.raises(InvalidValue) as info:
        BufferDescriptor.from_dict(data, "event.outputs[0]")
    assert info.value.field == "event.outputs[0].nbytes"


def test_from_dict_needs_an_object() -> None:
    with pytest.raises(InvalidValue) as info:
        BufferDescriptor.from_dict([1, 2], "x")  # type: ignore[arg-type]
    assert info.value.field == "x"
