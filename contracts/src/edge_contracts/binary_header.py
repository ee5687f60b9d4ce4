"""The fixed binary header of per-request frames (request, event, ack).

Frames whose prefix magic is :data:`BINARY_MAGIC` (``b"EDGB"``) carry their header in
this layout instead of JSON; everything else about the frame (prefix, payload, limits,
order of checks) is as in :mod:`edge_contracts.wire`. Only the ops a request makes on
every call use it (``run``, ``generate``, ``event``, ``ack``); control frames and
``meta`` (request params, event data) stay JSON. A peer sends it only when the channel
negotiated :data:`~edge_contracts.protocol.FEATURE_BINARY_HEADER`, and a reader refuses
it unless its limits support that feature. docs/wire.md records the layout and why.

Layout, all integers little-endian::

    fixed        34 bytes, struct "<HBBHHHIIQQ":
                 version u16, op code u8, required-feature bits u8,
                 request id bytes u16, stage id bytes u16, tensor count u16,
                 tensor entry bytes u32, meta bytes u32, epoch u64, generation u64
    request id   UTF-8
    stage id     UTF-8
    event block  only with the ``event-fields`` feature bit (events only), 17 bytes,
                 struct "<QQB": seq u64, created_ns u64, kind code u8 (output, token,
                 progress, done, error, cancelled = 0..5); ``meta`` then holds the
                 event's other keys, never these three
    tensors      per tensor, struct "<HBBBQ": name bytes u16, dtype code u8,
                 dimension count u8, ref flag u8 (0 inline, 1 shared memory), nbytes u64;
                 then one u64 per dimension; then the UTF-8 name; with a ref, struct
                 "<HQQ": segment bytes u16, offset u64, generation u64, then the segment
    meta         ``meta bytes`` of compact UTF-8 JSON, one object; 0 bytes: ``{}``

The tensor entries fill exactly ``tensor entry bytes`` and the header ends exactly after
``meta``. :func:`parse_binary_header` runs the same checks as the JSON parser, in the
same order (length, version, features, tensor count, every field and tensor entry, total
bytes, payload length), so a refusal raises the same error class naming the same field;
it reads no byte past the header. A stream repeats the same few inline tensor lists, so
the parsed entries are kept per distinct entry bytes (bounded): an entry list already
checked is not parsed or validated again (lists over 2 KiB are always parsed, so the
cache holds at most 1024 x 2 KiB). A list with shared-memory refs is kept by its bytes
without the refs' generations (a producer stamps a new one on every lease): a later list
equal but for those takes each ref's generation from its own bytes, checked as
:class:`~edge_contracts.headers.ShmRef` checks it (a generation the parser refuses, or a
frame without the ``shm-tensors`` bit, goes through the full parser). Whole headers are
kept the same way, per reader limits, without their request id and event block: a header
equal to a kept one but for those two parts is built from it after its own id and block
pass the same checks (anything else differing, or any check failing, goes through the
full parser and its errors). A header with a shared-memory entry is kept apart, also
without its references' generations and its meta (a zero-copy DONE's meta acknowledges
inputs by generation): one equal to it in every other byte (its fixed part but for the
meta length, stage id, and every entry byte but the generations) is built from it after
its own id and block, each generation (at most ``INT64_MAX``) and its meta (decoded by
the wire's strict decoder, an object repeating no field of the block, frozen) pass the
full parser's checks. An ``ack`` (its meta lists generations, new every call) is kept
apart without its meta: one with the same fixed part but for its meta's length is built
from it after its meta passes the full parser's checks. Other headers with an event
block beside JSON meta, or headers over 4 KiB, are never kept.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from typing import Any

from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    DescriptorInvalid,
    HeaderMalformed,
    UnknownRequiredFeature,
    VersionMismatch,
)
from edge_contracts.headers import (
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    check_totals,
    prechecked_header,
    tensor_totals,
    with_generation,
)
from edge_contracts.jsonvalues import (
    EMPTY_OBJECT,
    STRICT_DECODER,
    JSONObject,
    freeze_object,
    thaw_json,
)
from edge_contracts.protocol import (
    FEATURE_BFLOAT16,
    FEATURE_CANCEL,
    FEATURE_EVENT_FIELDS,
    FEATURE_SHM_TENSORS,
    FEATURE_STREAM_EVENTS,
    OP_ACK,
    OP_EVENT,
    OP_GENERATE,
    OP_RUN,
    PROTOCOL_VERSION,
)
from edge_contracts.validation import INT64_MAX, MAX_ID_LENGTH, rebase, require_id

__all__ = [
    "BINARY_FEATURES",
    "BINARY_MAGIC",
    "BINARY_OPS",
    "EVENT_BLOCK",
    "FIXED",
    "ID_LENGTHS",
    "KIND_CODES",
    "SHM_TENSORS_BIT",
    "ack_pairs_text",
    "encode_ack_header",
    "encode_binary_header",
    "encode_event_header",
    "event_block",
    "generations_between",
    "kept_header",
    "pairs_meta",
    "parse_binary_header",
    "split_generations",
]

BINARY_MAGIC = b"EDGB"
"""Prefix magic of a frame whose header is binary (JSON headers: ``b"EDGW"``)."""

FIXED = struct.Struct("<HBBHHHIIQQ")
"""The fixed part of a binary header (34 bytes)."""
ID_LENGTHS = struct.Struct("<HH")
"""The request and stage ids' byte lengths, at offset 4 of :data:`FIXED`."""

_TENSOR = struct.Struct("<HBBBQ")
_REF = struct.Struct("<HQQ")

_OPS: tuple[str, ...] = ("", OP_RUN, OP_GENERATE, OP_EVENT, OP_ACK)
BINARY_OPS: frozenset[str] = frozenset(_OPS[1:])
"""The ops that may travel with a binary header."""
_OP_CODES = {op: code for code, op in enumerate(_OPS) if op}
_ACK_CODE = _OP_CODES[OP_ACK]

_FEATURE_BITS: tuple[str, ...] = (
    FEATURE_SHM_TENSORS,
    FEATURE_STREAM_EVENTS,
    FEATURE_BFLOAT16,
    FEATURE_CANCEL,
    FEATURE_EVENT_FIELDS,
)
_EVENT_BIT = 1 << _FEATURE_BITS.index(FEATURE_EVENT_FIELDS)
SHM_TENSORS_BIT = 1 << _FEATURE_BITS.index(FEATURE_SHM_TENSORS)
"""The ``shm-tensors`` feature's bit in a binary header's feature byte (its fourth)."""
EVENT_BLOCK = struct.Struct("<QQB")
"""The ``event-fields`` block: seq u64, created_ns u64, kind code u8 (17 bytes)."""
_KINDS: tuple[str, ...] = ("output", "token", "progress", "done", "error", "cancelled")
KIND_CODES: dict[str, int] = {kind: code for code, kind in enumerate(_KINDS)}
"""Wire code of each event kind in the block (fixed here, never reused)."""
_EVENT_KEYS = frozenset({"seq", "kind", "created_ns"})
_ALL_BITS = (1 << len(_FEATURE_BITS)) - 1
_FEATURE_SETS: tuple[frozenset[str], ...] = tuple(
    frozenset(name for index, name in enumerate(_FEATURE_BITS) if bits & (1 << index))
    for bits in range(_ALL_BITS + 1)
)  # the required features of each valid bit pattern, built once
BINARY_FEATURES: frozenset[str] = frozenset(_FEATURE_BITS)
"""The required features a binary header can express (others need the JSON header)."""

# Wire codes of the dtypes: fixed here (not DType's declaration order) and never reused.
_DTYPES: tuple[DType, ...] = (
    DType.BOOL,
    DType.INT8,
    DType.INT16,
    DType.INT32,
    DType.INT64,
    DType.UINT8,
    DType.UINT16,
    DType.UINT32,
    DType.UINT64,
    DType.FLOAT16,
    DType.FLOAT32,
    DType.FLOAT64,
    DType.BFLOAT16,
)
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_DTYPES)}
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_MAX_TEXT = 512  # 128 characters of at most 4 UTF-8 bytes: longer is refused unread


def encode_binary_header(header: FrameHeader) -> bytes:
    """Return ``header`` in the binary layout.

    Raises:
        HeaderMalformed: the op has no binary form, or a feature has no bit.

    """
    code = _OP_CODES.get(header.op)
    if code is None:
        raise HeaderMalformed(
            "header.op", header.op, f"has no binary header (only {', '.join(sorted(BINARY_OPS))})"
        )
    bits = _feature_bits(header)
    block = b""
    plain: Any = thaw_json(header.meta) if header.meta else {}  # type: ignore[arg-type]
    if bits & _EVENT_BIT:  # seq, kind and created_ns leave meta for the fixed block
        block = event_block(plain.get("seq"), plain.get("kind"), plain.get("created_ns"),
                            header.op)
        plain = {key: value for key, value in plain.items() if key not in _EVENT_KEYS}
    meta = _ENCODER.encode(plain).encode() if plain else b""
    return _assemble(header, code, bits, meta, block)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # ShmRef's segment names: no JSON escape
# One acknowledged pair as ack_pairs_text writes it: a plain name (nothing JSON escapes)
# and a generation in JSON's own form of a non-negative integer (no sign, no leading zero)
_PAIR_TEXT = rb'\["([A-Za-z0-9_.-]{1,128})",(0|[1-9][0-9]{0,18})\]'
_PAIR = re.compile(_PAIR_TEXT)
_PAIR_ANY = _PAIR_TEXT.replace(b"(", b"(?:")  # the same, its groups not captured
_PAIRS_META = re.compile(rb'\{"(acks|segments)":\[' + _PAIR_ANY + rb"(?:," + _PAIR_ANY
                         + rb")*\]\}")
_PAIRS_KEYS = {b"acks": "acks", b"segments": "segments"}


def ack_pairs_text(pairs: Sequence[Sequence[Any]]) -> str:
    """``[[segment, generation], ...]`` as the compact JSON :func:`encode_binary_header` writes.

    For the per-call paths' own acknowledgements, whose pairs come from checked
    references (:func:`~edge_contracts.wire.refs_of`) or the side's own producer: a
    segment name is 1-128 of ``[A-Za-z0-9_.-]`` (nothing JSON escapes; checked here, in C)
    and a generation an ``int`` in 0..INT64_MAX (checked too).

    Raises:
        HeaderMalformed: a pair that is not such a name and generation (field
            ``header.meta``).

    """
    items = []
    for segment, generation in pairs:
        if (type(segment) is not str or _PLAIN_NAME.fullmatch(segment) is None
                or type(generation) is not int or not 0 <= generation <= INT64_MAX):
            raise HeaderMalformed("header.meta", [segment, generation],
                                  "an acknowledged pair must be [segment name, generation]")
        items.append(f'["{segment}",{generation}]')
    return "[" + ",".join(items) + "]"


def pairs_meta(raw: bytes, at: int) -> JSONObject | None:
    """The frozen meta ``raw[at:]`` holds when it is the usual text of acknowledged pairs.

    The usual meta of an ``ack`` frame and of a DONE acknowledging its inputs is exactly
    ``{"segments":[...]}`` or ``{"acks":[...]}`` with one or more ``["name",generation]``
    pairs, as :func:`ack_pairs_text` writes them: its frozen value (a
    :class:`~edge_contracts.jsonvalues.JSONObject` of one key whose value is a tuple of
    ``(name, generation)`` tuples) is read here by two regular expressions, without
    decoding the JSON and freezing it. The value is the one the full parser's decode and
    :func:`~edge_contracts.jsonvalues.freeze_object` give for the same bytes (a test
    compares them over mutated texts). None for any other text (other keys, spacing,
    escapes, an empty list, a generation over ``INT64_MAX``): the caller decodes it so.
    """
    match = _PAIRS_META.fullmatch(raw, at)
    if match is None:
        return None
    pairs = []
    for name, text in _PAIR.findall(raw, at):  # (only pairs lie between the brackets)
        generation = int(text)
        if generation > INT64_MAX:
            return None
        pairs.append((name.decode(), generation))
    return JSONObject({_PAIRS_KEYS[match[1]]: tuple(pairs)})


def encode_ack_header(
    generation: int,
    segments: Sequence[Sequence[Any]],
    unlink: Sequence[Sequence[Any]] = (),
    gone: Sequence[str] = (),
) -> bytes:
    """An ``ack`` frame's binary header, its ``meta`` written as text directly.

    The bytes :func:`encode_binary_header` writes for ``FrameHeader("ack", "", "", 0,
    generation, meta=...)`` with ``meta`` ``{"segments": segments}``, plus ``"unlink"`` and
    ``"gone"`` when not empty (in that order), without freezing a mapping only to thaw and
    encode it again: an acknowledgement is sent on every call that read shared memory.
    ``generation`` is the channel's worker generation, checked once by the caller; the
    pairs are checked by :func:`ack_pairs_text`, the names in ``gone`` the same way.

    Raises:
        HeaderMalformed: a pair or name that :func:`ack_pairs_text` refuses.

    """
    parts = ['{"segments":', ack_pairs_text(segments)]
    if unlink:
        parts += (',"unlink":', ack_pairs_text(unlink))
    if gone:
        for name in gone:
            if type(name) is not str or _PLAIN_NAME.fullmatch(name) is None:
                raise HeaderMalformed("header.meta.gone", name, "must be a segment name")
        parts += (',"gone":["', '","'.join(gone), '"]')
    parts.append("}")
    meta = "".join(parts).encode()
    return FIXED.pack(PROTOCOL_VERSION, _ACK_CODE, 0, 0, 0, 0, 0, len(meta), 0,
                      generation) + meta


def event_block(seq: object, kind: object, created_ns: object, op: str = OP_EVENT) -> bytes:
    """The fixed event block of the ``event-fields`` feature: "<QQB" seq, created_ns, kind.

    Raises:
        HeaderMalformed: not an ``event``, or a field missing or out of range (``seq``
            and ``created_ns`` are integers in 0..INT64_MAX, ``kind`` an event kind).

    """
    if op != OP_EVENT:
        raise HeaderMalformed(
            "header.required_features", FEATURE_EVENT_FIELDS, "only an event carries it"
        )
    for field, value in (("seq", seq), ("created_ns", created_ns)):
        if type(value) is not int or not 0 <= value <= INT64_MAX:
            raise HeaderMalformed(f"header.meta.{field}", value, f"must be in 0..{INT64_MAX}")
    code = KIND_CODES.get(kind) if type(kind) is str else None
    if code is None:
        raise HeaderMalformed("header.meta.kind", kind, f"must be one of {', '.join(_KINDS)}")
    return EVENT_BLOCK.pack(seq, created_ns, code)


def encode_event_header(header: FrameHeader, meta: bytes, block: bytes = b"") -> bytes:
    """Return an ``event`` frame's binary header whose ``meta`` is given as JSON bytes.

    The worker's per-event path: it writes the event's ``meta`` text itself (its fields
    are its own, and handler data checked by :func:`~edge_contracts.jsonvalues.freeze_object`)
    instead of freezing a mapping only for :func:`encode_binary_header` to thaw and
    encode it again. ``header.meta`` is not read. ``meta`` must be one compact UTF-8 JSON
    object (``b""`` for ``{}``), as the reader checks it like any other; with the
    ``event-fields`` feature among the header's required features, ``block`` is the
    :func:`event_block` and ``meta`` holds none of its fields.

    Raises:
        HeaderMalformed: the header is not an ``event``, a feature has no bit, or the
            block is missing or was given without the feature.

    """
    if header.op != OP_EVENT:
        raise HeaderMalformed("header.op", header.op, f"must be {OP_EVENT}")
    bits = _feature_bits(header)
    if bool(bits & _EVENT_BIT) != (len(block) == EVENT_BLOCK.size):
        raise HeaderMalformed("header.event", len(block), "the block goes with event-fields")
    return _assemble(header, _OP_CODES[OP_EVENT], bits, meta, block)


def _feature_bits(header: FrameHeader) -> int:
    bits = 0
    for name in header.required_features:
        try:
            bits |= 1 << _FEATURE_BITS.index(name)
        except ValueError:
            raise HeaderMalformed(
                "header.required_features", name, "has no bit in the binary header"
            ) from None
    return bits


def _assemble(header: FrameHeader, code: int, bits: int, meta: bytes, block: bytes = b"") -> bytes:
    request = header.request_id.encode()
    stage = header.stage_id.encode()
    tensors = _tensor_bytes(header.tensors)
    return b"".join(
        (
            FIXED.pack(
                header.version,
                code,
                bits,
                len(request),
                len(stage),
                len(header.tensors),
                len(tensors),
                len(meta),
                header.epoch,
                header.generation,
            ),
            request,
            stage,
            block,
            tensors,
            meta,
        )
    )


def _tensor_bytes(specs: tuple[TensorSpec, ...]) -> bytes:
    if not specs:
        return b""
    parts: list[bytes] = []
    for spec in specs:
        if spec.ref is not None:  # generations change: never cached
            parts.append(_spec_bytes(spec))
            continue
        # Keyed by identity (TensorSpec.inline hands out the same checked instance for
        # a repeated entry), so no dataclass __hash__ runs; the entry holds the spec,
        # so its id cannot be reused while cached, and a spec is immutable.
        entry = _SPEC_BYTES.get(id(spec))
        if entry is None or entry[0] is not spec:
            entry = (spec, _spec_bytes(spec))
            if len(_SPEC_BYTES) >= 1024:
                _SPEC_BYTES.clear()
            _SPEC_BYTES[id(spec)] = entry
        parts.append(entry[1])
    return parts[0] if len(parts) == 1 else b"".join(parts)


_SPEC_BYTES: dict[int, tuple[TensorSpec, bytes]] = {}  # id(spec) -> (spec, its entry bytes)
# inline entry bytes -> (checked entries, inline bytes, total bytes, some entry is bfloat16)
_PARSED: dict[bytes, tuple[tuple[TensorSpec, ...], int, int, bool]] = {}
_CACHED_ENTRY_BYTES = 2048  # longer entry lists are parsed every time: the cache stays small
# entry bytes without their references' generations -> as _PARSED, with the generations
# of the frame they were checked in (replaced by each later frame's own)
_PARSED_REFS: dict[bytes, tuple[tuple[TensorSpec, ...], int, int, bool]] = {}


def split_generations(entries: bytes, count: int) -> tuple[list[bytes], list[int]] | None:
    """``entries`` (``count`` tensor entries) cut around each reference's generation.

    Returns the pieces around the generations (one more than the generations) and the
    generations, or None when the entries hold no reference or do not add up (walked by
    their own lengths, checking nothing else: the full parser says what is wrong). The
    generations are 8 bytes at a place the bytes before them fix, so the pieces and the
    generations give back the entries exactly: two lists with the same pieces differ only
    in generations. A reader keeps checked entries by their pieces; a sender keeps the
    pieces of its own entries and writes each frame's generations between them.
    """
    pieces: list[bytes] = []
    generations: list[int] = []
    size = len(entries)
    at = start = 0
    for _ in range(count):
        if at + _TENSOR.size > size:
            return None
        name_len, _, ndim, has_ref, _ = _TENSOR.unpack_from(entries, at)
        at += _TENSOR.size + 8 * ndim + name_len
        if has_ref:
            if has_ref > 1 or at + _REF.size > size:
                return None
            segment_len, _, generation = _REF.unpack_from(entries, at)
            pieces.append(entries[start : at + 10])  # up to the generation ("<HQ" before it)
            generations.append(generation)
            start = at + _REF.size
            at = start + segment_len
    if at != size or not generations:
        return None
    pieces.append(entries[start:])
    return pieces, generations


def _spec_bytes(spec: TensorSpec) -> bytes:
    name = spec.name.encode()
    ref = spec.ref
    parts = [
        _TENSOR.pack(
            len(name), _DTYPE_CODES[spec.dtype], len(spec.shape), ref is not None, spec.nbytes
        ),
        struct.pack(f"<{len(spec.shape)}Q", *spec.shape),
        name,
    ]
    if ref is not None:
        segment = ref.segment.encode()
        parts += [_REF.pack(len(segment), ref.offset, ref.generation), segment]
    return b"".join(parts)


def parse_binary_header(
    raw: bytes | bytearray | memoryview,
    limits: Limits,
    *,
    payload_len: int | None = None,
    json_decoder: json.JSONDecoder,
    kept: bool = True,
) -> FrameHeader:
    """Parse and check a binary header against ``limits``, allocating no payload.

    ``json_decoder`` parses ``meta`` (the wire's strict decoder: no duplicate keys, no
    NaN); ``kept=False`` skips looking for a kept equal header (:func:`kept_header`)
    first, for a caller that has just looked (headers are looked for and kept only with
    the wire's decoder, :data:`~edge_contracts.jsonvalues.STRICT_DECODER`, which the kept
    paths decode meta with). Checks and errors are those of
    :func:`edge_contracts.wire.parse_header`, plus the layout's own: every length inside
    the header, the op code and the feature bits.

    Raises:
        HeaderTooLarge, HeaderMalformed, VersionMismatch, UnknownRequiredFeature,
        DescriptorInvalid, PayloadTooLarge, PayloadMismatch.

    """
    # as a frame reader passes it (the wire's decoder): a repeated header is kept
    if kept and type(raw) is bytes and json_decoder is STRICT_DECODER:
        found = kept_header(raw, limits, payload_len)
        if found is not None:
            return found
    view = memoryview(raw).cast("B") if isinstance(raw, memoryview) else memoryview(raw)
    size = len(view)
    if size < FIXED.size:
        raise HeaderMalformed("header", size, f"a binary header is >= {FIXED.size} bytes")
    (
        version,
        code,
        bits,
        request_len,
        stage_len,
        count,
        tensors_len,
        meta_len,
        epoch,
        generation,
    ) = FIXED.unpack_from(view)
    if version != PROTOCOL_VERSION:
        raise VersionMismatch("header.version", version, f"must be {PROTOCOL_VERSION}")
    if bits & ~_ALL_BITS:
        raise UnknownRequiredFeature(
            "header.required_features", bits, f"unknown feature bits (known: {_ALL_BITS:#x})"
        )
    features = _FEATURE_SETS[bits]
    if not features <= limits.supported_features:
        unknown = sorted(features - limits.supported_features)
        raise UnknownRequiredFeature(
            "header.required_features",
            unknown,
            f"not supported here (supported: {', '.join(sorted(limits.supported_features))})",
        )
    if count > limits.max_tensors:
        raise HeaderMalformed(
            "header.tensors", count, f"must hold <= max_tensors {limits.max_tensors}"
        )
    if not 0 < code < len(_OPS):
        raise HeaderMalformed("header.op", code, f"unknown binary op code (1..{len(_OPS) - 1})")
    if epoch > INT64_MAX:
        raise HeaderMalformed("header.epoch", epoch, f"must be <= {INT64_MAX}")
    if generation > INT64_MAX:
        raise HeaderMalformed("header.generation", generation, f"must be <= {INT64_MAX}")
    at = FIXED.size
    # connection-level frames (an ack) have neither id: no call for an empty one
    request_id, at = (_text(view, at, request_len, "header.request_id", HeaderMalformed)
                      if request_len else ("", at))
    stage_id, at = (_text(view, at, stage_len, "header.stage_id", HeaderMalformed)
                    if stage_len else ("", at))
    fields: tuple[int, int, int] | None = None
    if bits & _EVENT_BIT:
        fields, at = _event_fields(view, at, code)
    end = at + tensors_len
    if end > size:
        raise HeaderMalformed(
            "header.tensors", tensors_len, f"entries run past the header's end ({size} bytes)"
        )
    if not count and tensors_len:
        raise HeaderMalformed("header.tensors", tensors_len, "entry bytes without entries")
    cached = 0 < tensors_len <= _CACHED_ENTRY_BYTES
    key = bytes(view[at:end]) if cached else b""
    known = _PARSED.get(key) if cached else None
    if known is not None and len(known[0]) != count:  # same bytes, another count: parse
        known = None
    masked: tuple[list[bytes], list[int]] | None = None
    if known is None and cached and _PARSED_REFS and FEATURE_SHM_TENSORS in features:
        masked = split_generations(key, count)
        if masked is not None:
            known = _PARSED_REFS.get(b"".join(masked[0]))
            if known is not None and (len(known[0]) != count or max(masked[1]) > INT64_MAX):
                known = None  # another count, or a generation the full parser refuses
    specs: tuple[TensorSpec, ...]
    if known is not None and masked is not None:  # the same entries, new generations
        generations = iter(masked[1])
        specs = tuple([spec if spec.ref is None else with_generation(spec, next(generations))
                       for spec in known[0]])
    elif known is not None:
        specs = known[0]
    elif not count:
        specs = ()
    else:
        entries = view[:end]  # an entry never reads into meta
        parsed: list[TensorSpec] = []
        for index in range(count):
            spec, at = _tensor(entries, at, f"header.tensors[{index}]")
            parsed.append(spec)
        if at != end:
            raise HeaderMalformed(
                "header.tensors", tensors_len, f"entries take {at - end + tensors_len} bytes"
            )
        specs = tuple(parsed)
    has_refs = False
    for spec in specs:  # a loop, not any(): no call per frame
        if spec.ref is not None:
            has_refs = True
            break
    at = end
    if size - at != meta_len:
        raise HeaderMalformed(
            "header.meta", meta_len, f"must be the {size - at} bytes left in the header"
        )
    decoded: Any = None
    if meta_len:
        try:
            decoded = json_decoder.decode(str(view[at:], "utf-8"))
        except (ValueError, RecursionError) as exc:
            raise HeaderMalformed(
                "header.meta", bytes(view[at : at + 64]), f"must be UTF-8 JSON ({exc})"
            ) from None
        if type(decoded) is not dict:
            raise HeaderMalformed("header.meta", type(decoded).__name__, "must be a JSON object")
    if fields is not None:
        decoded = _merge_event(fields, decoded)
    # Then the checks FrameHeader runs, in its order: ids, meta, the entries as a list.
    if request_id and not (len(request_id) <= MAX_ID_LENGTH and request_id.isprintable()):
        require_id(request_id, "header.request_id", error=HeaderMalformed)
    if stage_id and not (len(stage_id) <= MAX_ID_LENGTH and stage_id.isprintable()):
        require_id(stage_id, "header.stage_id", error=HeaderMalformed)
    meta: JSONObject
    if decoded is None:
        meta = EMPTY_OBJECT
    elif fields is not None and not meta_len:  # the block's ints and kind: frozen already
        meta = JSONObject(decoded)
    else:
        meta = freeze_object(decoded, "header.meta", error=HeaderMalformed)
    if known is not None and not (known[3] and FEATURE_BFLOAT16 not in features):
        inline, total = known[1], known[2]  # checked as a list when it was cached
    else:
        inline, total = tensor_totals(specs, features)
        if cached and known is None:
            bf16 = any(spec.dtype is DType.BFLOAT16 for spec in specs)
            if not has_refs:
                if len(_PARSED) >= 1024:
                    _PARSED.clear()
                _PARSED[key] = (specs, inline, total, bf16)
            else:
                masked = split_generations(key, count)
                if masked is not None:
                    if len(_PARSED_REFS) >= 1024:
                        _PARSED_REFS.clear()
                    _PARSED_REFS[b"".join(masked[0])] = (specs, inline, total, bf16)
    header = prechecked_header(
        _OPS[code],
        request_id,
        stage_id,
        epoch,
        generation,
        specs,
        meta,
        features,
        inline,
        total,
        version,
    )
    check_totals(header, limits, payload_len)
    if type(raw) is bytes and size <= _KEPT_HEADER_BYTES and json_decoder is STRICT_DECODER:
        if code == _ACK_CODE:  # its meta differs every call: kept without it
            if size == FIXED.size + meta_len:  # (no id, block or entry)
                if len(_KEPT_ACKS) >= 1024:
                    _KEPT_ACKS.clear()
                _KEPT_ACKS[(id(limits), raw[:_META_LEN_AT] + raw[_META_LEN_END:FIXED.size])] = (
                    limits, header)
        elif has_refs:  # kept apart: its generations and meta are read from each frame
            _keep_refs_header(raw, limits, header, request_len, stage_len,
                              fields is not None, tensors_len)
        elif not (fields and meta_len):
            _keep_header(raw, limits, header, request_len, stage_len, fields is not None)
    return header


# (id of the reader's limits, a whole header without its request id and event block)
# -> (those limits, header size, the header parsed from it, has a block). Its checks
# passed once; an equal header differs only in those two parts, checked by kept_header.
_KEPT: dict[tuple[int, bytes], tuple[Limits, int, FrameHeader, bool]] = {}
_KEPT_HEADER_BYTES = 4096


def _kept_key(raw: bytes, request_len: int, stage_len: int, block: bool) -> bytes:
    stage_at = FIXED.size + request_len
    body_at = stage_at + stage_len + (EVENT_BLOCK.size if block else 0)
    return raw[: FIXED.size] + raw[stage_at : stage_at + stage_len] + raw[body_at:]


def _keep_header(raw: bytes, limits: Limits, header: FrameHeader, request_len: int,
                 stage_len: int, block: bool) -> None:
    if len(_KEPT) >= 1024:
        _KEPT.clear()
    key = (id(limits), _kept_key(raw, request_len, stage_len, block))
    _KEPT[key] = (limits, len(raw), header, block)  # holding limits: its id stays its own


# (id of the reader's limits, a header's fixed part without its meta length, and its
# stage id) -> up to _REFS_PER_KEY kept headers, the newest first, each (those limits, the
# header parsed from it, the entries' pieces around the references' generations as
# (start, end, bytes) from the entries' start, each generation's offset there). A header
# with shared-memory entries: equal to a kept one but for its request id, block,
# generations and meta, it is built from it once those pass the full parser's checks
# (kept_header). Several per key: a producer whose last segment is still held
# hands out another, so replies alternate between segments (or offsets) of one key.
_KeptRefs = tuple[Limits, FrameHeader, tuple[tuple[int, int, bytes], ...], tuple[int, ...]]
_KEPT_REFS: dict[tuple[int, bytes], tuple[_KeptRefs, ...]] = {}
_REFS_PER_KEY = 4
_META_LEN_AT = 14  # where the fixed part's meta byte count lies (u32)
_META_LEN_END = _META_LEN_AT + 4
_GENERATION_END = 8  # a generation's bytes


def _keep_refs_header(raw: bytes, limits: Limits, header: FrameHeader, request_len: int,
                      stage_len: int, block: bool, tensors_len: int) -> None:
    stage_at = FIXED.size + request_len
    entries_at = stage_at + stage_len + (EVENT_BLOCK.size if block else 0)
    cut = split_generations(raw[entries_at : entries_at + tensors_len], len(header.tensors))
    if cut is None:  # pragma: no cover - checked entries add up
        return
    pieces: list[tuple[int, int, bytes]] = []
    generations_at: list[int] = []
    at = 0
    for index, piece in enumerate(cut[0]):
        pieces.append((at, at + len(piece), piece))
        at += len(piece)
        if index < len(cut[1]):
            generations_at.append(at)
            at += _GENERATION_END
    if len(_KEPT_REFS) >= 1024:
        _KEPT_REFS.clear()
    key = (id(limits), raw[:_META_LEN_AT] + raw[_META_LEN_END : FIXED.size]
           + raw[stage_at : stage_at + stage_len])
    kept: _KeptRefs = (limits, header, tuple(pieces), tuple(generations_at))
    others = tuple(old for old in _KEPT_REFS.get(key, ())
                   if old[0] is limits and old[2] != kept[2])  # (the same pieces: replaced)
    _KEPT_REFS[key] = (kept, *others[: _REFS_PER_KEY - 1])


# (id of the reader's limits, an ack's fixed part without its meta length) -> (those
# limits, the ack parsed from it). An ack has neither id nor entry: one with the same
# fixed part but for its meta's length is built from it once its meta passes the full
# parser's checks (kept_header).
_KEPT_ACKS: dict[tuple[int, bytes], tuple[Limits, FrameHeader]] = {}


def _kept_ack(raw: bytes, limits: Limits, payload_len: int | None,
              size: int) -> FrameHeader | None:
    """:func:`kept_header` for an ack (see _KEPT_ACKS)."""
    kept = _KEPT_ACKS.get((id(limits), raw[:_META_LEN_AT] + raw[_META_LEN_END : FIXED.size]))
    if (kept is None or kept[0] is not limits or (payload_len is not None and payload_len)
            or FIXED.size + int.from_bytes(raw[_META_LEN_AT:_META_LEN_END], "little") != size):
        return None
    template = kept[1]
    meta: Any = EMPTY_OBJECT
    if size > FIXED.size and (meta := pairs_meta(raw, FIXED.size)) is None:
        # decoded and frozen as the full parser does; a failure: its error
        try:
            decoded = STRICT_DECODER.decode(str(raw[FIXED.size :], "utf-8"))
        except (ValueError, RecursionError):
            return None
        if type(decoded) is not dict:
            return None
        try:
            meta = freeze_object(decoded, "header.meta", error=HeaderMalformed)
        except HeaderMalformed:
            return None
    return prechecked_header(template.op, "", "", template.epoch, template.generation, (),
                             meta, template.required_features, 0, 0, template.version)


def generations_between(raw: bytes, at: int, pieces: Sequence[tuple[int, int, bytes]],
                        generations_at: Sequence[int]) -> list[int] | None:
    """The references' generations of ``raw`` when its bytes from ``at`` are ``pieces``.

    ``pieces`` are ``(start, end, bytes)`` of a kept header's entries cut around the
    generations (:func:`split_generations`), ``generations_at`` where each generation's 8
    bytes lie, both relative to ``at``. Returns the generations (each checked as
    :class:`~edge_contracts.headers.ShmRef` checks one: at most ``INT64_MAX``), or None
    when a piece differs or a generation is out of range: for a reader that keeps checked
    entries and sees them again with only the generations changed (the kept-header path
    here, the worker's usual zero-copy request).
    """
    for start, end, piece in pieces:
        if raw[at + start : at + end] != piece:
            return None
    generations = []
    for where in generations_at:
        generation = int.from_bytes(raw[at + where : at + where + 8], "little")
        if generation > INT64_MAX:  # the full parser refuses it
            return None
        generations.append(generation)
    return generations


def _kept_refs_header(raw: bytes, limits: Limits, payload_len: int | None, size: int,
                      stage_at: int, stage_end: int, block: int) -> FrameHeader | None:
    """:func:`kept_header` for a header with shared-memory entries (see _KEPT_REFS)."""
    candidates = _KEPT_REFS.get((id(limits), raw[:_META_LEN_AT]
                                 + raw[_META_LEN_END : FIXED.size] + raw[stage_at:stage_end]))
    if candidates is None:
        return None
    entries_at = stage_end + EVENT_BLOCK.size if block else stage_end
    meta_len = int.from_bytes(raw[_META_LEN_AT:_META_LEN_END], "little")
    for kept in candidates:  # the one whose every entry byte but the generations is these
        _, template, pieces, generations_at = kept
        if kept[0] is not limits or (payload_len is not None
                                     and payload_len != template.inline_nbytes):
            continue
        # the fixed part, but for the meta length, is the kept one's: so is the entries'
        # length (the last piece ends where they end)
        meta_at = entries_at + pieces[-1][1]
        if meta_at + meta_len != size:
            continue
        generations = generations_between(raw, entries_at, pieces, generations_at)
        if generations is not None:
            break
    else:
        return None
    try:
        request_id = str(raw[FIXED.size : stage_at], "utf-8")
    except UnicodeDecodeError:
        return None
    if request_id and not (len(request_id) <= MAX_ID_LENGTH and request_id.isprintable()):
        return None
    meta: Any = EMPTY_OBJECT
    if meta_len and (meta := pairs_meta(raw, meta_at)) is None:
        # decoded and frozen as the full parser does; a failure: its error
        try:
            decoded = STRICT_DECODER.decode(str(raw[meta_at:], "utf-8"))
        except (ValueError, RecursionError):
            return None
        if type(decoded) is not dict or (block and not _EVENT_KEYS.isdisjoint(decoded)):
            return None
        try:  # (the block's fields are frozen values already)
            meta = freeze_object(decoded, "header.meta", error=HeaderMalformed)
        except HeaderMalformed:
            return None
    if block:
        seq, created_ns, kind = EVENT_BLOCK.unpack_from(raw, stage_end)
        if seq > INT64_MAX or created_ns > INT64_MAX or kind >= len(_KINDS):
            return None
        fields = {"seq": seq, "kind": _KINDS[kind], "created_ns": created_ns}
        if meta_len:  # the block's fields first, then the JSON's (as _merge_event)
            fields.update(meta.view())
        meta = JSONObject(fields)
    specs = []
    index = 0
    for spec in template.tensors:  # a loop, not a comprehension: no call
        if spec.ref is not None:
            spec = with_generation(spec, generations[index])
            index += 1
        specs.append(spec)
    return prechecked_header(template.op, request_id, template.stage_id, template.epoch,
                             template.generation, tuple(specs), meta,
                             template.required_features, template.inline_nbytes,
                             template.total_nbytes, template.version)


def kept_header(raw: bytes, limits: Limits, payload_len: int | None) -> FrameHeader | None:
    """The header of ``raw`` from a kept equal one, its own id (and block) checked; else None.

    For a reader's per-frame path: ``raw`` is a whole binary header (bytes) whose length
    the frame's prefix gave and ``limits`` allowed; ``payload_len`` the prefix's payload
    length. A header is kept by :func:`parse_binary_header` once it passed every check
    (see the module docstring). None sends ``raw`` through the full parser, which raises
    whatever is wrong with it.
    """
    size = len(raw)
    if size < FIXED.size:
        return None
    if raw[2] == _ACK_CODE:  # kept apart (its op code is in every key of the others)
        return _kept_ack(raw, limits, payload_len, size) if _KEPT_ACKS else None
    request_len, stage_len = ID_LENGTHS.unpack_from(raw, 4)
    block = raw[3] & _EVENT_BIT
    stage_at = FIXED.size + request_len
    stage_end = stage_at + stage_len
    # the key of _kept_key, written out: one call fewer per frame
    kept = _KEPT.get((id(limits), raw[: FIXED.size] + raw[stage_at:stage_end]
                      + raw[stage_end + EVENT_BLOCK.size if block else stage_end :]))
    if kept is None or kept[1] != size or kept[0] is not limits:
        if raw[3] & SHM_TENSORS_BIT and _KEPT_REFS:  # perhaps one with shared-memory entries
            return _kept_refs_header(raw, limits, payload_len, size, stage_at, stage_end,
                                     block)
        return None
    template = kept[2]
    try:
        request_id = str(raw[FIXED.size : stage_at], "utf-8")
    except UnicodeDecodeError:
        return None
    if request_id and not (len(request_id) <= MAX_ID_LENGTH and request_id.isprintable()):
        return None
    meta: Any = template.meta  # frozen when it was kept
    if block:
        seq, created_ns, kind = EVENT_BLOCK.unpack_from(raw, stage_end)
        if seq > INT64_MAX or created_ns > INT64_MAX or kind >= len(_KINDS):
            return None
        meta = JSONObject({"seq": seq, "kind": _KINDS[kind], "created_ns": created_ns})
    if payload_len is not None and payload_len != template.inline_nbytes:
        return None
    return prechecked_header(template.op, request_id, template.stage_id, template.epoch,
                             template.generation, template.tensors, meta,
                             template.required_features, template.inline_nbytes,
                             template.total_nbytes, template.version)


def _event_fields(view: memoryview, at: int, code: int) -> tuple[tuple[int, int, int], int]:
    """Read the ``event-fields`` block at ``at``: ``(seq, created_ns, kind code)``, next offset."""
    if _OPS[code] != OP_EVENT:
        raise HeaderMalformed(
            "header.required_features", FEATURE_EVENT_FIELDS, "only an event carries it"
        )
    if at + EVENT_BLOCK.size > len(view):
        raise HeaderMalformed(
            "header.event", len(view) - at, f"the {EVENT_BLOCK.size}-byte block runs past the end"
        )
    seq, created_ns, kind = EVENT_BLOCK.unpack_from(view, at)
    if seq > INT64_MAX:
        raise HeaderMalformed("header.meta.seq", seq, f"must be <= {INT64_MAX}")
    if created_ns > INT64_MAX:
        raise HeaderMalformed("header.meta.created_ns", created_ns, f"must be <= {INT64_MAX}")
    if kind >= len(_KINDS):
        raise HeaderMalformed("header.meta.kind", kind, f"unknown kind code (0..{len(_KINDS) - 1})")
    return (seq, created_ns, kind), at + EVENT_BLOCK.size


def _merge_event(fields: tuple[int, int, int], decoded: dict[str, Any] | None) -> dict[str, Any]:
    """The event's whole meta: the block's fields first, then the JSON's (none repeated)."""
    seq, created_ns, kind = fields
    meta: dict[str, Any] = {"seq": seq, "kind": _KINDS[kind], "created_ns": created_ns}
    if decoded:
        repeated = _EVENT_KEYS.intersection(decoded)
        if repeated:
            raise HeaderMalformed(
                "header.meta", sorted(repeated), "repeats a field of the event block"
            )
        meta.update(decoded)
    return meta


def _text(
    view: memoryview,
    at: int,
    length: int,
    field: str,
    error: type[HeaderMalformed] | type[DescriptorInvalid],
) -> tuple[str, int]:
    """Decode ``length`` UTF-8 bytes at ``at``; return the text and the next offset."""
    if length > _MAX_TEXT:
        raise error(field, length, f"must be <= {_MAX_TEXT} bytes")
    end = at + length
    if end > len(view):
        raise error(field, length, f"runs past the header's end ({len(view)} bytes)")
    try:
        return str(view[at:end], "utf-8"), end
    except UnicodeDecodeError:
        raise error(field, bytes(view[at:end]), "must be UTF-8") from None


def _tensor(view: memoryview, at: int, field: str) -> tuple[TensorSpec, int]:
    """Read one tensor entry at ``at``; return it and the next offset."""
    size = len(view)
    if at + _TENSOR.size > size:
        raise DescriptorInvalid(field, size - at, "entry runs past the header's end")
    name_len, dtype_code, ndim, has_ref, nbytes = _TENSOR.unpack_from(view, at)
    at += _TENSOR.size
    if dtype_code >= len(_DTYPES):
        raise DescriptorInvalid(
            f"{field}.dtype", dtype_code, f"unknown dtype code (0..{len(_DTYPES) - 1})"
        )
    if has_ref > 1:
        raise DescriptorInvalid(f"{field}.ref", has_ref, "ref flag must be 0 or 1")
    if at + 8 * ndim > size:
        raise DescriptorInvalid(f"{field}.shape", ndim, "dimensions run past the header's end")
    shape = struct.unpack_from(f"<{ndim}Q", view, at)
    at += 8 * ndim
    name, at = _text(view, at, name_len, f"{field}.name", DescriptorInvalid)
    try:
        if not has_ref:
            return TensorSpec.inline(name, _DTYPES[dtype_code], shape, nbytes), at
        if at + _REF.size > size:
            raise DescriptorInvalid(f"{field}.ref", size - at, "runs past the header's end")
        segment_len, offset, generation = _REF.unpack_from(view, at)
        at += _REF.size
        segment, at = _text(view, at, segment_len, f"{field}.ref.segment", DescriptorInvalid)
        try:
            ref = ShmRef(segment, offset, generation)
        except DescriptorInvalid as exc:
            raise rebase(exc, "ref", f"{field}.ref") from None
        return TensorSpec(name, _DTYPES[dtype_code], shape, nbytes, ref), at
    except DescriptorInvalid as exc:
        raise rebase(exc, "tensor", field) from None
