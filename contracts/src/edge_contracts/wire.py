"""Wire framing: length-prefixed frames with a JSON header and an inline tensor payload.

A frame is::

    prefix   16 bytes, struct "<4sIQ": magic b"EDGW", header length (u32) and
             payload length (u64), little-endian
    header   header-length bytes of UTF-8 JSON: one object (FrameHeader.to_dict)
    payload  payload-length bytes: the inline tensors' bytes back to back, in header
             order, each C-contiguous and little-endian, with no padding

:func:`read_frame` checks everything it can *before* it reads or allocates a payload
byte, in this order: the prefix (magic; header length <= ``max_header_bytes``;
payload length <= ``max_io_bytes``), the header's JSON, its version, its required
features, the tensor count, every tensor descriptor, the total of inline and
shared-memory tensor bytes (<= ``max_io_bytes``) and that the payload length equals
the inline tensors' bytes. Only then does it allocate the payload's ``bytearray``, and
even then only as the bytes arrive (:func:`receive_payload`): a declared length is not
an allocation. Every refusal is a :class:`~edge_contracts.errors.WireError`. There is no pickle
anywhere; docs/wire.md records the measurement behind the JSON header.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edge_contracts.binary_header import (
    BINARY_FEATURES,
    BINARY_MAGIC,
    BINARY_OPS,
    encode_binary_header,
    encode_event_header,
    parse_binary_header,
)
from edge_contracts.errors import (
    FrameTruncated,
    HeaderMalformed,
    HeaderTooLarge,
    PayloadMismatch,
    PayloadTooLarge,
    StreamClosed,
    UnknownRequiredFeature,
    VersionMismatch,
    WireError,
)
from edge_contracts.headers import (
    MAX_HEADER_CAP,
    FrameHeader,
    Limits,
    ShmRef,
    TensorSpec,
    check_totals,
)
from edge_contracts.jsonvalues import STRICT_DECODER, thaw_json
from edge_contracts.protocol import FEATURE_BINARY_HEADER, PROTOCOL_VERSION

__all__ = [
    "BINARY_MAGIC",
    "MAGIC",
    "PAYLOAD_STEP",
    "PREFIX",
    "PREFIX_SIZE",
    "Buffer",
    "Frame",
    "FrameHeader",
    "Limits",
    "ShmRef",
    "TensorSpec",
    "decode_frame",
    "decode_prefix",
    "encode_frame",
    "encode_header",
    "parse_header",
    "prechecked_frame",
    "read_frame",
    "receive_payload",
    "refs_of",
    "write_frame",
]

MAGIC = b"EDGW"
"""The first four bytes of every frame."""

PREFIX = struct.Struct("<4sIQ")
"""The fixed prefix: magic, header length (u32), payload length (u64), little-endian."""

PREFIX_SIZE = PREFIX.size
"""Bytes in the prefix (16)."""

_IOV_BATCH = 512  # below IOV_MAX (1024 on Linux) for sendmsg/writev

PAYLOAD_STEP = 256 * 1024
"""Most bytes a reader allocates for a payload ahead of the bytes that have arrived
(beyond an eighth of what has arrived, see :func:`receive_payload`)."""

_ZEROS = memoryview(bytes(PAYLOAD_STEP))  # calloc'd: zero pages, nothing resident

Buffer = bytes | bytearray | memoryview
"""A bytes-like object accepted as a payload part."""


@dataclass(frozen=True, slots=True, eq=False)
class Frame:
    """A received frame: its header and the inline payload in one writable buffer.

    Attributes:
        header: the validated header.
        payload: the inline tensors' bytes, exactly ``header.inline_nbytes`` long.

    """

    header: FrameHeader
    payload: bytearray

    def __post_init__(self) -> None:
        if not isinstance(self.header, FrameHeader):
            raise HeaderMalformed("frame.header", self.header, "must be a FrameHeader")
        if not isinstance(self.payload, bytearray):
            raise PayloadMismatch(
                "frame.payload", type(self.payload).__name__, "must be a bytearray"
            )
        if len(self.payload) != self.header.inline_nbytes:
            raise PayloadMismatch(
                "frame.payload",
                len(self.payload),
                f"must equal the inline tensor bytes {self.header.inline_nbytes}",
            )

    def tensor_views(self) -> dict[str, memoryview]:
        """Return a writable byte view of each inline tensor, by name, in header order.

        Shared-memory tensors (``spec.ref`` set) have no bytes in the payload and are
        not included; resolve them through their :class:`ShmRef`.
        """
        whole = memoryview(self.payload)
        views: dict[str, memoryview] = {}
        offset = 0
        for spec in self.header.tensors:
            if spec.ref is None:
                end = offset + spec.nbytes
                views[spec.name] = whole[offset:end]
                offset = end
        return views



def prechecked_frame(header: FrameHeader, payload: bytearray) -> Frame:
    """A :class:`Frame` whose payload length the header parser has checked already.

    For a reader's per-frame path: ``payload`` is the bytearray it filled with exactly
    ``header.inline_nbytes`` bytes (``parse_header`` compared the prefix's length with
    them). Anything else must build ``Frame``, which checks.
    """
    frame = object.__new__(Frame)
    _set_header(frame, header)
    _set_payload(frame, payload)
    return frame


# The slots' own setters, taken once (as object.__setattr__ would set them, without a
# lookup by name per frame).
_set_header, _set_payload = Frame.__dict__["header"].__set__, Frame.__dict__["payload"].__set__


def refs_of(frame: Frame) -> list[list[Any]]:
    """Return ``[segment, generation]`` of every shared-memory tensor of ``frame``."""
    refs: list[list[Any]] = []
    for spec in frame.header.tensors:  # a loop, not a comprehension: no frame per call
        ref = spec.ref
        if ref is not None:
            refs.append([ref.segment, ref.generation])
    return refs

def decode_prefix(prefix: bytes | bytearray | memoryview, limits: Limits) -> tuple[int, int]:
    """Check a 16-byte prefix against ``limits``; return ``(header_len, payload_len)``.

    The magic is ``b"EDGW"`` (JSON header) or, when ``limits`` support the
    ``binary-header`` feature, ``b"EDGB"`` (binary header, see
    :mod:`edge_contracts.binary_header`); the caller tells them apart by the first four
    bytes.

    Raises:
        FrameTruncated: fewer than 16 bytes.
        HeaderMalformed: unknown magic, or a header length of 0.
        UnknownRequiredFeature: a binary header when ``limits`` do not support it.
        HeaderTooLarge: header length over ``limits.max_header_bytes``.
        PayloadTooLarge: payload length over ``limits.max_io_bytes``.

    """
    if len(prefix) != PREFIX_SIZE:
        raise FrameTruncated("prefix", len(prefix), f"must be {PREFIX_SIZE} bytes")
    magic, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        if magic != BINARY_MAGIC:
            raise HeaderMalformed(
                "prefix.magic", bytes(magic), f"must be {MAGIC!r} or {BINARY_MAGIC!r}"
            )
        if FEATURE_BINARY_HEADER not in limits.supported_features:
            raise UnknownRequiredFeature(
                "prefix.magic", bytes(magic), f"a binary header needs {FEATURE_BINARY_HEADER}"
            )
    if header_len == 0:
        raise HeaderMalformed("prefix.header_len", 0, "must be > 0")
    if header_len > limits.max_header_bytes:
        raise HeaderTooLarge(
            "prefix.header_len",
            header_len,
            f"must be <= max_header_bytes {limits.max_header_bytes}",
        )
    if payload_len > limits.max_io_bytes:
        raise PayloadTooLarge(
            "prefix.payload_len", payload_len, f"must be <= max_io_bytes {limits.max_io_bytes}"
        )
    return header_len, payload_len


def parse_header(
    raw: bytes | bytearray | memoryview,
    limits: Limits,
    *,
    payload_len: int | None = None,
    binary: bool = False,
    kept: bool = True,
) -> FrameHeader:
    """Parse and check a header against ``limits``, allocating no payload.

    Checks, in order: length cap, UTF-8 JSON (no duplicate keys, no NaN/Infinity),
    version, required features, tensor count, the header's fields and every tensor
    descriptor, total tensor bytes <= ``max_io_bytes`` and, when ``payload_len`` is
    given, that it equals the inline tensors' bytes. With ``binary`` the header is in
    the layout of :mod:`edge_contracts.binary_header` (same checks, same errors);
    ``kept=False`` tells it that the caller has just looked for a kept equal header.

    Raises:
        HeaderTooLarge, HeaderMalformed, VersionMismatch, UnknownRequiredFeature,
        DescriptorInvalid, PayloadTooLarge, PayloadMismatch.

    """
    if len(raw) > limits.max_header_bytes:
        raise HeaderTooLarge(
            "header", len(raw), f"must be <= max_header_bytes {limits.max_header_bytes}"
        )
    if binary:
        if FEATURE_BINARY_HEADER not in limits.supported_features:
            raise UnknownRequiredFeature(
                "header", FEATURE_BINARY_HEADER, "binary headers are not supported here"
            )
        return parse_binary_header(
            raw, limits, payload_len=payload_len, json_decoder=_DECODER, kept=kept
        )
    try:
        data = _DECODER.decode(str(raw, "utf-8"))
    except (ValueError, RecursionError) as exc:
        raise HeaderMalformed("header", _excerpt(raw), f"must be UTF-8 JSON ({exc})") from None
    if not isinstance(data, dict):
        raise HeaderMalformed("header", type(data).__name__, "must be a JSON object")
    if "version" not in data:
        raise HeaderMalformed("header.version", None, "missing required key")
    version = data["version"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionMismatch("header.version", version, f"must be {PROTOCOL_VERSION}")
    features = data.get("required_features")
    if features and isinstance(features, list):
        unknown = sorted(
            {name for name in features if isinstance(name, str)} - limits.supported_features
        )
        if unknown:
            raise UnknownRequiredFeature(
                "header.required_features",
                unknown,
                f"not supported here (supported: {', '.join(sorted(limits.supported_features))})",
            )
    tensors = data.get("tensors")
    if isinstance(tensors, list) and len(tensors) > limits.max_tensors:
        raise HeaderMalformed(
            "header.tensors", len(tensors), f"must hold <= max_tensors {limits.max_tensors}"
        )
    header = FrameHeader.from_dict(data)
    check_totals(header, limits, payload_len)
    return header


def read_frame(recv_into: Callable[[memoryview], int], limits: Limits) -> Frame:
    """Read one frame with ``recv_into`` (e.g. ``socket.recv_into``), checking it first.

    ``recv_into(view)`` fills a prefix of ``view`` and returns the byte count, 0 at end
    of stream. The prefix and header are read and checked before the payload buffer is
    allocated.

    Raises:
        StreamClosed: the stream ended before the first byte of a frame.
        FrameTruncated: the stream ended inside a frame.
        WireError: any other refusal (see :func:`decode_prefix`, :func:`parse_header`).

    """
    prefix = bytearray(PREFIX_SIZE)
    _fill(recv_into, memoryview(prefix), "prefix", at_boundary=True)
    header_len, payload_len = decode_prefix(prefix, limits)
    raw = bytearray(header_len)
    _fill(recv_into, memoryview(raw), "header")
    binary = prefix[:4] == BINARY_MAGIC
    header = parse_header(raw, limits, payload_len=payload_len, binary=binary)
    return Frame(header, receive_payload(recv_into, payload_len))


def receive_payload(
    recv_into: Callable[[memoryview], int], length: int, head: Buffer = b""
) -> bytearray:
    """Return a payload of ``length`` bytes: ``head`` (already received), then reads.

    The buffer grows with what arrives instead of being allocated whole up front, by
    :data:`PAYLOAD_STEP` at a time (CPython over-allocates a growing ``bytearray`` by an
    eighth, so resizes stay few): it never holds more than the bytes received plus
    ``max(PAYLOAD_STEP, 1/8 of them)`` and a little. A peer that declares a large
    payload (within the limits) and sends nothing makes the reader allocate at most
    ``PAYLOAD_STEP`` bytes.

    Raises:
        FrameTruncated: the stream ended first.
        WireError: ``recv_into`` returned a count outside the view it was given.

    """
    got = len(head)
    payload = bytearray(min(length, got + PAYLOAD_STEP))
    if got:
        payload[:got] = head
    while True:
        size = len(payload)
        with memoryview(payload) as view:
            while got < size:
                count = recv_into(view[got:size])
                if count == 0:
                    raise FrameTruncated(
                        "payload", got, f"stream ended after {got} of {length} bytes"
                    )
                if not 0 < count <= size - got:
                    wanted = size - got
                    raise WireError("payload", count, f"recv_into must return 0..{wanted} bytes")
                got += count
        if got == length:
            return payload
        payload += _ZEROS[: min(length - got, PAYLOAD_STEP)]


def decode_frame(data: bytes | bytearray | memoryview, limits: Limits) -> Frame:
    """Decode exactly one frame from in-memory bytes (fixtures, fuzzing, tests).

    Runs the same checks as :func:`read_frame`; bytes left after the frame are refused
    with :class:`PayloadMismatch`.
    """
    source = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    position = 0

    def recv_into(view: memoryview) -> int:
        nonlocal position
        count = min(len(view), len(source) - position)
        view[:count] = source[position : position + count]
        position += count
        return count

    frame = read_frame(recv_into, limits)
    if position != len(source):
        raise PayloadMismatch("frame", len(source) - position, "trailing bytes after the frame")
    return frame


def encode_header(header: FrameHeader) -> bytes:
    """Return the header's compact UTF-8 JSON bytes, as they travel on the wire.

    The same bytes as ``json.dumps(header.to_dict(), separators=(",", ":"))``, assembled
    without building the dictionary: the tensor list's text is cached per distinct list
    of entries (a stream repeats the same few buckets).
    """
    meta = header.meta
    features = header.required_features
    return (
        f'{{"version":{int(header.version)},'
        f'"required_features":{_ENCODER.encode(sorted(features)) if features else "[]"},'
        f'"op":{_quote(header.op)},"request_id":{_quote(header.request_id)},'
        f'"stage_id":{_quote(header.stage_id)},"epoch":{int(header.epoch)},'
        f'"generation":{int(header.generation)},'
        f'"meta":{_ENCODER.encode(thaw_json(meta)) if meta else "{}"},'  # type: ignore[arg-type]
        f'"tensors":{_tensors_text(header.tensors)}}}'
    ).encode()


def _tensors_text(specs: tuple[TensorSpec, ...]) -> str:
    if not specs:
        return "[]"
    if any(spec.ref is not None for spec in specs):  # generations change: never cached
        return _ENCODER.encode([spec.to_dict() for spec in specs])
    text = _TENSORS_TEXT.get(specs)
    if text is None:
        text = _ENCODER.encode([spec.to_dict() for spec in specs])
        if len(_TENSORS_TEXT) >= 1024:
            _TENSORS_TEXT.clear()
        _TENSORS_TEXT[specs] = text
    return text


_TENSORS_TEXT: dict[tuple[TensorSpec, ...], str] = {}


def encode_frame(
    header: FrameHeader,
    payloads: Sequence[Buffer],
    *,
    limits: Limits | None = None,
    binary: bool = False,
    event_meta: bytes | None = None,
    event_block: bytes = b"",
) -> list[bytes | memoryview]:
    """Return a frame as buffers for scatter-gather writing (see :func:`write_frame`).

    The first buffer holds prefix and header; each inline tensor's payload follows as
    a byte view of the caller's buffer (never copied or concatenated), so the caller
    must keep those buffers unchanged until the frame is written.

    Args:
        header: the frame header.
        payloads: one C-contiguous buffer per inline tensor, in header order, each of
            exactly that tensor's ``nbytes``.
        limits: when given, the sender refuses what such a reader would refuse.
        binary: write the binary header (:mod:`edge_contracts.binary_header`) when the
            op has one (request, event, ack) and its required features have bits; only
            on a channel that negotiated the ``binary-header`` feature. Anything else
            is written with the JSON header.
        event_meta: an ``event`` header's ``meta`` as compact JSON bytes, used instead
            of ``header.meta`` when the binary header is written
            (:func:`~edge_contracts.binary_header.encode_event_header`).
        event_block: with ``event_meta``, the event's fixed block when the header
            requires ``event-fields`` (:data:`~edge_contracts.binary_header.EVENT_BLOCK`).

    Raises:
        PayloadMismatch: wrong number of payloads, a wrong size or a non-contiguous one.
        HeaderTooLarge, PayloadTooLarge, UnknownRequiredFeature: against ``limits``.

    """
    inline = [spec for spec in header.tensors if spec.ref is None]
    if len(payloads) != len(inline):
        raise PayloadMismatch(
            "payloads", len(payloads), f"must hold one buffer per inline tensor ({len(inline)})"
        )
    parts: list[bytes | memoryview] = [b""]
    for index, (spec, payload) in enumerate(zip(inline, payloads, strict=True)):
        view = memoryview(payload)
        if not view.c_contiguous:
            raise PayloadMismatch(f"payloads[{index}]", spec.name, "must be C-contiguous")
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if view.nbytes != spec.nbytes:
            raise PayloadMismatch(
                f"payloads[{index}]", view.nbytes, f"must be {spec.nbytes} bytes for {spec.name}"
            )
        parts.append(view)
    binary = (
        binary and header.op in BINARY_OPS and header.required_features <= BINARY_FEATURES
    )
    if event_meta is not None and not binary:  # header.meta does not hold it
        raise HeaderMalformed("event_meta", header.op, "needs a binary event header")
    if not binary:
        raw = encode_header(header)
    elif event_meta is not None:
        raw = encode_event_header(header, event_meta, event_block)
    else:
        raw = encode_binary_header(header)
    cap = MAX_HEADER_CAP if limits is None else limits.max_header_bytes
    if len(raw) > cap:
        raise HeaderTooLarge("header", len(raw), f"must be <= max_header_bytes {cap}")
    if limits is not None:
        _check_sender_limits(header, limits)
        if binary and FEATURE_BINARY_HEADER not in limits.supported_features:
            raise UnknownRequiredFeature(
                "header", FEATURE_BINARY_HEADER, "not supported by the reader's limits"
            )
    parts[0] = PREFIX.pack(BINARY_MAGIC if binary else MAGIC, len(raw), header.inline_nbytes) + raw
    return parts


def write_frame(sendmsg: Callable[[list[memoryview]], int], parts: Sequence[Buffer]) -> int:
    """Write ``parts`` completely with a gather-write function; return the bytes written.

    ``sendmsg`` takes a list of buffers and returns how many bytes it wrote, like
    ``socket.sendmsg`` or ``lambda views: os.writev(fd, views)``. Partial writes are
    resumed; at most 512 buffers go into one call (below ``IOV_MAX``).
    """
    written = 0
    if len(parts) <= _IOV_BATCH:  # the usual frame: one call writes it whole
        total = 0
        for part in parts:
            total += part.nbytes if type(part) is memoryview else len(part)
        written = sendmsg(parts)  # type: ignore[arg-type]
        if written == total:
            return written
        if written <= 0:
            raise WireError("frame", 0, f"write made no progress after 0 of {total} bytes")
        views = _after(parts, written)  # the rest, resumed below
    else:
        views = [memoryview(part).cast("B") for part in parts if len(part)]
        total = sum(view.nbytes for view in views)
    first = 0
    while first < len(views):
        sent = sendmsg(views[first : first + _IOV_BATCH])
        if sent <= 0:
            raise WireError(
                "frame", written, f"write made no progress after {written} of {total} bytes"
            )
        written += sent
        while sent and first < len(views):
            size = views[first].nbytes
            if sent >= size:
                sent -= size
                first += 1
            else:
                views[first] = views[first][sent:]
                sent = 0
    return written


def _after(parts: Sequence[Buffer], written: int) -> list[memoryview]:
    """What is left of ``parts`` once their first ``written`` bytes were sent."""
    left: list[memoryview] = []
    for part in parts:
        view = memoryview(part).cast("B")
        if written >= view.nbytes:
            written -= view.nbytes
            continue
        left.append(view[written:])
        written = 0
    return left


def _check_sender_limits(header: FrameHeader, limits: Limits) -> None:
    unknown = sorted(header.required_features - limits.supported_features)
    if unknown:
        raise UnknownRequiredFeature(
            "header.required_features", unknown, "not supported by the reader's limits"
        )
    if len(header.tensors) > limits.max_tensors:
        raise HeaderMalformed(
            "header.tensors", len(header.tensors), f"must hold <= max_tensors {limits.max_tensors}"
        )
    if header.total_nbytes > limits.max_io_bytes:
        raise PayloadTooLarge(
            "header.tensors",
            header.total_nbytes,
            f"total tensor bytes must be <= max_io_bytes {limits.max_io_bytes}",
        )


def _fill(
    recv_into: Callable[[memoryview], int],
    view: memoryview,
    part: str,
    *,
    at_boundary: bool = False,
) -> None:
    wanted = len(view)
    got = 0
    while got < wanted:
        count = recv_into(view[got:])
        if count == 0:
            if at_boundary and got == 0:
                raise StreamClosed(part, 0, "end of stream before the next frame")
            raise FrameTruncated(part, got, f"stream ended after {got} of {wanted} bytes")
        if not 0 < count <= wanted - got:
            raise WireError(part, count, f"recv_into must return 0..{wanted - got} bytes")
        got += count


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii
_DECODER = STRICT_DECODER


def _excerpt(raw: bytes | bytearray | memoryview) -> bytes:
    return bytes(raw[:64])
