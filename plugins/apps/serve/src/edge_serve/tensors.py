"""Named tensors in JSON: ``{"dtype": "float32", "shape": [1, 3], "data": "<base64>"}``.

The data is the array's bytes in C order, little-endian, base64-encoded (standard
alphabet, padding required). Every check — a known dtype, at most 32 non-negative dims,
the element count (an empty tensor's other dimensions too: NumPy must be able to describe
it), the decoded length equal to ``prod(shape) * itemsize``, a ``bool`` tensor's bytes
each 0 or 1 (as the wire requires) — runs before the array is built, and a refusal names
the field: ``inputs['x'].shape``.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.dtypes import DType
from edge_contracts.errors import ContractError
from edge_contracts.shapes import expected_nbytes
from edge_contracts.validation import require_id
from edge_serve.outcomes import HttpRefusal

__all__ = ["MAX_DIMS", "decode_tensors", "encode_tensor", "encode_tensors"]

MAX_DIMS = 32
"""Dimensions per tensor, at most (the wire's own limit)."""


#: The dtypes a JSON tensor may have: the wire's spellings NumPy itself knows.
_NUMPY_DTYPES = tuple(d.value for d in DType if d is not DType.BFLOAT16)

#: Each JSON dtype name → (its little-endian dtype, its native one), made once: NumPy's
#: own name and byte-order lookups are Python code, and they ran on every request.
_DECODED = {name: (np.dtype(name).newbyteorder("<"), np.dtype(name).newbyteorder("="))
            for name in _NUMPY_DTYPES}

#: An array's dtype → (its JSON name, its little-endian dtype), filled as they come.
_ENCODED: dict[np.dtype[Any], tuple[str, np.dtype[Any]]] = {}


#: The keys of a tensor's JSON form.
_KEYS = frozenset({"dtype", "shape", "data"})


def _refuse(field: str, reason: str, value: object) -> HttpRefusal:
    return HttpRefusal(400, field, reason, value, kind="TensorInvalid")


def _dtype(name: object, field: str) -> tuple[np.dtype[Any], np.dtype[Any]]:
    """The little-endian and the native dtype a tensor's ``dtype`` names."""
    found = _DECODED.get(name) if isinstance(name, str) else None
    if found is None:
        raise _refuse(f"{field}.dtype", f"must be one of {', '.join(_NUMPY_DTYPES)}", name)
    return found


def _shape(value: object, field: str) -> tuple[int, ...]:
    if type(value) is list and len(value) <= MAX_DIMS:
        for d in value:
            if type(d) is not int or d < 0:  # bool is not int; an int subclass is refused
                break
        else:
            return tuple(value)
    if (not isinstance(value, list) or len(value) > MAX_DIMS
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in value)):
        raise _refuse(f"{field}.shape", f"must be a list of at most {MAX_DIMS} integers >= 0",
                      value)
    return tuple(value)


def decode_tensor(spec: object, field: str, *, max_bytes: int) -> np.ndarray:
    """One tensor from its JSON form, checked before anything is allocated.

    Raises:
        HttpRefusal: 400 naming the field; 413 when the tensor exceeds ``max_bytes``.
    """
    if not isinstance(spec, dict):
        raise _refuse(field, 'must be an object {"dtype", "shape", "data"}', spec)
    if not spec.keys() <= _KEYS:
        unknown = sorted(spec.keys() - _KEYS)
        raise _refuse(f"{field}.{unknown[0]}", "unknown key (known: data, dtype, shape)",
                      spec[unknown[0]])
    dtype, native = _dtype(spec.get("dtype"), field)
    shape = _shape(spec.get("shape"), field)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > max_bytes:
        raise HttpRefusal(413, f"{field}.shape", f"the tensor exceeds {max_bytes} bytes",
                          nbytes, kind="TensorTooLarge")
    if not nbytes:  # empty, yet its other dimensions must describe an array (as the wire's)
        try:
            expected_nbytes(DType(spec["dtype"]), shape, f"{field}.shape")
        except ContractError as exc:
            raise _refuse(exc.field, exc.reason, exc.value) from None
    data = spec.get("data")
    if not isinstance(data, str):
        raise _refuse(f"{field}.data", "must be a base64 string", type(data).__name__)
    characters = 4 * -(-nbytes // 3)
    if len(data) != characters:
        raise _refuse(f"{field}.data", f"base64 of {nbytes} bytes is {characters} "
                      "characters (prod(shape) * itemsize)", len(data))
    try:
        # base64.b64decode(data, validate=True) is this call, after its own two in Python
        raw = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):  # ValueError: a str that is not ASCII
        raise _refuse(f"{field}.data", "not valid base64", data[:32]) from None
    if len(raw) != nbytes:
        raise _refuse(f"{field}.data", f"decodes to {len(raw)} bytes, not {nbytes}", len(raw))
    if dtype.kind == "b" and nbytes:  # the wire carries a bool as one byte, 0 or 1
        largest = int(np.frombuffer(raw, np.uint8).max())
        if largest > 1:
            raise _refuse(f"{field}.data", "a bool tensor's bytes must each be 0 or 1 "
                          "(the largest is shown)", largest)
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return array.astype(native, copy=False)


def decode_tensors(value: object, field: str, *, max_bytes: int) -> dict[str, np.ndarray]:
    """A mapping of named tensors (``{"x": {...}}``) from JSON.

    Each name must be one the wire carries (non-empty, printable, at most 128
    characters): a refusal names it as ``inputs['NAME']``.
    """
    if not isinstance(value, dict):
        raise _refuse(field, "must be an object of named tensors", type(value).__name__)
    tensors: dict[str, np.ndarray] = {}
    remaining = max_bytes
    for name, spec in value.items():
        named = f"{field}[{name!r}]"
        try:  # the wire's rule for a tensor's name, checked before the request waits
            require_id(name, named)
        except ContractError as exc:
            raise _refuse(named, f"a tensor's name {exc.reason}", name) from None
        array = decode_tensor(spec, named, max_bytes=remaining)
        remaining -= array.nbytes
        tensors[name] = array
    return tensors


def encode_tensor(array: Any) -> dict[str, Any]:
    """One array as JSON (copied out of any worker memory it views)."""
    value = np.asarray(array)
    found = _ENCODED.get(value.dtype)
    if found is None:
        # named without its byte order (``>i4`` is ``int32``): the data goes little-endian
        found = _ENCODED[value.dtype] = (str(value.dtype.newbyteorder("=")),
                                         value.dtype.newbyteorder("<"))
    name, little_endian = found
    little = value.astype(little_endian, copy=False)
    return {"dtype": name, "shape": list(value.shape),
            "data": binascii.b2a_base64(np.ascontiguousarray(little).tobytes(),  # b64encode
                                        newline=False).decode("ascii")}


def encode_tensors(arrays: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Named arrays as JSON."""
    encoded: dict[str, dict[str, Any]] = {}
    for name, array in arrays.items():  # (a loop: a comprehension is a call more)
        encoded[name] = encode_tensor(array)
    return encoded
