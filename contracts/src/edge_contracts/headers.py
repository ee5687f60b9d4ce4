"""Frame headers: the typed header of a wire frame, its tensor entries and a reader's limits.

See :mod:`edge_contracts.wire` for the framing that carries them. The header travels
as one JSON object (:meth:`FrameHeader.to_dict`); every key is required on the wire.

A header holds the protocol version, the features the reader must support, the
op, request and stage ids, epoch, worker generation, an op-specific ``meta`` object
and one :class:`TensorSpec` per tensor. Tensor entries fail with
:class:`~edge_contracts.errors.DescriptorInvalid`, other header fields with
:class:`~edge_contracts.errors.HeaderMalformed`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_contracts.dtypes import DType
from edge_contracts.errors import (
    DescriptorInvalid,
    HeaderMalformed,
    InvalidValue,
    PayloadMismatch,
    PayloadTooLarge,
    WireError,
)
from edge_contracts.jsonvalues import EMPTY_OBJECT, JSONObject, freeze_object, thaw_json
from edge_contracts.protocol import (
    FEATURE_BFLOAT16,
    FEATURE_SHM_TENSORS,
    KNOWN_FEATURES,
    PROTOCOL_VERSION,
    validate_feature_name,
)
from edge_contracts.shapes import check_shape, expected_nbytes
from edge_contracts.validation import (
    INT64_MAX,
    MAX_ID_LENGTH,
    check_keys,
    rebase,
    require_id,
    require_int,
    require_list,
)

__all__ = [
    "MAX_FEATURES",
    "MAX_HEADER_CAP",
    "MAX_TENSORS_CAP",
    "FrameHeader",
    "Limits",
    "ShmRef",
    "TensorSpec",
    "check_totals",
    "prechecked_header",
    "tensor_features",
    "tensor_totals",
    "with_generation",
]

MAX_HEADER_CAP = 2**32 - 1
"""The largest header length the frame prefix can express (u32)."""

MAX_TENSORS_CAP = 65536
"""The most tensor entries any header may hold, whatever the limits say."""

MAX_FEATURES = 256
"""The most feature names in one header or one set of limits."""

_OP = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_VALID_OPS: set[str] = set()  # ops already checked against _OP (bounded)
_NO_FEATURES: frozenset[str] = frozenset()
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_FEATURE = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a tensor's bytes live when they travel through shared memory.

    Attributes:
        segment: name of the shared-memory segment (``[A-Za-z0-9_.-]``, 1-128 chars).
        offset: byte offset of the tensor inside the segment.
        generation: the producer's buffer generation; the consumer acknowledges it.

    """

    segment: str
    offset: int
    generation: int

    def __post_init__(self) -> None:
        if not isinstance(self.segment, str) or _SEGMENT.fullmatch(self.segment) is None:
            raise DescriptorInvalid("ref.segment", self.segment, "must be 1-128 of [A-Za-z0-9_.-]")
        require_int(self.offset, "ref.offset", error=DescriptorInvalid)
        require_int(self.generation, "ref.generation", error=DescriptorInvalid)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {"segment": self.segment, "offset": self.offset, "generation": self.generation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "ref") -> ShmRef:
        """Build from the JSON form; all three keys are required."""
        mapping = check_keys(data, field, _REF_KEYS, error=DescriptorInvalid)
        try:
            return cls(mapping["segment"], mapping["offset"], mapping["generation"])  # type: ignore[arg-type]
        except DescriptorInvalid as exc:
            raise rebase(exc, "ref", field) from None


_REF_KEYS = frozenset({"segment", "offset", "generation"})


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor entry of a frame header.

    Attributes:
        name: tensor name, unique within the frame (non-empty, printable, <= 128).
        dtype: element type.
        shape: dimensions, at most 32, each >= 0.
        nbytes: exactly ``prod(shape) * dtype.itemsize``.
        ref: where the bytes live in shared memory, or ``None`` when they are inline
            in the frame's payload.

    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    ref: ShmRef | None = None

    def __post_init__(self) -> None:
        require_id(self.name, "tensor.name", error=DescriptorInvalid)
        dtype = DType.parse(self.dtype, "tensor.dtype", error=DescriptorInvalid)
        shape = check_shape(self.shape, "tensor.shape", error=DescriptorInvalid)
        require_int(self.nbytes, "tensor.nbytes", error=DescriptorInvalid)
        wanted = expected_nbytes(dtype, shape, "tensor.shape", error=DescriptorInvalid)
        if self.nbytes != wanted:
            raise DescriptorInvalid(
                "tensor.nbytes", self.nbytes, f"must equal prod(shape) * itemsize = {wanted}"
            )
        if self.ref is not None and not isinstance(self.ref, ShmRef):
            raise DescriptorInvalid("tensor.ref", self.ref, "must be a ShmRef or null")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (``ref`` is always present, null when inline)."""
        return {
            "name": self.name,
            "dtype": self.dtype.value,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "ref": None if self.ref is None else self.ref.to_dict(),
        }

    @classmethod
    def inline(cls, name: str, dtype: DType | str, shape: Any, nbytes: int) -> TensorSpec:
        """Return the entry of an inline tensor, validated once per distinct value.

        A stream of frames repeats the same few entries (fixed buckets), so validated
        entries are kept in a bounded cache keyed by the exact field values and types;
        anything not of the plain types (a float or bool dimension, a non-str name) is
        validated afresh and refused as usual.
        """
        if (
            type(name) is str
            and (type(dtype) is str or type(dtype) is DType)
            and type(nbytes) is int
            and type(shape) in (tuple, list)
            and all(type(dim) is int for dim in shape)
        ):
            key = (name, dtype, tuple(shape), nbytes)
            spec = _INLINE_CACHE.get(key)
            if spec is None:
                spec = cls(name, dtype, key[2], nbytes)  # type: ignore[arg-type]
                if len(_INLINE_CACHE) >= _INLINE_CACHE_SIZE:
                    _INLINE_CACHE.clear()
                _INLINE_CACHE[key] = spec
            return spec
        return cls(name, dtype, shape, nbytes)  # type: ignore[arg-type]

    @classmethod
    def inline_plain(
        cls, name: str, dtype: DType, shape: tuple[int, ...], nbytes: int
    ) -> TensorSpec:
        """:meth:`inline` for values known to be of the plain types.

        A NumPy array's ``shape``, a ``str`` name and an ``int`` byte count: the cache is
        looked up without :meth:`inline`'s per-dimension type test.
        """
        spec = _INLINE_CACHE.get((name, dtype, shape, nbytes))
        return spec if spec is not None else cls.inline(name, dtype, shape, nbytes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "tensor") -> TensorSpec:
        """Build from the JSON form; every key, ``ref`` included, is required."""
        if type(data) is dict and data.keys() == _TENSOR_KEYS and data["ref"] is None:
            try:
                return cls.inline(data["name"], data["dtype"], data["shape"], data["nbytes"])
            except DescriptorInvalid as exc:
                raise rebase(exc, "tensor", field) from None
        mapping = check_keys(data, field, _TENSOR_KEYS, error=DescriptorInvalid)
        try:
            raw_ref = mapping["ref"]
            ref = None if raw_ref is None else ShmRef.from_dict(raw_ref, "tensor.ref")  # type: ignore[arg-type]
            return cls(mapping["name"], mapping["dtype"], mapping["shape"], mapping["nbytes"], ref)  # type: ignore[arg-type]
        except DescriptorInvalid as exc:
            raise rebase(exc, "tensor", field) from None


_TENSOR_KEYS = frozenset({"name", "dtype", "shape", "nbytes", "ref"})
_INLINE_CACHE: dict[tuple[Any, ...], TensorSpec] = {}
_INLINE_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a reader accepts; every check against these runs before payload allocation.

    Attributes:
        max_header_bytes: longest header accepted (default 64 KiB).
        max_io_bytes: most tensor bytes (inline plus shared memory) in one frame.
        supported_features: features this reader supports; a frame requiring any other
            is refused.
        max_tensors: most tensor entries in one header.

    """

    max_header_bytes: int = 65536
    max_io_bytes: int
    supported_features: frozenset[str] = KNOWN_FEATURES
    max_tensors: int = 1024

    def __post_init__(self) -> None:
        require_int(
            self.max_header_bytes, "limits.max_header_bytes", minimum=1, maximum=MAX_HEADER_CAP
        )
        require_int(self.max_io_bytes, "limits.max_io_bytes")
        require_int(self.max_tensors, "limits.max_tensors", maximum=MAX_TENSORS_CAP)
        features = self.supported_features
        items = (
            features
            if isinstance(features, frozenset | set)
            else require_list(features, "limits.supported_features", max_length=MAX_FEATURES)
        )
        for name in items:
            validate_feature_name(name, "limits.supported_features")
        object.__setattr__(self, "supported_features", frozenset(items))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (features sorted)."""
        return {
            "max_header_bytes": self.max_header_bytes,
            "max_io_bytes": self.max_io_bytes,
            "supported_features": sorted(self.supported_features),
            "max_tensors": self.max_tensors,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "limits") -> Limits:
        """Build from the JSON form; only ``max_io_bytes`` is required."""
        mapping: Any = check_keys(
            data,
            field,
            ("max_io_bytes",),
            ("max_header_bytes", "supported_features", "max_tensors"),
        )
        try:
            return cls(**mapping)
        except InvalidValue as exc:
            raise rebase(exc, "limits", field) from None


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """The header of one frame.

    Attributes:
        op: what the frame is (``call``, ``event``, ``hello`` ...; ``[a-z][a-z0-9_.-]*``).
        request_id: the request the frame belongs to, or ``""`` for connection-level frames.
        stage_id: the stage the frame belongs to, or ``""``.
        epoch: the stage epoch, so a worker can fence stale work too.
        generation: the worker generation the frame is addressed to or comes from.
        tensors: tensor entries; inline ones appear in the payload in this order.
        meta: op-specific JSON object (frozen).
        required_features: features the reader must support to understand the frame; a
            frame with a shared-memory tensor must require ``shm-tensors``.
        version: protocol version (a reader refuses any other than its own).
        inline_nbytes: bytes of the inline tensors, i.e. the payload length (derived).
        total_nbytes: bytes of all tensors, inline and shared memory (derived).

    """

    op: str
    request_id: str
    stage_id: str
    epoch: int
    generation: int
    tensors: tuple[TensorSpec, ...] = ()
    meta: Mapping[str, Any] = EMPTY_OBJECT
    required_features: frozenset[str] = frozenset()
    version: int = PROTOCOL_VERSION
    inline_nbytes: int = field(init=False, repr=False, compare=False)
    total_nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not (type(self.version) is int and 1 <= self.version <= INT64_MAX):
            require_int(self.version, "header.version", minimum=1, error=HeaderMalformed)
        if type(self.op) is not str or self.op not in _VALID_OPS:
            if not isinstance(self.op, str) or _OP.fullmatch(self.op) is None:
                raise HeaderMalformed(
                    "header.op", self.op, "must match [a-z][a-z0-9_.-]*, <= 64 chars"
                )
            if len(_VALID_OPS) < 256:
                _VALID_OPS.add(self.op)
        # Unrolled (no getattr loop): the common case is one inline test per field.
        value: object = self.request_id
        if value != "" and not (
            type(value) is str and len(value) <= MAX_ID_LENGTH and value.isprintable()
        ):
            require_id(value, "header.request_id", error=HeaderMalformed)
        value = self.stage_id
        if value != "" and not (
            type(value) is str and len(value) <= MAX_ID_LENGTH and value.isprintable()
        ):
            require_id(value, "header.stage_id", error=HeaderMalformed)
        value = self.epoch
        if not (type(value) is int and 0 <= value <= INT64_MAX):
            require_int(value, "header.epoch", error=HeaderMalformed)
        value = self.generation
        if not (type(value) is int and 0 <= value <= INT64_MAX):
            require_int(value, "header.generation", error=HeaderMalformed)
        features = self.required_features
        if not (type(features) is frozenset and not features):
            features = _features(features, "header.required_features")
            set_(self, "required_features", features)
        meta = self.meta
        if type(meta) is not JSONObject:
            set_(self, "meta", freeze_object(meta, "header.meta", error=HeaderMalformed))
        tensors: tuple[object, ...] | object = self.tensors
        if not isinstance(tensors, tuple):
            tensors = tuple(
                require_list(
                    tensors, "header.tensors", max_length=MAX_TENSORS_CAP, error=HeaderMalformed
                )
            )
        inline, total = tensor_totals(tensors, features)  # type: ignore[arg-type]
        set_(self, "tensors", tensors)
        set_(self, "inline_nbytes", inline)
        set_(self, "total_nbytes", total)

    def to_dict(self) -> dict[str, Any]:
        """Return the header's JSON object, exactly as it travels on the wire."""
        return {
            "version": self.version,
            "required_features": sorted(self.required_features),
            "op": self.op,
            "request_id": self.request_id,
            "stage_id": self.stage_id,
            "epoch": self.epoch,
            "generation": self.generation,
            "meta": thaw_json(self.meta),  # type: ignore[arg-type]
            "tensors": [spec.to_dict() for spec in self.tensors],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "header") -> FrameHeader:
        """Build from the header's JSON object; every key is required.

        This checks the header on its own; :func:`parse_header` adds the reader's
        limits (version, features, tensor count, total bytes).
        """
        mapping = check_keys(data, field, _HEADER_KEYS, error=HeaderMalformed)
        tensors = require_list(
            mapping["tensors"],
            f"{field}.tensors",
            max_length=MAX_TENSORS_CAP,
            error=HeaderMalformed,
        )
        try:
            specs = tuple(
                TensorSpec.from_dict(item, f"header.tensors[{index}]")  # type: ignore[arg-type]
                for index, item in enumerate(tensors)
            )
            wanted = mapping["required_features"]
            features = (
                _NO_FEATURES
                if type(wanted) is list and not wanted
                else _features(wanted, "header.required_features")
            )
            return cls(
                op=mapping["op"],  # type: ignore[arg-type]
                request_id=mapping["request_id"],  # type: ignore[arg-type]
                stage_id=mapping["stage_id"],  # type: ignore[arg-type]
                epoch=mapping["epoch"],  # type: ignore[arg-type]
                generation=mapping["generation"],  # type: ignore[arg-type]
                tensors=specs,
                meta=mapping["meta"],  # type: ignore[arg-type]
                required_features=features,
                version=mapping["version"],  # type: ignore[arg-type]
            )
        except WireError as exc:
            raise rebase(exc, "header", field) from None


_HEADER_KEYS = frozenset(
    {
        "version",
        "required_features",
        "op",
        "request_id",
        "stage_id",
        "epoch",
        "generation",
        "meta",
        "tensors",
    }
)


_SHM_ONLY = frozenset({FEATURE_SHM_TENSORS})
_BF16_ONLY = frozenset({FEATURE_BFLOAT16})
_SHM_BF16 = _SHM_ONLY | _BF16_ONLY


def tensor_features(specs: tuple[TensorSpec, ...]) -> frozenset[str]:
    """The features a frame carrying ``specs`` must require.

    ``shm-tensors`` when some tensor lives in shared memory, ``bfloat16`` when some
    tensor is bfloat16: a reader that did not negotiate a feature refuses the frame
    before its payload (:class:`FrameHeader` enforces both).
    """
    shm = bf16 = False
    for spec in specs:
        shm = shm or spec.ref is not None
        bf16 = bf16 or spec.dtype is DType.BFLOAT16
    if shm:
        return _SHM_BF16 if bf16 else _SHM_ONLY
    return _BF16_ONLY if bf16 else _NO_FEATURES


def tensor_totals(tensors: tuple[TensorSpec, ...], features: frozenset[str]) -> tuple[int, int]:
    """Check a header's tensor entries together; return ``(inline bytes, total bytes)``.

    Every entry must be a :class:`TensorSpec` with a unique name; a bfloat16 entry needs
    the ``bfloat16`` feature among ``features`` and a shared-memory one ``shm-tensors``;
    the total must fit in 63 bits. This is the part of :class:`FrameHeader`'s checks that
    looks at the entries as a list (each entry checked itself when it was built).

    Raises:
        DescriptorInvalid: naming ``header.tensors[i]`` and the field at fault.
        PayloadTooLarge: the total is over ``INT64_MAX``.

    """
    inline = total = 0
    names: set[str] = set()
    for index, spec in enumerate(tensors):
        if not isinstance(spec, TensorSpec):
            raise DescriptorInvalid(f"header.tensors[{index}]", spec, "must be a TensorSpec")
        if spec.dtype is DType.BFLOAT16 and FEATURE_BFLOAT16 not in features:
            raise DescriptorInvalid(
                f"header.tensors[{index}].dtype",
                spec.dtype.value,
                f"a bfloat16 tensor needs required feature {FEATURE_BFLOAT16}",
            )
        if spec.name in names:
            raise DescriptorInvalid(f"header.tensors[{index}].name", spec.name, "must be unique")
        names.add(spec.name)
        total += spec.nbytes
        if spec.ref is None:
            inline += spec.nbytes
        elif FEATURE_SHM_TENSORS not in features:
            raise DescriptorInvalid(
                f"header.tensors[{index}].ref",
                spec.ref.segment,
                f"a shared-memory tensor needs required feature {FEATURE_SHM_TENSORS}",
            )
    if total > INT64_MAX:
        raise PayloadTooLarge("header.tensors", total, f"total bytes must be <= {INT64_MAX}")
    return inline, total


# The slots' own setters, taken once: a prechecked header is built field by field as
# object.__setattr__ would, without looking each field's slot up by name per frame.
_new = object.__new__
(_set_op, _set_request_id, _set_stage_id, _set_epoch, _set_generation, _set_tensors,
 _set_meta, _set_required_features, _set_version, _set_inline_nbytes, _set_total_nbytes) = (
    FrameHeader.__dict__[name].__set__ for name in (
        "op", "request_id", "stage_id", "epoch", "generation", "tensors", "meta",
        "required_features", "version", "inline_nbytes", "total_nbytes"))


def prechecked_header(
    op: str,
    request_id: str,
    stage_id: str,
    epoch: int,
    generation: int,
    tensors: tuple[TensorSpec, ...],
    meta: JSONObject,
    required_features: frozenset[str],
    inline_nbytes: int,
    total_nbytes: int,
    version: int = PROTOCOL_VERSION,
) -> FrameHeader:
    """Build a :class:`FrameHeader` from values its checks have already passed.

    For the per-call paths only, where every value was checked once already: ids,
    epoch and generation by :class:`~edge_contracts.requests.StageRequest` or by the
    binary parser, ``meta`` frozen, entries by :func:`tensor_totals` (which gave the two
    byte counts). Running ``FrameHeader``'s checks again would repeat them all for
    nothing; a caller holding anything unchecked must build ``FrameHeader`` instead.
    """
    header = _new(FrameHeader)
    _set_op(header, op)
    _set_request_id(header, request_id)
    _set_stage_id(header, stage_id)
    _set_epoch(header, epoch)
    _set_generation(header, generation)
    _set_tensors(header, tensors)
    _set_meta(header, meta)
    _set_required_features(header, required_features)
    _set_version(header, version)
    _set_inline_nbytes(header, inline_nbytes)
    _set_total_nbytes(header, total_nbytes)
    return header


_set_ref_segment, _set_ref_offset, _set_ref_generation = (
    ShmRef.__dict__[name].__set__ for name in ("segment", "offset", "generation"))
(_set_spec_name, _set_spec_dtype, _set_spec_shape, _set_spec_nbytes, _set_spec_ref) = (
    TensorSpec.__dict__[name].__set__ for name in ("name", "dtype", "shape", "nbytes", "ref"))


def with_generation(spec: TensorSpec, generation: int) -> TensorSpec:
    """``spec``, a shared-memory entry, with its reference's generation replaced.

    For a reader that kept an entry it checked and sees it again with only the
    generation changed (a producer stamps a new one on every lease): everything else was
    checked when ``spec`` was built, and ``generation`` is checked here as
    :class:`ShmRef` checks it, so nothing unchecked comes out.

    Raises:
        DescriptorInvalid: ``spec`` has no reference (field ``tensor.ref``), or
            ``generation`` is not an integer in 0..INT64_MAX (``ref.generation``).

    """
    ref = spec.ref
    if ref is None:
        raise DescriptorInvalid("tensor.ref", None, "must be a ShmRef to take a generation")
    if not (type(generation) is int and 0 <= generation <= INT64_MAX):
        require_int(generation, "ref.generation", error=DescriptorInvalid)
    new_ref = _new(ShmRef)
    _set_ref_segment(new_ref, ref.segment)
    _set_ref_offset(new_ref, ref.offset)
    _set_ref_generation(new_ref, generation)
    new_spec = _new(TensorSpec)  # each slot set by its own setter: no loop per entry
    _set_spec_name(new_spec, spec.name)
    _set_spec_dtype(new_spec, spec.dtype)
    _set_spec_shape(new_spec, spec.shape)
    _set_spec_nbytes(new_spec, spec.nbytes)
    _set_spec_ref(new_spec, new_ref)
    return new_spec


def _features(value: object, field: str) -> frozenset[str]:
    """Return ``value`` (a list or set of feature names) as a frozenset, checked."""
    items = (
        value
        if isinstance(value, frozenset | set)
        else require_list(value, field, max_length=MAX_FEATURES, error=HeaderMalformed)
    )
    if len(items) > MAX_FEATURES:
        raise HeaderMalformed(field, len(items), f"must hold <= {MAX_FEATURES} items")
    for name in items:
        if not isinstance(name, str) or _FEATURE.fullmatch(name) is None:
            raise HeaderMalformed(field, name, "must be a feature name [a-z0-9][a-z0-9.-]*")
    return frozenset(items)


def check_totals(header: FrameHeader, limits: Limits, payload_len: int | None) -> None:
    """Refuse a parsed header whose tensors exceed the limits or disagree with the prefix.

    Raises:
        PayloadTooLarge: the tensors' total bytes are over ``limits.max_io_bytes``.
        PayloadMismatch: ``payload_len`` (the frame prefix's) differs from the header's
            inline tensor bytes.
    """
    if header.total_nbytes > limits.max_io_bytes:
        raise PayloadTooLarge(
            "header.tensors",
            header.total_nbytes,
            f"total tensor bytes must be <= max_io_bytes {limits.max_io_bytes}",
        )
    if payload_len is not None and payload_len != header.inline_nbytes:
        raise PayloadMismatch(
            "prefix.payload_len",
            payload_len,
            f"must equal the inline tensor bytes {header.inline_nbytes}",
        )
