"""The binary header's parsed-entry cache: a checked entry list is reused, never its limits."""

import pytest

from edge_contracts import binary_header
from edge_contracts.binary_header import encode_binary_header, parse_binary_header
from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    DescriptorInvalid,
    HeaderMalformed,
    PayloadMismatch,
    PayloadTooLarge,
    UnknownRequiredFeature,
)
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


def shm_header(generation: int, segment: str = "edge_seg", request_id: str = "r1",
               offset: int = 4096) -> FrameHeader:
    ref = TensorSpec("kv", DType.UINT8, (8,), 8, ShmRef(segment, offset, generation))
    return FrameHeader("event", request_id, "s", 0, 1, (X, ref),
                       required_features={"shm-tensors"})


def test_entries_with_shared_memory_refs_are_kept_without_their_generations() -> None:
    binary_header._PARSED_REFS.clear()
    before = dict(binary_header._PARSED)
    assert parse(shm_header(3)) == shm_header(3)
    assert before == binary_header._PARSED and len(binary_header._PARSED_REFS) == 1
    for generation in (4, 2**63 - 1, 0):  # each frame's own generation, on kept entries
        assert parse(shm_header(generation, request_id=f"r{generation}")) == shm_header(
            generation, request_id=f"r{generation}")
    assert len(binary_header._PARSED_REFS) == 1
    assert parse(shm_header(5, segment="edge_other")) == shm_header(5, segment="edge_other")
    assert len(binary_header._PARSED_REFS) == 2  # another segment: checked, then kept
    with pytest.raises(UnknownRequiredFeature):  # and the feature check runs every time
        parse(shm_header(6), Limits(max_io_bytes=1 << 20, supported_features=frozenset()))


def test_a_kept_shared_memory_entry_still_refuses_what_the_full_parser_refuses() -> None:
    parse(shm_header(3))  # kept
    raw = bytearray(raw_of(shm_header(3)))
    generation_at = raw.index(b"edge_seg") - 8
    raw[generation_at : generation_at + 8] = (2**63).to_bytes(8, "little")
    with pytest.raises(DescriptorInvalid) as refused:
        parse_raw(bytes(raw))
    assert refused.value.field == "header.tensors[1].ref.generation"
    raw = bytearray(raw_of(shm_header(4)))
    raw[3] &= ~1  # the shm-tensors feature bit cleared: a ref needs it
    with pytest.raises(DescriptorInvalid) as refused:
        parse_raw(bytes(raw))
    assert refused.value.field == "header.tensors[1].ref"
    with pytest.raises(DescriptorInvalid) as refused:  # a bad segment name: never kept
        parse_raw(raw_of(shm_header(3)).replace(b"edge_seg", b"edge/seg"))
    assert refused.value.field == "header.tensors[1].ref.segment"


@pytest.mark.parametrize("seed", range(4))
def test_kept_shared_memory_entries_change_no_outcome_of_mutated_frames(seed: int) -> None:
    """Differential: every mutation of a header whose entries are kept without their
    generations parses (or fails) as it does with no entry kept."""
    import random

    rng = random.Random(seed)
    kinds = [shm_header(7), shm_header(2**40, segment="edge_0123abcd_0123456789abcdef")]
    for _ in range(1500):
        raw = bytearray(raw_of(rng.choice(kinds)))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            raw[at] = rng.randrange(256)
        binary_header._PARSED_REFS.clear()
        for header in kinds:  # kept: the unmutated forms
            parse_raw(raw_of(header))
        with_kept = outcome(bytes(raw), None)
        binary_header._PARSED_REFS.clear()
        binary_header._PARSED.clear()
        binary_header._KEPT.clear()
        binary_header._KEPT_REFS.clear()
        assert outcome(bytes(raw), None) == with_kept


def test_long_entry_lists_are_never_kept() -> None:
    specs = tuple(TensorSpec(f"t{i:03d}-" + "n" * 100, DType.UINT8, (1,), 1) for i in range(30))
    before = dict(binary_header._PARSED)
    header = FrameHeader("run", "r1", "s", 0, 1, specs)
    assert parse(header) == header
    assert before == binary_header._PARSED  # over 2 KiB of entries: parsed every time


FIELDS = frozenset({"event-fields"})


def event(meta: dict[str, object], features: frozenset[str] = FIELDS) -> FrameHeader:
    return FrameHeader("event", "r1", "s", 2, 1, (X,), meta=meta, required_features=features)


def test_event_fields_round_trip_with_and_without_other_meta() -> None:
    bare = event({"seq": 4, "kind": "done", "created_ns": 2**63 - 1})
    raw = encode_binary_header(bare)
    assert raw.endswith(binary_header.EVENT_BLOCK.pack(4, 2**63 - 1, 3) + b"".join(
        [binary_header._tensor_bytes((X,))]))  # block after the ids, no meta JSON at all
    assert parse(bare) == bare
    full = event({"seq": 0, "kind": "token", "created_ns": 7, "data": {"text": "é"},
                  "error": None, "acks": [["edge_a", 1]]})
    assert parse(full) == full
    assert b'"seq"' not in encode_binary_header(full)  # only the other keys are JSON


@pytest.mark.parametrize(("meta", "field"), [
    ({"kind": "done", "created_ns": 1}, "header.meta.seq"),
    ({"seq": -1, "kind": "done", "created_ns": 1}, "header.meta.seq"),
    ({"seq": 1, "kind": "done", "created_ns": True}, "header.meta.created_ns"),
    ({"seq": 1, "kind": "finished", "created_ns": 1}, "header.meta.kind"),
])
def test_event_fields_are_checked_when_encoded(meta: dict[str, object], field: str) -> None:
    with pytest.raises(HeaderMalformed) as info:
        encode_binary_header(event(meta))
    assert info.value.field == field


def test_event_fields_belong_to_events_only() -> None:
    with pytest.raises(HeaderMalformed) as info:
        encode_binary_header(FrameHeader("run", "r1", "s", 0, 1, (X,), required_features=FIELDS))
    assert info.value.field == "header.required_features"
    block = binary_header.EVENT_BLOCK.pack(0, 0, 3)
    with pytest.raises(HeaderMalformed):  # the block without the feature, or the reverse
        binary_header.encode_event_header(event({}, frozenset()), b"", block)
    with pytest.raises(HeaderMalformed):
        binary_header.encode_event_header(event({}), b"")


def test_a_reader_without_event_fields_refuses_the_block() -> None:
    without = Limits(max_io_bytes=1 << 20, supported_features=frozenset({"shm-tensors"}))
    with pytest.raises(UnknownRequiredFeature):
        parse(event({"seq": 1, "kind": "done", "created_ns": 1}), without)


# -- kept whole headers: an equal header differs only in its request id and event block --


def raw_of(header: FrameHeader) -> bytes:
    return encode_binary_header(header)


def parse_raw(raw: bytes, limits: Limits = LIMITS, payload_len: int | None = None) -> FrameHeader:
    return parse_binary_header(raw, limits, payload_len=payload_len, json_decoder=_DECODER)


@pytest.mark.parametrize(
    "make",
    [
        lambda rid: FrameHeader("run", rid, "s", 0, 1, (X,), meta={"temperature": 0.5}),
        lambda rid: FrameHeader("run", rid, "s", 3, 9, ()),
        lambda rid: event({"seq": len(rid), "kind": "done", "created_ns": 77}),
        lambda rid: FrameHeader("event", rid, "s", 2, 1, (X,),
                                meta={"seq": 1, "kind": "token", "created_ns": 5,
                                      "data": {"text": "a"}}),
    ],
)
def test_a_kept_header_gives_what_the_full_parser_gives(make: object) -> None:
    binary_header._KEPT.clear()
    for rid in ("r1", "r2", "q7", "r1"):
        header = make(rid)  # type: ignore[operator]
        assert parse_raw(raw_of(header)) == header
    assert len(binary_header._KEPT) == 1


def test_a_kept_event_header_takes_each_frame_s_block() -> None:
    binary_header._KEPT.clear()
    for seq in range(4):
        header = event({"seq": seq, "kind": "output" if seq < 3 else "done",
                        "created_ns": 10 * seq})
        parsed = parse_raw(raw_of(header))
        assert (parsed.meta["seq"], parsed.meta["kind"]) == (seq, header.meta["kind"])
    assert len(binary_header._KEPT) == 1


def test_what_differs_from_a_kept_header_is_still_refused_by_the_full_parser() -> None:
    binary_header._KEPT.clear()
    good = event({"seq": 1, "kind": "done", "created_ns": 5})
    raw = raw_of(good)
    parse_raw(raw)
    at = binary_header.FIXED.size
    with pytest.raises(HeaderMalformed) as refused:  # an unprintable request id
        parse_raw(raw[:at] + b"r\x07" + raw[at + 2 :])
    assert refused.value.field == "header.request_id"
    with pytest.raises(HeaderMalformed) as refused:  # a request id that is not UTF-8
        parse_raw(raw[:at] + b"r\xff" + raw[at + 2 :])
    assert refused.value.field == "header.request_id"
    block_at = at + 2 + 1  # request id "r1", stage id "s"
    with pytest.raises(HeaderMalformed) as refused:  # seq over INT64_MAX in the block
        parse_raw(raw[:block_at] + (2**64 - 1).to_bytes(8, "little") + raw[block_at + 8 :])
    assert refused.value.field == "header.meta.seq"
    with pytest.raises(PayloadMismatch):
        parse_raw(raw, payload_len=5)
    assert parse_raw(raw, payload_len=24) == good


def test_a_truncated_header_never_matches_a_kept_one() -> None:
    binary_header._KEPT.clear()
    bare = FrameHeader("run", "r1", "", 0, 1, ())  # empty stage id, no entries, no meta
    raw = raw_of(bare)
    parse_raw(raw)
    with pytest.raises(HeaderMalformed):
        parse_raw(raw[:-1])  # the same fixed part and nothing after the id: still refused


def outcome(raw: bytes, payload_len: int | None) -> object:
    try:
        return parse_raw(raw, payload_len=payload_len)
    except Exception as exc:
        return (type(exc).__name__, getattr(exc, "field", None))


@pytest.mark.parametrize("seed", range(4))
def test_kept_headers_change_no_outcome_of_mutated_frames(seed: int) -> None:
    """Differential: every mutation of a kept header parses (or fails) as without the cache."""
    import random

    rng = random.Random(seed)
    kinds = [
        FrameHeader("run", "a1b2-17", "det", 3, 9, (X,)),
        event({"seq": 5, "kind": "output", "created_ns": 99}),
        FrameHeader("event", "a1b2-17", "det", 3, 9, (X,), meta={"seq": 1, "kind": "done",
                                                                 "created_ns": 5}),
    ]
    for _ in range(1500):
        raw = bytearray(raw_of(rng.choice(kinds)))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            raw[at] = rng.randrange(256)
        if rng.random() < 0.2:
            raw = raw[: rng.randrange(len(raw) + 1)]
        payload_len = rng.choice([None, 24, 0])
        binary_header._KEPT.clear()
        for header in kinds:  # kept: the unmutated forms
            parse_raw(raw_of(header))
        with_kept = outcome(bytes(raw), payload_len)
        binary_header._KEPT.clear()
        binary_header._PARSED.clear()
        assert outcome(bytes(raw), payload_len) == with_kept


def test_a_cached_entry_list_is_not_taken_for_another_tensor_count() -> None:
    raw = bytearray(raw_of(FrameHeader("run", "r1", "s", 0, 1, (X,))))
    parse_raw(bytes(raw))  # its entry list is kept
    raw[8] = 2  # the fixed part's tensor count (u16 at offset 8): two, with one entry
    binary_header._KEPT.clear()
    with pytest.raises(DescriptorInvalid) as refused:
        parse_raw(bytes(raw))
    assert refused.value.field.startswith("header.tensors[1]")


def ack(generation: int, channel: int = 1, **meta: object) -> FrameHeader:
    return FrameHeader("ack", "", "", 0, channel,
                       meta={"segments": [["edge_seg", generation]], **meta})


def test_ack_headers_are_kept_apart_without_their_meta() -> None:
    """An ack's meta lists generations, new on every call: kept with the others, it would
    only push out the headers that repeat; kept apart, its meta is read from each frame."""
    binary_header._KEPT.clear()
    binary_header._KEPT_ACKS.clear()
    for generation in (0, 1, 9, 10, 2**63 - 1):  # the meta's length changes too
        header = ack(generation)
        if binary_header._KEPT_ACKS:  # built from the kept one, as the full parser builds it
            assert binary_header.kept_header(raw_of(header), LIMITS, 0) == header
        assert parse_raw(raw_of(header)) == header
    assert binary_header._KEPT == {} and len(binary_header._KEPT_ACKS) == 1
    for other in (ack(3, channel=2), ack(3, unlink=[["edge_seg", 2]]), ack(3, gone=["edge_x"]),
                  FrameHeader("ack", "", "", 0, 1)):  # another generation; other meta; none
        built = binary_header.kept_header(raw_of(other), LIMITS, 0)
        assert built == (None if other.generation == 2 else other)
        assert parse_raw(raw_of(other)) == other
    assert binary_header.kept_header(raw_of(ack(3)), LIMITS, 5) is None  # a payload
    with pytest.raises(HeaderMalformed) as refused:  # a generation over int64: refused
        parse_raw(raw_of(ack(2**63 - 1)).replace(b"9223372036854775807", b"9223372036854775808"))
    assert refused.value.field == "header.meta.segments[0][1]"
    with pytest.raises(HeaderMalformed) as refused:  # a duplicate key: refused
        parse_raw(raw_of(ack(1, gone=["edge_x"])).replace(b'"gone"', b'"segments"'))
    assert refused.value.field == "header.meta"
    parse_raw(raw_of(FrameHeader("run", "r1", "s", 0, 1, (X,))))
    assert len(binary_header._KEPT) == 1


# -- kept headers with shared-memory entries: each frame's generations and meta read --

SHM_EVENT = frozenset({"shm-tensors", "event-fields"})


def zero_copy_done(generation: int, ack: int = 5, request_id: str = "r1",
                   segment: str = "edge_seg", offset: int = 4096,
                   shape: tuple[int, ...] = (2, 4), **meta: object) -> FrameHeader:
    """A zero-copy DONE: its output in the worker's segment, the input acknowledged."""
    y = TensorSpec("y", DType.FLOAT32, shape, 32, ShmRef(segment, offset, generation))
    return FrameHeader("event", request_id, "s", 0, 1, (X, y), required_features=SHM_EVENT,
                       meta={"seq": 0, "kind": "done", "created_ns": 9,
                             "acks": [["edge_in", ack]], **meta})


def test_a_header_with_shared_memory_entries_is_kept_without_generations_and_meta() -> None:
    binary_header._KEPT_REFS.clear()
    for generation, ack, rid in ((3, 5, "r1"), (4, 9, "r2"), (5, 10, "q3"),
                                 (2**63 - 1, 2**63 - 1, "r4"), (0, 0, "r5")):
        header = zero_copy_done(generation, ack, rid)  # the acks' meta changes length too
        if binary_header._KEPT_REFS:  # built from the kept one, as the full parser builds it
            assert binary_header.kept_header(raw_of(header), LIMITS, 24) == header
        assert parse_raw(raw_of(header), payload_len=24) == header
    assert len(binary_header._KEPT_REFS) == 1
    kept = dict(binary_header._KEPT_REFS)
    # what else may differ, in bytes of the same length: each parsed as it is, not as kept
    for other in (zero_copy_done(6, segment="edge_seh"), zero_copy_done(6, offset=8192),
                  zero_copy_done(6, shape=(4, 2)), zero_copy_done(6, data={"k": 1}),
                  zero_copy_done(6, segment="edge_segment_longer")):
        binary_header._KEPT_REFS.clear()
        binary_header._KEPT_REFS.update(kept)
        if "data" not in other.meta:  # (other meta: read from the frame, on the kept entries)
            assert binary_header.kept_header(raw_of(other), LIMITS, 24) is None
        assert parse_raw(raw_of(other)) == other
    assert len(binary_header._KEPT_REFS) == 2  # the longer segment name: another length
    request = FrameHeader("run", "r1", "s", 0, 1, (shm_header(3).tensors[1],),
                          required_features={"shm-tensors"})  # no block, no meta
    for generation in (3, 4):
        header = FrameHeader("run", f"r{generation}", "s", 0, 1,
                             (shm_header(generation).tensors[1],),
                             required_features={"shm-tensors"})
        assert parse_raw(raw_of(header)) == header
    assert parse_raw(raw_of(request)) == request



def test_headers_alternating_between_segments_are_each_kept() -> None:
    """A producer whose last segment is still held hands out another: replies alternate.

    Up to four headers of one key (the same fixed part and stage) are kept, so replies
    alternating between two segments of the same name length, or two offsets of one, are
    each built from their own kept header; a fifth of the key drops the oldest.
    """
    binary_header._KEPT_REFS.clear()
    looks = [dict(segment="edge_seg"), dict(segment="edge_seh"),
             dict(segment="edge_seg", offset=8192)]
    for generation in range(1, 4):
        for look in looks:
            header = zero_copy_done(generation, **look)  # type: ignore[arg-type]
            found = binary_header.kept_header(raw_of(header), LIMITS, 24)
            assert found == (header if generation > 1 else None), look
            assert parse_raw(raw_of(header), payload_len=24) == header
    assert len(binary_header._KEPT_REFS) == 1  # one key, three headers kept under it
    for name in ("edge_se1", "edge_se2"):  # two more: the oldest kept (edge_seg) dropped
        parse_raw(raw_of(zero_copy_done(1, segment=name)), payload_len=24)
    assert binary_header.kept_header(raw_of(zero_copy_done(7)), LIMITS, 24) is None
    again = zero_copy_done(8, segment="edge_se2")
    assert binary_header.kept_header(raw_of(again), LIMITS, 24) == again


def test_a_decoder_other_than_the_wires_never_reads_a_kept_header() -> None:
    """Kept headers are decoded with the wire's decoder: another one parses every header."""
    import json

    class NoFloats(json.JSONDecoder):
        def __init__(self) -> None:
            def refuse(text: str) -> float:
                raise ValueError(f"no floats: {text}")
            super().__init__(parse_float=refuse)

    binary_header._KEPT_REFS.clear()
    parse_raw(raw_of(zero_copy_done(3)), payload_len=24)  # kept, by the wire's decoder
    with_float = zero_copy_done(4, data={"x": 1.5})
    with pytest.raises(HeaderMalformed):
        parse_binary_header(raw_of(with_float), LIMITS, payload_len=24, json_decoder=NoFloats())
    before = dict(binary_header._KEPT_REFS)
    parse_binary_header(raw_of(zero_copy_done(5, segment="edge_sex")), LIMITS, payload_len=24,
                        json_decoder=NoFloats())
    assert before == binary_header._KEPT_REFS  # nothing kept through another decoder


def test_a_kept_shared_memory_header_still_refuses_what_the_full_parser_refuses() -> None:
    binary_header._KEPT_REFS.clear()
    parse_raw(raw_of(zero_copy_done(3)))  # kept
    raw = bytearray(raw_of(zero_copy_done(3)))
    generation_at = raw.index(b"edge_seg") - 8
    raw[generation_at : generation_at + 8] = (2**63).to_bytes(8, "little")
    with pytest.raises(DescriptorInvalid) as refused:  # a stale-looking, impossible one
        parse_raw(bytes(raw))
    assert refused.value.field == "header.tensors[1].ref.generation"
    too_big = raw_of(zero_copy_done(3, ack=2**63 - 1)).replace(b"9223372036854775807",
                                                                b"9223372036854775808")
    with pytest.raises(HeaderMalformed) as refused:
        parse_raw(too_big)
    assert refused.value.field == "header.meta.acks[0][1]"
    with pytest.raises(HeaderMalformed) as refused:  # a field of the block again in JSON
        parse_raw(raw_of(zero_copy_done(3)).replace(b'"acks"', b'"seq" '))
    assert refused.value.field == "header.meta"
    with pytest.raises(HeaderMalformed) as refused:  # not JSON
        parse_raw(raw_of(zero_copy_done(3)).replace(b'"acks"', b"'acks'"))
    assert refused.value.field == "header.meta"
    with pytest.raises(PayloadMismatch):
        parse_raw(raw_of(zero_copy_done(3)), payload_len=5)
    assert len(binary_header._KEPT_REFS) == 1


@pytest.mark.parametrize("seed", range(4))
def test_kept_shared_memory_headers_change_no_outcome_of_mutated_frames(seed: int) -> None:
    """Differential: every mutation of a header with shared-memory entries, or of an ack,
    parses (or fails) as it does with nothing kept."""
    import random

    rng = random.Random(seed)
    kinds = [zero_copy_done(7), zero_copy_done(2**40, 123456, "a1b2-17",
                                               segment="edge_0123abcd_0123456789abcdef"),
             shm_header(9), ack(17), ack(2**40, unlink=[["edge_o", 3]])]
    for _ in range(1500):
        raw = bytearray(raw_of(rng.choice(kinds)))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            raw[at] = rng.randrange(256)
        if rng.random() < 0.2:
            raw = raw[: rng.randrange(len(raw) + 1)]
        payload_len = rng.choice([None, 24, 0])
        binary_header._KEPT_REFS.clear()
        binary_header._KEPT_ACKS.clear()
        for header in kinds:  # kept: the unmutated forms
            parse_raw(raw_of(header))
        with_kept = outcome(bytes(raw), payload_len)
        binary_header._PARSED_REFS.clear()
        binary_header._PARSED.clear()
        binary_header._KEPT.clear()
        binary_header._KEPT_REFS.clear()
        binary_header._KEPT_ACKS.clear()
        assert outcome(bytes(raw), payload_len) == with_kept


def _frozen_by_the_parser(text: bytes) -> object:
    """What the full parser's decode and freeze make of a meta text (None: it refuses)."""
    from edge_contracts.jsonvalues import STRICT_DECODER, freeze_object

    try:
        decoded = STRICT_DECODER.decode(text.decode("utf-8"))
        if type(decoded) is not dict:
            return None
        return freeze_object(decoded, "header.meta", error=HeaderMalformed)
    except (ValueError, RecursionError, HeaderMalformed):
        return None


def test_the_usual_pairs_meta_is_read_as_the_parser_freezes_it() -> None:
    """``pairs_meta`` gives the parser's own value for its texts, and None for any other.

    Texts as ack_pairs_text writes them, then mutated (a byte changed, dropped or doubled,
    spaces, escapes, signs, leading zeros, generations around INT64_MAX): wherever the
    fast read answers, its value equals the decoded and frozen one, type for type.
    """
    import random

    from edge_contracts.binary_header import ack_pairs_text, pairs_meta
    from edge_contracts.validation import INT64_MAX

    rng = random.Random(38)
    alphabet = "abcXYZ019_.-"
    texts = [b'{"acks":[["a",9223372036854775807]]}', b'{"acks":[["a",9223372036854775808]]}',
             b'{"acks":[["a",01]]}', b'{"acks":[["a",-1]]}', b'{"acks":[]}',
             b'{"acks":[["a",1],]}', b'{"acks": [["a",1]]}', b'{"acks":[["a\\u0041",1]]}',
             b'{"segments":[["s",0]],"unlink":[["s",0]]}', b'{"acks":[["a",1.0]]}',
             b'{"acks":[["' + b"n" * 129 + b'",1]]}', b'{"ACKS":[["a",1]]}']
    for _ in range(400):
        pairs = [["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))),
                  rng.choice([0, 1, rng.randint(0, INT64_MAX), INT64_MAX])]
                 for _ in range(rng.randint(1, 4))]
        key = rng.choice(["acks", "segments"])
        texts.append(f'{{"{key}":{ack_pairs_text(pairs)}}}'.encode())
    mutated = []
    for text in texts:
        for _ in range(6):
            at = rng.randrange(len(text))
            change = rng.choice(["flip", "drop", "double", "space"])
            if change == "flip":
                mutated.append(text[:at] + bytes([rng.choice(b'[]",{}: 0123456789a\\-')])
                               + text[at + 1:])
            elif change == "drop":
                mutated.append(text[:at] + text[at + 1:])
            elif change == "double":
                mutated.append(text[:at] + text[at:at + 1] + text[at:])
            else:
                mutated.append(text[:at] + b" " + text[at:])
    read = 0
    for text in texts + mutated:
        for prefix in (b"", b"\x00" * 7):  # read where it starts, after other bytes
            fast = pairs_meta(prefix + text, len(prefix))
            if fast is None:
                continue
            read += 1
            parsed = _frozen_by_the_parser(text)
            assert fast == parsed, text
            (key, value), = fast.items()
            (parsed_key, parsed_value), = parsed.items()  # type: ignore[union-attr]
            assert key == parsed_key
            assert type(value) is type(parsed_value) is tuple, text
            for pair, parsed_pair in zip(value, parsed_value, strict=True):
                assert type(pair) is type(parsed_pair) is tuple
                assert [type(item) for item in pair] == [type(item) for item in parsed_pair]
    assert read >= 800  # the usual texts themselves were read fast (400 of them, twice)
    assert pairs_meta(b'{"acks":[]}', 0) is None  # an empty list: the parser's own way


def test_a_kept_ack_and_a_kept_reply_read_the_pairs_without_decoding_them() -> None:
    """The kept paths take the pairs' fast read: the JSON decoder is not called for them."""
    from unittest import mock

    from edge_contracts.binary_header import encode_ack_header, kept_header

    binary_header._KEPT_REFS.clear()

    ack = encode_ack_header(3, [["seg_a", 5]])
    strict = binary_header.STRICT_DECODER  # (only a header parsed with it is kept)
    full = parse_binary_header(ack, LIMITS, payload_len=0, json_decoder=strict)
    with mock.patch.object(binary_header, "STRICT_DECODER", wraps=strict) as decoder:
        again = encode_ack_header(3, [["seg_a", 6]])
        kept = kept_header(again, LIMITS, 0)
        assert kept is not None and kept.meta == {"segments": (("seg_a", 6),)}
        assert decoder.decode.call_count == 0
    assert full.meta == {"segments": (("seg_a", 5),)}
    # a header with a shared-memory entry and its inputs' acknowledgement (a zero-copy DONE)
    done = encode_binary_header(FrameHeader(
        "event", "r1", "s", 0, 1, shm_header(3).tensors, meta={"acks": [["in_a", 7]]},
        required_features={"shm-tensors"}))
    parse_binary_header(done, LIMITS, payload_len=None, json_decoder=strict)  # kept
    again = encode_binary_header(FrameHeader(
        "event", "r2", "s", 0, 1, shm_header(4).tensors, meta={"acks": [["in_a", 8]]},
        required_features={"shm-tensors"}))
    with mock.patch.object(binary_header, "STRICT_DECODER", wraps=strict) as decoder:
        kept = kept_header(again, LIMITS, None)
        assert kept is not None and kept.meta == {"acks": (("in_a", 8),)}
        assert kept.tensors[1].ref is not None and kept.tensors[1].ref.generation == 4
        assert decoder.decode.call_count == 0
