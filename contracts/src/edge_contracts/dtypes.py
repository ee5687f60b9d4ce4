"""Element types: the one spelling of every dtype used on the wire, in manifests and config.

The spelling is the lowercase NumPy-style name (``float32``, ``uint8``, ``bool``), with
``bfloat16`` as a named 2-byte type even though NumPy itself has none. Aliases such as
``float`` or ``f4`` are refused on purpose: there is exactly one way to write each type.
"""

from __future__ import annotations

from enum import StrEnum

from edge_contracts.errors import ContractError, InvalidValue

__all__ = ["DType"]


class DType(StrEnum):
    """A tensor element type; the value is its canonical spelling.

    ``DType`` members are strings (``DType.FLOAT32 == "float32"``), so they serialise
    to JSON as-is.
    """

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BFLOAT16 = "bfloat16"

    @property
    def itemsize(self) -> int:
        """Bytes per element (``bool`` is stored as one byte)."""
        return _ITEMSIZE[self]

    @classmethod
    def parse(
        cls, value: object, field: str = "dtype", *, error: type[ContractError] = InvalidValue
    ) -> DType:
        """Return the member spelled exactly ``value``; raise ``error`` otherwise."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            member = _BY_NAME.get(value)
            if member is not None:
                return member
        raise error(field, value, f"unknown dtype (known: {', '.join(_BY_NAME)})")


_ITEMSIZE: dict[DType, int] = {
    DType.BOOL: 1,
    DType.INT8: 1,
    DType.INT16: 2,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.UINT8: 1,
    DType.UINT16: 2,
    DType.UINT32: 4,
    DType.UINT64: 8,
    DType.FLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
    DType.BFLOAT16: 2,
}

_BY_NAME: dict[str, DType] = {member.value: member for member in DType}
