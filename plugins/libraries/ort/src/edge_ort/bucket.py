"""The shapes a graph stage serves, as the worker and the controller both check them.

Shared by the worker and the controller (standard library, numpy and edge_contracts
only): the controller refuses a request outside every declared shape before sending it,
the worker checks again before running; both read an array's spec with :func:`spec_of`.
The shape set itself is :class:`edge_contracts.shapesets.ShapeSet`; this module keeps the
ORT-side names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.shapesets import ShapeEntry, ShapeRefused, ShapeSet, Spec
from edge_contracts.tensors import dtype_of

__all__ = ["BucketMismatch", "LoneAccepted", "ServedShapes", "spec_of"]

BucketMismatch = ShapeRefused
"""The error for inputs outside every served shape (the name earlier releases used)."""


_WIRE_NAMES: dict[np.dtype[Any], str] = {}
"""numpy dtype -> its wire dtype's name, kept as requests bring them (a handful)."""


def spec_of(array: Any) -> tuple[str, tuple[int, ...]]:
    """``(wire dtype name, shape)`` of ``array``, as a shape set matches it (per call).

    Anything else is taken as NumPy takes it (``np.asarray``: a list, a scalar), as the
    request's packing does.

    Raises:
        InvalidValue: for a dtype the wire does not carry (from
            :func:`edge_contracts.tensors.dtype_of`, field ``dtype``; a refused dtype is
            never kept).
    """
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    name = _WIRE_NAMES.get(array.dtype)
    if name is None:
        # str() of a DType (a StrEnum) is its value, without the enum's property
        name = _WIRE_NAMES[array.dtype] = str(dtype_of(array))
    return name, array.shape


class LoneAccepted:
    """A lone input array a shape set accepted: its name, dtype and shape, and the entry.

    A stage's calls mostly repeat one input's dtype and shape. The next request whose
    only input is an ``ndarray`` of the same name with an equal dtype and this shape,
    checked against the same set (``shapes``, compared by identity), is accepted by the
    same entry without matching again: :meth:`ShapeSet.match` answers alike for equal
    specs, and :func:`spec_of` reads only an array's dtype and shape. The callers compare
    the fields themselves (no call per request) and keep the last one accepted.
    """

    __slots__ = ("dtype", "entry", "name", "shape", "shapes")

    def __init__(self, shapes: ShapeSet, name: str, array: np.ndarray,
                 entry: ShapeEntry) -> None:
        self.shapes = shapes
        self.name = name
        self.dtype = array.dtype
        self.shape = array.shape
        self.entry = entry


class ServedShapes:
    """A stage's shape set, as the worker checks every call against it."""

    __slots__ = ("accepted", "shapes")

    def __init__(self, shapes: ShapeSet) -> None:
        self.shapes = shapes
        self.accepted: LoneAccepted | None = None
        """The last lone input :attr:`shapes` accepted (see :class:`LoneAccepted`)."""

    def match(self, specs: Mapping[str, Spec]) -> ShapeEntry:
        """The entry serving ``specs``; :class:`ShapeRefused` names input, shape and set."""
        return self.shapes.match(specs)

    def to_json(self) -> list[dict[str, Any]]:
        """The shape set's JSON form."""
        return self.shapes.to_json()
