"""Errors a request caused, as their types declare them: a stable code and the field at fault.

An error is the *request's fault* — a client error: the same request fails the same way
however often it is sent, so a front end answers it with a 4xx and a client must not retry
it — when its type (or the instance) declares a code word in ``request_fault``::

    class ContextTooLong(ValueError):
        request_fault = "context_length_exceeded"

        def __init__(self, field: str, ...):
            self.field = field  # the request field at fault

The field at fault is the error's ``param`` attribute, else its ``field`` (the name every
edge error already uses for it), else none. An instance may instead carry a whole
:class:`RequestFault` in ``request_fault`` (the controller's ``RequestFailed`` does, with
what the worker sent). An error without the declaration is not the request's fault: a
server error.

The declaration travels with the error: a worker's ERROR event carries
``error.fault = {"code", "param"}`` (:func:`fault_of`, read by
:func:`edge_contracts.worker_errors.error_info`), so the classification is made where the
error is raised — by the backend that knows its runtime's errors — and never by matching
type names on the other side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.validation import check_keys, rebase

__all__ = ["FAULT_ATTR", "MAX_PARAM_LENGTH", "RequestFault", "fault_of"]

FAULT_ATTR = "request_fault"
"""The attribute an error type declares its code word in (or an instance its fault)."""

MAX_PARAM_LENGTH = 256
"""Most characters of a ``param`` (longer field paths are cut at this length)."""

_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True, slots=True)
class RequestFault:
    """Why a request was refused as its own fault.

    Attributes:
        code: A stable machine word (``[a-z][a-z0-9_]*``, at most 64 characters), e.g.
            ``context_length_exceeded`` or ``invalid_value``.
        param: The request field at fault (``max_tokens``, ``messages[2].content``), or
            None when no single field is.
    """

    code: str
    param: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or _CODE.fullmatch(self.code) is None:
            raise InvalidValue("error.fault.code", self.code,
                               "must match [a-z][a-z0-9_]* (at most 64 characters)")
        if self.param is not None and (
                not isinstance(self.param, str) or not self.param
                or len(self.param) > MAX_PARAM_LENGTH or not self.param.isprintable()):
            raise InvalidValue("error.fault.param", self.param,
                               f"must be a printable string of 1 to {MAX_PARAM_LENGTH} "
                               "characters, or null")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"code": ..., "param": ...}``."""
        return {"code": self.code, "param": self.param}

    @classmethod
    def from_dict(cls, data: object, field: str = "error.fault") -> RequestFault:
        """Build from the JSON form; ``code`` is required, ``param`` may be null."""
        mapping: Any = check_keys(data, field, ("code",), ("param",))
        try:
            return cls(mapping["code"], mapping.get("param"))
        except InvalidValue as exc:
            raise rebase(exc, "error.fault", field) from None


def fault_of(error: BaseException) -> RequestFault | None:
    """The fault ``error`` declares, or None when it is not the request's fault.

    A declaration that is not a valid code word counts as none (the error is then a
    server error, as an undeclared one is); a field path longer than
    :data:`MAX_PARAM_LENGTH` is cut, and one that is not a printable string is left out.
    """
    declared = getattr(error, FAULT_ATTR, None)
    if isinstance(declared, RequestFault):
        return declared
    if not isinstance(declared, str) or _CODE.fullmatch(declared) is None:
        return None
    param: object = getattr(error, "param", None)
    if param is None:
        param = getattr(error, "field", None)
    if isinstance(param, str) and param and param.isprintable():
        return RequestFault(declared, param[:MAX_PARAM_LENGTH])
    return RequestFault(declared, None)
