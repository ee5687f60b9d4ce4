"""Kept templates of the usual request and of its DONE event, for the worker's serve loop.

A stage's worker reads the same request frame call after call: the same op, stage,
epoch, generation, required features and input entries, no params; only the request id
and the input bytes change. It answers with the same DONE event call after call: only
the request id, the event block (seq, created_ns) and the output bytes change.
:class:`~edge_contracts.worker._Server` serves such a request on a usual path made of
what this module keeps:

* :func:`request_template`: after a request frame passed every check of the frame
  reader (:class:`~edge_contracts.frame_reader.FrameReader`, the full binary header
  parser), its header bytes without the request id become a key, and what the request
  needs (op, ids, epoch, generation, where each input lies in the payload) its
  template. A later frame whose header equals the key but for its request id, and
  whose payload length is the template's, differs from the checked one only in that id
  and its input bytes: the loop checks the id as the parser does (UTF-8, printable,
  at most 128 characters) and takes the inputs as read-only views of its payload.
  Anything else (another header, several frames in one receive but for the
  controller's usual acknowledgement before it, which the loop applies first, a frame
  not wholly received) goes through the frame reader and its errors.
* :func:`event_template`: the first DONE event of a given stage, epoch, request id
  length and output list (names, dtypes, shapes, each C-contiguous and inline) is
  packed by the channel's tensor packer (its checks: ``max_io_bytes``) and encoded by
  :func:`~edge_contracts.call_frames.encode_call_frame`; its header bytes are cut
  around the request id and the event block, which a later DONE writes between them.
  The bytes are those the general path writes; a test compares the two.

A zero-copy stage's request and DONE have their own templates, since a generation changes
in them on every call:

* :func:`refs_request_template`: a checked request with shared-memory input entries
  (no params) is kept by its fixed part (request id length included), with the bytes
  after its request id cut around each reference's generation. A later frame whose fixed
  part is the key, whose other bytes equal the pieces (:func:`refs_request_match`) and
  whose payload length is the template's differs from the checked one only in its id,
  its references' generations and its inline bytes: the loop checks the id as the parser
  does, each generation as :class:`~edge_contracts.headers.ShmRef` does (at most
  ``INT64_MAX``), and maps each input through
  :meth:`~edge_contracts.shm.SegmentConsumer.view`, which checks the segment, the range
  and the generation as for any request. A refusal sends the frame through the frame
  reader and the general path, which refuse it as they refuse any.
* :func:`in_place_event_template`: a DONE whose outputs are all the handler's own output
  buffers (:meth:`~edge_contracts.worker_call.Call.output_buffer`, leased in the worker's
  segments) is written from a template cut from what
  :func:`~edge_contracts.call_frames.encode_call_frame` wrote for the first such DONE of
  its stage, epoch, request id length, output names, dtypes, shapes, segments and
  offsets: each write puts in the id, the event block, each output's generation and the
  acknowledgement of the inputs (``{"acks": [...]}``, the meta, its length in the fixed
  part). The bytes are those the general path writes; a test compares the two.

Only tensors of plain numeric types (not ``bool``, whose values the unpacker checks, nor
``bfloat16``) and headers of at most 4 KiB are kept; at most 256 of each kind at once
(then all are dropped and made again). Standard library only; numpy is imported with the
first template that has tensors.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from edge_contracts.binary_header import (
    BINARY_MAGIC,
    EVENT_BLOCK,
    FIXED,
    generations_between,
    split_generations,
)
from edge_contracts.call_frames import encode_call_frame
from edge_contracts.dtypes import DType
from edge_contracts.headers import FrameHeader
from edge_contracts.jsonvalues import EMPTY_OBJECT
from edge_contracts.protocol import DATA_OPS, FEATURE_EVENT_FIELDS, OP_EVENT
from edge_contracts.wire import PREFIX_SIZE

if TYPE_CHECKING:
    from edge_contracts.worker_transport import TensorPacker

__all__ = [
    "MAX_KEPT",
    "REFS_PER_KEY",
    "REQUEST_ID_AT",
    "InPlaceEvent",
    "KeptEvent",
    "KeptRefsRequest",
    "KeptRequest",
    "event_template",
    "in_place_event_template",
    "refs_request_match",
    "refs_request_template",
    "request_template",
]

MAX_KEPT = 256
"""Most templates of each kind kept at once (then all are dropped and made again)."""
REQUEST_ID_AT = FIXED.size
"""Where a binary header's request id begins (after its fixed part)."""
_MAX_HEADER = 4096  # longer headers are never kept

#: ``(payload length, op, stage id, epoch, generation, layout)``; the layout holds, per
#: input in header order, ``(name, NumPy dtype, element count, payload offset, shape)``
#: with shape None for one dimension (the view needs no reshape).
KeptRequest = tuple[int, str, str, int, int, tuple[tuple[str, Any, int, int, Any], ...]]
#: ``(prefix and fixed part, stage id bytes, entries and meta, the frame's byte count)``
KeptEvent = tuple[bytes, bytes, bytes, int]
#: ``(payload length, op, stage id, epoch, generation, pieces, generations' offsets,
#: layout)``: the pieces are the header's bytes after the request id but each reference's
#: generation, as ``(start, end, bytes)`` counted from the request id's end, and each
#: generation lies 8 bytes at its offset there; the layout holds, per input in header
#: order, ``(name, NumPy dtype, element count, shape or None, segment or None, offset)``:
#: a shared-memory input (its segment, the offset in it) takes the next generation, an
#: inline one (segment None) lies at the offset in the payload.
KeptRefsRequest = tuple[int, str, str, int, int, tuple[tuple[int, int, bytes], ...],
                        tuple[int, ...], tuple[tuple[str, Any, int, Any, Any, int], ...]]
#: ``(fixed part before its meta length, after it, stage id bytes, the pieces of the
#: entries around the outputs' generations, the header's byte count without meta)``
InPlaceEvent = tuple[bytes, bytes, bytes, tuple[bytes, ...], int]
REFS_PER_KEY = 4
"""Most zero-copy request templates kept per fixed part (a producer alternates segments)."""
_META_LEN_AT = 14  # where the fixed part's meta byte count lies (u32)
_META_LEN_END = _META_LEN_AT + 4
_ENTRIES_LEN = struct.Struct("<I")  # the fixed part's tensor entry bytes, at offset 10
_ENTRIES_LEN_AT = 10


def request_template(raw: bytes, header: FrameHeader) -> tuple[bytes, KeptRequest] | None:
    """The key and template of a request whose binary header ``raw`` was checked whole.

    ``header`` is what the frame reader parsed from ``raw`` (every check passed). None
    when the request is not a usual one: not ``run``/``generate``, request params, a
    shared-memory or ``bool``/``bfloat16`` input, or a header over 4 KiB.
    """
    if (header.op not in DATA_OPS or header.meta is not EMPTY_OBJECT
            or len(raw) > _MAX_HEADER):
        return None
    layout = []
    if header.tensors:
        from edge_contracts.tensors import numpy_dtype  # numpy: tensors are handled

        offset = 0
        for spec in header.tensors:
            if spec.ref is not None or spec.dtype is DType.BOOL or spec.dtype is DType.BFLOAT16:
                return None
            dtype = numpy_dtype(spec.dtype)
            shape = spec.shape if len(spec.shape) != 1 else None
            layout.append((spec.name, dtype, spec.nbytes // dtype.itemsize, offset, shape))
            offset += spec.nbytes
    request_end = REQUEST_ID_AT + len(header.request_id.encode())
    key = raw[:REQUEST_ID_AT] + raw[request_end:]
    return key, (header.inline_nbytes, header.op, header.stage_id, header.epoch,
                 header.generation, tuple(layout))


def event_template(
    outputs: Mapping[str, Any],
    packer: TensorPacker,
    request_id: bytes,
    stage_id: str,
    epoch: int,
    generation: int,
    features: frozenset[str],
    max_header_bytes: int,
) -> KeptEvent | None:
    """The template of a DONE event with these ``outputs``, or None when it is not kept.

    Kept: every output a C-contiguous array of at least one dimension and one byte, of
    a NumPy dtype the wire carries as it is (plain little-endian numeric), below the
    packer's shared-memory threshold; ``packer`` (the channel's) accepts them (their
    total within its ``max_bytes``); the header at most 4 KiB and ``max_header_bytes``.
    ``features`` are the event's required features (``event-fields`` among them),
    ``generation`` the channel's, checked once.
    """
    import numpy as np  # an output of arrays: numpy is imported

    from edge_contracts.tensors import plain_wire_dtype

    for value in outputs.values():  # shared memory: leased by pack, never kept
        if (type(value) is not np.ndarray or not value.flags.c_contiguous or not value.ndim
                or not value.size or plain_wire_dtype(value.dtype) is None
                or (packer.producer is not None and value.nbytes >= packer.threshold)):
            return None
    try:
        packed = packer.pack(outputs)
    except Exception:  # refused again, with its error, by the general path
        return None
    if packed.leases or packed.features:  # pragma: no cover - excluded above
        packer.take_back(packed.leases)
        return None
    stage = stage_id.encode()
    block = EVENT_BLOCK.pack(0, 0, 0)
    first = encode_call_frame(
        OP_EVENT, request_id.decode(), stage_id, epoch, generation, packed.specs,
        packed.payloads, features, event_meta=b"", event_block=block, keep=False)[0]
    header_len = len(first) - PREFIX_SIZE
    if header_len > min(_MAX_HEADER, max_header_bytes):
        return None
    fixed_end = PREFIX_SIZE + REQUEST_ID_AT
    tail_at = fixed_end + len(request_id) + len(stage) + len(block)
    inline = sum(spec.nbytes for spec in packed.specs)
    return bytes(first[:fixed_end]), stage, bytes(first[tail_at:]), len(first) + inline


def refs_request_template(raw: bytes, header: FrameHeader) -> tuple[bytes, KeptRefsRequest] | None:
    """The key and template of a zero-copy request whose binary header ``raw`` was checked.

    ``header`` is what the frame reader parsed from ``raw`` (every check passed). None
    when it is not one: not ``run``/``generate``, request params, no shared-memory input,
    a ``bool``/``bfloat16`` input, or a header over 4 KiB.
    """
    if (header.op not in DATA_OPS or header.meta is not EMPTY_OBJECT
            or len(raw) > _MAX_HEADER or not header.tensors):
        return None
    from edge_contracts.tensors import numpy_dtype  # numpy: tensors are handled

    request_end = REQUEST_ID_AT + len(header.request_id.encode())
    entries_at = request_end + len(header.stage_id.encode())  # (a request has no block)
    entries_end = entries_at + _ENTRIES_LEN.unpack_from(raw, _ENTRIES_LEN_AT)[0]
    cut = split_generations(raw[entries_at:entries_end], len(header.tensors))
    if cut is None or entries_end != len(raw):  # no reference; (meta: none, checked)
        return None
    layout: list[tuple[str, Any, int, Any, Any, int]] = []
    offset = 0
    for spec in header.tensors:
        if spec.dtype is DType.BOOL or spec.dtype is DType.BFLOAT16:
            return None
        dtype = numpy_dtype(spec.dtype)
        shape = spec.shape if len(spec.shape) != 1 else None
        ref = spec.ref
        if ref is None:
            layout.append((spec.name, dtype, spec.nbytes // dtype.itemsize, shape, None, offset))
            offset += spec.nbytes
        else:
            layout.append((spec.name, dtype, spec.nbytes // dtype.itemsize, shape,
                           ref.segment, ref.offset))
    pieces = []
    generations_at = []
    at = entries_at - request_end
    first = raw[request_end:entries_at]  # the stage id, before the first entry's piece
    for index, piece in enumerate(cut[0]):
        if not index:
            piece = first + piece
            pieces.append((0, len(piece), piece))
        else:
            pieces.append((at, at + len(piece), piece))
        at = pieces[-1][1]
        if index < len(cut[1]):
            generations_at.append(at)
            at += 8
    return raw[:REQUEST_ID_AT], (header.inline_nbytes, header.op, header.stage_id,
                                 header.epoch, header.generation, tuple(pieces),
                                 tuple(generations_at), tuple(layout))


def refs_request_match(
    raw: bytes, id_end: int, candidates: tuple[KeptRefsRequest, ...], payload_len: int,
) -> tuple[KeptRefsRequest, list[int]] | None:
    """The template among ``candidates`` that ``raw`` equals but for id and generations.

    ``raw`` is a whole binary header whose fixed part is the candidates' key, its request
    id ending at ``id_end``; ``payload_len`` its prefix's payload length. Returns the
    template and the frame's generations (each checked: at most ``INT64_MAX``), or None.
    """
    size = len(raw) - id_end
    for kept in candidates:
        pieces = kept[5]
        if kept[0] != payload_len or pieces[-1][1] != size:
            continue
        generations = generations_between(raw, id_end, pieces, kept[6])
        if generations is not None:
            return kept, generations
    return None


def in_place_event_template(
    outputs: Mapping[str, Any],
    allocated: Mapping[int, tuple[Any, Any]],
    packer: TensorPacker,
    request_id: bytes,
    stage_id: str,
    epoch: int,
    generation: int,
    max_header_bytes: int,
) -> InPlaceEvent | None:
    """The template of a DONE whose ``outputs`` all lie in their output buffers, or None.

    ``allocated`` maps ``id(array)`` to ``(array, lease)`` for the request's output
    buffers (:meth:`~edge_contracts.worker_call.Call.output_buffer`): each output must be
    one of them (the very array), and ``packer`` (the channel's) must accept them (their
    total within its ``max_bytes``); it packs them from a copy of ``allocated``, which is
    left as it is. The header without meta must be at most 4 KiB and ``max_header_bytes``.
    ``generation`` is the channel's, checked once.
    """
    seen = set()
    for value in outputs.values():  # each its own buffer (one under two names: a copy)
        owned = allocated.get(id(value))
        if owned is None or owned[0] is not value or id(value) in seen:
            return None
        seen.add(id(value))
    try:
        packed = packer.pack(outputs, dict(allocated))
    except Exception:  # refused again, with its error, by the general path
        return None
    if packed.payloads or len(packed.leases) != len(outputs):  # pragma: no cover - in place
        return None
    features = packed.features | {FEATURE_EVENT_FIELDS}
    stage = stage_id.encode()
    first = encode_call_frame(
        OP_EVENT, request_id.decode(), stage_id, epoch, generation, packed.specs, [],
        features, event_meta=b"", event_block=EVENT_BLOCK.pack(0, 0, 0), keep=False)[0]
    header_len = len(first) - PREFIX_SIZE
    if first[:4] != BINARY_MAGIC or header_len > min(_MAX_HEADER, max_header_bytes):
        return None
    raw = bytes(first[PREFIX_SIZE:])
    entries_at = REQUEST_ID_AT + len(request_id) + len(stage) + EVENT_BLOCK.size
    cut = split_generations(raw[entries_at:], len(packed.specs))
    if cut is None or len(cut[1]) != len(outputs):  # pragma: no cover - own entries
        return None
    return (raw[:_META_LEN_AT], raw[_META_LEN_END:REQUEST_ID_AT], stage, tuple(cut[0]),
            header_len)
