"""The input shapes a graph stage serves: static buckets and dynamic ranges.

A :class:`ShapeSet` is a tuple of :class:`ShapeEntry`; each entry maps every input name to
a dtype spelling and one dimension spec per axis: an ``int`` (fixed) or an inclusive
``(low, high, step)`` range (dynamic; sizes ``low, low + step, ... <= high``: a network that
downsamples by 32 declares step 32). An entry whose every dimension is fixed is a *static
bucket* (what an NPU compiles); one with a range is a *dynamic* entry.

Shared by the controller (which refuses a request outside every entry before anything is
sent) and the worker (which checks again before running): standard library only.

JSON form (manifests and the worker's ``load``)::

    {"name": "b4_w640", "inputs": {"x": {"dtype": "float32", "dims": [4, 3, 48, 640]}}}
    {"name": "any", "inputs": {"x": {"dtype": "float32", "dims": [1, 3, 48, [32, 2048]]}}}
    {"name": "page", "inputs": {"x": {"dtype": "float32",
                                      "dims": [1, 3, [320, 1280, 32], [320, 1280, 32]]}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_contracts.errors import InvalidValue

__all__ = [
    "MAX_ENTRIES",
    "Dim",
    "InputShape",
    "ShapeEntry",
    "ShapeRefused",
    "ShapeSet",
    "Spec",
]

MAX_ENTRIES = 1024
"""Most entries one shape set may hold (each is warmed up and gated at load)."""

Dim = int | tuple[int, int, int]
"""One axis: a fixed size, or an inclusive ``(low, high, step)`` range."""

Spec = tuple[str, tuple[int, ...]]
"""What a request's input is: ``(dtype spelling, shape)``."""


class ShapeRefused(InvalidValue):
    """An input matches no entry of the stage's shape set (names the input, shape, set).

    The request's own fault (:mod:`edge_contracts.request_faults`), wherever it is
    raised: the controller's check or the worker's.

    Attributes:
        input: the input's name (or ``"inputs"`` when the names differ).
        shape: the input's shape as received.
        served: the served set, described (:meth:`ShapeSet.describe`).
    """

    request_fault = "unsupported_shape"

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(field, value, reason)
        parts = field.split(".")
        self.input = parts[1] if len(parts) > 1 else field
        self.shape = value
        self.served = reason.rsplit("served: ", 1)[-1]


def _dim(value: object, where: str) -> Dim:
    if type(value) is int and value >= 0:
        return value
    if (isinstance(value, (list, tuple)) and len(value) in (2, 3)
            and all(type(v) is int and v >= 0 for v in value) and value[0] <= value[1]
            and (len(value) == 2 or value[2] >= 1)):
        low, high = int(value[0]), int(value[1])
        step = int(value[2]) if len(value) == 3 else 1
        if (high - low) % step:
            raise InvalidValue(where, value, "high - low must be a multiple of the step")
        return low if low == high else (low, high, step)
    raise InvalidValue(where, value, "must be a size >= 0 or a range [low, high(, step)] "
                                     "with low <= high and step >= 1")


def _dim_text(dim: Dim) -> str:
    if isinstance(dim, int):
        return str(dim)
    return f"{dim[0]}..{dim[1]}" + (f"/{dim[2]}" if dim[2] != 1 else "")


def _in_range(size: int, dim: tuple[int, int, int]) -> bool:
    return dim[0] <= size <= dim[1] and (size - dim[0]) % dim[2] == 0


@dataclass(frozen=True, slots=True)
class InputShape:
    """One input of an entry: its dtype spelling and its dimension specs."""

    dtype: str
    dims: tuple[Dim, ...]

    @property
    def static(self) -> bool:
        """True when every dimension is fixed."""
        return all(isinstance(d, int) for d in self.dims)

    def accepts(self, dtype: str, shape: tuple[int, ...]) -> bool:
        """True when ``dtype`` matches and every axis of ``shape`` is inside its spec."""
        if dtype != self.dtype or len(shape) != len(self.dims):
            return False
        for size, dim in zip(shape, self.dims, strict=True):
            if isinstance(dim, int):
                if size != dim:
                    return False
            elif not _in_range(size, dim):
                return False
        return True

    def fits(self, dtype: str, shape: tuple[int, ...]) -> bool:
        """True when ``shape`` can be padded up to this input (each axis at most its top)."""
        if dtype != self.dtype or len(shape) != len(self.dims):
            return False
        return all(size <= (d if isinstance(d, int) else d[1])
                   for size, d in zip(shape, self.dims, strict=True))

    def text(self) -> str:
        """``float32[4,3,48,32..2048]``."""
        return f"{self.dtype}[{','.join(_dim_text(d) for d in self.dims)}]"

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {"dtype": self.dtype,
                "dims": [d if isinstance(d, int) else list(d[:2] if d[2] == 1 else d)
                         for d in self.dims]}


@dataclass(frozen=True, slots=True)
class ShapeEntry:
    """One element of a shape set: every input's dtype and dimension specs."""

    name: str
    inputs: Mapping[str, InputShape]

    @property
    def static(self) -> bool:
        """True for a static bucket (every dimension of every input fixed)."""
        return all(spec.static for spec in self.inputs.values())

    def accepts(self, specs: Mapping[str, Spec]) -> bool:
        """True when the names match and every input is inside its spec."""
        if set(specs) != set(self.inputs):
            return False
        return all(self.inputs[n].accepts(dt, tuple(sh)) for n, (dt, sh) in specs.items())

    def fits(self, specs: Mapping[str, Spec]) -> bool:
        """True when every input can be padded up to this entry."""
        if set(specs) != set(self.inputs):
            return False
        return all(self.inputs[n].fits(dt, tuple(sh)) for n, (dt, sh) in specs.items())

    @property
    def volume(self) -> int:
        """Elements of all inputs at each axis's largest size (orders entries by size)."""
        return sum(math.prod(d if isinstance(d, int) else d[1] for d in spec.dims)
                   for spec in self.inputs.values())

    def text(self) -> str:
        """``b4_w640{x: float32[4,3,48,640]}``."""
        body = ", ".join(f"{n}: {s.text()}" for n, s in sorted(self.inputs.items()))
        return f"{self.name}{{{body}}}"

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {"name": self.name,
                "inputs": {n: s.to_json() for n, s in sorted(self.inputs.items())}}

    @classmethod
    def from_json(cls, data: object, where: str = "entry") -> ShapeEntry:
        """Build from the JSON form, refusing malformed specs with the field named."""
        if not isinstance(data, Mapping):
            raise InvalidValue(where, data, "must be an object with name and inputs")
        name = data.get("name")
        if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 128:
            raise InvalidValue(f"{where}.name", name, "must be printable text of 1..128 chars")
        inputs = data.get("inputs")
        if not isinstance(inputs, Mapping) or not inputs:
            raise InvalidValue(f"{where}.inputs", inputs, "must map input names to specs")
        built: dict[str, InputShape] = {}
        for input_name, spec in inputs.items():
            at = f"{where}.inputs.{input_name}"
            if not isinstance(spec, Mapping):
                raise InvalidValue(at, spec, "must be an object with dtype and dims")
            dtype = spec.get("dtype")
            if not isinstance(dtype, str) or not dtype:
                raise InvalidValue(f"{at}.dtype", dtype, "must be a dtype spelling")
            dims = spec.get("dims")
            if not isinstance(dims, (list, tuple)) or len(dims) > 32:
                raise InvalidValue(f"{at}.dims", dims, "must be a list of <= 32 dimensions")
            built[str(input_name)] = InputShape(
                dtype, tuple(_dim(d, f"{at}.dims[{i}]") for i, d in enumerate(dims)))
        return cls(name, built)


# (id of a set, its specs' items) -> (that set, the entry that accepted them)
_MATCHED: dict[tuple[int, tuple[Any, ...]], tuple[ShapeSet, ShapeEntry]] = {}
_MATCHED_SIZE = 1024


@dataclass(frozen=True, slots=True)
class ShapeSet:
    """The shapes a stage serves; :meth:`match` refuses everything else.

    Attributes:
        entries: the static buckets and dynamic entries, in declaration order.
    """

    entries: tuple[ShapeEntry, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.entries:
            raise InvalidValue("shapes", [], "a shape set needs at least one entry")
        if len(self.entries) > MAX_ENTRIES:
            raise InvalidValue("shapes", len(self.entries), f"must hold <= {MAX_ENTRIES} entries")
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise InvalidValue("shapes", names, "entry names must be unique")

    @property
    def names(self) -> tuple[str, ...]:
        """Entry names in declaration order."""
        return tuple(e.name for e in self.entries)

    def entry(self, name: str) -> ShapeEntry:
        """The entry called ``name``; ``KeyError`` when there is none."""
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def describe(self) -> str:
        """Every entry, for refusals: ``b1{x: float32[1,3,48,320]} | ...``."""
        return " | ".join(e.text() for e in self.entries)

    def match(self, specs: Mapping[str, Spec], where: str = "inputs") -> ShapeEntry:
        """The first entry that accepts ``specs`` (static buckets before dynamic ones).

        Raises:
            ShapeRefused: naming the first input outside every entry, its shape and the
                served set (or the input names, when they differ from every entry's).
        """
        try:  # a stream repeats a few shapes: each is matched once per set
            key: tuple[int, tuple[Any, ...]] | None = (id(self), tuple(specs.items()))
            hit = _MATCHED.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable shape (a list): matched afresh
            key, hit = None, None
        if hit is not None and hit[0] is self:  # the set itself: its id was not reused
            return hit[1]
        for entry in sorted(self.entries, key=lambda e: not e.static):
            if entry.accepts(specs):
                if key is not None:
                    if len(_MATCHED) >= _MATCHED_SIZE:
                        _MATCHED.clear()
                    _MATCHED[key] = (self, entry)
                return entry
        raise self.refusal(specs, where)

    def smallest_fit(self, specs: Mapping[str, Spec], where: str = "inputs") -> ShapeEntry:
        """The smallest entry ``specs`` can be padded up to (by :attr:`ShapeEntry.volume`).

        Raises:
            ShapeRefused: when no entry is large enough.
        """
        fitting = [e for e in self.entries if e.fits(specs)]
        if not fitting:
            raise self.refusal(specs, where, "fits in no entry (too large)")
        return min(fitting, key=lambda e: (e.volume, not e.static))

    def refusal(self, specs: Mapping[str, Spec], where: str = "inputs",
                why: str = "outside every declared shape") -> ShapeRefused:
        """The error for ``specs``: the first input no entry accepts, named with the set."""
        served = self.describe()
        names = sorted(specs)
        if not any(set(names) == set(e.inputs) for e in self.entries):
            return ShapeRefused(where, names, f"input names differ from the served set; "
                                              f"served: {served}")
        for name in names:
            dtype, shape = specs[name]
            inputs = [e.inputs[name] for e in self.entries if name in e.inputs]
            if not any(i.accepts(dtype, tuple(shape)) for i in inputs):
                dtypes = sorted({i.dtype for i in inputs})
                reason = why if dtype in dtypes else (
                    f"dtype {dtype} is not served (only {', '.join(dtypes)})")
                return ShapeRefused(f"{where}.{name}", f"{dtype}{list(shape)}",
                                    f"{reason}; served: {served}")
        first = names[0]
        dtype, shape = specs[first]
        return ShapeRefused(f"{where}.{first}", f"{dtype}{list(shape)}",
                            f"no single entry accepts all inputs together; served: {served}")

    def to_json(self) -> list[dict[str, Any]]:
        """The JSON form: a list of entries."""
        return [e.to_json() for e in self.entries]

    @classmethod
    def from_json(cls, data: object, where: str = "shapes") -> ShapeSet:
        """Build from :meth:`to_json` output (or a manifest's ``shapes`` list)."""
        if not isinstance(data, (list, tuple)):
            raise InvalidValue(where, data, "must be a list of entries")
        return cls(tuple(ShapeEntry.from_json(item, f"{where}[{i}]")
                         for i, item in enumerate(data)))

    @classmethod
    def single(cls, specs: Mapping[str, Spec], name: str = "example") -> ShapeSet:
        """A set of one static bucket: exactly ``specs``."""
        return cls((ShapeEntry(name, {n: InputShape(dt, tuple(sh))
                                      for n, (dt, sh) in specs.items()}),))

