"""Every edge error class: a plain subclass in the hierarchy, copied whole.

Each error class's bases are exception classes (no mixin), and every edge error survives
``copy.copy`` and ``copy.deepcopy`` whole: type, message, attributes.

pytest, ``concurrent.futures`` and asyncio's re-raise paths copy exceptions; the default
``BaseException.__reduce__`` passes only ``self.args`` back to ``__init__``, which fails (or
loses attributes) for an error whose ``__init__`` takes other arguments. The classes are
found by walking every module of ``edge_contracts`` and ``edge_core``, so a new error class
is covered; its constructor's arguments are built from their annotations
(:data:`SAMPLES`): a new annotation fails here until a sample for it is added.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest

from edge_contracts.error_details import ErrorDetail
from edge_contracts.errors import ContractError
from edge_contracts.request_faults import RequestFault
from edge_core.errors import ConfigError, EdgeError
from edge_core.ledger import Shortfall
from edge_core.placement import PlacementReport, ProviderShare

PACKAGES = ("edge_contracts", "edge_core")


def _edge_error_classes() -> list[type[BaseException]]:
    """Every ``EdgeError`` and ``ContractError`` class defined in a module of ``PACKAGES``."""
    found: dict[str, type[BaseException]] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if info.name.endswith("__main__"):  # running it is what importing it does
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if (inspect.isclass(value) and issubclass(value, (EdgeError, ContractError))
                        and value.__module__ == module.__name__):
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[key] for key in sorted(found)]


CLASSES = _edge_error_classes()

SAMPLES: dict[str, Callable[[str], object]] = {
    "str": lambda name: f"{name} sample",
    "str | None": lambda name: f"{name} sample",
    "object": lambda name: {"nested": [name, 1]},
    "int": lambda name: 7,
    "int | None": lambda name: 4242,
    "bool": lambda name: True,
    "BaseException": lambda name: ValueError(f"{name} inner"),
    "ErrorDetail | None": lambda name: ErrorDetail("inputs.x", "must be finite", "nan"),
    "RequestFault | None": lambda name: RequestFault("invalid_value", "inputs.x"),
    "list[ConfigError]": lambda name: [ConfigError("a.b", "must be 1", 2, stage="s")],
    "Iterable[Shortfall]": lambda name: [Shortfall("cpu", 10, 5, 8)],
    "Iterable[str]": lambda name: ["owner-a", "owner-b"],
    "PlacementReport": lambda name: PlacementReport(
        target="cpu", available_providers=("cpu",), providers={"cpu": ProviderShare(nodes=3)},
        method="graph-assignment-info"),
    "list[dict[str, Any]]": lambda name: [
        {"backend": "ort-cpu", "layer": "probe", "reason": "absent"}],
    "dict[str, Any] | None": lambda name: {"error": {"code": "x"}},
    "Sequence[str]": lambda name: ("line one", "line two"),
}
"""A value per constructor annotation; every argument is given, defaults included."""


def _construct(cls: type[BaseException]) -> BaseException:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except ValueError:  # no __init__ of its own: the built-in's, args are the message
        return cls("a message")
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for param in parameters:
        annotation = param.annotation
        assert annotation in SAMPLES, f"{cls.__name__}({param.name}: {annotation}): add a sample"
        value = SAMPLES[annotation](param.name)
        if param.kind is param.KEYWORD_ONLY:
            kwargs[param.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def _same(left: object, right: object) -> bool:
    """Equal values; exceptions (which compare by identity) by type, args and attributes."""
    if isinstance(left, BaseException):
        return (isinstance(right, BaseException) and type(left) is type(right)
                and _same(left.args, right.args) and _same(vars(left), vars(right)))
    if isinstance(left, (list, tuple)):
        return (isinstance(right, (list, tuple)) and type(left) is type(right)
                and len(left) == len(right)
                and all(_same(a, b) for a, b in zip(left, right, strict=True)))
    if isinstance(left, dict):
        return (isinstance(right, dict) and left.keys() == right.keys()
                and all(_same(left[key], right[key]) for key in left))
    return left == right


def test_the_walk_finds_the_errors_that_take_other_arguments() -> None:
    names = {cls.__name__ for cls in CLASSES}
    assert {"RequestFailed", "ConfigError", "TransportCapExceeded", "PoolExhausted",
            "InvalidValue", "ShmRefused", "BundleChanged"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_an_edge_error_copies_whole(cls: type[BaseException],
                                    copier: Callable[[Any], Any]) -> None:
    error = _construct(cls)
    error.extra = ["set after raising"]  # type: ignore[attr-defined]
    clone = copier(error)
    assert type(clone) is cls
    assert clone is not error
    assert str(clone) == str(error)
    assert _same(clone.args, error.args)
    assert _same(vars(clone), vars(error))
    assert vars(clone)["extra"] == ["set after raising"]
    if copier is copy.deepcopy:
        assert vars(clone)["extra"] is not vars(error)["extra"]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_an_edge_error_has_only_exception_bases(cls: type[BaseException]) -> None:
    mixins = [base.__qualname__ for base in cls.__bases__ if not issubclass(base, BaseException)]
    assert not mixins, f"{cls.__qualname__} has bases that are not exceptions: {mixins}"
