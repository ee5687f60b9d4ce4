import pytest

from edge_contracts.dtypes import DType
from edge_contracts.errors import DescriptorInvalid, InvalidValue

EXPECTED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "bfloat16": 2,
}


def test_the_thirteen_spellings_and_their_itemsizes() -> None:
    assert {member.value: member.itemsize for member in DType} == EXPECTED


def test_members_are_their_own_spelling() -> None:
    assert DType.FLOAT32 == "float32"
    assert str(DType.BFLOAT16) == "bfloat16"
    assert f"{DType.UINT8}" == "uint8"


@pytest.mark.parametrize("spelling", list(EXPECTED))
def test_parse_accepts_each_canonical_spelling(spelling: str) -> None:
    assert DType.parse(spelling).value == spelling


def test_parse_passes_members_through() -> None:
    assert DType.parse(DType.INT64) is DType.INT64


@pytest.mark.parametrize("spelling", ["float", "f4", "FLOAT32", "bf16", "complex64", "", " int8"])
def test_parse_refuses_aliases_and_unknown_names(spelling: str) -> None:
    with pytest.raises(InvalidValue) as info:
        DType.parse(spelling, "inputs[0].dtype")
    assert info.value.field == "inputs[0].dtype"
    assert info.value.value == spelling


def test_parse_refuses_non_strings() -> None:
    with pytest.raises(InvalidValue):
        DType.parse(4)


def test_parse_raises_the_requested_error_class() -> None:
    with pytest.raises(DescriptorInvalid):
        DType.parse("float", error=DescriptorInvalid)
