"""Structure raw configuration data (dicts from TOML / YAML) into the attrs model with cattrs.

The converter is strict: no value is coerced (``3`` is not the string ``"3"``, a string is
not a list of characters), every table refuses unknown keys, and every leaf is checked by
its ``Annotated`` :class:`~edge_core.config.checks.Check`. cattrs collects every problem with
validation notes; :func:`structure_config` walks them and raises one
:class:`InvalidConfigError` whose message is the first problem, in the form
``stages[1].backend.route.interpreter: not an absolute path: 'python'``, and whose
``problems`` lists them all.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override

from edge_core.config.checks import (
    INTERNAL,
    Check,
    CheckError,
    check_adapter_or_callable,
    check_text,
)
from edge_core.config.model import InputTransform
from edge_core.errors import NO_VALUE, ConfigError

__all__ = ["InvalidConfigError", "join_path", "make_converter", "name_stages", "stage_ids",
           "structure_config"]

T = TypeVar("T")


class InvalidConfigError(ConfigError):
    """One or more configuration values are invalid.

    The message (and ``path`` / ``reason`` / ``value``) is the first problem in document
    order; ``problems`` holds every problem found, each a :class:`ConfigError`.
    """

    def __init__(self, problems: list[ConfigError]) -> None:
        first = problems[0]
        super().__init__(first.path, first.reason, first.value, stage=first.stage)
        self.problems: tuple[ConfigError, ...] = tuple(problems)
        for extra in problems[1:]:
            self.add_note(f"also: {extra}")


def join_path(prefix: str, part: str | int) -> str:
    """Append a field name (``.name``), list index (``[1]``) or odd key (``["a:b"]``)."""
    if isinstance(part, int):
        return f"{prefix}[{part}]"
    if part.startswith("[") or part.startswith("."):
        return f"{prefix}{part}"
    if part.isidentifier():
        return f"{prefix}.{part}" if prefix else part
    return f"{prefix}[{json.dumps(part)}]"


def stage_ids(document: object) -> list[str | None]:
    """The ``id`` of each entry of a raw pipeline table's ``stages`` (None where it has none).

    Read from the document as written, so that the problems of a file that does not
    structure can still name their stages.
    """
    stages = document.get("stages") if isinstance(document, Mapping) else None
    if not isinstance(stages, list):
        return []
    return [stage["id"] if isinstance(stage, Mapping) and isinstance(stage.get("id"), str)
            and stage["id"] else None for stage in stages]


def name_stages(error: ConfigError, ids: Sequence[str | None], prefix: str = "") -> ConfigError:
    """``error`` with every problem about a stage of the file naming that stage's id.

    A problem whose path lies in ``{prefix}.stages[i]`` gets ``stage`` = ``ids[i]``
    (its message: ``stages[0].backend.name (stage 'classify'): ...``), unless it has one
    already or is about that id itself (``stages[i].id``). Its type, path, reason and
    value stay; an :class:`InvalidConfigError` is rebuilt from its named problems.
    """
    if isinstance(error, InvalidConfigError):
        named = [name_stages(problem, ids, prefix) for problem in error.problems]
        if all(new is old for new, old in zip(named, error.problems, strict=True)):
            return error
        return InvalidConfigError(named)
    found = re.match(re.escape(join_path(prefix, "stages")) + r"\[(\d+)\](.*)$", error.path)
    if found is None or error.stage is not None or found.group(2) == ".id":
        return error
    index = int(found.group(1))
    stage = ids[index] if index < len(ids) else None
    if stage is None:
        return error
    return type(error)(error.path, error.reason, error.value, stage=stage)


def _concat(prefix: str, relative: str) -> str:
    if not prefix:
        return relative
    return prefix + relative if relative.startswith("[") else f"{prefix}.{relative}"


def _key_path(prefix: str, key: object) -> str:
    if isinstance(key, str):
        return f"{prefix}[{json.dumps(key)}]"
    return join_path(prefix, key) if isinstance(key, int) else f"{prefix}[{key!r}]"


def _strict_scalar(kind: type, label: str) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _type: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise CheckError(f"expected {label}", value)
        if kind is float and isinstance(value, int | float):
            return float(value)
        if not isinstance(value, kind):
            raise CheckError(f"expected {label}", value)
        return value

    return hook


def _is_checked(type_: Any) -> bool:
    return get_origin(type_) is typing.Annotated and any(
        isinstance(meta, Check) for meta in type_.__metadata__
    )


def _checked_hook(value: Any, type_: Any) -> Any:
    check = next(meta for meta in type_.__metadata__ if isinstance(meta, Check))
    return check.fn(value)


def _is_homogeneous_tuple(type_: Any) -> bool:
    args = get_args(type_)
    return get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_mapping(type_: Any) -> bool:
    return get_origin(type_) in (Mapping, dict, typing.Mapping)


def make_converter() -> cattrs.Converter:
    """Build the strict converter used for pipeline configuration."""
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=True)

    def structure_tuple(value: Any, type_: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise CheckError("expected an array", value)
        item_type = get_args(type_)[0]
        items: list[Any] = []
        errors: list[Exception] = []
        for index, item in enumerate(value):
            try:
                items.append(converter.structure(item, item_type))
            except Exception as exc:
                exc.add_note(IterableValidationNote(f"index {index}", index, item_type))
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {type_}", errors, type_)
        return tuple(items)

    def structure_mapping(value: Any, type_: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise CheckError("expected a table", value)
        key_type, value_type = get_args(type_) or (str, Any)
        result: dict[str, Any] = {}
        errors: list[Exception] = []
        for key, item in value.items():
            try:
                checked_key = converter.structure(key, key_type)
                result[checked_key] = (
                    item if value_type is Any else converter.structure(item, value_type)
                )
            except Exception as exc:
                exc.add_note(IterableValidationNote(f"key {key!r}", key, value_type))
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {type_}", errors, type_)
        return result

    def structure_path(value: Any, _type: Any) -> Path:
        return Path(check_text(value))

    def structure_object(value: Any, _type: Any) -> Any:
        return value

    def structure_transform(value: Any, _type: Any) -> InputTransform:
        return InputTransform(check_adapter_or_callable(value))

    def attrs_factory(cls: type[Any]) -> Callable[[Any, Any], Any]:
        internal = {
            field.name: override(omit=True)
            for field in attrs.fields(cls)
            if field.metadata.get(INTERNAL)
        }
        inner = make_dict_structure_fn(cls, converter, **internal)  # type: ignore[arg-type]

        def structure(value: Any, type_: Any) -> Any:
            if not isinstance(value, Mapping):
                raise CheckError("expected a table", value)
            try:
                return inner(value, type_)
            except ClassValidationError as exc:
                # Field validators never ran: run them now, so that one report names a
                # misspelt key and an out-of-range value of another key together.
                failed = {n.name for e in exc.exceptions
                          if isinstance(n := _note_of(e), AttributeValidationNote)}
                seen = {str(e) for e in exc.exceptions}
                more = [e for e in _validator_errors(converter, cls, value, failed)
                        if str(e) not in seen]
                if not more:
                    raise
                raise ClassValidationError(exc.message, [*exc.exceptions, *more], cls) from None
            except (ConfigError, ValueError, TypeError) as exc:
                more = _validator_errors(converter, cls, value, set())
                if not any(str(e) == str(exc) for e in more):
                    more.insert(0, exc)
                if len(more) == 1:
                    raise
                raise ClassValidationError(f"While structuring {cls.__name__}", more,
                                           cls) from None

        return structure

    converter.register_structure_hook(str, _strict_scalar(str, "a string"))
    converter.register_structure_hook(int, _strict_scalar(int, "an integer"))
    converter.register_structure_hook(float, _strict_scalar(float, "a number"))
    converter.register_structure_hook(bool, _strict_scalar(bool, "true or false"))
    converter.register_structure_hook(Path, structure_path)
    converter.register_structure_hook(InputTransform, structure_transform)
    converter.register_structure_hook_func(lambda type_: type_ is object, structure_object)
    converter.register_structure_hook_func(_is_checked, _checked_hook)
    converter.register_structure_hook_func(_is_homogeneous_tuple, structure_tuple)
    converter.register_structure_hook_func(_is_mapping, structure_mapping)
    converter.register_structure_hook_factory(attrs.has, attrs_factory)
    return converter


_MISSING = object()


def _validator_errors(converter: cattrs.Converter, cls: type[Any], value: Mapping[str, Any],
                      skip: set[str]) -> list[Exception]:
    """Run each given field's own validator on its structured value; collect the failures.

    Fields in ``skip`` (already reported) or whose value does not structure are left out;
    a validator that needs the whole instance (it reads another field) is not judged here.
    """
    errors: list[Exception] = []
    for field in attrs.fields(cls):
        if field.validator is None or field.name in skip or field.name not in value:
            continue
        try:
            item = converter.structure(value[field.name], field.type)
            if field.converter is not None and callable(field.converter):
                item = field.converter(item)
        except Exception:  # noqa: S112 - reported by the structuring pass, or not a value
            continue
        try:
            field.validator(None, field, item)
        except ConfigError as exc:
            errors.append(exc)  # its own path names the field
        except (ValueError, TypeError) as exc:
            exc.add_note(AttributeValidationNote(f"validating {field.name}", field.name,
                                                 field.type))
            errors.append(exc)
        except Exception:  # noqa: S112 - needs the instance; judged at construction
            continue
    return errors


def _sub_value(exc: BaseException, value: object) -> object:
    """The part of ``value`` that the sub-exception ``exc`` is about (for its message)."""
    note = _note_of(exc)
    try:
        if isinstance(note, AttributeValidationNote) and isinstance(value, Mapping):
            return value.get(note.name, _MISSING)
        if isinstance(note, IterableValidationNote):
            if isinstance(value, Mapping):
                return value.get(note.index, _MISSING)
            if isinstance(value, list | tuple) and isinstance(note.index, int):
                return value[note.index]
    except (IndexError, TypeError):
        pass
    return _MISSING


_ATTRS_MESSAGE = re.compile(
    r"'([A-Za-z_][A-Za-z0-9_]*)' (must .*?)(?: \(got (.*)\)|: (.*))$", re.DOTALL)
"""attrs' own validators' messages: ``'n' must be >= 0: -3``, ``'k' must be in (...) (got 'x')``."""


def _literal(text: str | None) -> object:
    """The value an attrs validator message shows, as a Python literal where it is one."""
    import ast

    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _problems(exc: BaseException, path: str, value: object = _MISSING) -> Iterator[ConfigError]:
    if isinstance(exc, ClassValidationError | IterableValidationError):
        for sub in exc.exceptions:
            yield from _problems(sub, _sub_path(sub, path), _sub_value(sub, value))
    elif isinstance(exc, ForbiddenExtraKeysError):
        allowed = ", ".join(
            sorted(a.name for a in attrs.fields(exc.cl) if not a.metadata.get(INTERNAL))
        )
        for key in sorted(exc.extra_fields, key=str):
            yield ConfigError(join_path(path, key), f"unknown key (allowed: {allowed})", key)
    elif isinstance(exc, CheckError):
        yield ConfigError(path + exc.subpath or "<root>", exc.reason, exc.value)
    elif isinstance(exc, ConfigError):
        yield ConfigError(_concat(path, exc.path), exc.reason, exc.value)
    elif isinstance(exc, KeyError) and _note_of(exc) is not None:
        yield ConfigError(path, "required key is missing")
    elif isinstance(exc, ValueError) and exc.args and (
            named := _ATTRS_MESSAGE.match(str(exc.args[0]))):
        # an attrs validator's "'field' must be ...: value": the field by its own path
        name, reason, text = named.group(1), named.group(2), named.group(3) or named.group(4)
        at = path if path == name or path.endswith(f".{name}") else join_path(path, name)
        yield ConfigError(at, reason, _literal(text))
    else:
        shown = NO_VALUE if value is _MISSING else value
        yield ConfigError(path or "<root>", f"invalid value ({exc})", shown)


def _note_of(exc: BaseException) -> AttributeValidationNote | IterableValidationNote | None:
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, AttributeValidationNote | IterableValidationNote):
            return note
    return None


def _sub_path(exc: BaseException, path: str) -> str:
    note = _note_of(exc)
    if isinstance(note, AttributeValidationNote):
        return join_path(path, note.name)
    if isinstance(note, IterableValidationNote):
        return (
            join_path(path, note.index)
            if isinstance(note.index, int)
            else _key_path(path, note.index)
        )
    return path


_CONVERTER = make_converter()


def structure_config(data: object, cls: type[T], *, path: str = "") -> T:
    """Structure ``data`` into ``cls``, raising one :class:`InvalidConfigError` for all problems.

    ``path`` prefixes every reported path (``"tool.edge.pipelines.ocr"`` for a pyproject
    table).
    """
    try:
        return _CONVERTER.structure(data, cls)
    except (cattrs.BaseValidationError, CheckError, ConfigError) as exc:
        problems = list(_problems(exc, path, data))
        raise InvalidConfigError(problems) from None
