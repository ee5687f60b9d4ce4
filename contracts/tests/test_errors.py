import copy

import pytest

from edge_contracts import errors
from edge_contracts.errors import (
    ContractError,
    DescriptorInvalid,
    FeatureRefused,
    FrameTruncated,
    HeaderMalformed,
    HeaderTooLarge,
    InvalidValue,
    PayloadMismatch,
    PayloadTooLarge,
    StreamClosed,
    UnknownRequiredFeature,
    VersionMismatch,
    WireError,
)


def test_message_names_field_reason_and_value() -> None:
    exc = InvalidValue("buffer.nbytes", 97, "must equal prod(shape) * itemsize = 96")
    assert str(exc) == "buffer.nbytes: must equal prod(shape) * itemsize = 96: 97"
    assert (exc.field, exc.value, exc.reason) == (
        "buffer.nbytes",
        97,
        "must equal prod(shape) * itemsize = 96",
    )


def test_every_contract_error_is_a_value_error() -> None:
    assert issubclass(ContractError, ValueError)


@pytest.mark.parametrize(
    "cls",
    [
        FrameTruncated,
        StreamClosed,
        HeaderTooLarge,
        HeaderMalformed,
        VersionMismatch,
        UnknownRequiredFeature,
        DescriptorInvalid,
        PayloadTooLarge,
        PayloadMismatch,
    ],
)
def test_wire_errors_share_the_wire_base(cls: type[WireError]) -> None:
    assert issubclass(cls, WireError)
    assert issubclass(cls, ContractError)


def test_clean_end_of_stream_is_a_kind_of_truncation() -> None:
    assert issubclass(StreamClosed, FrameTruncated)


def test_feature_refused_aliases_unknown_required_feature() -> None:
    assert FeatureRefused is UnknownRequiredFeature


def test_header_and_descriptor_errors_are_invalid_values() -> None:
    assert issubclass(HeaderMalformed, InvalidValue)
    assert issubclass(DescriptorInvalid, InvalidValue)


def test_errors_survive_copy_with_their_attributes() -> None:
    exc = PayloadTooLarge("prefix.payload_len", 2**40, "must be <= max_io_bytes 1024")
    clone = copy.deepcopy(exc)
    assert type(clone) is PayloadTooLarge
    assert (clone.field, clone.value, clone.reason) == (exc.field, exc.value, exc.reason)
    assert str(clone) == str(exc)


def test_every_public_error_has_a_docstring() -> None:
    for name in errors.__all__:
        assert getattr(errors, name).__doc__, name
