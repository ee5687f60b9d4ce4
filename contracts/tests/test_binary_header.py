"""The binary header's parsed-entry cache: a checked entry list is reused, never its limits."""

import pytest

from edge_contracts import binary_header
from edge_contracts.binary_header import encode_binary_header, parse_binary_header
from edge_contracts.dtypes import DType
from edge_contracts.errors import PayloadTooLarge, UnknownRequiredFeature
from edge_contracts.headers import FrameHeader, Limits, ShmRef, TensorSpec
from edge_contracts.wire import _DECODER

LIMITS = Limits(max_io_bytes=1 << 20)
X = TensorSpec("x", DType.FLOAT32, (2, 3), 24)


def parse(header: FrameHeader, limits: Limits = LIMITS) -> FrameHeader:
    raw = encode_binary_header(header)
    return parse_binary_header(raw, limits, payload_len=None, json_decoder=_DECODER)


def test_an_entry_list_already_checked_is_reused() -> None:
    first = parse(FrameHeader("run", "r1", "s", 0, 1, (X,)))
    second = parse(FrameHeader("run", "r2", "s", 0, 1, (X,), meta={"k": 1}))
    assert second.tensors is first.tensors and second.request_id == "r2"
    assert second.meta == {"k": 1}


def test_cached_entries_still_meet_the_reader_limits() -> None:
    parse(FrameHeader("run", "r1", "s", 0, 1, (X,)))
    with pytest.raises(PayloadTooLarge):
        parse(FrameHeader("run", "r2", "s", 0, 1, (X,)), Limits(max_io_bytes=23))


def test_entries_with_shared_memory_refs_are_never_kept() -> None:
    ref = TensorSpec("kv", DType.UINT8, (8,), 8, ShmRef("edge_seg", 0, 3))
    header = FrameHeader("event", "r1", "s", 0, 1, (ref,), required_features={"shm-tensors"})
    before = dict(binary_header._PARSED)
    assert parse(header) == header
    assert before == binary_header._PARSED
    with pytest.raises(UnknownRequiredFeature):  # and the feature check runs every time
        parse(header, Limits(max_io_bytes=1 << 20, supported_features=frozenset()))


def test_long_entry_lists_are_never_kept() -> None:
    specs = tuple(TensorSpec(f"t{i:03d}-" + "n" * 100, DType.UINT8, (1,), 1) for i in range(30))
    before = dict(binary_header._PARSED)
    header = FrameHeader("run", "r1", "s", 0, 1, specs)
    assert parse(header) == header
    assert before == binary_header._PARSED  # over 2 KiB of entries: parsed every time
