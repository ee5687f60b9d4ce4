"""The shapes a graph stage serves, as the worker and the controller both check them.

Shared by the worker and the controller (standard library + edge_contracts only): the
controller refuses a request outside every declared shape before sending it, the worker
checks again before running. The shape set itself is
:class:`edge_contracts.shapesets.ShapeSet`; this module keeps the ORT-side names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_contracts.shapesets import ShapeEntry, ShapeRefused, ShapeSet, Spec

__all__ = ["BucketMismatch", "ServedShapes"]

BucketMismatch = ShapeRefused
"""The error for inputs outside every served shape (the name earlier releases used)."""


class ServedShapes:
    """A stage's shape set, as the worker checks every call against it."""

    __slots__ = ("shapes",)

    def __init__(self, shapes: ShapeSet) -> None:
        self.shapes = shapes

    def match(self, specs: Mapping[str, Spec]) -> ShapeEntry:
        """The entry serving ``specs``; :class:`ShapeRefused` names input, shape and set."""
        return self.shapes.match(specs)

    def to_json(self) -> list[dict[str, Any]]:
        """The shape set's JSON form."""
        return self.shapes.to_json()
