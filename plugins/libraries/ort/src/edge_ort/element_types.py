"""The element types an ORT stage carries, and its refusal of the others by name.

A stage's tensors travel as wire dtypes (:class:`edge_contracts.dtypes.DType`) and reach
ONNX Runtime, and come back from it, as NumPy arrays (``InferenceSession.run``). That
carries the graph tensor types ``bool``, ``int8`` to ``int64``, ``uint8`` to ``uint64``,
``float16``, ``float`` (``float32``) and ``double`` (``float64``). Not carried:

- ``bfloat16``: a wire dtype (``ml_dtypes.bfloat16`` arrays), but ONNX Runtime's NumPy
  binding takes no such array (``Numpy_type 256 can't be converted to MLDataType``) and
  gives none back (``No corresponding Numpy type for Tensor Type. bfloat16``); an
  ``.npz`` stores such an array as 2-byte void (``|V2``), which a bundle's example cannot
  hold (the manifest refuses it);
- the ``float8`` types: no wire dtype, and ONNX Runtime hands such an output back as
  ``uint8`` bits, which would travel as ``uint8`` values;
- ``string``, ``complex64``/``complex128``, ``int4``/``uint4``, ``float4e2m1`` and any
  other tensor type without a wire dtype.

:func:`check_graph_types` refuses a graph with such an input or output when the worker
loads it (before any warm-up or call; the controller retires the worker and the runtime
releases what it reserved), naming the input or output and its type;
:func:`check_example` refuses, at the warm-up, an example input whose dtype is not its
graph input's, by name, instead of ONNX Runtime's ``INVALID_ARGUMENT`` message. Neither
runs on a call's path.

Worker and controller side: numpy and edge_contracts only (no ``onnxruntime``: the
types are read from a session's ``NodeArg.type`` strings).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from edge_contracts.dtypes import DType
from edge_contracts.errors import InvalidValue
from edge_contracts.tensors import dtype_of

__all__ = ["CARRIED", "ElementTypeRefused", "check_example", "check_graph_types"]

CARRIED: Mapping[str, DType] = {
    "tensor(bool)": DType.BOOL,
    "tensor(int8)": DType.INT8, "tensor(int16)": DType.INT16,
    "tensor(int32)": DType.INT32, "tensor(int64)": DType.INT64,
    "tensor(uint8)": DType.UINT8, "tensor(uint16)": DType.UINT16,
    "tensor(uint32)": DType.UINT32, "tensor(uint64)": DType.UINT64,
    "tensor(float16)": DType.FLOAT16, "tensor(float)": DType.FLOAT32,
    "tensor(double)": DType.FLOAT64,
}
"""ONNX Runtime's tensor type (``NodeArg.type``) -> the wire dtype its arrays travel as."""

_CARRIED_TEXT = ", ".join(dtype.value for dtype in CARRIED.values())


class ElementTypeRefused(InvalidValue):
    """A graph's input or output type an ORT stage does not carry, or an example's dtype.

    ``field`` names the input or output (``graph.inputs.x``, ``graph.outputs.y``) or the
    example's array (``example_inputs.x``; a declared warm-up case's other file:
    ``validation.shapes[i].examples[j].example_inputs.x``); ``value`` is the type refused (ONNX
    Runtime's spelling for a graph's, ``tensor(bfloat16)``; the array's dtype for an
    example's).
    Raised in a worker, the three travel as data with the error
    (:mod:`edge_contracts.error_details`): the controller refuses the stage with this type
    again, the field prefixed with the stage's manifest
    (:func:`edge_ort.controller.element_type_refusal`).
    """


def _why(kind: str) -> str:
    if kind == "tensor(bfloat16)":
        return ("ONNX Runtime's NumPy binding neither takes nor gives bfloat16 arrays, so "
                "this backend does not carry them")
    if kind.startswith("tensor(float8"):
        return ("the wire has no float8 dtype (ONNX Runtime would give uint8 bits, sent as "
                "uint8 values)")
    return "the wire has no such dtype"


def check_graph_types(inputs: Iterable[Any], outputs: Iterable[Any]) -> None:
    """Refuse a graph whose tensor inputs or outputs include a type not :data:`CARRIED`.

    ``inputs`` and ``outputs`` are a session's ``get_inputs()`` and ``get_outputs()``
    (anything with ``name`` and ``type``). Only tensor types are checked (``tensor(...)``):
    sequence, map and optional values are left as they are.

    Raises:
        ElementTypeRefused: naming ``graph.inputs.<name>`` or ``graph.outputs.<name>``
            and its type, with why it is not carried and the types that are.
    """
    for where, args in (("inputs", inputs), ("outputs", outputs)):
        for arg in args:
            kind = str(arg.type)
            if kind.startswith("tensor(") and kind not in CARRIED:
                raise ElementTypeRefused(
                    f"graph.{where}.{arg.name}", kind,
                    f"{_why(kind)} (an ONNX Runtime stage carries {_CARRIED_TEXT})")


def check_example(inputs: Iterable[Any], example: Mapping[str, np.ndarray],
                  field: str = "example_inputs", file: str = "") -> None:
    """Refuse an example array whose dtype is not its graph input's (``inputs``: a session's).

    An input the example does not hold, or one whose type is not a tensor's, is left to
    the caller (the warm-up names missing inputs itself).

    Raises:
        ElementTypeRefused: naming ``<field>.<name>``, the array's dtype, the graph
            input's type and (``file``) the archive's name.
    """
    for arg in inputs:
        wanted = CARRIED.get(str(arg.type))
        array = example.get(arg.name)
        if wanted is None or array is None:
            continue
        try:
            got: str = dtype_of(array).value
        except InvalidValue:
            got = str(np.asarray(array).dtype)
        if got != wanted.value:
            raise ElementTypeRefused(
                f"{field}.{arg.name}", got,
                f"the graph's input {arg.name} is {arg.type}: its example"
                f"{f' ({file})' if file else ''} must be {wanted.value}")
