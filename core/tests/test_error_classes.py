"""Every exception class the project defines: a plain subclass in the hierarchy, copied whole.

Each exception class's bases are exception classes (no mixin), and every one survives
``copy.copy`` and ``copy.deepcopy`` whole: type, message, attributes.

pytest, ``concurrent.futures`` and asyncio's re-raise paths copy exceptions; the default
``BaseException.__reduce__`` passes only ``self.args`` back to ``__init__``, which fails (or
loses attributes) for an error whose ``__init__`` takes other arguments
(:func:`edge_contracts.error_copies.whole_reduction` is the fix). The classes are found by
walking every module of every package of the repository (:data:`PACKAGES`: contracts, core,
each plugin, the test and example packages), so a new exception class, module or plugin
is covered; its constructor's arguments are built from their annotations
(:data:`SAMPLES`): a new annotation fails here until a sample for it is added.

A module that cannot be imported because a package outside the project is absent (an
optional heavy dependency: vLLM, onnxruntime-qnn, qai_hub), and a package not installed
here (``examples/third_party_backend``, a template its own test installs apart), are left
out of the walk and named in the skip reason of :func:`test_every_errors_module_is_walked`,
which fails if an ``errors`` module is among them; any other import failure fails the
collection, and a plugin, contracts or core left out fails
:func:`test_the_walk_covers_contracts_core_and_every_plugin`. At present every module of
the installed packages imports in the development environment (the plugins import their
heavy dependencies where used), so only the template is left out.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from edge_contracts.error_details import ErrorDetail
from edge_contracts.request_faults import RequestFault
from edge_core.cli.run_inputs import RefusedInput
from edge_core.errors import ConfigError
from edge_core.ledger import Shortfall
from edge_core.placement import PlacementReport, ProviderShare

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = tuple(sorted(
    path.parent.name
    for pattern in ("contracts/src/*/__init__.py", "core/src/*/__init__.py",
                    "plugins/*/*/src/*/__init__.py", "tests/*/src/*/__init__.py",
                    "examples/*/src/*/__init__.py")
    for path in ROOT.glob(pattern)))
"""Every package the repository holds, found by its layout."""

LEFT_OUT: dict[str, str] = {}
"""A package or module left out of the walk -> why: the package outside the project it
needs, or that the package is not installed here (the third-party backend template,
which its own test installs in a scratch environment)."""


def _modules(name: str) -> list[ModuleType]:
    """``name`` and every module under it that imports; others go to :data:`LEFT_OUT`."""
    if importlib.util.find_spec(name) is None:
        LEFT_OUT[name] = "not installed"
        return []
    package = importlib.import_module(name)
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, f"{name}."):
        if info.name.endswith("__main__"):  # running it is what importing it does
            continue
        try:
            found.append(importlib.import_module(info.name))
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if not missing or missing in PACKAGES:
                raise
            LEFT_OUT[info.name] = f"needs {missing}"
    return found


def _exception_classes() -> list[type[BaseException]]:
    """Every ``BaseException`` subclass defined in a module of :data:`PACKAGES`."""
    found: dict[str, type[BaseException]] = {}
    for name in PACKAGES:
        for module in _modules(name):
            for value in vars(module).values():
                if (inspect.isclass(value) and issubclass(value, BaseException)
                        and value.__module__ == module.__name__):
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[key] for key in sorted(found)]


CLASSES = _exception_classes()


def _generate_problems(name: str) -> object:
    sampling = importlib.import_module("edge_vllm_cuda.sampling")
    return (sampling.GenerateParamsInvalid("top_p", "must be <= 1", 2.0),
            sampling.GenerateParamsInvalid("n", "must be >= 1", 0, code="unsupported_parameter"))


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
    "bool | None": lambda name: False,
    "Mapping[str, str] | None": lambda name: {"Retry-After": "3"},
    "RefusedInput": lambda name: RefusedInput("in/a.png", "ValueError: not an image"),
    "tuple[GenerateParamsInvalid, ...]": _generate_problems,
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
    # not edge errors: core's own, and the plugins'
    assert {"CheckError", "ByteSizeError", "UsageError", "_Refused", "HttpRefusal",
            "GenerateParamsInvalid", "EngineRefused", "TextsMalformed", "LuidInvalid",
            "RouteUnavailable"} <= names


def test_the_walk_covers_contracts_core_and_every_plugin() -> None:
    plugins = {path.parent.name for path in ROOT.glob("plugins/*/*/src/*/__init__.py")}
    assert {"edge_ort", "edge_ort_cpu", "edge_qnn", "edge_serve", "edge_vllm_cuda"} <= plugins
    assert not LEFT_OUT.keys() & (plugins | {"edge_contracts", "edge_core"})
    walked = {cls.__module__.partition(".")[0] for cls in CLASSES}
    assert {"edge_contracts", "edge_core", "edge_ort", "edge_serve", "edge_vllm_cuda",
            "edge_ort_directml", "edge_echo", "edge_ocr_example"} <= walked


def test_every_errors_module_is_walked() -> None:
    errors = [module for module in LEFT_OUT if "error" in module.rpartition(".")[2]]
    assert not errors, f"errors modules left out of the walk: {errors}"
    if LEFT_OUT:
        pytest.skip("left out of the walk: " + ", ".join(
            f"{module} ({why})" for module, why in sorted(LEFT_OUT.items())))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_an_exception_copies_whole(cls: type[BaseException],
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
def test_an_exception_class_has_only_exception_bases(cls: type[BaseException]) -> None:
    mixins = [base.__qualname__ for base in cls.__bases__ if not issubclass(base, BaseException)]
    assert not mixins, f"{cls.__qualname__} has bases that are not exceptions: {mixins}"
