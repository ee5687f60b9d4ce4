"""The hook markers: ``hookspec`` for this package's specifications, ``hookimpl`` for plugins.

They record their options on the decorated function under the attributes ``edge_spec``
and ``edge_impl`` — the same shape pluggy's own markers give a project named ``edge`` —
without importing pluggy, so that importing a plugin module stays cheap. The plugin
manager (:mod:`edge_core.plugins`) reads these attributes when it registers a plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["IMPL_ATTR", "SPEC_ATTR", "hookimpl", "hookspec"]

#: Attribute holding a hook implementation's options.
IMPL_ATTR = "edge_impl"
#: Attribute holding a hook specification's options.
SPEC_ATTR = "edge_spec"


@overload
def hookimpl(function: _F, /) -> _F: ...
@overload
def hookimpl(
    *,
    tryfirst: bool = False,
    trylast: bool = False,
    wrapper: bool = False,
    hookwrapper: bool = False,
    optionalhook: bool = False,
    specname: str | None = None,
) -> Callable[[_F], _F]: ...
def hookimpl(
    function: _F | None = None,
    *,
    tryfirst: bool = False,
    trylast: bool = False,
    wrapper: bool = False,
    hookwrapper: bool = False,
    optionalhook: bool = False,
    specname: str | None = None,
) -> Any:
    """Mark a function (or method) as an implementation of the ``edge`` hook of its name.

    Usable bare (``@hookimpl``) or with options (``@hookimpl(tryfirst=True)``). The options
    mean what they mean in pluggy: ordering, new-style ``wrapper``s (the place for
    tracing, profiling or fault injection), ``optionalhook`` for hooks from an optional
    spec, and ``specname`` to implement a hook under another function name.
    """
    opts = {
        "tryfirst": tryfirst,
        "trylast": trylast,
        "wrapper": wrapper,
        "hookwrapper": hookwrapper,
        "optionalhook": optionalhook,
        "specname": specname,
    }

    def mark(func: _F) -> _F:
        setattr(func, IMPL_ATTR, opts)
        return func

    return mark if function is None else mark(function)


@overload
def hookspec(function: _F, /) -> _F: ...
@overload
def hookspec(*, firstresult: bool = False, historic: bool = False) -> Callable[[_F], _F]: ...
def hookspec(
    function: _F | None = None, *, firstresult: bool = False, historic: bool = False
) -> Any:
    """Mark a function in :mod:`edge_core.hookspecs` as a hook specification."""
    opts = {
        "firstresult": firstresult,
        "historic": historic,
        "warn_on_impl": None,
        "warn_on_impl_args": None,
    }

    def mark(func: _F) -> _F:
        setattr(func, SPEC_ATTR, opts)
        return func

    return mark if function is None else mark(function)
