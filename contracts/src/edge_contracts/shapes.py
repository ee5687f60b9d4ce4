"""Tensor shapes: at most :data:`MAX_DIMS` non-negative dimensions, and their byte size.

Kept apart from :mod:`edge_contracts.buffers` (which re-exports them) so that frame
headers can check shapes without importing the buffer descriptor types.
"""

from __future__ import annotations

import math

from edge_contracts.dtypes import DType
from edge_contracts.errors import ContractError, InvalidValue
from edge_contracts.validation import INT64_MAX, require_int, require_list

__all__ = ["MAX_DIMS", "check_shape", "expected_nbytes"]

MAX_DIMS = 32
"""Most dimensions a tensor may have."""


def check_shape(
    shape: object, field: str, *, error: type[ContractError] = InvalidValue
) -> tuple[int, ...]:
    """Return ``shape`` as a tuple of <= 32 non-negative integers (bools refused)."""
    if (
        type(shape) in (tuple, list)
        and len(shape) <= MAX_DIMS  # type: ignore[arg-type]
        and all(type(dim) is int and 0 <= dim <= INT64_MAX for dim in shape)  # type: ignore[attr-defined]
    ):
        return tuple(shape)  # type: ignore[arg-type]
    dims = require_list(shape, field, max_length=MAX_DIMS, error=error)
    return tuple(
        require_int(dim, f"{field}[{index}]", error=error) for index, dim in enumerate(dims)
    )


def expected_nbytes(
    dtype: DType, shape: tuple[int, ...], field: str, *, error: type[ContractError] = InvalidValue
) -> int:
    """Return ``prod(shape) * dtype.itemsize``; refuse totals beyond the int64 range.

    An empty tensor (some dimension 0) is refused too when its *other* dimensions could
    not describe an array (their product times the item size beyond the int64 range, as
    in ``[0, 2**62]`` of 4-byte items): NumPy refuses such a shape, so no reader could
    build it.
    """
    total = math.prod(shape) * dtype.itemsize
    if total > INT64_MAX:
        raise error(field, list(shape), f"prod(shape) * itemsize must be <= {INT64_MAX}")
    if not total and shape and math.prod(d for d in shape if d) * dtype.itemsize > INT64_MAX:
        raise error(
            field, list(shape), f"prod(non-zero dims) * itemsize must be <= {INT64_MAX}"
        )
    return total
