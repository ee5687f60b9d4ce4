"""Per-call frames with a binary header, encoded from a kept template of their header.

A request or event frame on a binary channel repeats most of its header call after call:
the op, stage id, epoch, generation, required features, tensor entries and meta are the
same for every call of one stage with inputs of one shape; only the request id (and an
event's ``event-fields`` block: seq, created_ns, kind) change. :func:`encode_call_frame`
keeps each such header once, encoded by :func:`~edge_contracts.wire.encode_frame` itself,
cut around the parts that change, and writes a later call's header by joining the kept
bytes with its own request id (and block). The bytes are those ``encode_frame`` writes;
a test compares the two.

What is kept is keyed by everything the kept bytes depend on: op, stage id, epoch,
generation, required features, the request id's length in bytes, each tensor entry (by
identity: the template holds the entries, so no other object can take their ids; a
shared-memory entry by its values but its reference's generation, which changes call
after call: the kept bytes are cut around it and each frame's generation is written
between the pieces) and the meta. A frame with non-empty request params, or with event
meta over 256 bytes, is encoded in full every time, but for an event whose meta is new on
every call (a DONE acknowledging its inputs by generation: ``meta_apart``), whose template
is kept without the meta, written after the kept bytes with its length in the fixed
part. At most 1024 templates are kept; then they are dropped and rebuilt.

An acknowledgement (:func:`encode_ack_frame`) has no template: its meta lists the
segments and generations it acknowledges, which change call after call; its header is
written directly (:func:`~edge_contracts.binary_header.encode_ack_header`).

For per-call paths whose values were checked once already (see
:func:`~edge_contracts.headers.prechecked_header`): entries made by the tensor packer,
payloads its contiguous byte views, one per inline entry, in order.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from edge_contracts.binary_header import (
    BINARY_MAGIC,
    EVENT_BLOCK,
    FIXED,
    encode_ack_header,
    split_generations,
)
from edge_contracts.headers import TensorSpec, prechecked_header, tensor_totals
from edge_contracts.jsonvalues import EMPTY_OBJECT, JSONObject
from edge_contracts.protocol import FEATURE_EVENT_FIELDS, FEATURE_SHM_TENSORS, OP_EVENT
from edge_contracts.wire import PREFIX, encode_frame

__all__ = ["MAX_TEMPLATES", "encode_ack_frame", "encode_call_frame", "template_count"]

MAX_TEMPLATES = 1024
"""Most header templates kept at once (then all are dropped and made again)."""

_MAX_EVENT_META = 256  # longer event meta (handler data) is not kept
_GENERATION = struct.Struct("<Q")  # a reference's generation in its entry
_META_LEN = struct.Struct("<I")  # the fixed part's meta byte count
_META_LEN_AT = 14  # (after "<HBBHHHI")
_META_LEN_END = _META_LEN_AT + _META_LEN.size
_APART = object()  # in a key: a template kept without the event meta (meta_apart)
# key -> (fixed part, stage id bytes, entries + meta bytes (with shared-memory entries:
# the pieces around their generations), event block bytes, inline bytes, the entries)
_TEMPLATES: dict[tuple[object, ...],
                 tuple[bytes, bytes, bytes | tuple[bytes, ...], int, int,
                       tuple[TensorSpec, ...]]] = {}


def template_count() -> int:
    """How many header templates are kept now (for tests and reports)."""
    return len(_TEMPLATES)


def encode_call_frame(
    op: str,
    request_id: str,
    stage_id: str,
    epoch: int,
    generation: int,
    specs: tuple[TensorSpec, ...],
    payloads: Sequence[memoryview],
    features: frozenset[str],
    *,
    meta: JSONObject = EMPTY_OBJECT,
    event_meta: bytes | None = None,
    event_block: bytes = b"",
    keep: bool = True,
    meta_apart: bool = False,
) -> list[bytes | memoryview]:
    """Return the frame ``encode_frame(prechecked_header(...), payloads, binary=True)`` writes.

    ``meta`` is a request's params; an event gives its meta as ``event_meta`` bytes (and
    its ``event_block`` with the ``event-fields`` feature), as
    :func:`~edge_contracts.wire.encode_frame` takes them. The entries' byte totals are
    those of :func:`~edge_contracts.headers.tensor_totals`, which checks the entries the
    first time they come together. The other values must have passed their checks
    already (see the module docstring): nothing is checked again here. ``keep=False``
    neither uses nor keeps a template. ``meta_apart`` (an event's) keeps the template
    without ``event_meta``, which a later frame writes after it (and its length into the
    fixed part): for an event whose meta is new on every call (it acknowledges inputs by
    generation), which would otherwise push others out (``keep`` is then not read).
    """
    rid = request_id.encode()
    key: tuple[object, ...] | None = None
    generations: list[int] | None = None
    apart = meta_apart and event_meta is not None
    if meta is EMPTY_OBJECT and (event_meta is None or apart
                                 or (keep and len(event_meta) <= _MAX_EVENT_META)):
        marked = _APART if apart else event_meta  # (the meta's bytes, or none kept)
        if features and FEATURE_SHM_TENSORS in features:  # entries by value, generations apart
            entries: list[object] = []
            generations = []
            for spec in specs:
                ref = spec.ref
                if ref is None:
                    entries.append(id(spec))
                else:
                    entries.append((spec.name, spec.dtype, spec.shape, spec.nbytes,
                                    ref.segment, ref.offset))
                    generations.append(ref.generation)
            key = (op, stage_id, epoch, generation, features, len(rid), marked, *entries)
        else:
            key = (op, stage_id, epoch, generation, features, len(rid), marked,
                   *map(id, specs))
        kept = _TEMPLATES.get(key)
        if kept is not None and len(event_block) == kept[3]:  # else encode_frame refuses
            fixed, stage, tail, _, inline, _ = kept
            if generations:  # the tail: pieces around the references' generations
                pieces: tuple[bytes, ...] = tail  # type: ignore[assignment]
                joined = [pieces[0]]
                for value, piece in zip(generations, pieces[1:], strict=True):
                    joined += (_GENERATION.pack(value), piece)
                tail = b"".join(joined)
            if apart:  # the meta after the kept bytes, its length in the fixed part
                fixed = (fixed[:_META_LEN_AT] + _META_LEN.pack(len(event_meta))  # type: ignore[arg-type]
                         + fixed[_META_LEN_END:])
            # bytes: a tail of pieces was joined just above
            raw = b"".join((fixed, rid, stage, event_block, tail,  # type: ignore[arg-type]
                            event_meta if apart else b""))
            return [PREFIX.pack(BINARY_MAGIC, len(raw), inline) + raw, *payloads]
    inline, total = tensor_totals(specs, features) if specs else (0, 0)
    header = prechecked_header(op, request_id, stage_id, epoch, generation, specs, meta,
                               features, inline, total)
    parts = encode_frame(header, payloads, binary=True, event_meta=event_meta,
                         event_block=event_block)
    first = parts[0]
    if key is not None and first[:4] == BINARY_MAGIC:
        raw = bytes(first[PREFIX.size :])
        stage = stage_id.encode()
        block = EVENT_BLOCK.size if op == OP_EVENT and FEATURE_EVENT_FIELDS in features else 0
        tail_at = FIXED.size + len(rid) + len(stage) + block
        end = len(raw) - len(event_meta) if apart else len(raw)  # type: ignore[arg-type]
        kept_tail: bytes | tuple[bytes, ...] = raw[tail_at:end]
        if generations:  # cut around them: the entries come first in the tail
            entries_len = FIXED.unpack_from(raw)[6]
            cut = split_generations(raw[tail_at : tail_at + entries_len], len(specs))
            if cut is None or cut[1] != generations:  # pragma: no cover - own entries
                return parts
            kept_tail = (*cut[0][:-1], cut[0][-1] + raw[tail_at + entries_len : end])
        if len(_TEMPLATES) >= MAX_TEMPLATES:
            _TEMPLATES.clear()
        _TEMPLATES[key] = (raw[: FIXED.size], stage, kept_tail, block, inline, specs)
    return parts


def encode_ack_frame(
    generation: int,
    segments: Sequence[Sequence[Any]],
    unlink: Sequence[Sequence[Any]] = (),
    gone: Sequence[str] = (),
) -> bytes:
    """Return the ``ack`` frame ``encode_frame`` writes on a binary channel, as one buffer.

    ``meta`` is ``{"segments": segments}`` plus ``"unlink"`` and ``"gone"`` when not empty
    (see :func:`~edge_contracts.binary_header.encode_ack_header`, which checks the pairs and
    names); ``generation`` the channel's worker generation, checked once already.
    """
    raw = encode_ack_header(generation, segments, unlink, gone)
    return PREFIX.pack(BINARY_MAGIC, len(raw), 0) + raw
