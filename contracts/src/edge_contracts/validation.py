"""Field validation shared by the value types of edge-contracts.

Each helper checks one field and either returns the (normalised) value or raises the
given :class:`~edge_contracts.errors.ContractError` subclass naming the field, the
value and the limit. Booleans are never accepted where an integer is expected.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from enum import Enum
from typing import TypeVar

from edge_contracts.errors import ContractError, InvalidValue

__all__ = [
    "INT64_MAX",
    "MAX_ID_LENGTH",
    "check_keys",
    "parse_enum",
    "rebase",
    "require_bool",
    "require_id",
    "require_int",
    "require_list",
    "require_mapping",
    "require_optional_str",
    "require_seconds",
    "require_str",
]

INT64_MAX = 2**63 - 1
"""Largest integer any contract field may hold, so that every port can represent it."""

MAX_ID_LENGTH = 128
"""Longest identifier (request id, stage id, owner, session ...) in characters."""

E = TypeVar("E", bound=Enum)
ErrorType = type[ContractError]


def require_int(
    value: object,
    field: str,
    *,
    minimum: int = 0,
    maximum: int = INT64_MAX,
    error: ErrorType = InvalidValue,
) -> int:
    """Return ``value`` if it is an ``int`` (not a bool) within ``[minimum, maximum]``."""
    if type(value) is int and minimum <= value <= maximum:
        return value
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(field, value, "must be an integer")
        value = int(value)
    if value < minimum:
        raise error(field, value, f"must be >= {minimum}")
    if value > maximum:
        raise error(field, value, f"must be <= {maximum}")
    return value


def require_bool(value: object, field: str, *, error: ErrorType = InvalidValue) -> bool:
    """Return ``value`` if it is exactly ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise error(field, value, "must be a boolean")
    return value


def require_seconds(
    value: object,
    field: str,
    *,
    reason: str = "must be a finite number of seconds",
    error: ErrorType = InvalidValue,
) -> float:
    """Return ``value`` if it is a finite ``int`` or ``float`` (not a bool) of seconds.

    NaN compares with no time and an infinity can be given to no wait: both are refused,
    as a bool or a string is. The sign is the caller's to read (a wait of zero or less
    is usually a wait already over). ``reason`` names what the caller's ``None`` means.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise error(field, value, reason)
    return value


def require_str(
    value: object,
    field: str,
    *,
    max_length: int,
    allow_empty: bool = False,
    error: ErrorType = InvalidValue,
) -> str:
    """Return ``value`` if it is a ``str`` of at most ``max_length`` characters."""
    if not isinstance(value, str):
        raise error(field, value, "must be a string")
    if not value and not allow_empty:
        raise error(field, value, "must not be empty")
    if len(value) > max_length:
        raise error(field, value, f"must be <= {max_length} characters")
    return str(value)


def require_optional_str(
    value: object, field: str, *, max_length: int, error: ErrorType = InvalidValue
) -> str | None:
    """Return ``None`` or a non-empty string of at most ``max_length`` characters."""
    if value is None:
        return None
    return require_str(value, field, max_length=max_length, error=error)


def require_id(value: object, field: str, *, error: ErrorType = InvalidValue) -> str:
    """Return ``value`` if it is a non-empty printable string of <= 128 characters."""
    if type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable():
        return value
    text = require_str(value, field, max_length=MAX_ID_LENGTH, error=error)
    if not text.isprintable():
        raise error(field, value, "must contain printable characters only")
    return text


def parse_enum(
    enum_type: type[E], value: object, field: str, *, error: ErrorType = InvalidValue
) -> E:
    """Return the member of ``enum_type`` spelled ``value`` (members pass through)."""
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        try:
            return enum_type(value)
        except ValueError:
            pass
    allowed = ", ".join(str(member.value) for member in enum_type)
    raise error(field, value, f"must be one of {allowed}")


def require_mapping(
    value: object, field: str, *, error: ErrorType = InvalidValue
) -> Mapping[str, object]:
    """Return ``value`` if it is a mapping whose keys are all strings."""
    if not isinstance(value, Mapping):
        raise error(field, value, "must be an object")
    for key in value:
        if not isinstance(key, str):
            raise error(field, key, "keys must be strings")
    return value


def require_list(
    value: object, field: str, *, max_length: int, error: ErrorType = InvalidValue
) -> list[object] | tuple[object, ...]:
    """Return ``value`` if it is a list or tuple of at most ``max_length`` items."""
    if not isinstance(value, list | tuple):
        raise error(field, value, "must be an array")
    if len(value) > max_length:
        raise error(field, len(value), f"must hold <= {max_length} items")
    return value


def check_keys(
    data: object,
    field: str,
    required: Collection[str],
    optional: Collection[str] = (),
    *,
    error: ErrorType = InvalidValue,
) -> Mapping[str, object]:
    """Return ``data`` as a mapping holding every required key and no unknown key.

    The error names the key with its path, e.g. ``buffer.nbytes``. Passing ``required``
    as a frozenset makes the common (valid) case a couple of set operations.
    """
    if type(data) is dict and type(required) is frozenset:
        keys = data.keys()
        if keys >= required and (len(keys) == len(required) or keys <= required.union(optional)):
            return data
    mapping = require_mapping(data, field, error=error)
    for key in mapping:
        if key not in required and key not in optional:
            raise error(f"{field}.{key}", mapping[key], "unknown key")
    for key in sorted(required):
        if key not in mapping:
            raise error(f"{field}.{key}", None, "missing required key")
    return mapping


def rebase(exc: ContractError, default: str, field: str) -> ContractError:
    """Return ``exc`` with its field path moved from the ``default`` root to ``field``.

    Value types validate under a fixed root (``buffer``, ``request`` ...); ``from_dict``
    rebases the error onto the caller's path (``request.inputs[0]`` ...).
    """
    if field == default or not exc.field.startswith(default):
        return exc
    rest = exc.field[len(default) :]
    if rest and rest[0] not in ".[":
        return exc
    return type(exc)(field + rest, exc.value, exc.reason)
