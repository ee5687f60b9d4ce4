"""Resolve a stage's input transform to a callable, at run time (never while reading config).

``package.module:function`` imports the module and takes the attribute; any other name is
looked up in the ``edge.adapters`` entry-point group, so a model package can ship its
adapters under stable names.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from edge_core.config.model import InputTransform
from edge_core.errors import ConfigError

__all__ = ["ADAPTER_GROUP", "call_prepare", "resolve_input_transform"]

ADAPTER_GROUP = "edge.adapters"
"""Entry-point group in which model packages register named input adapters."""


def resolve_input_transform(
    transform: InputTransform, path: str = "input_transform"
) -> Callable[..., object]:
    """Import and return the callable that ``transform`` names.

    Raises:
        ConfigError: (at ``path``) the module or attribute does not exist, the adapter is
            not registered (or registered twice), or the object is not callable.

    """
    reference = transform.reference
    if transform.kind == "callable":
        module_name, _, attribute = reference.partition(":")
        try:
            target: object = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(
                path, f"cannot import module {module_name!r} ({exc})", reference
            ) from None
        for part in attribute.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise ConfigError(
                    path, f"module has no attribute {attribute!r}", reference
                ) from None
    else:
        found = [ep for ep in entry_points(group=ADAPTER_GROUP) if ep.name == reference]
        if not found:
            raise ConfigError(
                path, f"no adapter of that name in entry-point group {ADAPTER_GROUP}", reference
            )
        if len({ep.value for ep in found}) > 1:
            sources = ", ".join(sorted(ep.value for ep in found))
            raise ConfigError(path, f"adapter registered more than once ({sources})", reference)
        try:
            target = found[0].load()
        except (ImportError, AttributeError) as exc:
            raise ConfigError(path, f"adapter cannot be loaded ({exc})", reference) from None
    if not callable(target):
        raise ConfigError(path, "does not name a callable", reference)
    return target


def call_prepare(prepare: Callable[..., object], source: str, pipeline: Any) -> object:
    """Call a pipeline's ``prepare(source)``, offering it the pipeline's input buffers.

    A prepare function that takes an ``input_buffer`` keyword gets
    ``pipeline.input_buffer`` (``(name, shape, dtype) -> array``): it can write the first
    stage's input straight into shared memory, which then travels without a copy.
    """
    try:
        takes = "input_buffer" in inspect.signature(prepare).parameters
    except (TypeError, ValueError):  # a callable without a signature: the plain call
        takes = False
    if takes:
        return prepare(source, input_buffer=pipeline.input_buffer)
    return prepare(source)
