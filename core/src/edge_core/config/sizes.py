"""Byte sizes as people write them: ``"512 MiB"``, ``"1.5 GiB"``, ``"64MB"`` or a plain integer.

Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal units (kB, MB, GB, TB) powers
of 1000, exactly as IEC 80000-13 and SI define them. The number may have a fraction as long
as the result is a whole number of bytes; the arithmetic is exact (``decimal``), so
``"0.1 GiB"`` is refused rather than rounded.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from edge_contracts.error_copies import whole_reduction

__all__ = ["UNITS", "ByteSizeError", "format_byte_size", "parse_byte_size"]

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
"""Accepted unit spellings (compared case-insensitively) and their size in bytes."""

_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*")
_BINARY_STEPS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


class ByteSizeError(ValueError):
    """A byte size could not be read; ``reason`` says why, ``value`` is what was given."""

    def __init__(self, reason: str, value: object) -> None:
        self.reason = reason
        self.value = value
        super().__init__(f"byte size: {reason}: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


def parse_byte_size(value: object) -> int:
    """Return the number of bytes that ``value`` denotes.

    ``value`` is a non-negative ``int`` or a string ``"<number> [unit]"``; a string without
    a unit counts bytes. ``bool`` and ``float`` are refused: ``true`` is not a size, and a
    float literal cannot say exactly how many bytes it means.

    Raises:
        ByteSizeError: the value is not a size, is negative, names an unknown unit, or is
            not a whole number of bytes.

    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ByteSizeError("expected an integer or a string like '512 MiB'", value)
    if isinstance(value, int):
        if value < 0:
            raise ByteSizeError("must not be negative", value)
        return value
    match = _SIZE.fullmatch(value)
    if match is None:
        raise ByteSizeError("expected '<number> <unit>' such as '512 MiB'", value)
    unit = match["unit"].lower() or "b"
    if unit not in UNITS:
        allowed = ", ".join(("B", "kB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise ByteSizeError(f"unknown unit (expected one of {allowed})", value)
    try:
        exact = Decimal(match["number"]) * UNITS[unit]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
        raise ByteSizeError("not a number", value) from exc
    if exact != exact.to_integral_value():
        raise ByteSizeError("not a whole number of bytes", value)
    return int(exact)


def format_byte_size(nbytes: int) -> str:
    """Render ``nbytes`` with the largest binary unit that divides it exactly (``"512 MiB"``).

    The result parses back to the same number with :func:`parse_byte_size`.
    """
    if nbytes < 0:
        raise ByteSizeError("must not be negative", nbytes)
    for name, size in _BINARY_STEPS:
        if nbytes and nbytes % size == 0:
            return f"{nbytes // size} {name}"
    return f"{nbytes} B"
