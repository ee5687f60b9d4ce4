"""The fixed input bucket of a graph stage: names, dtypes and shapes frozen at warm-up.

Shared by the worker and the controller (standard library + edge_contracts only): the
controller checks a request before sending it, the worker checks again before running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_contracts.errors import InvalidValue

__all__ = ["Bucket", "BucketMismatch"]


class BucketMismatch(InvalidValue):
    """A request's inputs differ from the stage's frozen example bucket."""


class Bucket:
    """Input name → (dtype spelling, shape) as the example inputs fixed them."""

    __slots__ = ("specs",)

    def __init__(self, specs: Mapping[str, tuple[str, tuple[int, ...]]]) -> None:
        self.specs = dict(specs)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Bucket:
        """Rebuild from :meth:`to_json` output."""
        return cls({name: (str(v["dtype"]), tuple(int(d) for d in v["shape"]))
                    for name, v in data.items()})

    def to_json(self) -> dict[str, dict[str, Any]]:
        """A JSON-ready mapping ``{name: {"dtype": ..., "shape": [...]}}``."""
        return {name: {"dtype": dt, "shape": list(shape)}
                for name, (dt, shape) in self.specs.items()}

    def check(self, inputs: Mapping[str, tuple[str, tuple[int, ...]]]) -> None:
        """Refuse inputs whose names, dtypes or shapes differ from the bucket.

        Args:
            inputs: name → (dtype spelling, shape) of the request's inputs.

        Raises:
            BucketMismatch: naming the first differing input and both values.
        """
        if set(inputs) != set(self.specs):
            raise BucketMismatch(
                "inputs", sorted(inputs),
                f"input names differ from the example bucket {sorted(self.specs)}",
            )
        for name, (dtype, shape) in inputs.items():
            want_dtype, want_shape = self.specs[name]
            if dtype != want_dtype:
                raise BucketMismatch(f"inputs.{name}.dtype", dtype,
                                     f"the example bucket has {want_dtype}")
            if tuple(shape) != want_shape:
                raise BucketMismatch(f"inputs.{name}.shape", list(shape),
                                     f"the example bucket has {list(want_shape)}")
