"""Binding a backend's owner hooks once, so that the hot path never searches plugins.

:func:`bind_owner` looks up, a single time per stage, the implementation of every
owner-only hook in the plugin that declared the backend, and returns an
:class:`OwnerBinding` of plain callables taking the hook's arguments positionally. The
runtime keeps that binding for the stage's lifetime: ``binding.call(loaded, request,
inputs)`` is one Python call into the plugin.

New-style hook wrappers (``@hookimpl(wrapper=True)``) from any plugin — tracing,
profiling, fault injection — are chained around the owner's implementation at bind time,
so they see owner hooks too without a per-call search. Old-style ``hookwrapper``s apply
only to hooks called through pluggy (discovery, probe, commands).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from edge_core import hookspecs
from edge_core.backend import BackendInfo, CancelOutcome
from edge_core.discovery import ENV_TRACE
from edge_core.errors import BackendUnavailable, ConfigError, EdgeError, PluginError
from edge_core.host.retire import RetireOutcome
from edge_core.host.started_workers import StartedWorkers, combined_outcome
from edge_core.plugins import PluginSet
from edge_core.stage import RETIRE_OUTCOME_ATTR

__all__ = ["OwnerBinding", "backend_table", "bind_owner"]

#: Owner-only hooks a backend plugin must implement.
REQUIRED_OWNER_HOOKS = (
    "edge_reserve",
    "edge_load",
    "edge_warmup_placement",
    "edge_call",
    "edge_retire",
)
#: Owner-only hooks with a default when the plugin leaves them out.
OPTIONAL_OWNER_HOOKS = (
    "edge_config_defaults",
    "edge_validate_stage",
    "edge_cancel",
    "edge_conformance_stage",
)


def _no_defaults(backend: str) -> Mapping[str, Any] | None:
    return None


def _no_options(backend: str, section: Mapping[str, Any], path: str) -> Any:
    if section:
        raise ConfigError(path, f"backend {backend!r} takes no options", dict(section))
    return None


def _cancel_by_retiring(loaded: Any, request_id: str, epoch: int) -> CancelOutcome:
    return CancelOutcome.RETIRE_REQUIRED


def _no_conformance_stage(backend: str, workdir: Any) -> Mapping[str, Any] | None:
    return None


_DEFAULTS: dict[str, Callable[..., Any]] = {
    "edge_conformance_stage": _no_conformance_stage,
    "edge_config_defaults": _no_defaults,
    "edge_validate_stage": _no_options,
    "edge_cancel": _cancel_by_retiring,
}


@attrs.frozen
class OwnerBinding:
    """A backend's owner-only hooks, resolved once; each takes the spec's arguments in order."""

    backend: BackendInfo
    plugin: str
    config_defaults: Callable[[str], Mapping[str, Any] | None]
    validate_stage: Callable[[str, Mapping[str, Any], str], Any]
    reserve: Callable[..., Mapping[str, int]]
    load: Callable[..., Any]
    warmup_placement: Callable[..., Any]
    call: Callable[..., Any]
    cancel: Callable[..., CancelOutcome]
    retire: Callable[..., Any]
    conformance_stage: Callable[..., Mapping[str, Any] | None]


def backend_table(plugins: PluginSet) -> dict[str, tuple[BackendInfo, str]]:
    """Backend name to its declaration and owning plugin name, for loaded plugins only.

    The plugin manager read the declarations once, when it loaded the plugins.
    """
    return dict(plugins.backends)


def _spec_argnames(hook_name: str) -> tuple[str, ...]:
    func = getattr(hookspecs, hook_name)
    code = func.__code__
    return tuple(code.co_varnames[: code.co_argcount])


def _positional(function: Callable[..., Any], impl_args: tuple[str, ...],
                spec_args: tuple[str, ...]) -> Callable[..., Any]:
    """Adapt an implementation that takes a subset of the spec's arguments (pluggy allows it)."""
    if impl_args == spec_args:
        return function
    picks = tuple(spec_args.index(name) for name in impl_args)

    def adapted(*args: Any) -> Any:
        return function(*(args[i] for i in picks))

    adapted.__name__ = getattr(function, "__name__", "adapted")
    return adapted


def _wrapped(
    function: Callable[..., Any], wrappers: list[Callable[..., Any]]
) -> Callable[..., Any]:
    """Chain new-style wrappers (``@hookimpl(wrapper=True)``) around the owner's function.

    Each wrapper is a generator function: it runs up to its ``yield``, receives the inner
    result (or has the inner exception thrown in), and returns the final value — the same
    protocol as pluggy's wrappers, applied here once at bind time.
    """

    def chained(*args: Any) -> Any:
        started = []
        try:
            for wrapper in wrappers:
                generator = wrapper(*args)
                next(generator)
                started.append(generator)
            result = function(*args)
            error: BaseException | None = None
        except BaseException as exc:
            result, error = None, exc
        for generator in reversed(started):
            try:
                if error is not None:
                    generator.throw(error)
                else:
                    generator.send(result)
                raise RuntimeError("a hook wrapper yielded more than once")
            except StopIteration as stop:
                result, error = stop.value, None
            except BaseException as exc:
                result, error = None, exc
        if error is not None:
            raise error
        return result

    return chained


def _traced(hook_name: str, plugin: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any) -> Any:
        summary = ", ".join(_short(a) for a in args)
        started = time.perf_counter()
        status = "ok"
        try:
            return function(*args)
        except BaseException as exc:
            status = f"raised {type(exc).__name__}: {exc}"
            raise
        finally:
            took = (time.perf_counter() - started) * 1e3
            print(f"[edge-trace] {hook_name}@{plugin}({summary}) {took:.3f} ms {status}",
                  file=sys.stderr)

    return traced


def _checked_reserve(plugin: str, backend: str,
                     function: Callable[..., Any]) -> Callable[..., Mapping[str, int]]:
    """``edge_reserve`` refusing an answer that is not a mapping of pool to bytes.

    The ledger checks each pool and amount; an answer of another type (an int, a list)
    would otherwise surface as a bare ``TypeError`` far from the plugin that gave it.
    """

    def reserve(*args: Any) -> Mapping[str, int]:
        demands = function(*args)
        if not isinstance(demands, Mapping):
            raise PluginError(
                f"plugin {plugin!r}: edge_reserve for backend {backend!r} returned "
                f"{_short(demands)} ({type(demands).__name__}), not a mapping of pool to "
                "bytes")
        return demands

    return reserve


FAILED_LOAD_RETIRE_S = 5.0
"""How long a failed ``edge_load`` waits for each worker it started to be retired."""


def _checked_load(plugin: str, backend: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``edge_load`` refusing ``None``, and leaving no worker when it fails either way.

    ``None`` (a hook that forgot to return its loaded stage) is a :class:`PluginError`
    naming the plugin and the backend. Every worker the hook started on this thread
    (:class:`~edge_core.host.started_workers.StartedWorkers`) is retired when it returns
    ``None`` or raises — no ``edge_retire`` could reach it, nothing holds its handle —
    and the error carries the retire outcome (:data:`~edge_core.stage.RETIRE_OUTCOME_ATTR`,
    combined with one the plugin set itself), which settles the stage's reservation.
    """

    def load(*args: Any) -> Any:
        with StartedWorkers() as started:
            try:
                loaded = function(*args)
            except BaseException as error:
                _retire_started(started, error)
                raise
        if loaded is None:
            outcome = started.retire(FAILED_LOAD_RETIRE_S)
            count = len(started.clients)
            retired = "" if outcome is None else (
                f" (the {count} worker{'s' if count != 1 else ''} it started "
                f"{'were' if count != 1 else 'was'} retired"
                + ("" if outcome.verified else f", unverified: {outcome.reason}") + ")")
            refusal = PluginError(f"plugin {plugin!r}: edge_load for backend {backend!r} "
                                  f"returned None, not the loaded stage{retired}")
            if outcome is not None:
                setattr(refusal, RETIRE_OUTCOME_ATTR, outcome)
            raise refusal
        return loaded

    return load


def _retire_started(started: StartedWorkers, error: BaseException) -> None:
    """Retire what a failed load started; the error carries the (combined) outcome."""
    outcome = started.retire(FAILED_LOAD_RETIRE_S)
    if outcome is None:
        return
    own = getattr(error, RETIRE_OUTCOME_ATTR, None)
    if isinstance(own, RetireOutcome):
        outcome = combined_outcome([own, outcome])
    elif own is not None and not getattr(own, "verified", True):
        return  # the plugin's own outcome, of another type, says unverified: it stands
    setattr(error, RETIRE_OUTCOME_ATTR, outcome)


def _checked_validate(plugin: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``edge_validate_stage`` whose every failure is a ``ConfigError`` at the options' path.

    An :class:`~edge_core.errors.EdgeError` passes unchanged (``structure_config``'s carry
    the path already); anything else the plugin raised (a bare ``ValueError``) is named
    with the plugin, the hook and the options' path instead of surfacing as its message
    alone.
    """

    def validate_stage(backend: str, section: Mapping[str, Any], path: str) -> Any:
        try:
            return function(backend, section, path)
        except EdgeError:
            raise
        except Exception as exc:
            raise ConfigError(path, f"plugin {plugin!r}: edge_validate_stage raised "
                              f"{type(exc).__name__}: {exc}", dict(section)) from exc

    return validate_stage


def _short(value: object, limit: int = 48) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bind_owner(
    plugins: PluginSet, backend: str, *, env: Mapping[str, str] | None = None
) -> OwnerBinding:
    """Resolve the plugin owning ``backend`` and bind its owner-only hooks.

    Raises:
        BackendUnavailable: no loaded plugin declares ``backend`` (the message lists those
            that do exist and the plugins that failed to load).
        PluginError: the owner lacks one of :data:`REQUIRED_OWNER_HOOKS`.

    """
    env = os.environ if env is None else env
    table = backend_table(plugins)
    if backend not in table:
        failed = [f"{r.name} ({r.error})" for r in plugins.records if r.error]
        hint = f"; plugins that failed to load: {', '.join(failed)}" if failed else ""
        raise BackendUnavailable(
            f"backend: no installed plugin provides it: {backend!r} "
            f"(available: {sorted(table)}){hint}"
        )
    info, plugin_name = table[backend]
    plugin = plugins.manager.get_plugin(plugin_name)
    trace = env.get(ENV_TRACE, "").strip().lower() in {"1", "true", "yes", "on"}
    bound: dict[str, Callable[..., Any]] = {}
    for hook_name in REQUIRED_OWNER_HOOKS + OPTIONAL_OWNER_HOOKS:
        caller = getattr(plugins.manager.hook, hook_name)
        impl = next((i for i in caller.get_hookimpls() if i.plugin is plugin
                     and not i.wrapper and not i.hookwrapper), None)
        wrappers = [
            _positional(w.function, tuple(w.argnames), _spec_argnames(hook_name))
            for w in reversed(caller.get_hookimpls()) if w.wrapper
        ]
        if impl is None:
            if hook_name in REQUIRED_OWNER_HOOKS:
                raise PluginError(
                    f"plugin {plugin_name!r}: declares backend {backend!r} but does not "
                    f"implement {hook_name}"
                )
            function = _DEFAULTS[hook_name]
        else:
            function = _positional(impl.function, tuple(impl.argnames),
                                   _spec_argnames(hook_name))
        if wrappers:
            function = _wrapped(function, wrappers)
        if hook_name == "edge_reserve":
            function = _checked_reserve(plugin_name, backend, function)
        elif hook_name == "edge_load":
            function = _checked_load(plugin_name, backend, function)
        elif hook_name == "edge_validate_stage" and impl is not None:
            function = _checked_validate(plugin_name, function)
        if trace:
            function = _traced(hook_name, plugin_name, function)
        bound[hook_name.removeprefix("edge_")] = function
    return OwnerBinding(backend=info, plugin=plugin_name, **bound)
