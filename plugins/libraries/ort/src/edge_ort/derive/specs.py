"""What a derivation is asked for: buckets (fixed input shapes), bounds, and its errors.

Standard library only, so that parsing a command line costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edge_core.errors import ConfigError, EdgeError

__all__ = ["BucketSpec", "DeriveFailed", "DeriveInputError", "check_buckets", "parse_bound",
           "parse_bucket"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_DIM = 2**31 - 1


class DeriveInputError(ConfigError):
    """A derivation's input is unusable (bucket spec, output directory, calibration data).

    ``path`` names the argument (``--bucket[1]``), ``value`` the offending value.
    """


class DeriveFailed(EdgeError):
    """The derivation ran but its result is refused.

    Numbers outside the bound, or a graph ONNX Runtime cannot fix or quantise; nothing is
    left in the output directory.
    """


@dataclass(frozen=True)
class BucketSpec:
    """One static bucket: its name and every input's fixed shape.

    Attributes:
        name: the shape-set entry name (``b`` and the dimensions unless given).
        shapes: input name -> fixed dimensions; an empty name means "the graph's only
            input" until :func:`check_buckets` resolves it.
    """

    name: str
    shapes: Mapping[str, tuple[int, ...]]

    def text(self) -> str:
        """``name{x: 1x3x48x192}``."""
        body = ", ".join(f"{n}: {'x'.join(map(str, d))}" for n, d in sorted(self.shapes.items()))
        return f"{self.name}{{{body}}}"


def _dims(text: str, where: str, value: str) -> tuple[int, ...]:
    parts = text.split("x")
    if not text or any(not p.isdigit() for p in parts):
        raise DeriveInputError(where, "dimensions must be positive integers joined by 'x' "
                               "(1x3x48x192)", value)
    dims = tuple(int(p) for p in parts)
    if any(d < 1 or d > _MAX_DIM for d in dims) or len(dims) > 32:
        raise DeriveInputError(where, f"every dimension must be in 1..{_MAX_DIM} "
                               "(at most 32 of them)", value)
    return dims


def parse_bucket(text: str, index: int) -> BucketSpec:
    """Parse ``[NAME:]DIMS`` or ``[NAME:]INPUT=DIMS[,INPUT=DIMS...]``.

    Raises:
        DeriveInputError: naming ``--bucket[index]`` and the text.
    """
    where = f"--bucket[{index}]"
    name, body = "", text.strip()
    if ":" in body:
        name, body = (part.strip() for part in body.split(":", 1))
        if not _NAME.match(name):
            raise DeriveInputError(where, "the bucket name must be 1..64 of [A-Za-z0-9_.-]",
                                   text)
    shapes: dict[str, tuple[int, ...]] = {}
    if "=" not in body:
        shapes[""] = _dims(body, where, text)
    else:
        for part in body.split(","):
            input_name, _, dims = part.partition("=")
            input_name = input_name.strip()
            if not input_name or input_name in shapes:
                raise DeriveInputError(where, "each INPUT=DIMS needs a distinct input name",
                                       text)
            shapes[input_name] = _dims(dims.strip(), where, text)
    if not name:  # b1x3x48x192, or b_x1x3x8x8_m1x8 for several inputs
        dims_text = ["x".join(map(str, d)) for d in shapes.values()]
        name = ("b" + dims_text[0] if "" in shapes
                else "b_" + "_".join(f"{n}{d}" for n, d in zip(shapes, dims_text, strict=True)))
        if not _NAME.match(name):
            raise DeriveInputError(where, "give the bucket a short name (NAME:...)", text)
    return BucketSpec(name, shapes)


def check_buckets(buckets: Sequence[BucketSpec],
                  graph_inputs: Mapping[str, Sequence[int | str | None]]) -> list[BucketSpec]:
    """Resolve each bucket against the graph's inputs (name -> dims, symbolic as text).

    Raises:
        DeriveInputError: no bucket; a duplicate name; an input missing, unknown, of
            another rank, or at odds with one of the graph's fixed dimensions.
    """
    if not buckets:
        raise DeriveInputError("--bucket", "at least one bucket is needed", [])
    resolved: list[BucketSpec] = []
    seen: set[str] = set()
    for index, bucket in enumerate(buckets):
        where = f"--bucket[{index}]"
        if bucket.name in seen:
            raise DeriveInputError(where, "bucket names must be distinct", bucket.name)
        seen.add(bucket.name)
        shapes = dict(bucket.shapes)
        if "" in shapes:
            if len(graph_inputs) != 1:
                raise DeriveInputError(where, "the graph has several inputs; give "
                                       f"INPUT=DIMS for each of {sorted(graph_inputs)}",
                                       bucket.text())
            shapes = {next(iter(graph_inputs)): shapes[""]}
        unknown = sorted(set(shapes) - set(graph_inputs))
        missing = sorted(set(graph_inputs) - set(shapes))
        if unknown or missing:
            raise DeriveInputError(where, f"must give exactly the graph's inputs "
                                   f"{sorted(graph_inputs)} (unknown {unknown}, missing "
                                   f"{missing})", bucket.text())
        for input_name, dims in shapes.items():
            declared = list(graph_inputs[input_name])
            if len(declared) != len(dims):
                raise DeriveInputError(f"{where}.{input_name}", f"the graph's input has rank "
                                       f"{len(declared)} ({declared})", list(dims))
            for axis, (have, want) in enumerate(zip(declared, dims, strict=True)):
                if isinstance(have, int) and have > 0 and have != want:
                    raise DeriveInputError(f"{where}.{input_name}[{axis}]", f"the graph fixes "
                                           f"this axis to {have}", want)
        resolved.append(BucketSpec(bucket.name, shapes))
    return resolved


def parse_bound(text: str | None) -> dict[str, float]:
    """``max_abs_error=0.05[,normalised_error=0.02]`` -> the bound mapping ({} for None).

    Raises:
        DeriveInputError: an unknown key or a value that is not a positive number.
    """
    if not text:
        return {}
    bound: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in ("max_abs_error", "normalised_error"):
            raise DeriveInputError("--bound", "keys are max_abs_error and normalised_error",
                                   text)
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not number > 0 or number != number or number == float("inf"):
            raise DeriveInputError(f"--bound.{key}", "must be a positive finite number", value)
        bound[key] = number
    return bound
