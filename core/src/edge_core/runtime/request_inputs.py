"""What a request's ``inputs`` must be: a mapping of input names (``str``) to arrays.

A good request's path never checks this (each request is bounded in work, see
``core/tests/runtime/test_calls_per_request.py``): inputs that are no such mapping fail
where they are first read — a key without ``startswith``, ``None`` not iterable — and the
request's failure path asks :func:`malformed_inputs` whether that was the inputs' fault,
so that the caller gets :class:`~edge_contracts.errors.InvalidValue` naming ``inputs``
rather than the ``AttributeError`` or ``TypeError`` of whatever read them. Each value is
checked where it is packed for the worker (``inputs.<name>.dtype`` and the like).
"""

from __future__ import annotations

from collections.abc import Mapping

from edge_contracts.errors import InvalidValue

__all__ = ["malformed_inputs"]


def malformed_inputs(inputs: object) -> InvalidValue | None:
    """The refusal of ``inputs`` that are no mapping of input names to values, else None.

    The refusal's field is ``inputs``; its value is the first key that is not a ``str``,
    or the inputs themselves when they are no mapping at all (``None``, a list); its
    reason names that value's type.
    """
    if not isinstance(inputs, Mapping):
        return InvalidValue("inputs", inputs, "must be a mapping of input names (str) to "
                            f"arrays, not {type(inputs).__name__}")
    for key in inputs:
        if not isinstance(key, str):
            return InvalidValue("inputs", key, "every key must be an input name (a str), "
                                f"not {type(key).__name__}")
    return None
