"""Finding plugins cheaply: entry points, local modules, static checks — no pluggy, no attrs.

``edge plugins`` must stay fast with every plugin installed, so this module reads
``entry_points.txt`` files of the distributions on ``sys.path`` directly (a fraction of
the cost of :func:`importlib.metadata.entry_points`, which parses every distribution's
metadata), imports each plugin module, checks its declared hook contract and the hooks it
marks, and records every failure instead of raising. Path entries that are not plain
directories (zip files, eggs) fall back to :mod:`importlib.metadata`.
"""

from __future__ import annotations

import importlib
import os
import sys

from edge_core.hookspecs import CONTRACT_VERSION, HOOK_NAMES
from edge_core.markers import IMPL_ATTR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_TEST_BACKENDS",
    "TEST_ENTRY_POINT_GROUP",
    "EntryPointRow",
    "PluginRecord",
    "check_contract",
    "discover",
    "not_installed",
    "plugin_errors",
    "scan_entry_points",
    "scan_groups",
]

ENTRY_POINT_GROUP = "edge"
TEST_ENTRY_POINT_GROUP = "edge.testing"
"""Test backends (the echo backend): loaded only when asked for, never in a user's listing."""
ENV_TEST_BACKENDS = "EDGE_TEST_BACKENDS"
ENV_ALLOWLIST = "EDGE_PLUGINS"
ENV_STRICT = "EDGE_STRICT_PLUGINS"
ENV_TRACE = "EDGE_TRACE_HOOKS"


class EntryPointRow:
    """One entry point of the plugin group, with the distribution that declares it."""

    __slots__ = ("distribution", "name", "value", "version")

    def __init__(self, name: str, value: str, distribution: str | None, version: str | None):
        self.name = name
        self.value = value
        self.distribution = distribution
        self.version = version

    def __repr__(self) -> str:
        return f"EntryPointRow({self.name!r}, {self.value!r}, {self.distribution!r})"


class PluginRecord:
    """What is known about one plugin, loaded or not.

    Attributes:
        name: The entry-point name (the module name for configured local plugins).
        module: The module path the plugin lives in.
        source: ``entry-point``, ``config`` (a local module) or ``object`` (registered as is).
        distribution: The distribution that provides it, when known.
        version: That distribution's version, when known.
        contract: The hook-contract version the plugin declares (``EDGE_CONTRACT``).
        hooks: Names of the hooks it implements.
        backends: Names of the backends it declares (filled by the plugin manager).
        targets: Each declared backend's placement targets (``BackendInfo.providers``: the
            ``placement.target`` values a stage of it may name; empty when it declares
            none), filled with ``backends``.
        error: Why it was not loaded (or why its backends could not be read).
        loaded: True when the plugin imported and passed the contract and hook checks.

    """

    __slots__ = ("backends", "contract", "distribution", "error", "hooks", "loaded",
                 "module", "name", "source", "targets", "version")

    def __init__(self, name: str, module: str, source: str, distribution: str | None = None,
                 version: str | None = None) -> None:
        self.name = name
        self.module = module
        self.source = source
        self.distribution = distribution
        self.version = version
        self.contract: str | None = None
        self.hooks: tuple[str, ...] = ()
        self.backends: tuple[str, ...] = ()
        self.targets: dict[str, tuple[str, ...]] = {}
        self.error: str | None = None
        self.loaded = False

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dictionary (a row of ``edge plugins --json``)."""
        return {
            "name": self.name,
            "module": self.module,
            "source": self.source,
            "distribution": self.distribution,
            "version": self.version,
            "contract": self.contract,
            "hooks": list(self.hooks),
            "backends": list(self.backends),
            "targets": {name: list(found) for name, found in self.targets.items()},
            "loaded": self.loaded,
            "error": self.error,
        }

    def __repr__(self) -> str:
        return f"PluginRecord({self.name!r}, error={self.error!r})"


def check_contract(declared: object, supported: str = CONTRACT_VERSION) -> str | None:
    """Return why a declared hook-contract version is unsupported, or ``None`` if it is fine.

    A plugin is compatible when its major version equals this core's and its minor
    version is not newer.
    """
    if not isinstance(declared, str):
        return f"EDGE_CONTRACT: not declared as a 'major.minor' string: {declared!r}"
    try:
        major, minor = (int(part) for part in declared.split("."))
    except ValueError:
        return f"EDGE_CONTRACT: not a 'major.minor' version: {declared!r}"
    s_major, s_minor = (int(part) for part in supported.split("."))
    if major != s_major or minor > s_minor:
        return (
            f"EDGE_CONTRACT: hook contract {declared} is not supported by this edge-core "
            f"(supports {s_major}.0 to {supported})"
        )
    return None


def _read_header_fields(path: str) -> tuple[str | None, str | None]:
    """Name and Version from a METADATA/PKG-INFO file's header block."""
    name = version = None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
    except OSError:
        pass
    return name, version


def _parse_groups(text: str, groups: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    rows: dict[str, list[tuple[str, str]]] = {group: [] for group in groups}
    inside: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            inside = rows.get(line[1:-1]) if line.endswith("]") else None
            continue
        if inside is not None and "=" in line:
            key, _, value = line.partition("=")
            inside.append((key.strip(), value.strip()))
    return rows


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def scan_entry_points(group: str = ENTRY_POINT_GROUP,
                      path: Iterable[str] | None = None) -> list[EntryPointRow]:
    """Entry points of ``group`` from the distributions on ``path`` (default ``sys.path``).

    As with :mod:`importlib.metadata`, the first distribution of a name on the path wins.
    """
    return scan_groups((group,), path)[group]


def scan_groups(groups: Sequence[str], path: Iterable[str] | None = None
                ) -> dict[str, list[EntryPointRow]]:
    """Entry points of each of ``groups``, reading each distribution's file once.

    What :func:`scan_entry_points` gives for each group, in one pass over ``path``.
    """
    rows: dict[str, list[EntryPointRow]] = {group: [] for group in groups}
    seen: set[str] = set()
    for entry in list(sys.path if path is None else path):
        directory = entry or "."
        try:
            names = sorted(os.listdir(directory))
        except NotADirectoryError:
            if os.path.isfile(directory):
                for group, listed in _scan_with_importlib(groups, directory, seen).items():
                    rows[group].extend(listed)
            continue
        except OSError:
            continue
        for child in names:
            if not child.endswith((".dist-info", ".egg-info")):
                continue
            info = os.path.join(directory, child)
            meta = os.path.join(info, "METADATA" if child.endswith(".dist-info")
                                else "PKG-INFO")
            dist_name = version = None
            if child.endswith(".dist-info"):  # NAME-VERSION.dist-info names it: no read
                key = _normalise(child[:-len(".dist-info")].rsplit("-", 1)[0])
            else:
                dist_name, version = _read_header_fields(meta)
                key = _normalise(dist_name or child.split("-")[0])
            if key in seen:
                continue
            seen.add(key)
            try:
                with open(os.path.join(info, "entry_points.txt"), encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            found = _parse_groups(text, groups)
            if dist_name is None and any(found.values()):  # the spelling and version it declares
                dist_name, version = _read_header_fields(meta)
            for group, pairs in found.items():
                rows[group] += [EntryPointRow(name, value, dist_name, version)
                                for name, value in pairs]
    return rows


def _scan_with_importlib(groups: Sequence[str], entry: str, seen: set[str]
                         ) -> dict[str, list[EntryPointRow]]:
    from importlib.metadata import distributions

    rows: dict[str, list[EntryPointRow]] = {group: [] for group in groups}
    for dist in distributions(path=[entry]):
        key = _normalise(dist.metadata["Name"] or "")
        if key in seen:
            continue
        seen.add(key)
        for ep in dist.entry_points:
            if ep.group in rows:
                rows[ep.group].append(
                    EntryPointRow(ep.name, ep.value, dist.metadata["Name"], dist.version))
    return rows


def _spec_args(hook_name: str) -> tuple[str, ...]:
    import edge_core.hookspecs as specs

    code = getattr(specs, hook_name).__code__
    return tuple(code.co_varnames[: code.co_argcount])


def marked_hooks(plugin: object) -> tuple[tuple[str, ...], str | None]:
    """The hook names a plugin marks, and the first problem a registration would hit."""
    hooks: list[str] = []
    problem: str | None = None
    for attr in dir(plugin):
        if attr.startswith("__"):
            continue
        try:
            member = getattr(plugin, attr)
        except Exception:  # noqa: S112 - a property that raises is not a hook
            continue
        opts = getattr(member, IMPL_ATTR, None)
        if not isinstance(opts, dict) or not callable(member):
            continue
        hook = opts.get("specname") or attr
        if hook not in HOOK_NAMES:
            if not opts.get("optionalhook"):
                problem = problem or f"hook {hook!r}: no such hook in this edge-core"
            continue
        function = getattr(member, "__func__", member)
        code = getattr(function, "__code__", None)
        if code is not None:
            args = code.co_varnames[: code.co_argcount]
            if function is not member:  # a bound method: drop self
                args = args[1:]
            extra = [a for a in args if a not in _spec_args(hook)]
            if extra:
                problem = problem or (
                    f"hook {hook!r}: arguments {extra} are not in the specification "
                    f"{list(_spec_args(hook))}"
                )
        hooks.append(hook)
    return tuple(sorted(set(hooks))), problem


def _import(value: str) -> object:
    module_name, _, attr = value.partition(":")
    module = importlib.import_module(module_name.strip())
    obj: object = module
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj


def _admit(record: PluginRecord, load: Callable[[], object],
           plugins: dict[str, object]) -> None:
    try:
        plugin = load()
    except Exception as exc:
        record.error = f"import failed: {type(exc).__name__}: {exc}"
        return
    contract = getattr(plugin, "EDGE_CONTRACT", None)
    record.contract = contract if isinstance(contract, str) else None
    problem = check_contract(contract)
    if problem is None:
        record.hooks, problem = marked_hooks(plugin)
    if problem is None and record.name in plugins:
        problem = f"name: already registered: {record.name!r}"
    if problem is not None:
        record.error = problem
        return
    record.loaded = True
    plugins[record.name] = plugin


def _env_true(env: Mapping[str, str], key: str) -> bool:
    return env.get(key, "").strip().lower() in {"1", "true", "yes", "on"}


def not_installed(name: str, installed: Sequence[str], group: str = ENTRY_POINT_GROUP
                  ) -> PluginRecord:
    """The failed record of a plugin ``EDGE_PLUGINS`` names that is not installed.

    Its error names the entry-point group and the closest of the ``installed`` names.
    """
    import difflib  # where used: only a name that matches nothing pays for it

    close = difflib.get_close_matches(name, installed, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    record = PluginRecord(name, "", "entry-point")
    record.error = (f"not installed: no installed distribution has an entry point {name!r} "
                    f"in group {group!r}{hint}")
    return record


def discover(
    *,
    local_modules: Iterable[str] = (),
    objects: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    group: str = ENTRY_POINT_GROUP,
) -> tuple[list[PluginRecord], dict[str, object]]:
    """Find and import plugins, recording every failure instead of raising.

    Order: entry points (filtered by ``EDGE_PLUGINS``), then local modules named in
    configuration, then objects given as they are. Entry points of the test group
    (:data:`TEST_ENTRY_POINT_GROUP`, test backends such as ``echo``) join the plugin group's
    only when ``EDGE_TEST_BACKENDS=1`` or when ``EDGE_PLUGINS`` names them, so an
    installed test backend never shows in a user's ``edge plugins`` or ``edge probe``.
    A name ``EDGE_PLUGINS`` lists that no installed entry point, local module or object
    has is recorded as a failed plugin (:func:`not_installed`), never skipped in silence.

    Returns:
        A record per plugin found (failures included, in load order) and the plugins that
        passed every check, by name.

    """
    env = os.environ if env is None else env
    raw_allow = env.get(ENV_ALLOWLIST)
    allow = None if raw_allow is None else {
        part.strip() for part in raw_allow.split(",") if part.strip()
    }
    records: list[PluginRecord] = []
    plugins: dict[str, object] = {}
    if group == ENTRY_POINT_GROUP:
        found = scan_groups((group, TEST_ENTRY_POINT_GROUP))
        rows, tests = found[group], found[TEST_ENTRY_POINT_GROUP]
        if not _env_true(env, ENV_TEST_BACKENDS):
            tests = [r for r in tests if allow is not None and r.name in allow]
        rows += tests
    else:
        rows = scan_entry_points(group)
    local_modules = tuple(local_modules)
    for row in sorted(rows, key=lambda r: r.name):
        if allow is not None and row.name not in allow:
            continue
        record = PluginRecord(row.name, row.value, "entry-point", row.distribution, row.version)
        records.append(record)
        _admit(record, lambda v=row.value: _import(v), plugins)  # type: ignore[misc]
    if allow:
        installed = sorted({row.name for row in rows})
        missing = allow - set(installed) - set(local_modules) - set(objects or {})
        records += [not_installed(name, installed, group) for name in sorted(missing)]
    for module_name in local_modules:
        record = PluginRecord(module_name, module_name, "config")
        records.append(record)
        _admit(record, lambda m=module_name: _import(m), plugins)  # type: ignore[misc]
    for name, obj in (objects or {}).items():
        record = PluginRecord(name, getattr(obj, "__module__", type(obj).__module__), "object")
        records.append(record)
        _admit(record, lambda o=obj: o, plugins)  # type: ignore[misc]
    return records, plugins


def plugin_errors(rows: Iterable[Mapping[str, Any]],
                  env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every plugin of ``rows`` (:meth:`PluginRecord.to_json` rows) that did not load.

    Each is ``{"plugin", "error", "named_by"}``, as ``edge probe --json`` lists them:
    ``named_by`` is ``"EDGE_PLUGINS"`` (an entry point while that variable is set in
    ``env``, default ``os.environ``; one not installed included), ``"configuration"`` (a
    module a configuration's ``plugins`` lists) or ``None`` (a failure nobody named).
    ``edge run --json``, ``edge plan --json``, ``edge profile --json`` and the profile
    :func:`edge_core.evidence.profiling.run_profile` returns carry the whole list as
    ``plugin_errors``.
    """
    env = os.environ if env is None else env
    allowlist = ENV_ALLOWLIST in env
    failures = []
    for row in rows:
        if not row.get("error"):
            continue
        named_by = ("configuration" if row.get("source") == "config" else
                    "EDGE_PLUGINS" if row.get("source") == "entry-point" and allowlist
                    else None)
        failures.append({"plugin": row["name"], "error": row["error"], "named_by": named_by})
    return failures
