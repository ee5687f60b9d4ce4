"""Kept templates of the usual request frame, for the controller's write to a worker channel.

A stage's caller sends the same request frame call after call: the same op, stage,
epoch, generation and input entry (one array of one name, dtype and shape), no params,
no required features; only the request id and the input bytes change. With the request
id's length the same too, every byte of the frame's prefix and header but the id's is
the same, and so is the frame's length. :class:`~edge_core.host.client.WorkerClient`
writes such a request on a usual path made of what this module keeps (the controller's
side of :mod:`edge_contracts.worker_kept`, which reads it on the worker's):

* :func:`request_template`: after a request was packed by the channel's tensor packer
  (its checks: one C-contiguous array of a plain wire dtype, inline, within
  ``max_io_bytes``) and encoded by
  :func:`~edge_contracts.call_frames.encode_call_frame` with a binary header, its first
  part (prefix and header) is cut around the request id. A later request with the same
  key is written as the kept bytes joined around its own id, followed by its array's
  bytes: the bytes the general path writes (a test compares the two).

The key of a usual request is what its frame's bytes but the id's depend on, the tuple
``(id length, name, dtype, shape, operation, stage id, epoch)``: the request id's length
in UTF-8 bytes, the lone input's name, its array's dtype and shape, the request's
:class:`~edge_contracts.requests.Operation`, stage id and epoch. The client builds it
inline on its per-request path (no call); ``core/tests/host/test_usual_request.py`` checks
the keys the client keeps.

Kept: one input, a C-contiguous array (at least one dimension and one byte) that went
inline without a required feature, no params, no segment names announced with the
frame (``gone``), headers of at most 4 KiB; at most :data:`MAX_KEPT` at once (then all
are dropped and made again). The channel's generation is not in the key: a client has
one.

The zero-copy request is kept the same way (:func:`ref_request_template`): one input
buffer (``InputBuffers.allocate``) sent by reference, no params, no segment names to
announce. Its frame has no payload; its header repeats call after call but for the
request id and the reference's generation, which the buffer's claim stamps anew on every
send. Its key adds the buffer's segment and offset to the usual one (the frame's bytes
depend on them, and on the features the dtype brings), and its template cuts the header
around the id and the generation (:func:`~edge_contracts.binary_header.split_generations`
finds it): a later request is written as the kept bytes joined around its own id and its
generation, the bytes the general path writes (a test compares the two).
"""

from __future__ import annotations

from edge_contracts.binary_header import FIXED, split_generations
from edge_contracts.wire import BINARY_MAGIC, PREFIX, PREFIX_SIZE

__all__ = ["MAX_KEPT", "KeptRefRequest", "KeptRequest", "ref_request_template",
           "request_template"]

MAX_KEPT = 256
"""Most request templates a client keeps at once (then all are dropped and made again)."""
_MAX_HEADER = 4096  # longer headers are never kept
_ID_AT = PREFIX_SIZE + FIXED.size  # where a frame's request id begins (after the fixed part)

#: ``(prefix and fixed part, the header after the request id, the frame's byte count)``
KeptRequest = tuple[bytes, bytes, int]
#: ``(prefix and fixed part, the header from the request id's end to the reference's
#: generation, the header after the generation)``: the frame is these with the id and the
#: generation (8 bytes, little-endian) between them, and nothing after
KeptRefRequest = tuple[bytes, bytes, bytes]


def request_template(first: bytes | memoryview, id_length: int,
                     nbytes: int) -> KeptRequest | None:
    """The template of a request frame whose first part is ``first``, or None.

    ``first`` is what :func:`~edge_contracts.call_frames.encode_call_frame` returned
    first (the prefix and the header) for a request with one inline input of ``nbytes``
    bytes and a request id of ``id_length`` UTF-8 bytes. None when the header is not
    binary or longer than 4 KiB.
    """
    if first[:4] != BINARY_MAGIC or len(first) - PREFIX_SIZE > _MAX_HEADER:
        return None
    head = bytes(first)
    return head[:_ID_AT], head[_ID_AT + id_length :], len(head) + nbytes


def ref_request_template(first: bytes | memoryview, id_length: int,
                         generation: int) -> KeptRefRequest | None:
    """The template of a zero-copy request frame whose whole bytes are ``first``, or None.

    ``first`` is what :func:`~edge_contracts.call_frames.encode_call_frame` returned for a
    request with one input sent by reference at ``generation`` (no payload, no params)
    and a request id of ``id_length`` UTF-8 bytes. None when the frame is not such a
    binary one (a payload, meta, not one reference of that generation) or its header is
    longer than 4 KiB.
    """
    head = bytes(first)
    if (head[:4] != BINARY_MAGIC or len(head) - PREFIX_SIZE > _MAX_HEADER
            or len(head) < _ID_AT):
        return None
    _, header_len, payload_len = PREFIX.unpack_from(head)
    fields = FIXED.unpack_from(head, PREFIX_SIZE)
    request_len, stage_len, count, entries_len, meta_len = fields[3:8]
    entries_at = _ID_AT + request_len + stage_len
    if (payload_len or meta_len or request_len != id_length
            or PREFIX_SIZE + header_len != len(head) or entries_at + entries_len != len(head)):
        return None
    cut = split_generations(head[entries_at:], count)
    if cut is None or cut[1] != [generation]:
        return None
    (before, after), _ = cut
    return head[:_ID_AT], head[_ID_AT + id_length : entries_at] + before, after
