"""How a worker reports an exception: its type, its message and its traceback, bounded.

An exception that declares itself the request's fault (:mod:`edge_contracts.request_faults`)
is reported with that declaration (``fault``: its code and the field at fault); one that
keeps its field, reason and value (every edge error does) with them as data
(``detail``: :mod:`edge_contracts.error_details`).

Standard library only; ``traceback``, and the modules that read an error's fault and
detail, are imported on the error path alone (a worker's start-up would pay for them).
"""

from __future__ import annotations

from typing import Any

from edge_contracts.errors import BoolBytesInvalid, BoolInputInvalid

__all__ = ["MAX_ERROR_TEXT", "error_info", "input_fault", "print_exception"]

MAX_ERROR_TEXT = 8192
"""Most characters of a message, and of a traceback (its last ones), sent in an event."""


def error_info(error: BaseException) -> dict[str, Any]:
    """The JSON form of an ERROR event's or reply's ``error``.

    Its type, message and traceback, the request fault the error declares (when it
    does: :func:`~edge_contracts.request_faults.fault_of`), and its field, reason and
    value as data (when it has them and they fit:
    :func:`~edge_contracts.error_details.detail_of`).
    """
    from edge_contracts.error_details import detail_of  # the error path only
    from edge_contracts.request_faults import fault_of

    info: dict[str, Any] = {"type": type(error).__name__,
                            "message": str(error)[:MAX_ERROR_TEXT] or "-"}
    fault = fault_of(error)
    if fault is not None:
        info["fault"] = fault.to_dict()
    detail = detail_of(error)
    if detail is not None:
        info["detail"] = detail.to_dict()
    if error.__traceback__ is not None:  # its last lines: where the handler failed
        import traceback

        text = "".join(traceback.format_exception(error))
        info["traceback"] = text[-MAX_ERROR_TEXT:]
    return info


def input_fault(error: Exception) -> Exception:
    """What a worker reports for ``error``, raised while it read a request's input tensors.

    A ``bool`` tensor holding a byte other than 0 and 1 (:class:`BoolBytesInvalid`) is the
    request's own values: reported as :class:`BoolInputInvalid` naming ``inputs.NAME``
    (code ``invalid_value``, no traceback). Any other error is reported as raised: a
    frame the worker cannot read is not the request's fault. Called on the failure path
    only: a request whose inputs are read pays nothing for it.
    """
    if isinstance(error, BoolBytesInvalid):
        name = error.field.removeprefix("tensors.")
        return BoolInputInvalid(f"inputs.{name}", error.value, "a bool tensor's bytes must "
                                "each be 0 or 1 (the largest is shown)")
    return error


def print_exception() -> None:
    """Print the exception being handled to the worker's stderr."""
    import traceback

    traceback.print_exc()
