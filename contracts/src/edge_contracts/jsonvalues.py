"""Immutable JSON values: the checked, frozen form of free-form ``params``/``meta`` data.

A JSON-compatible value is ``None``, a bool, an integer within the signed 64-bit
range, a finite float, a string, a list/tuple of such values or a mapping with string
keys and such values, nested at most :data:`MAX_JSON_DEPTH` levels. :func:`freeze_json`
checks a value and returns its frozen form (tuples and :class:`JSONObject`), so value
types that hold free-form data stay immutable and hashable; :func:`thaw_json` turns
it back into plain ``dict``/``list`` for serialisation.

:func:`strict_loads` parses JSON text the way every reader of untrusted JSON here must:
a duplicate key in any object, ``NaN``/``Infinity`` and out-of-range numbers are refused
(``json.loads`` would keep the last duplicate silently).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias, Union

from edge_contracts.errors import ContractError, InvalidValue
from edge_contracts.validation import INT64_MAX

__all__ = [
    "EMPTY_OBJECT",
    "MAX_JSON_DEPTH",
    "JSONObject",
    "JSONValue",
    "freeze_json",
    "freeze_object",
    "strict_loads",
    "thaw_json",
]

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects accepted in free-form data."""

JSONValue: TypeAlias = Union[bool, int, float, str, tuple["JSONValue", ...], "JSONObject", None]
"""A frozen JSON value."""


class JSONObject(Mapping[str, JSONValue]):
    """An immutable, hashable JSON object (a mapping of strings to frozen JSON values).

    Build one with :func:`freeze_object`; it compares equal to a ``dict`` with the same
    items.
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, JSONValue] | None = None) -> None:
        self._items: dict[str, JSONValue] = dict(items) if items else {}
        self._hash: int | None = None

    def __getitem__(self, key: str) -> JSONValue:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, else ``default`` (one lookup; protocol code reads meta so)."""
        return self._items.get(key, default)

    def view(self) -> Mapping[str, JSONValue]:
        """A read-only view of the items: one call, then every lookup on it runs in C.

        For code that reads several keys of one object on a per-frame path.
        """
        return MappingProxyType(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._items.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"JSONObject({self._items!r})"


EMPTY_OBJECT = JSONObject()
"""The empty frozen JSON object, the default of every free-form mapping field."""


def freeze_json(
    value: object, field: str, *, error: type[ContractError] = InvalidValue, depth: int = 0
) -> JSONValue:
    """Check that ``value`` is JSON-compatible and return its frozen form."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value  # type: ignore[return-value]
    if kind is int and -INT64_MAX - 1 <= value <= INT64_MAX:  # type: ignore[operator]
        return value  # type: ignore[return-value]
    # Sequences first (no type is both a sequence and a number or a string): an array of
    # the wire's meta skips the scalar checks below
    if isinstance(value, list | tuple):
        if depth >= MAX_JSON_DEPTH:
            raise error(field, "...", f"nesting must be <= {MAX_JSON_DEPTH} levels deep")
        items: list[JSONValue] = []
        for index, item in enumerate(value):
            kind = type(item)
            if (  # the common leaves, inline (as freeze_object does)
                kind is str
                or item is None
                or kind is bool
                or (kind is int and -INT64_MAX - 1 <= item <= INT64_MAX)
            ):
                items.append(item)
                continue
            if kind is list and depth + 1 < MAX_JSON_DEPTH:  # an array of leaves (a pair
                inner: list[JSONValue] = []  # of a segment and its generation), inline
                for leaf in item:
                    kind = type(leaf)
                    if not (kind is str or leaf is None or kind is bool
                            or (kind is int and -INT64_MAX - 1 <= leaf <= INT64_MAX)):
                        break  # anything else: checked by the call below
                    inner.append(leaf)
                else:
                    items.append(tuple(inner))
                    continue
            items.append(freeze_json(item, f"{field}[{index}]", error=error, depth=depth + 1))
        return tuple(items)
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if -INT64_MAX - 1 <= value <= INT64_MAX:
            return int(value)
        raise error(field, value, "integers must fit in 64 signed bits")
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise error(field, value, "floats must be finite (JSON has no NaN or Infinity)")
    if depth >= MAX_JSON_DEPTH:
        raise error(field, "...", f"nesting must be <= {MAX_JSON_DEPTH} levels deep")
    if isinstance(value, Mapping):
        return freeze_object(value, field, error=error, depth=depth)
    raise error(field, value, "must be JSON-compatible (null, bool, number, string, array, object)")


def freeze_object(
    value: object, field: str, *, error: type[ContractError] = InvalidValue, depth: int = 0
) -> JSONObject:
    """Check that ``value`` is a JSON object (string keys) and return it frozen."""
    if type(value) is not dict:  # a plain dict skips the two (abc) instance checks
        if isinstance(value, JSONObject):
            return value
        if not isinstance(value, Mapping):
            raise error(field, value, "must be an object")
    if depth >= MAX_JSON_DEPTH:
        raise error(field, "...", f"nesting must be <= {MAX_JSON_DEPTH} levels deep")
    if not value:
        return EMPTY_OBJECT
    items: dict[str, JSONValue] = {}
    for key, item in value.items():
        if type(key) is not str and not isinstance(key, str):
            raise error(field, key, "object keys must be strings")
        kind = type(item)
        if (  # the common leaves, inline
            kind is str
            or item is None
            or kind is bool
            or (kind is int and -INT64_MAX - 1 <= item <= INT64_MAX)
        ):
            items[key] = item
        elif (kind is dict or kind is list) and not item and depth + 1 < MAX_JSON_DEPTH:
            items[key] = EMPTY_OBJECT if kind is dict else ()
        else:
            items[key] = freeze_json(item, f"{field}.{key}", error=error, depth=depth + 1)
    return JSONObject(items)


def thaw_json(value: JSONValue) -> object:
    """Return the plain ``dict``/``list`` form of a frozen JSON value."""
    if type(value) is JSONObject:
        items = value.view()
        plain: dict[str, object] = {}
        for key, item in items.items():
            kind = type(item)
            if kind is str or kind is int or item is None or kind is bool or kind is float:
                plain[key] = item
            else:
                plain[key] = thaw_json(item)
        return plain
    if isinstance(value, JSONObject):
        return {key: thaw_json(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thaw_json(item) for item in value]
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {duplicate!r}")
    return mapping


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:32]} is out of range")
    return value


STRICT_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite_float
)
"""A decoder refusing duplicate keys, ``NaN``/``Infinity`` and infinite floats."""


def strict_loads(text: str | bytes | bytearray) -> Any:
    """Parse JSON text like ``json.loads``, refusing duplicate keys and non-finite numbers.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), a duplicate key in some object,
            ``NaN``/``Infinity``, a float out of range, or invalid UTF-8.
        RecursionError: nesting deeper than the interpreter's recursion limit.

    """
    if not isinstance(text, str):
        text = bytes(text).decode(json.detect_encoding(text))
    return STRICT_DECODER.decode(text)
