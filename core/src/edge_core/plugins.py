"""The plugin manager: discovered plugins registered with pluggy, and their backends.

Loading is forgiving by default: a plugin that fails to import, declares no hook
contract, declares one this core does not support, or marks hooks that do not match the
specifications is *recorded* with its error and skipped, so one broken plugin never takes
the ``edge`` command down. ``EDGE_STRICT_PLUGINS=1`` turns such failures into a
:class:`~edge_core.errors.PluginError`. ``EDGE_PLUGINS=a,b`` is an allowlist of
entry-point names (set but empty: load none); a name in it that is not installed is a
failed record of its own. ``edge plugins`` is built from these records
and the manager's own state; there is no second registry.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pluggy

from edge_core import hookspecs
from edge_core.backend import BackendInfo, ProbeReport
from edge_core.discovery import (
    ENTRY_POINT_GROUP,
    ENV_STRICT,
    ENV_TRACE,
    PluginRecord,
    check_contract,
    discover,
)
from edge_core.errors import PluginError
from edge_core.markers import IMPL_ATTR, SPEC_ATTR

__all__ = [
    "ENTRY_POINT_GROUP",
    "EdgePluginManager",
    "HookAnswer",
    "PluginRecord",
    "PluginSet",
    "backends_problem",
    "check_contract",
    "load_plugins",
    "probe_problem",
]


class EdgePluginManager(pluggy.PluginManager):
    """A pluggy manager for project ``edge`` that reads edge-core's own hook markers."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        """Options of ``plugin.name`` when it is marked with :func:`edge_core.hookimpl`."""
        member = getattr(plugin, name, None)
        opts = getattr(member, IMPL_ATTR, None)
        return dict(opts) if callable(member) and isinstance(opts, dict) else None

    def parse_hookspec_opts(self, module_or_class: object, name: str) -> Any:
        """Options of a specification marked with :func:`edge_core.markers.hookspec`."""
        member = getattr(module_or_class, name, None)
        opts = getattr(member, SPEC_ATTR, None)
        return dict(opts) if callable(member) and isinstance(opts, dict) else None


class HookAnswer:
    """One plugin's answer to an isolated hook call: a result, or the error it raised."""

    __slots__ = ("error", "plugin", "result", "seconds")

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.result: Any = None
        self.error: str | None = None
        self.seconds = 0.0


class PluginSet:
    """The loaded plugins: a pluggy manager plus a record per plugin found."""

    def __init__(self, manager: EdgePluginManager, records: list[PluginRecord],
                 *, trace: bool = False) -> None:
        self.manager = manager
        self.records = records
        #: Print every isolated hook call (``EDGE_TRACE_HOOKS=1``), as pluggy calls are.
        self.trace = trace
        #: Backend name → (its declaration, the owning plugin's name), read once at load.
        self.backends: dict[str, tuple[BackendInfo, str]] = {}
        self._probes: dict[str, tuple[float, HookAnswer]] = {}
        self._probe_lock = threading.Lock()

    def probe(self, plugin: str, *, timeout_s: float, max_age_s: float = 30.0) -> HookAnswer:
        """One plugin's ``edge_probe`` answer, reused for ``max_age_s`` seconds.

        Opening a pipeline needs a stage owner's probe twice (the pools it reports for the
        ledger, then the backend's availability); devices do not change in between, and a
        vendor probe may start an interpreter, so the answer is asked for once.
        """
        now = time.monotonic()
        with self._probe_lock:
            cached = self._probes.get(plugin)
            if cached is not None and now - cached[0] <= max_age_s:
                return cached[1]
        answer = self.call_one(plugin, "edge_probe", timeout_s=timeout_s)
        if answer.error is None:
            answer.error = probe_problem(answer.result)
            if answer.error is not None:
                answer.result = None
        if answer.error is None:
            with self._probe_lock:
                self._probes[plugin] = (now, answer)
        return answer

    def read_backends(self) -> None:
        """Ask every registered plugin for its backends again.

        :func:`load_plugins` does it once; this is for a manager populated by hand.
        """
        self.backends.clear()
        _read_backends(self)

    def record(self, name: str) -> PluginRecord:
        """The record of the plugin registered under ``name``."""
        for rec in self.records:
            if rec.name == name:
                return rec
        raise KeyError(name)

    def call_one(
        self, plugin: str, hook_name: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> HookAnswer:
        """Call one plugin's implementation of a hook, isolated like :meth:`call_each`."""
        answers = self.call_each(hook_name, timeout_s=timeout_s, only=plugin, **kwargs)
        if not answers:
            answer = HookAnswer(plugin)
            answer.error = f"plugin {plugin!r} does not implement {hook_name}"
            return answer
        return answers[0]

    def call_each(
        self, hook_name: str, *, timeout_s: float | None = None, only: str | None = None,
        **kwargs: Any,
    ) -> list[HookAnswer]:
        """Call a hook on every plugin separately (registration order), capturing errors.

        With ``timeout_s``, the plugins are called in parallel threads and one that has not
        answered by then is reported as timed out (its daemon thread is abandoned). With
        ``only``, just that plugin is called.
        """
        caller = getattr(self.manager.hook, hook_name)
        impls = [impl for impl in caller.get_hookimpls() if not impl.wrapper
                 and not impl.hookwrapper and (only is None or impl.plugin_name == only)]
        answers = [HookAnswer(impl.plugin_name) for impl in impls]

        def run(idx: int) -> None:
            impl = impls[idx]
            started = time.perf_counter()
            try:
                answers[idx].result = impl.function(*(kwargs[a] for a in impl.argnames))
            except Exception as exc:  # one plugin must not hide the others
                answers[idx].error = f"{type(exc).__name__}: {exc}"
            answers[idx].seconds = time.perf_counter() - started
            if self.trace:
                status = "ok" if answers[idx].error is None else f"raised {answers[idx].error}"
                _trace(hook_name, impl.plugin_name, kwargs, answers[idx].seconds, status)

        if timeout_s is None:
            for idx in range(len(impls)):
                run(idx)
            return answers
        threads = [
            threading.Thread(target=run, args=(i,), daemon=True, name=f"edge-{hook_name}-{i}")
            for i in range(len(impls))
        ]
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.start()
        for idx, thread in enumerate(threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                answers[idx].error = f"TimeoutError: no answer within {timeout_s} s"
                answers[idx].seconds = timeout_s
        return answers


def load_plugins(
    *,
    local_modules: Iterable[str] = (),
    objects: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    strict: bool | None = None,
    group: str = ENTRY_POINT_GROUP,
) -> PluginSet:
    """Discover plugins, register them with pluggy and read their backend declarations.

    Args:
        local_modules: Module names a project's configuration lists as plugins.
        objects: Plugin objects to register as they are, by name (embedding, tests).
        env: Environment to read ``EDGE_PLUGINS``, ``EDGE_STRICT_PLUGINS`` and
            ``EDGE_TRACE_HOOKS`` from (defaults to ``os.environ``).
        strict: Overrides ``EDGE_STRICT_PLUGINS``.
        group: The entry-point group to scan.

    Raises:
        PluginError: in strict mode, naming every plugin that failed.

    """
    env = os.environ if env is None else env
    strict = _env_true(env, ENV_STRICT) if strict is None else strict
    records, found = discover(local_modules=local_modules, objects=objects, env=env,
                              group=group)
    manager = EdgePluginManager()
    manager.add_hookspecs(hookspecs)
    for record in records:
        plugin = found.get(record.name)
        if plugin is None:
            continue
        try:
            manager.register(plugin, name=record.name)
        except Exception as exc:  # pluggy validates hook signatures against the specs
            record.error = f"registration failed: {type(exc).__name__}: {exc}"
            record.loaded = False
    trace = _env_true(env, ENV_TRACE)
    plugin_set = PluginSet(manager, records, trace=trace)
    _read_backends(plugin_set)
    if trace:
        _install_tracing(manager)
    failed = [rec for rec in records if rec.error]
    if strict and failed:
        detail = "; ".join(f"{rec.name}: {rec.error}" for rec in failed)
        raise PluginError(f"plugins: {len(failed)} plugin(s) failed to load: {detail}")
    return plugin_set


def probe_problem(result: Any) -> str | None:
    """What is wrong with an ``edge_probe`` answer, or ``None`` for a list of probe reports.

    ``None`` (no answer) is fine; anything else must be a list or tuple of
    :class:`~edge_core.backend.ProbeReport`.
    """
    if result is None:
        return None
    if not isinstance(result, list | tuple):
        return (f"edge_probe returned {type(result).__name__} {result!r:.200}, not a list "
                "of ProbeReport")
    for item in result:
        if not isinstance(item, ProbeReport):
            return f"edge_probe returned a non-ProbeReport: {item!r:.200}"
    return None


def backends_problem(result: Any) -> str | None:
    """What is wrong with an ``edge_backends`` answer, or ``None`` for a list of backends.

    ``None`` (no answer: the plugin owns no backend) is fine; anything else must be a list
    or tuple of :class:`~edge_core.backend.BackendInfo` (the hook's documented type). A
    plugin whose answer is anything else declares no backend at all: which of its items
    it meant is not known.
    """
    if result is None:
        return None
    if not isinstance(result, list | tuple):
        return (f"edge_backends returned {type(result).__name__} {result!r:.200}, not a "
                "list of BackendInfo")
    for item in result:
        if not isinstance(item, BackendInfo):
            return (f"edge_backends returned a list holding {type(item).__name__} "
                    f"{item!r:.200}, not a list of BackendInfo")
    return None


def _env_true(env: Mapping[str, str], key: str) -> bool:
    return env.get(key, "").strip().lower() in {"1", "true", "yes", "on"}


def _read_backends(plugin_set: PluginSet) -> None:
    """Ask every plugin for its backends; record duplicates and failures on the plugin.

    An answer that raised or is not a list of :class:`BackendInfo`
    (:func:`backends_problem`) is the plugin's error, and it declares no backend: no
    stage binds to it, and ``edge probe`` reports whatever its probe says of a backend as
    unavailable, with that error (:func:`edge_core.probe.probe_all`).

    A backend name two plugins declare is served by neither: which one a stage naming it
    would get is not the user's choice (it would hang on the plugins' entry-point names,
    and a newly installed package could take over ``ort-cpu`` in silence). Both plugins
    record the clash as their error, so that every report and a stage naming the
    backend say it.
    """
    claims: dict[str, list[tuple[str, BackendInfo]]] = {}
    answered: list[str] = []
    for answer in plugin_set.call_each("edge_backends"):
        record = plugin_set.record(answer.plugin)
        if answer.error:
            record.error = f"edge_backends failed: {answer.error}"
            continue
        problem = backends_problem(answer.result)
        if problem is not None:  # refused whole: the plugin serves no backend
            record.error = problem
            continue
        answered.append(answer.plugin)
        for info in answer.result or ():
            claims.setdefault(info.name, []).append((answer.plugin, info))
    declared: dict[str, list[str]] = {}
    for name, claimants in claims.items():
        owners = sorted({plugin for plugin, _ in claimants})
        if len(owners) > 1:
            for plugin in owners:
                plugin_set.record(plugin).error = (
                    f"backend: {name!r} is declared by plugins "
                    f"{' and '.join(repr(o) for o in owners)}: neither serves it "
                    "(uninstall or rename one)")
            continue
        plugin, info = claimants[0]
        plugin_set.backends[name] = (info, plugin)
        declared.setdefault(plugin, []).append(name)
    for plugin in answered:
        record = plugin_set.record(plugin)
        record.backends = tuple(declared.get(plugin, ()))
        record.targets = {name: plugin_set.backends[name][0].providers
                          for name in record.backends}


def _trace(hook_name: str, plugins: str, kwargs: Mapping[str, Any], seconds: float,
           status: str) -> None:
    """One ``[edge-trace]`` line: hook, plugin(s), argument summary, duration, outcome."""
    summary = ", ".join(f"{k}={_summarise(v)}" for k, v in kwargs.items())
    print(f"[edge-trace] {hook_name}@{plugins}({summary}) {seconds * 1e3:.3f} ms {status}",
          file=sys.stderr)


def _install_tracing(manager: pluggy.PluginManager) -> None:
    """Trace every hook called through pluggy, with its duration (a per-thread stack)."""
    local = threading.local()

    def before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        stack = getattr(local, "stack", None)
        if stack is None:
            stack = local.stack = []
        stack.append(time.perf_counter())

    def after(outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Any) -> None:
        started = local.stack.pop()
        names = ",".join(impl.plugin_name for impl in impls) or "-"
        error = outcome.exception
        status = "ok" if error is None else f"raised {type(error).__name__}: {error}"
        _trace(hook_name, names, kwargs, time.perf_counter() - started, status)

    manager.add_hookcall_monitoring(before, after)


def _summarise(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
