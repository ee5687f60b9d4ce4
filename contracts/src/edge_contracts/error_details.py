"""The typed fields of an error, carried with it over the wire: field, reason and value.

Every edge error names the field that was wrong, the reason and the offending value
(:class:`~edge_contracts.errors.ContractError` and the core's errors keep the three as
attributes) and renders them as ``field: reason: value``. A worker's ERROR event or
failed control reply carries them as data too, ``error.detail = {"field", "reason",
"value"}`` (:func:`detail_of`, read by :func:`edge_contracts.worker_errors.error_info`), so
that the controller acts on what a worker's error names — the file it read, the digest
it found — without reading them out of the message's wording.

A detail is exact or absent: it is sent only when the field is a non-empty string, the
reason a string and the value a JSON scalar (string, integer, finite float, boolean or
null), each string at most :data:`MAX_DETAIL_TEXT` characters; anything else is left to
the message alone, never cut or rendered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.validation import check_keys, rebase

__all__ = ["MAX_DETAIL_TEXT", "DetailValue", "ErrorDetail", "detail_of"]

MAX_DETAIL_TEXT = 1024
"""Most characters of a detail's field, reason, and value when it is a string."""

DetailValue = str | int | float | bool | None
"""A detail's value: a JSON scalar."""

_KEYS = frozenset({"field", "reason", "value"})


def _scalar_problem(value: object) -> str | None:
    """Why ``value`` cannot be a detail's value, or None when it can."""
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "must be a finite number"
    if isinstance(value, str):
        return (None if len(value) <= MAX_DETAIL_TEXT
                else f"must be <= {MAX_DETAIL_TEXT} characters")
    return "must be a string, an integer, a finite number, a boolean or null"


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """The field, reason and value of an error, exactly as the error holds them.

    Attributes:
        field: The field the error names (a dotted path, a file's path): 1 to
            :data:`MAX_DETAIL_TEXT` characters.
        reason: What is wrong with it (at most :data:`MAX_DETAIL_TEXT` characters).
        value: The offending value, a JSON scalar (a string of at most
            :data:`MAX_DETAIL_TEXT` characters).
    """

    field: str
    reason: str
    value: DetailValue

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field or len(self.field) > MAX_DETAIL_TEXT:
            raise InvalidValue("error.detail.field", self.field,
                               f"must be a string of 1 to {MAX_DETAIL_TEXT} characters")
        if not isinstance(self.reason, str) or len(self.reason) > MAX_DETAIL_TEXT:
            raise InvalidValue("error.detail.reason", self.reason,
                               f"must be a string of at most {MAX_DETAIL_TEXT} characters")
        problem = _scalar_problem(self.value)
        if problem is not None:
            raise InvalidValue("error.detail.value", self.value, problem)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"field": ..., "reason": ..., "value": ...}``."""
        return {"field": self.field, "reason": self.reason, "value": self.value}

    @classmethod
    def from_dict(cls, data: object, field: str = "error.detail") -> ErrorDetail:
        """Build from the JSON form; all three keys are required (``value`` may be null)."""
        mapping: Any = check_keys(data, field, _KEYS)
        try:
            return cls(mapping["field"], mapping["reason"], mapping["value"])
        except InvalidValue as exc:
            raise rebase(exc, "error.detail", field) from None


def detail_of(error: BaseException) -> ErrorDetail | None:
    """``error``'s ``field``, ``reason`` and ``value`` attributes, or None.

    None unless the error has all three and they fit an :class:`ErrorDetail` exactly
    (a value that is not a JSON scalar, or a string too long, is not rendered or cut).
    """
    try:
        found = (error.field, error.reason, error.value)  # type: ignore[attr-defined]
    except AttributeError:
        return None
    try:
        return ErrorDetail(*found)
    except InvalidValue:
        return None
