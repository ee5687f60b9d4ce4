"""Buffer descriptors: what a tensor's bytes are, where they live and who owns them.

A :class:`BufferDescriptor` is exact: ``nbytes`` must equal ``prod(shape) * itemsize``.
Only host memory in C (row-major) layout exists today; the enums leave room for more
without changing the descriptor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from edge_contracts.dtypes import DType
from edge_contracts.errors import InvalidValue
from edge_contracts.shapes import MAX_DIMS, check_shape, expected_nbytes
from edge_contracts.validation import (
    check_keys,
    parse_enum,
    rebase,
    require_bool,
    require_id,
    require_int,
)

__all__ = [
    "MAX_DIMS",
    "BufferDescriptor",
    "Layout",
    "MemoryDomain",
    "check_shape",
    "expected_nbytes",
]



class MemoryDomain(StrEnum):
    """Where a buffer's bytes live. Only host memory is supported today."""

    HOST = "host"


class Layout(StrEnum):
    """How elements are laid out. Only C (row-major, contiguous) today."""

    C = "C"


@dataclass(frozen=True, slots=True)
class BufferDescriptor:
    """A typed, shaped, owned buffer of host memory.

    Attributes:
        owner: id of the producer that owns (and will release) the bytes.
        generation: the owner's worker generation the buffer belongs to.
        dtype: element type.
        shape: dimensions, at most 32, each >= 0.
        nbytes: exactly ``prod(shape) * dtype.itemsize``.
        domain: memory domain (only ``host``).
        layout: element layout (only ``C``).
        ready: whether the bytes are complete and may be read. Requests and events
            accept only ready buffers (nothing waits for one to become ready).

    """

    owner: str
    generation: int
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    domain: MemoryDomain = MemoryDomain.HOST
    layout: Layout = Layout.C
    ready: bool = True

    def __post_init__(self) -> None:
        field = "buffer"
        require_id(self.owner, f"{field}.owner")
        require_int(self.generation, f"{field}.generation")
        dtype = DType.parse(self.dtype, f"{field}.dtype")
        shape = check_shape(self.shape, f"{field}.shape")
        require_int(self.nbytes, f"{field}.nbytes")
        wanted = expected_nbytes(dtype, shape, f"{field}.shape")
        if self.nbytes != wanted:
            raise InvalidValue(
                f"{field}.nbytes", self.nbytes, f"must equal prod(shape) * itemsize = {wanted}"
            )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "domain", parse_enum(MemoryDomain, self.domain, f"{field}.domain"))
        object.__setattr__(self, "layout", parse_enum(Layout, self.layout, f"{field}.layout"))
        require_bool(self.ready, f"{field}.ready")

    @classmethod
    def for_shape(
        cls, owner: str, generation: int, dtype: DType | str, shape: tuple[int, ...]
    ) -> BufferDescriptor:
        """Build a ready host descriptor, computing ``nbytes`` from dtype and shape."""
        parsed = DType.parse(dtype, "buffer.dtype")
        dims = check_shape(shape, "buffer.shape")
        return cls(owner, generation, parsed, dims, expected_nbytes(parsed, dims, "buffer.shape"))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "owner": self.owner,
            "generation": self.generation,
            "dtype": self.dtype.value,
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "domain": self.domain.value,
            "layout": self.layout.value,
            "ready": self.ready,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "buffer") -> BufferDescriptor:
        """Build from the JSON form; keys with a default may be omitted, unknown ones refused."""
        mapping: Any = check_keys(data, field, _REQUIRED, _OPTIONAL)
        try:
            return cls(**mapping)
        except InvalidValue as exc:
            raise rebase(exc, "buffer", field) from None


_REQUIRED = frozenset({"owner", "generation", "dtype", "shape", "nbytes"})
_OPTIONAL = frozenset({"domain", "layout", "ready"})
