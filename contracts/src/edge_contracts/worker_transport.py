"""Tensors on a worker channel: inline in the frame, or through shared memory above a threshold.

Both ends of a worker channel use this module (it imports numpy, so it is imported only
where tensors are handled). :class:`TensorPacker` turns named arrays into header
entries plus payload buffers: arrays of at least ``threshold`` bytes are copied into a
leased shared-memory segment (:class:`~edge_contracts.shm.SegmentProducer`) and travel as
a :class:`~edge_contracts.headers.ShmRef`; smaller ones travel inline, as zero-copy views
for a scatter-gather write. Arrays whose bytes together are more than the packer's
``max_bytes`` (the reader's ``max_io_bytes``) are refused before the one that crosses it
is leased or copied. :class:`TensorUnpacker` turns a received frame back into
read-only arrays, mapping referenced segments through a
:class:`~edge_contracts.shm.SegmentConsumer` after validating every reference.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.copying import copy_bytes
from edge_contracts.dtypes import DType
from edge_contracts.errors import DescriptorInvalid, PayloadTooLarge
from edge_contracts.headers import ShmRef, TensorSpec, tensor_features, with_generation
from edge_contracts.shm import Lease, SegmentConsumer, SegmentProducer, ShmCapExceeded
from edge_contracts.tensors import arrays_from_frame, dtype_of, numpy_dtype, plain_wire_dtype
from edge_contracts.validation import INT64_MAX
from edge_contracts.wire import Frame, refs_of

__all__ = [
    "DEFAULT_SHM_THRESHOLD",
    "Packed",
    "TensorPacker",
    "TensorUnpacker",
    "refs_of",
]

DEFAULT_SHM_THRESHOLD = 256 * 1024
"""Arrays of at least this many bytes go through shared memory (see docs/host.md)."""


class Packed:
    """Header entries and payloads of one outgoing frame, plus the leases it holds.

    Attributes:
        specs: one entry per tensor, in the caller's order.
        payloads: the inline tensors' bytes, in header order.
        leases: ``(segment, generation)`` of every segment written for this frame.
        features: the features a reader needs for this frame (``shm-tensors``,
            ``bfloat16``): given by the packer, else worked out from ``specs``.

    """

    __slots__ = ("features", "leases", "payloads", "specs")

    def __init__(
        self,
        specs: tuple[TensorSpec, ...],
        payloads: list[memoryview],
        leases: list[tuple[str, int]],
        features: frozenset[str] | None = None,
    ) -> None:
        self.specs = specs
        self.payloads = payloads
        self.leases = leases
        self.features = tensor_features(specs) if features is None else features

    @property
    def uses_shm(self) -> bool:
        """True when at least one tensor travels through shared memory."""
        return bool(self.leases)


_NO_FEATURES: frozenset[str] = frozenset()
_MAX_LONE = 64  # lone-array entries a packer keeps
_EMPTY = Packed((), [], [], _NO_FEATURES)

class TensorPacker:
    """Packs outgoing arrays; large ones go through ``producer`` when there is one.

    ``max_bytes``: the most bytes the arrays of one frame may hold together, inline and
    shared memory (the reader's ``max_io_bytes``; a worker's packer has its channel's).
    ``field``: what its refusals call the arrays, ``outputs`` (a worker's events) or
    ``inputs`` (a controller's requests): ``inputs.x.dtype``.
    """

    def __init__(
        self, producer: SegmentProducer | None, threshold: int, max_bytes: int = INT64_MAX,
        *, field: str = "outputs",
    ) -> None:
        self.producer = producer
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.field = field
        # (name, NumPy dtype, shape) -> the entry of a lone array that went inline, of a
        # plain wire dtype, under the threshold and max_bytes (all fixed by the three)
        self._lone: dict[tuple[Any, ...], TensorSpec] = {}

    def allocate(
        self, shape: tuple[int, ...], dtype: Any, *, private: bool = False
    ) -> tuple[np.ndarray[Any, Any], Lease | None]:
        """Return a writable array to compute an outgoing tensor into, and its lease.

        At or above the threshold (with shared memory in use) the array lives in a
        leased segment, so that :meth:`pack` sends it without a copy when it is passed
        back in ``allocated``; otherwise (``private``, a dtype the wire cannot carry
        as is, or the cap reached) it is a private array.
        """
        np_dtype = np.dtype(dtype)
        count = math.prod(shape)
        nbytes = count * np_dtype.itemsize
        if (
            private
            or self.producer is None
            or nbytes < self.threshold
            or nbytes <= 0
            or plain_wire_dtype(np_dtype) is None  # not a plain little-endian wire type
        ):
            return np.empty(shape, np_dtype), None
        try:
            lease = self.producer.lease(nbytes)
        except ShmCapExceeded:  # fall back to a private array; pack copies later
            return np.empty(shape, np_dtype), None
        try:
            array = np.frombuffer(lease.view, dtype=np_dtype, count=count).reshape(shape)
        except BaseException:
            self.take_back([(lease.segment, lease.generation)])
            raise
        return array, lease

    def pack(
        self,
        arrays: Mapping[str, Any] | None,
        allocated: dict[int, tuple[Any, Lease]] | None = None,
    ) -> Packed:
        """Return the header entries and payloads for ``arrays`` (a name -> array mapping).

        ``allocated`` maps ``id(array)`` to ``(array, lease)`` for arrays made by
        :meth:`allocate`: such an array (the very object) travels as a reference to its
        lease, without a copy, and its entry is removed. On any failure, segments leased
        for this frame are taken back.

        Raises:
            PayloadTooLarge: the arrays' bytes together are more than ``max_bytes``
                (field ``tensors``, value their total): raised before the array that
                crosses it is leased or copied.

        """
        if not arrays:
            return _EMPTY
        if not allocated and len(arrays) == 1:  # the usual lone array: its kept entry
            ((name, value),) = arrays.items()
            if type(value) is np.ndarray:
                spec = self._lone.get((name, value.dtype, value.shape))
                if spec is not None and value.flags.c_contiguous:
                    return Packed((spec,), [value.data.cast("B")], [], _NO_FEATURES)
        specs: list[TensorSpec] = []
        payloads: list[memoryview] = []
        leases: list[tuple[str, int]] = []
        total = 0  # the bytes of the arrays so far, inline and shared memory
        plain = True  # every entry inline and of a plain wire dtype: no feature needed
        try:
            for name, value in arrays.items():
                owned = allocated.pop(id(value), None) if allocated else None
                if owned is not None and owned[0] is value:  # already in its segment
                    leases.append((owned[1].segment, owned[1].generation))
                    total += value.nbytes
                    if total > self.max_bytes:
                        raise self._too_large(arrays)
                    specs.append(_in_place(name, value, owned[1], self.field))
                    continue
                if owned is not None and allocated is not None:  # an unrelated array
                    allocated[id(value)] = owned
                array = value if type(value) is np.ndarray else np.asarray(value)
                dtype = plain_wire_dtype(array.dtype)  # common little-endian types: no checks
                if dtype is not None and array.flags.c_contiguous and array.size:
                    # their bytes as one flat byte view, no intermediate arrays
                    flat: Any = array.data.cast("B") if array.ndim else (
                        array.reshape(-1).view(np.uint8))
                else:
                    if dtype is None:
                        plain = False  # bfloat16, say
                        dtype = dtype_of(array, f"{self.field}.{name}.dtype")
                        if array.dtype.byteorder == ">" and array.dtype.itemsize > 1:
                            array = array.astype(array.dtype.newbyteorder("<"))
                    flat = (
                        array if array.flags.c_contiguous else np.ascontiguousarray(array)
                    ).reshape(-1).view(np.uint8)
                nbytes = int(flat.nbytes)
                total += nbytes
                if total > self.max_bytes:  # nothing leased or copied for it
                    raise self._too_large(arrays)
                ref = None
                if self.producer is not None and nbytes >= self.threshold:
                    lease = self.producer.lease(nbytes)
                    leases.append((lease.segment, lease.generation))
                    copy_bytes(np.frombuffer(lease.view, dtype=np.uint8),
                               np.frombuffer(flat, dtype=np.uint8))
                    ref = ShmRef(lease.segment, lease.offset, lease.generation)
                else:
                    payloads.append(flat if type(flat) is memoryview else flat.data)
                if ref is None:  # a NumPy shape and an int: the plain types
                    specs.append(TensorSpec.inline_plain(name, dtype, array.shape, nbytes)
                                 if type(name) is str
                                 else TensorSpec.inline(name, dtype, array.shape, nbytes))
                else:
                    specs.append(TensorSpec(name, dtype, tuple(array.shape), nbytes, ref))
        except BaseException:
            self.take_back(leases)
            raise
        if (len(specs) == 1 and plain and not leases and type(value) is np.ndarray
                and value.ndim and value.size and type(name) is str):  # kept for the next
            if len(self._lone) >= _MAX_LONE:
                self._lone.clear()
            self._lone[(name, value.dtype, value.shape)] = specs[0]
        return Packed(tuple(specs), payloads, leases,
                      _NO_FEATURES if plain and not leases else None)

    @staticmethod
    def sizes(arrays: Mapping[str, Any]) -> dict[str, int]:
        """The bytes each of ``arrays`` (a name -> array mapping) takes on the wire, by name.

        A value that is not an array and cannot be made one is left out (:meth:`pack`
        would refuse it on its own).
        """
        found: dict[str, int] = {}
        for name, value in arrays.items():
            with contextlib.suppress(Exception):  # no array: pack refuses it on its own
                found[name] = int(np.asarray(value).nbytes)
        return found

    def _too_large(self, arrays: Mapping[str, Any]) -> PayloadTooLarge:
        total = sum(self.sizes(arrays).values())
        return PayloadTooLarge(
            "tensors", total, f"the tensors of one frame must be <= max_bytes {self.max_bytes}")

    def take_back(self, leases: list[tuple[str, int]], *, unlink: bool = False) -> None:
        """Release leases of a frame that was never delivered (``unlink``: never reuse)."""
        if self.producer is not None:
            for segment, generation in leases:
                self.producer.release(segment, generation, unlink=unlink)


def _layout(specs: tuple[TensorSpec, ...]) -> _Layout | None:
    """Where each tensor of an inline entry list lies in the payload; None for any other.

    Only plain numeric types whose every byte pattern is valid (``bool`` values are
    checked and ``bfloat16`` decodes through its own type in ``arrays_from_frame``).
    """
    layout: _Layout = []
    offset = 0
    for spec in specs:
        if spec.ref is not None or spec.dtype is DType.BOOL or spec.dtype is DType.BFLOAT16:
            return None
        dtype = numpy_dtype(spec.dtype)
        layout.append((spec.name, dtype, spec.nbytes // dtype.itemsize, offset, spec.shape))
        offset += spec.nbytes
    return layout


def _in_place(name: str, array: np.ndarray[Any, Any], lease: Lease,
              field: str) -> TensorSpec:
    """The entry of an array made by :meth:`TensorPacker.allocate`, sent as its lease.

    A buffer is sent again and again from the same segment (a pooled output, an input
    buffer) with a new generation each time: the entry is checked once per distinct name,
    dtype, shape, segment and offset, and later ones take the lease's generation
    (:func:`~edge_contracts.headers.with_generation`, which checks it).
    """
    key = (name, array.dtype, array.shape, lease.segment, lease.offset)
    kept = _IN_PLACE.get(key)
    if kept is not None:
        return with_generation(kept, lease.generation)
    ref = ShmRef(lease.segment, lease.offset, lease.generation)
    dtype = dtype_of(array, f"{field}.{name}.dtype")
    spec = TensorSpec(name, dtype, tuple(array.shape), int(array.nbytes), ref)
    if type(name) is str:
        if len(_IN_PLACE) >= _MAX_IN_PLACE:
            _IN_PLACE.clear()
        _IN_PLACE[key] = spec
    return spec


# (name, NumPy dtype, shape, segment, offset) -> an entry checked with some generation
_IN_PLACE: dict[tuple[Any, ...], TensorSpec] = {}
_MAX_IN_PLACE = 256


# (name, NumPy dtype, element count, byte offset, shape) of each inline tensor
_Layout = list[tuple[str, np.dtype[Any], int, int, tuple[int, ...]]]
_MAX_LAYOUTS = 256


class TensorUnpacker:
    """Turns a received frame's tensors into read-only numpy arrays.

    A stream repeats the same few tensor lists, and a frame reader hands out the same
    checked entry tuple for a repeated list (:func:`~edge_contracts.binary_header.kept_header`):
    for such a tuple of inline entries of plain numeric types, where each array lies in
    the payload is worked out once and kept (bounded), by the tuple's identity.
    """

    def __init__(self, consumer: SegmentConsumer | None) -> None:
        self.consumer = consumer
        # id(entries) -> (the entries, their layout); holding the entries keeps the id theirs
        self._layouts: dict[int, tuple[tuple[TensorSpec, ...], _Layout]] = {}

    def unpack(self, frame: Frame) -> dict[str, np.ndarray[Any, Any]]:
        """Return the frame's tensors as read-only arrays, by name.

        Shared-memory arrays are views of the peer's segment: valid until the frame's
        references (:func:`refs_of`) are acknowledged.
        """
        specs = frame.header.tensors
        if not specs:
            return {}
        kept = self._layouts.get(id(specs))
        if kept is not None and kept[0] is specs:  # the payload's length: checked by Frame
            payload = memoryview(frame.payload).toreadonly()
            found: dict[str, np.ndarray[Any, Any]] = {}
            for name, dtype, count, offset, shape in kept[1]:  # (no comprehension's frame)
                found[name] = np.frombuffer(payload, dtype, count, offset).reshape(shape)
            return found
        arrays = arrays_from_frame(frame, self._shared, readonly=True)
        for spec in specs:
            if spec.ref is not None:  # a view of the peer's mapping: made read-only too
                arrays[spec.name].flags.writeable = False
        layout = _layout(specs)
        if layout is not None:
            if len(self._layouts) >= _MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[id(specs)] = (specs, layout)
        return arrays

    def _shared(self, spec: TensorSpec) -> memoryview:
        if self.consumer is None or spec.ref is None:
            raise DescriptorInvalid(
                f"tensors.{spec.name}.ref", spec.ref, "shared memory is not in use on this channel"
            )
        ref = spec.ref
        return self.consumer.view(ref.segment, ref.offset, ref.generation, spec.nbytes)

