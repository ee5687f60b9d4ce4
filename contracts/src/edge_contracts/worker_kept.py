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
  Anything else (another header, several frames in one receive, a frame not wholly
  received) goes through the frame reader and its errors.
* :func:`event_template`: the first DONE event of a given stage, epoch, request id
  length and output list (names, dtypes, shapes, each C-contiguous and inline) is
  packed by the channel's tensor packer (its checks: ``max_io_bytes``) and encoded by
  :func:`~edge_contracts.call_frames.encode_call_frame`; its header bytes are cut
  around the request id and the event block, which a later DONE writes between them.
  The bytes are those the general path writes; a test compares the two.

Only inline tensors of plain numeric types (not ``bool``, whose values the unpacker
checks, nor ``bfloat16``) and headers of at most 4 KiB are kept; at most 256 of each
kind at once (then all are dropped and made again). Standard library only; numpy is
imported with the first template that has tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from edge_contracts.binary_header import EVENT_BLOCK, FIXED
from edge_contracts.call_frames import encode_call_frame
from edge_contracts.dtypes import DType
from edge_contracts.headers import FrameHeader
from edge_contracts.jsonvalues import EMPTY_OBJECT
from edge_contracts.protocol import DATA_OPS, OP_EVENT
from edge_contracts.wire import PREFIX_SIZE

if TYPE_CHECKING:
    from edge_contracts.worker_transport import TensorPacker

__all__ = [
    "MAX_KEPT",
    "REQUEST_ID_AT",
    "KeptEvent",
    "KeptRequest",
    "event_template",
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
