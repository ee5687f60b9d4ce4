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

__all__ = ["BucketMismatch", "ServedShapes", "case_specs"]

BucketMismatch = ShapeRefused
"""The error for inputs outside every served shape (the name earlier releases used)."""


class ServedShapes:
    """A stage's shape set plus, per static entry, the output shapes its warm-up observed.

    The observed output shapes let a static bucket's outputs be written in place into
    shared memory even when the graph declares them symbolic.
    """

    __slots__ = ("outputs", "shapes")

    def __init__(self, shapes: ShapeSet) -> None:
        self.shapes = shapes
        self.outputs: dict[str, list[tuple[str, tuple[int, ...], str]]] = {}

    def match(self, specs: Mapping[str, Spec]) -> ShapeEntry:
        """The entry serving ``specs``; :class:`ShapeRefused` names input, shape and set."""
        return self.shapes.match(specs)

    def to_json(self) -> list[dict[str, Any]]:
        """The shape set's JSON form."""
        return self.shapes.to_json()


def case_specs(data: Mapping[str, Any]) -> dict[str, Spec]:
    """``{name: (dtype, shape)}`` from a JSON ``{name: {"dtype", "shape"}}`` mapping."""
    return {name: (str(v["dtype"]), tuple(int(d) for d in v["shape"]))
            for name, v in data.items()}
