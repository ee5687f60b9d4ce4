"""NumPy arrays to and from wire frames -- the only module of edge-contracts that needs numpy.

Encoding (:func:`arrays_to_wire`) turns each array into a :class:`TensorSpec` and a
flat byte view of its C-contiguous, little-endian bytes; a copy is made only when the
input is not already in that form (non-contiguous, Fortran order, big-endian).
Decoding (:func:`arrays_from_frame`) returns writable arrays that are views over the
frame's payload ``bytearray`` -- no extra copy.

``bfloat16``: NumPy has no such type. An array of ``ml_dtypes.bfloat16`` is encoded
as ``bfloat16`` when the ``ml_dtypes`` package is installed; without it, pass a
``uint16`` array holding the raw bits together with ``dtypes={name: DType.BFLOAT16}``.
Decoding yields ``ml_dtypes.bfloat16`` arrays when ``ml_dtypes`` is importable, else
``uint16`` arrays holding the raw bits. ``bool`` travels as one byte per element (0 or
1); any other byte value is refused on decode.

Arrays decoded from a frame may be unaligned (payloads are packed without padding);
NumPy handles that, and ``np.require(array, requirements="A")`` gives an aligned copy
where a consumer insists.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: numpy.typing costs ~0.5 ms of a worker's start-up
    import numpy.typing as npt

from edge_contracts.dtypes import DType
from edge_contracts.errors import BoolBytesInvalid, DescriptorInvalid, InvalidValue
from edge_contracts.headers import TensorSpec
from edge_contracts.wire import Frame

__all__ = [
    "array_from_buffer",
    "arrays_from_frame",
    "arrays_to_wire",
    "bfloat16_dtype",
    "dtype_of",
    "numpy_dtype",
    "plain_wire_dtype",
]

_WIRE_DTYPES: dict[DType, np.dtype[Any]] = {
    DType.BOOL: np.dtype("|b1"),
    DType.INT8: np.dtype("|i1"),
    DType.INT16: np.dtype("<i2"),
    DType.INT32: np.dtype("<i4"),
    DType.INT64: np.dtype("<i8"),
    DType.UINT8: np.dtype("|u1"),
    DType.UINT16: np.dtype("<u2"),
    DType.UINT32: np.dtype("<u4"),
    DType.UINT64: np.dtype("<u8"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT64: np.dtype("<f8"),
}

_BY_KIND: dict[tuple[str, int], DType] = {
    (np.dtype(dtype).kind, np.dtype(dtype).itemsize): member
    for member, dtype in _WIRE_DTYPES.items()
}

_PLAIN: dict[np.dtype[Any], DType] = {dtype: member for member, dtype in _WIRE_DTYPES.items()}


def plain_wire_dtype(dtype: np.dtype[Any]) -> DType | None:
    """The wire dtype of a numeric NumPy dtype already in wire form, else ``None``.

    "Wire form" is exactly the little-endian (or single-byte) type the wire carries, so
    its bytes can be sent as they are; one dictionary lookup, for the per-call path.
    Anything else (big-endian, bfloat16, unsupported) answers ``None``: use
    :func:`dtype_of`.
    """
    return _PLAIN.get(dtype)

_UNSET: Any = object()
_bfloat16: Any = _UNSET
_LITTLE = sys.byteorder == "little"


def bfloat16_dtype() -> np.dtype[Any] | None:
    """Return ``ml_dtypes.bfloat16`` as a NumPy dtype, or ``None`` when not installed."""
    global _bfloat16
    if _bfloat16 is _UNSET:
        try:
            module = importlib.import_module("ml_dtypes")
        except ImportError:
            _bfloat16 = None
        else:
            _bfloat16 = np.dtype(module.bfloat16)
    return _bfloat16  # type: ignore[no-any-return]


def _is_bfloat16(dtype: np.dtype[Any]) -> bool:
    # An ml_dtypes array exists only if ml_dtypes was imported: no import needed here.
    return dtype.name == "bfloat16" and "ml_dtypes" in sys.modules and dtype == bfloat16_dtype()


def numpy_dtype(dtype: DType) -> np.dtype[Any]:
    """Return the NumPy dtype a wire tensor of ``dtype`` decodes to.

    Explicitly little-endian for multi-byte types; ``bfloat16`` maps to
    ``ml_dtypes.bfloat16`` when installed, else to ``<u2`` (the raw bits).
    """
    parsed = DType.parse(dtype)
    if parsed is DType.BFLOAT16:
        bf16 = bfloat16_dtype()
        return np.dtype("<u2") if bf16 is None else bf16
    return _WIRE_DTYPES[parsed]


def dtype_of(array: npt.NDArray[Any] | np.dtype[Any], field: str = "dtype") -> DType:
    """Return the wire dtype of an array (or a NumPy dtype), whatever its byte order.

    Raises:
        InvalidValue: for types the wire does not carry (complex, strings, objects ...).

    """
    dtype = array if isinstance(array, np.dtype) else np.asarray(array).dtype
    member = _PLAIN.get(dtype)  # the plain numeric types: one lookup
    if member is not None:
        return member
    if _is_bfloat16(dtype):
        return DType.BFLOAT16
    member = _BY_KIND.get((dtype.kind, dtype.itemsize))
    if member is None or dtype.fields is not None or dtype.subdtype is not None:
        raise InvalidValue(field, str(dtype), f"unsupported dtype (wire dtypes: {_known()})")
    return member


def arrays_to_wire(
    arrays: Mapping[str, npt.NDArray[Any]], dtypes: Mapping[str, DType] | None = None
) -> tuple[tuple[TensorSpec, ...], list[memoryview]]:
    """Return the tensor entries and payload views for ``arrays``, in mapping order.

    Args:
        arrays: name -> array. Any layout or byte order; values are preserved.
        dtypes: optional name -> wire dtype overrides. The only override allowed that
            changes the type is ``DType.BFLOAT16`` on a ``uint16`` array of raw bits;
            otherwise it must match the array's own dtype.

    Returns:
        ``(specs, payloads)`` -- pass them to :class:`FrameHeader` and
        :func:`~edge_contracts.wire.encode_frame`. Each payload is a flat ``uint8``
        view that keeps its (possibly converted) array alive.

    Raises:
        InvalidValue: an unsupported dtype or a wrong override.
        DescriptorInvalid: a bad name or shape (e.g. more than 32 dimensions).

    """
    overrides = dict(dtypes or {})
    for name in overrides:
        if name not in arrays:
            raise InvalidValue(f"dtypes.{name}", overrides[name], "names no array")
    specs: list[TensorSpec] = []
    payloads: list[memoryview] = []
    for name, value in arrays.items():
        array = np.asarray(value)
        natural = dtype_of(array, f"arrays.{name}.dtype")
        wanted = DType.parse(overrides.get(name, natural), f"dtypes.{name}")
        if wanted is not natural and not (wanted is DType.BFLOAT16 and natural is DType.UINT16):
            raise InvalidValue(
                f"dtypes.{name}",
                wanted.value,
                f"must match the array's dtype {natural.value} (or be bfloat16 on uint16 bits)",
            )
        flat = _little_endian_c(array)
        specs.append(TensorSpec(name, wanted, tuple(array.shape), flat.nbytes))
        payloads.append(flat.reshape(-1).view(np.uint8).data)
    return tuple(specs), payloads


def _little_endian_c(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    dtype = array.dtype
    swap = dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE)
    if swap and dtype.itemsize > 1:
        if _is_bfloat16(dtype):
            bits = np.ascontiguousarray(array).view(np.uint16)
            return bits.astype("<u2")
        return np.ascontiguousarray(array, dtype=dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


def array_from_buffer(spec: TensorSpec, buffer: Any) -> npt.NDArray[Any]:
    """Return the array of ``spec`` as a view over ``buffer`` (exactly ``spec.nbytes``).

    The array is writable when ``buffer`` is. Raises :class:`DescriptorInvalid` when the
    buffer has the wrong size, :class:`BoolBytesInvalid` (one) when a ``bool`` tensor holds
    bytes other than 0 and 1.
    """
    view = memoryview(buffer).cast("B")
    if view.nbytes != spec.nbytes:
        raise DescriptorInvalid(
            f"tensors.{spec.name}", view.nbytes, f"buffer must be exactly {spec.nbytes} bytes"
        )
    if spec.dtype is DType.BOOL and spec.nbytes:
        largest = int(np.frombuffer(view, np.uint8).max())
        if largest > 1:
            raise BoolBytesInvalid(
                f"tensors.{spec.name}", largest,
                "bool payload holds bytes other than 0 and 1 (the largest is shown)",
            )
    array = np.frombuffer(view, dtype=_WIRE_DTYPES.get(spec.dtype, np.dtype("<u2")))
    if spec.dtype is DType.BFLOAT16:
        bf16 = bfloat16_dtype()
        if bf16 is not None:
            array = array.view(bf16) if _LITTLE else array.astype("=u2").view(bf16)
    return array.reshape(spec.shape)


def arrays_from_frame(
    frame: Frame, shared: Callable[[TensorSpec], Any] | None = None, *, readonly: bool = False
) -> dict[str, npt.NDArray[Any]]:
    """Return every tensor of ``frame`` as an array, by name, in header order.

    Inline tensors are writable views over ``frame.payload`` (no copy), read-only ones
    with ``readonly``. A tensor whose
    bytes live in shared memory (``spec.ref`` set) is read through ``shared(spec)``,
    which must return a buffer of exactly ``spec.nbytes``; without ``shared`` such a
    frame is refused with :class:`DescriptorInvalid`.
    """
    # exactly the inline tensors' bytes (Frame checks it); read-only views when asked
    payload: Any = memoryview(frame.payload).toreadonly() if readonly else frame.payload
    arrays: dict[str, npt.NDArray[Any]] = {}
    offset = 0
    for spec in frame.header.tensors:
        if spec.ref is None:
            end = offset + spec.nbytes
            dtype = _WIRE_DTYPES.get(spec.dtype)
            if dtype is not None and spec.dtype is not DType.BOOL:  # any bytes are valid
                arrays[spec.name] = np.frombuffer(
                    payload, dtype, spec.nbytes // dtype.itemsize, offset
                ).reshape(spec.shape)
            else:  # bool (values checked) and bfloat16 (its NumPy type)
                arrays[spec.name] = array_from_buffer(spec, memoryview(payload)[offset:end])
            offset = end
        elif shared is None:
            raise DescriptorInvalid(
                f"tensors.{spec.name}.ref", spec.ref.segment, "lives in shared memory: pass shared"
            )
        else:
            arrays[spec.name] = array_from_buffer(spec, shared(spec))
    return arrays


def _known() -> str:
    return ", ".join(member.value for member in DType)
