"""Kept templates of the usual reply, for the controller's read of a worker channel.

A stage's worker answers request after request with the same DONE event: the same
stage, epoch, generation, required features and output entries, no error, no data;
only the request id, the event block (seq, created_ns) and the output bytes change.
:class:`~edge_core.host.client.WorkerClient` reads such a reply on a usual path made of
what this module keeps (the controller's side of :mod:`edge_contracts.worker_kept`):

* :func:`reply_template`: after an event frame passed every check of the frame reader
  (:class:`~edge_contracts.frame_reader.FrameReader`, the full binary header parser) and
  was the only frame of its receive, its header bytes without the request id and the
  event block's stamp (seq and created_ns; its kind code stays) become a key
  (:func:`reply_key`), and what its delivery needs (stage, epoch, generation, where each
  output lies in the payload, the event's output descriptors) its template. A later
  frame that is again the only, whole frame of its receive, whose header equals the key
  but for those two parts and whose payload length is the template's, differs from the
  checked one only in them and its output bytes: the client checks the stamp as the
  parser does (seq and created_ns at most ``INT64_MAX``), that the id is UTF-8 naming a
  call in flight of the template's epoch (the id of a call in flight was checked when
  its request was made: printable, at most 128 characters), and delivers the outputs
  as the general path makes them (read-only views of a copy of the payload) with the
  event built from the template. Anything else goes through the frame reader (but for
  a zero-copy reply alone in its receive, whose header the client looks up among the
  frame reader's kept ones itself: see ``WorkerClient._read_one``).

Kept: DONE events of the client's generation with the ``event-fields`` block and no
other meta (no error, data, ``gone`` or ``acks``), without the ``shm-tensors`` feature,
whose outputs are inline arrays of plain numeric types (not ``bool``, whose values the
unpacker checks, nor ``bfloat16``), headers of at most 4 KiB; at most
:data:`MAX_KEPT` at once (then all are dropped and made again).
"""

from __future__ import annotations

import struct
from typing import Any

from edge_contracts.binary_header import FIXED
from edge_contracts.buffers import BufferDescriptor
from edge_contracts.dtypes import DType
from edge_contracts.headers import FrameHeader
from edge_contracts.protocol import FEATURE_EVENT_FIELDS, FEATURE_SHM_TENSORS, OP_EVENT
from edge_contracts.tensors import numpy_dtype
from edge_core.host.calls import output_descriptor

__all__ = ["MAX_KEPT", "STAMP", "KeptReply", "reply_key", "reply_template"]

MAX_KEPT = 256
"""Most reply templates a client keeps at once (then all are dropped and made again)."""
STAMP = struct.Struct("<QQ")
"""The event block's stamp, seq u64 and created_ns u64: the block but for its kind code."""
_MAX_HEADER = 4096  # longer headers are never kept
_STAMP_SIZE = STAMP.size
_META_KEYS = frozenset({"seq", "kind", "created_ns"})  # the block's: no JSON meta

#: ``(payload length, stage id, epoch, generation, layout, outputs)``; the layout holds,
#: per output in header order, ``(name, NumPy dtype, element count, payload offset,
#: shape)`` with shape None for one dimension (the view needs no reshape), and
#: ``outputs`` the event's descriptor of each (:attr:`StageEvent.outputs`).
KeptReply = tuple[int, str, int, int,
                  tuple[tuple[str, Any, int, int, tuple[int, ...] | None], ...],
                  tuple[BufferDescriptor, ...]]


def reply_key(raw: bytes) -> bytes:
    """The key of a binary event header ``raw``: without its request id and stamp.

    ``raw`` is at least the fixed part long. (The client's usual path computes the same
    key inline.)
    """
    id_end = FIXED.size + (raw[4] | raw[5] << 8)
    stage_end = id_end + (raw[6] | raw[7] << 8)
    return raw[: FIXED.size] + raw[id_end:stage_end] + raw[stage_end + _STAMP_SIZE :]


def reply_template(
    raw: bytes, header: FrameHeader, generation: int
) -> tuple[bytes, KeptReply] | None:
    """The key and template of a reply whose binary header ``raw`` was checked whole.

    ``header`` is what the frame reader parsed from ``raw`` (every check passed),
    ``generation`` the client's. None when the reply is not a usual one (see the module
    docstring).
    """
    meta = header.meta
    if (header.op != OP_EVENT or len(raw) > _MAX_HEADER or header.generation != generation
            or FEATURE_EVENT_FIELDS not in header.required_features
            or FEATURE_SHM_TENSORS in header.required_features
            or meta.get("kind") != "done" or frozenset(meta) != _META_KEYS):
        return None
    layout = []
    outputs = []
    offset = 0
    for spec in header.tensors:
        if spec.ref is not None or spec.dtype is DType.BOOL or spec.dtype is DType.BFLOAT16:
            return None
        dtype = numpy_dtype(spec.dtype)
        shape = spec.shape if len(spec.shape) != 1 else None
        layout.append((spec.name, dtype, spec.nbytes // dtype.itemsize, offset, shape))
        outputs.append(output_descriptor(generation, spec.dtype, spec.shape, spec.nbytes))
        offset += spec.nbytes
    return reply_key(raw), (header.inline_nbytes, header.stage_id, header.epoch,
                            header.generation, tuple(layout), tuple(outputs))
