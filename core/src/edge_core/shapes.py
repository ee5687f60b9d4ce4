"""Shape sets in core: what a bundle declares it serves, the warm-up cases, and ``fit``.

A graph stage serves a :class:`~edge_contracts.shapesets.ShapeSet` (static buckets and
dynamic ranges). The bundle declares it in ``metadata.validation.shapes``: a list of
entries, each with its example inputs (and expected outputs where available) as listed
members::

    "shapes": [
      {"name": "b4_w640",
       "inputs": {"x": {"dtype": "float32", "dims": [4, 3, 48, 640]}},
       "examples": [{"example_inputs": "buckets/b4_w640.npz",
                     "expected_outputs": "buckets/b4_w640.expected.npz"}]},
      {"name": "page",
       "inputs": {"x": {"dtype": "float32", "dims": [1, 3, [320, 1280], [320, 1280]]}},
       "examples": [...three or more: the minimum, the maximum and one between...]}
    ]

A bundle without ``shapes`` serves exactly the shape of its ``example_inputs`` (one static
bucket), checked against ``expected_outputs``. :func:`declared_shapes` reads either form
and checks that every static bucket has an example of exactly its shape and every dynamic
entry has examples at its minimum, its maximum and one shape strictly between; the load
warms up and gates every one of these :class:`WarmupCase`.

:func:`fit` is the caller's helper: it picks the smallest entry the inputs fit in and pads
them along the declared axes (zeros by default; the model's own transform decides what
padding means by passing ``pad``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from edge_contracts.errors import InvalidValue
from edge_contracts.shapesets import InputShape, ShapeEntry, ShapeRefused, ShapeSet, Spec

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "SHAPES_KEY",
    "Fitted",
    "ShapeRefused",
    "ShapeSet",
    "WarmupCase",
    "declared_shapes",
    "fit",
    "select",
    "specs_of",
]

SHAPES_KEY = "shapes"
"""Key of ``metadata.validation`` holding the served shape set with its examples."""


@attrs.frozen
class WarmupCase:
    """One warm-up run of the load gate: an entry of the shape set and its example.

    Attributes:
        entry: the shape-set entry the example exercises.
        example_inputs: member path of the ``.npz`` of inputs.
        expected_outputs: member path of the ``.npz`` of reference outputs, or ``None``.
        specs: the example's ``(dtype, shape)`` per input.
        point: ``static``, ``min``, ``max`` or ``between`` (where in a dynamic range).
        field: where the example is named under ``manifest.metadata``:
            ``example_inputs``, or ``validation.shapes[i].examples[j].example_inputs`` for a
            declared entry's (what a refusal of that example names).
    """

    entry: str
    example_inputs: str
    expected_outputs: str | None
    specs: Mapping[str, Spec]
    point: str
    field: str = "example_inputs"

    def to_json(self) -> dict[str, Any]:
        """The JSON form recorded in execution plans."""
        return {"entry": self.entry, "point": self.point,
                "example_inputs": self.example_inputs,
                "expected_outputs": self.expected_outputs,
                "shapes": {n: list(s) for n, (_, s) in sorted(self.specs.items())}}


def specs_of(arrays: Mapping[str, Any]) -> dict[str, Spec]:
    """``{name: (dtype spelling, shape)}`` of numpy arrays (the wire's dtype spellings)."""
    from edge_contracts.tensors import dtype_of

    return {name: (dtype_of(a).value, tuple(int(d) for d in a.shape))
            for name, a in arrays.items()}


def _point(entry: ShapeEntry, specs: Mapping[str, Spec]) -> str:
    """Where ``specs`` sits in ``entry``'s ranges: min, max, between (or static)."""
    if entry.static:
        return "static"
    where: set[str] = set()
    for name, spec in entry.inputs.items():
        for size, dim in zip(specs[name][1], spec.dims, strict=True):
            if isinstance(dim, int):
                continue
            where.add("min" if size == dim[0] else "max" if size == dim[1] else "between")
    if where == {"min"}:
        return "min"
    if where == {"max"}:
        return "max"
    return "between"


def declared_shapes(
    validation: Mapping[str, Any] | None,
    example_inputs: str | None,
    expected_outputs: str | None,
    arrays: Callable[[str, str], Mapping[str, Spec]],
    files: Mapping[str, str],
) -> tuple[ShapeSet, tuple[WarmupCase, ...]] | None:
    """The served shape set and the warm-up cases that gate it.

    Args:
        validation: the manifest's ``metadata.validation``.
        example_inputs: the bundle's single example (``metadata.example_inputs``).
        expected_outputs: its reference outputs (``validation.expected_outputs``).
        arrays: ``arrays(member, field)`` → the ``(dtype, shape)`` of each array in the
            ``.npz`` member (refusing unreadable ones, naming ``field``).
        files: the manifest's listed members.

    Returns:
        ``None`` when the bundle declares no shapes and has no example inputs.

    Raises:
        InvalidValue: a malformed entry, an example member not listed, an example outside
            its entry, a static bucket without its example, a dynamic entry whose examples
            miss its minimum, maximum or a shape between (the field is named).
    """
    declared = (validation or {}).get(SHAPES_KEY)
    base = f"manifest.metadata.validation.{SHAPES_KEY}"
    if declared is None:
        if example_inputs is None:
            return None
        specs = dict(arrays(example_inputs, "manifest.metadata.example_inputs"))
        shape_set = ShapeSet.single(specs)
        return shape_set, (WarmupCase("example", example_inputs, expected_outputs, specs,
                                      "static"),)
    if not isinstance(declared, Sequence) or isinstance(declared, str):
        raise InvalidValue(base, declared, "must be a list of entries")
    shape_set = ShapeSet.from_json([{"name": e.get("name"), "inputs": e.get("inputs")}
                                    if isinstance(e, Mapping) else e for e in declared], base)
    cases: list[WarmupCase] = []
    for index, (entry, raw) in enumerate(zip(shape_set.entries, declared, strict=True)):
        where = f"{base}[{index}].examples"
        examples = raw.get("examples")
        if not isinstance(examples, Sequence) or isinstance(examples, str) or not examples:
            raise InvalidValue(where, examples, "every entry needs its example inputs")
        points: set[str] = set()
        for number, example in enumerate(examples):
            at = f"{where}[{number}]"
            if not isinstance(example, Mapping):
                raise InvalidValue(at, example, "must name example_inputs (and expected_outputs)")
            inputs, expected = example.get("example_inputs"), example.get("expected_outputs")
            for key, member in (("example_inputs", inputs), ("expected_outputs", expected)):
                if member is None and key == "expected_outputs":
                    continue
                if not isinstance(member, str) or member not in files:
                    raise InvalidValue(f"{at}.{key}", member,
                                       "must be a key of files (not in the verified set)")
            assert isinstance(inputs, str)
            specs = dict(arrays(inputs, f"{at}.example_inputs"))
            if expected is not None:
                arrays(str(expected), f"{at}.expected_outputs")
            if not entry.accepts(specs):
                raise InvalidValue(f"{at}.example_inputs",
                                   {n: f"{d}{list(s)}" for n, (d, s) in sorted(specs.items())},
                                   f"outside its entry {entry.text()}")
            point = _point(entry, specs)
            points.add(point)
            cases.append(WarmupCase(entry.name, inputs,
                                    expected if isinstance(expected, str) else None,
                                    specs, point,
                                    f"{at.removeprefix('manifest.metadata.')}.example_inputs"))
        missing = [] if entry.static else sorted({"min", "max", "between"} - points)
        if missing:
            raise InvalidValue(where, sorted(points),
                               f"a dynamic entry is gated at its minimum, its maximum and one "
                               f"shape between; missing {missing} for {entry.text()}")
    return shape_set, tuple(cases)


def select(shapes: ShapeSet, cases: tuple[WarmupCase, ...], names: Sequence[str],
           field: str = "shapes") -> tuple[ShapeSet, tuple[WarmupCase, ...]]:
    """The entries named (in the set's order) and their warm-up cases; all when empty.

    Raises:
        ConfigError: a name is not an entry of the set (the known names are listed).
    """
    if not names:
        return shapes, cases
    from edge_core.errors import ConfigError

    for index, name in enumerate(names):
        if name not in shapes.names:
            raise ConfigError(f"{field}[{index}]",
                              f"not an entry of the bundle's shape set {list(shapes.names)}",
                              name)
    kept = ShapeSet(tuple(e for e in shapes.entries if e.name in set(names)))
    return kept, tuple(c for c in cases if c.entry in set(names))


@attrs.frozen
class Fitted:
    """What :func:`fit` returns.

    Attributes:
        inputs: the padded inputs, ready to submit.
        entry: the entry they were padded to.
        shapes: each input's shape before padding (to cut padded rows off the outputs).
    """

    inputs: Mapping[str, Any]
    entry: ShapeEntry
    shapes: Mapping[str, tuple[int, ...]]


Pad = Callable[[str, "npt.NDArray[Any]", tuple[int, ...]], "npt.NDArray[Any]"]
"""``pad(input name, array, target shape) -> array of the target shape``."""


def _target(spec: InputShape, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Each axis's size after padding: the fixed size, or the next size a range holds."""
    sizes = []
    for size, d in zip(shape, spec.dims, strict=True):
        if isinstance(d, int):
            sizes.append(d)
        else:
            low, _, step = d
            sizes.append(low + -(-max(0, size - low) // step) * step)
    return tuple(sizes)


def _zeros(_name: str, array: npt.NDArray[Any], target: tuple[int, ...]) -> npt.NDArray[Any]:
    import numpy as np

    widths = [(0, t - s) for s, t in zip(array.shape, target, strict=True)]
    return np.pad(array, widths)


def fit(
    inputs: Mapping[str, Any],
    shapes: ShapeSet,
    *,
    axes: Mapping[str, Sequence[int]] | None = None,
    pad: Pad | None = None,
) -> Fitted:
    """Pick the smallest entry ``inputs`` fit in and pad them up to it.

    Args:
        inputs: input name → array.
        shapes: the stage's served set (``StageRuntime.shapes`` once it is loaded).
        axes: input name → the axes that may be padded (default: every axis). An input
            that would need padding along another axis is refused.
        pad: the model's padding (default: zeros appended at the end of each axis).

    Raises:
        ShapeRefused: no entry is large enough, or padding would touch an undeclared axis.
    """
    specs = specs_of(inputs)
    entry = shapes.smallest_fit(specs)
    padder = pad or _zeros
    padded: dict[str, Any] = {}
    for name, array in inputs.items():
        target = _target(entry.inputs[name], specs[name][1])
        allowed = set(range(len(target)) if axes is None or name not in axes else axes[name])
        for axis, (size, want) in enumerate(zip(specs[name][1], target, strict=True)):
            if size != want and axis not in allowed:
                raise ShapeRefused(
                    f"inputs.{name}", f"{specs[name][0]}{list(specs[name][1])}",
                    f"axis {axis} would need padding to {want} but only axes "
                    f"{sorted(allowed)} may be padded; served: {shapes.describe()}")
        result = array if tuple(array.shape) == target else padder(name, array, target)
        if tuple(result.shape) != target:
            raise ShapeRefused(f"inputs.{name}", list(result.shape),
                               f"pad returned a shape other than {list(target)}; "
                               f"served: {shapes.describe()}")
        padded[name] = result
    return Fitted(padded, entry, {n: s for n, (_, s) in specs.items()})
