import pytest

from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    DescriptorInvalid,
    HeaderMalformed,
    InvalidValue,
)
from edge_contracts.headers import FrameHeader, Limits, ShmRef, TensorSpec
from edge_contracts.protocol import KNOWN_FEATURES, PROTOCOL_VERSION

REF = ShmRef("edge_0badcafe_k3v9", 4096, 7)


def header(**changes: object) -> FrameHeader:
    fields: dict[str, object] = {
        "op": "call",
        "request_id": "r1",
        "stage_id": "det",
        "epoch": 1,
        "generation": 2,
    }
    fields.update(changes)
    return FrameHeader(**fields)  # type: ignore[arg-type]


def test_tensor_spec_round_trips_and_parses_dtype() -> None:
    spec = TensorSpec("x", "float16", [2, 3], 12)  # type: ignore[arg-type]
    assert spec.dtype is DType.FLOAT16
    assert spec.shape == (2, 3)
    assert TensorSpec.from_dict(spec.to_dict()) == spec
    shm = TensorSpec("kv", DType.UINT8, (8,), 8, REF)
    assert TensorSpec.from_dict(shm.to_dict()) == shm


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("x", "float32", (2, 2), 15), "tensor.nbytes"),
        (("x", "float32", (1,) * 33, 4), "tensor.shape"),
        (("x", "float32", (2, -2), 0), "tensor.shape[1]"),
        (("x", "complex64", (2,), 16), "tensor.dtype"),
        (("", "uint8", (1,), 1), "tensor.name"),
        (("x", "uint8", (1,), 1, "segment"), "tensor.ref"),
    ],
)
def test_tensor_spec_errors_are_descriptor_errors(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(DescriptorInvalid) as info:
        TensorSpec(*args)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("/psm_1", 0, 0), "ref.segment"),
        (("", 0, 0), "ref.segment"),
        (("s" * 129, 0, 0), "ref.segment"),
        (("seg", -1, 0), "ref.offset"),
        (("seg", 0, True), "ref.generation"),
    ],
)
def test_shm_ref_errors_are_descriptor_errors(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(DescriptorInvalid) as info:
        ShmRef(*args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_header_derives_inline_and_total_bytes() -> None:
    made = header(
        tensors=(
            TensorSpec("a", DType.UINT8, (3,), 3),
            TensorSpec("kv", DType.UINT8, (8,), 8, REF),
        ),
        required_features=frozenset({"shm-tensors"}),
    )
    assert made.inline_nbytes == 3
    assert made.total_nbytes == 11
    assert made.version == PROTOCOL_VERSION


def test_header_round_trips_through_its_wire_object() -> None:
    made = header(
        tensors=[TensorSpec("a", DType.BOOL, (2,), 2)],
        meta={"bucket": [640, 640]},
        required_features=["cancel"],
    )
    assert FrameHeader.from_dict(made.to_dict()) == made
    assert made.to_dict()["required_features"] == ["cancel"]


def test_connection_level_frames_may_have_empty_ids() -> None:
    assert header(op="hello", request_id="", stage_id="").request_id == ""


def test_shared_memory_tensor_requires_its_feature() -> None:
    with pytest.raises(DescriptorInvalid) as info:
        header(tensors=(TensorSpec("kv", DType.UINT8, (8,), 8, REF),))
    assert info.value.field == "header.tensors[0].ref"


def test_tensor_names_are_unique_within_a_header() -> None:
    spec = TensorSpec("a", DType.UINT8, (1,), 1)
    with pytest.raises(DescriptorInvalid) as info:
        header(tensors=(spec, spec))
    assert info.value.field == "header.tensors[1].name"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"op": "Call"}, "header.op"),
        ({"op": ""}, "header.op"),
        ({"request_id": "a\x07"}, "header.request_id"),
        ({"epoch": -1}, "header.epoch"),
        ({"generation": 2**63}, "header.generation"),
        ({"meta": [1]}, "header.meta"),
        ({"required_features": ["Bad Name"]}, "header.required_features"),
        ({"required_features": [{"x": 1}]}, "header.required_features"),
        ({"version": 0}, "header.version"),
    ],
)
def test_invalid_header_fields_are_malformed_headers(change: dict[str, object], field: str) -> None:
    with pytest.raises(HeaderMalformed) as info:
        header(**change)
    assert info.value.field == field


def test_from_dict_requires_every_key() -> None:
    data = header().to_dict()
    del data["meta"]
    with pytest.raises(HeaderMalformed) as info:
        FrameHeader.from_dict(data)
    assert info.value.field == "header.meta"


def test_limits_are_keyword_only_with_defaults() -> None:
    limits = Limits(max_io_bytes=1024)
    assert limits.max_header_bytes == 65536
    assert limits.max_tensors == 1024
    assert limits.supported_features == KNOWN_FEATURES
    assert Limits.from_dict(limits.to_dict()) == limits
    with pytest.raises(TypeError):
        Limits(65536, 1024)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_io_bytes": -1}, "limits.max_io_bytes"),
        ({"max_header_bytes": 0}, "limits.max_header_bytes"),
        ({"max_header_bytes": 2**32}, "limits.max_header_bytes"),
        ({"max_tensors": -1}, "limits.max_tensors"),
        ({"supported_features": ["Bad"]}, "limits.supported_features"),
    ],
)
def test_invalid_limits_are_refused(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as info:
        Limits(**{"max_io_bytes": 10, **change})  # type: ignore[arg-type]
    assert info.value.field == field


def test_with_generation_replaces_only_the_generation_and_checks_it() -> None:
    from edge_contracts.headers import with_generation

    spec = TensorSpec("x", DType.FLOAT32, (2, 3), 24, ShmRef("edge_seg", 4096, 3))
    assert with_generation(spec, 2**63 - 1) == TensorSpec(
        "x", DType.FLOAT32, (2, 3), 24, ShmRef("edge_seg", 4096, 2**63 - 1))
    assert spec.ref is not None and spec.ref.generation == 3  # the kept entry is unchanged
    for bad in (-1, 2**63, True, 1.0):
        with pytest.raises(DescriptorInvalid) as refused:
            with_generation(spec, bad)  # type: ignore[arg-type]
        assert refused.value.field == "ref.generation"
    with pytest.raises(DescriptorInvalid) as refused:
        with_generation(TensorSpec("x", DType.FLOAT32, (2, 3), 24), 1)
    assert refused.value.field == "tensor.ref"
