"""encode_call_frame writes the bytes encode_frame writes, from a kept header template."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts import call_frames
from edge_contracts.binary_header import BINARY_MAGIC, EVENT_BLOCK, KIND_CODES
from edge_contracts.call_frames import MAX_TEMPLATES, encode_call_frame, template_count
from edge_contracts.dtypes import DType
from edge_contracts.errors import HeaderMalformed
from edge_contracts.headers import Limits, ShmRef, TensorSpec, prechecked_header, tensor_totals
from edge_contracts.jsonvalues import EMPTY_OBJECT, JSONObject
from edge_contracts.protocol import (
    FEATURE_BINARY_HEADER,
    FEATURE_EVENT_FIELDS,
    FEATURE_SHM_TENSORS,
    OP_EVENT,
    OP_RUN,
)
from edge_contracts.wire import PREFIX, decode_frame, encode_frame, parse_header

LIMITS = Limits(max_io_bytes=1 << 20, supported_features=frozenset(
    {FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS, FEATURE_SHM_TENSORS}))
X = TensorSpec.inline_plain("x", DType.FLOAT32, (2, 2), 16)
MASK = TensorSpec.inline_plain("mask", DType.BOOL, (3,), 3)


@pytest.fixture(autouse=True)
def no_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_frames, "_TEMPLATES", {})


def payloads(specs: tuple[TensorSpec, ...]) -> list[memoryview]:
    return [memoryview(bytes(range(spec.nbytes))) for spec in specs if spec.ref is None]


def joined(parts: list[Any]) -> bytes:
    return b"".join(bytes(part) for part in parts)


def full(op: str, rid: str, specs: tuple[TensorSpec, ...], features: frozenset[str],
         meta: JSONObject = EMPTY_OBJECT, **event: Any) -> bytes:
    inline, total = tensor_totals(specs, features) if specs else (0, 0)
    header = prechecked_header(op, rid, "det", 2, 7, specs, meta, features, inline, total)
    return joined(encode_frame(header, payloads(specs), binary=True, **event))


@pytest.mark.parametrize("specs", [(), (X,), (X, MASK)])
def test_request_frames_equal_encode_frame_first_and_then_from_the_template(
    specs: tuple[TensorSpec, ...],
) -> None:
    for rid in ("r1", "r2", "r9", "a-longer-id", "r3"):  # same length: kept; other: its own
        frame = encode_call_frame(OP_RUN, rid, "det", 2, 7, specs, payloads(specs), frozenset())
        assert joined(frame) == full(OP_RUN, rid, specs, frozenset())
        header_len = PREFIX.unpack(frame[0][: PREFIX.size])[1]
        header = parse_header(frame[0][PREFIX.size : PREFIX.size + header_len], LIMITS,
                              binary=True)
        assert (header.request_id, header.stage_id, header.tensors) == (rid, "det", specs)
    assert template_count() == 2  # one per request-id length


def test_event_frames_take_each_call_s_block() -> None:
    features = frozenset({FEATURE_EVENT_FIELDS})
    for seq, meta in ((0, b""), (1, b""), (2, b'{"data":{"t":"a"}}'), (3, b"")):
        block = EVENT_BLOCK.pack(seq, 1000 + seq, KIND_CODES["done"])
        frame = encode_call_frame(OP_EVENT, "r1", "det", 2, 7, (X,), payloads((X,)),
                                  features, event_meta=meta, event_block=block)
        assert joined(frame) == full(OP_EVENT, "r1", (X,), features, event_meta=meta,
                                     event_block=block)
        header_len = PREFIX.unpack(frame[0][: PREFIX.size])[1]
        header = parse_header(frame[0][PREFIX.size : PREFIX.size + header_len], LIMITS,
                              binary=True)
        assert (header.meta["seq"], header.meta["created_ns"]) == (seq, 1000 + seq)
    assert template_count() == 2  # one per meta text


def test_events_without_the_block_are_kept_too() -> None:
    for _ in range(2):
        frame = encode_call_frame(OP_EVENT, "r1", "det", 2, 7, (), [], frozenset(),
                                  event_meta=b'{"seq":0,"kind":"done","created_ns":5}')
        assert frame[0][:4] == BINARY_MAGIC
        assert joined(frame) == full(OP_EVENT, "r1", (), frozenset(),
                                     event_meta=b'{"seq":0,"kind":"done","created_ns":5}')
    assert template_count() == 1


def test_params_and_long_event_meta_are_encoded_in_full() -> None:
    params = JSONObject({"temperature": 0.5})
    encode_call_frame(OP_RUN, "r1", "det", 2, 7, (X,), payloads((X,)), frozenset(),
                      meta=params)
    long_meta = b'{"data":{"t":"' + b"x" * 300 + b'"}}'
    encode_call_frame(OP_EVENT, "r1", "det", 2, 7, (), [], frozenset(), event_meta=long_meta)
    assert template_count() == 0


def test_a_new_epoch_generation_or_stage_gets_its_own_template() -> None:
    for stage, epoch, generation in (("det", 2, 7), ("det", 3, 7), ("det", 2, 8), ("rec", 2, 7)):
        frame = encode_call_frame(OP_RUN, "r1", stage, epoch, generation, (X,), payloads((X,)),
                                  frozenset())
        header_len = PREFIX.unpack(frame[0][: PREFIX.size])[1]
        header = parse_header(frame[0][PREFIX.size : PREFIX.size + header_len], LIMITS,
                              binary=True)
        assert (header.stage_id, header.epoch, header.generation) == (stage, epoch, generation)
    assert template_count() == 4


def test_templates_are_bounded() -> None:
    for index in range(MAX_TEMPLATES + 5):
        encode_call_frame(OP_RUN, "r1", f"s{index}", 0, 1, (), [], frozenset())
    assert 0 < template_count() <= MAX_TEMPLATES


def test_a_frame_from_a_template_reads_back_with_its_payload() -> None:
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    for rid in ("r1", "r2"):
        frame = encode_call_frame(OP_RUN, rid, "det", 2, 7, (X,), [memoryview(data).cast("B")],
                                  frozenset())
        decoded = decode_frame(joined(frame), LIMITS)
        assert decoded.header.request_id == rid
        assert bytes(decoded.payload) == data.tobytes()


def test_a_missing_event_block_is_refused_even_with_a_template() -> None:
    features = frozenset({FEATURE_EVENT_FIELDS})
    block = EVENT_BLOCK.pack(0, 1, KIND_CODES["done"])
    encode_call_frame(OP_EVENT, "r1", "det", 2, 7, (), [], features, event_meta=b"",
                      event_block=block)
    assert template_count() == 1
    with pytest.raises(HeaderMalformed) as refused:
        encode_call_frame(OP_EVENT, "r2", "det", 2, 7, (), [], features, event_meta=b"")
    assert refused.value.field == "header.event"


@pytest.mark.parametrize(("segments", "unlink", "gone"), [
    ([["edge_0123abcd_0123456789abcdef", 7]], [], []),
    ([], [["edge_0123abcd_0123456789abcdef", 2**63 - 1]], []),
    ([["a", 0], ["b.c-d_e", 12]], [["f", 3]], ["edge_0123abcd_fedcba9876543210", "g"]),
    ([], [], ["edge_0123abcd_fedcba9876543210"]),
])
def test_an_ack_frame_equals_encode_frame_s_and_reads_back(
    segments: list[list[Any]], unlink: list[list[Any]], gone: list[str],
) -> None:
    from edge_contracts.call_frames import encode_ack_frame
    from edge_contracts.headers import FrameHeader
    from edge_contracts.protocol import OP_ACK

    meta: dict[str, Any] = {"segments": segments}
    if unlink:
        meta["unlink"] = unlink
    if gone:
        meta["gone"] = gone
    header = FrameHeader(OP_ACK, "", "", 0, 5, meta=meta)
    (want,) = encode_frame(header, [], binary=True)
    raw = encode_ack_frame(5, segments, unlink, gone)
    assert raw == bytes(want)
    assert decode_frame(raw, LIMITS).header == header


@pytest.mark.parametrize(("segments", "gone"), [
    ([["edge\"x", 1]], []), ([["", 1]], []), ([["a" * 129, 1]], []), ([["a", -1]], []),
    ([["a", 2**63]], []), ([["a", True]], []), ([[1, 1]], []), ([], ["bad\\name"]),
])
def test_an_ack_frame_refuses_what_is_not_a_segment_and_generation(
    segments: list[list[Any]], gone: list[str],
) -> None:
    from edge_contracts.call_frames import encode_ack_frame

    with pytest.raises(HeaderMalformed):
        encode_ack_frame(5, segments, (), gone)


def test_frames_with_shared_memory_entries_take_each_frame_s_generations() -> None:
    shm = frozenset({FEATURE_SHM_TENSORS})
    with_fields = frozenset({FEATURE_SHM_TENSORS, FEATURE_EVENT_FIELDS})
    for op, features, block in ((OP_RUN, shm, b""),
                                (OP_EVENT, with_fields, EVENT_BLOCK.pack(1, 2, 3))):
        for generation in (3, 4, 2**63 - 1, 0):
            specs = (X, TensorSpec("big", DType.UINT8, (4096,), 4096,
                                   ShmRef("edge_abc_1", 4096, generation)),
                     TensorSpec("kv", DType.FLOAT32, (8,), 32,
                                ShmRef("edge_abc_2", 4096, generation // 2)),
                     MASK)
            frame = encode_call_frame(op, "r1", "det", 2, 7, specs, payloads(specs), features,
                                      event_meta=b"" if block else None, event_block=block)
            assert joined(frame) == full(op, "r1", specs, features,
                                         event_meta=b"" if block else None, event_block=block)
    assert template_count() == 2  # one per op: later frames wrote their generations in
    other = (TensorSpec("big", DType.UINT8, (4096,), 4096, ShmRef("edge_abc_9", 4096, 5)),)
    frame = encode_call_frame(OP_RUN, "r1", "det", 2, 7, other, [], shm)
    assert joined(frame) == full(OP_RUN, "r1", other, shm)  # another segment: its own
    assert template_count() == 3


def test_an_event_not_to_keep_is_encoded_in_full_and_keeps_nothing() -> None:
    fields = frozenset({FEATURE_EVENT_FIELDS})
    for generation in range(3):  # meta acknowledging inputs: new on every call
        meta = b'{"acks":[["edge_abc_1",%d]]}' % generation
        block = EVENT_BLOCK.pack(1, 2, 3)
        frame = encode_call_frame(OP_EVENT, "r1", "det", 2, 7, (X,), payloads((X,)), fields,
                                  event_meta=meta, event_block=block, keep=False)
        assert joined(frame) == full(OP_EVENT, "r1", (X,), fields, event_meta=meta,
                                     event_block=block)
    assert template_count() == 0


def test_an_event_whose_meta_is_new_every_call_keeps_its_template_without_it() -> None:
    fields = frozenset({FEATURE_SHM_TENSORS, FEATURE_EVENT_FIELDS})
    for generation in (3, 9, 10, 12345, 2**63 - 1, 0):  # the meta's length changes too
        meta = b'{"acks":[["edge_abc_1",%d]]}' % generation
        block = EVENT_BLOCK.pack(generation, 2, 3)
        specs = (X, TensorSpec("y", DType.FLOAT32, (8,), 32,
                               ShmRef("edge_out_1", 4096, generation // 2)))
        frame = encode_call_frame(OP_EVENT, "r1", "det", 2, 7, specs, payloads(specs), fields,
                                  event_meta=meta, event_block=block, meta_apart=True)
        assert joined(frame) == full(OP_EVENT, "r1", specs, fields, event_meta=meta,
                                     event_block=block)
        header_len = PREFIX.unpack(frame[0][: PREFIX.size])[1]
        header = parse_header(frame[0][PREFIX.size : PREFIX.size + header_len], LIMITS,
                              binary=True)
        assert header.meta["acks"] == (("edge_abc_1", generation),)
        assert header.tensors == specs
    assert template_count() == 1  # kept once, without the meta
    for meta in (b"", b'{"data":{"k":1}}'):  # another meta (or none) on the same template
        frame = encode_call_frame(OP_EVENT, "r1", "det", 2, 7, specs, payloads(specs), fields,
                                  event_meta=meta, event_block=block, meta_apart=True)
        assert joined(frame) == full(OP_EVENT, "r1", specs, fields, event_meta=meta,
                                     event_block=block)
    frame = encode_call_frame(OP_EVENT, "r1", "det", 2, 7, specs, payloads(specs), fields,
                              event_meta=b"", event_block=block)  # kept with its meta
    assert joined(frame) == full(OP_EVENT, "r1", specs, fields, event_meta=b"",
                                 event_block=block)
    assert template_count() == 2
