"""Read pipeline configuration from a file, a mapping, or a pyproject ``[tool.edge]`` table.

Sources:

* a pipeline file: ``.toml`` (stdlib ``tomllib``), ``.yaml`` / ``.yml`` (needs PyYAML,
  ``pip install edge-core[yaml]``) or ``.json``;
* a ``[tool.edge.pipelines.<name>]`` table of a ``pyproject.toml``;
* an already-parsed mapping (tests, generated configs).

Config never imports a plugin. A stage's ``backend.options`` table is handed, as written,
to the ``validate_backend`` callback (the owning plugin's config hook, wired up by the
plugin manager), together with the table's path, and the callback's result is stored on
the stage as ``backend.validated``.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_core.config.checks import INTERNAL, check_module_path
from edge_core.config.model import BackendSection, Identifier, ModulePath, PipelineConfig
from edge_core.config.structure import (
    InvalidConfigError,
    join_path,
    name_stages,
    stage_ids,
    structure_config,
)
from edge_core.errors import ConfigError

__all__ = [
    "BackendValidator",
    "ToolSettings",
    "folder_problem",
    "load_pipeline",
    "load_pyproject_pipeline",
    "load_tool_settings",
    "pyproject_name_required",
    "pyproject_pipelines",
    "read_document",
]

BackendValidator = Callable[[str, Mapping[str, object], str], object]
"""``(backend name, raw options table, path of that table) -> validated options``.

It raises :class:`~edge_core.errors.ConfigError` (paths starting with the given one) when
the table is invalid.
"""


@attrs.frozen
class ToolSettings:
    """The ``[tool.edge]`` table of a ``pyproject.toml``.

    ``plugins`` are local plugin modules loaded for every pipeline; ``backends`` holds
    per-backend default options (``[tool.edge.backends.ort-cpu]``) that a stage's own
    ``backend.options`` override key by key; ``pipelines`` holds the raw pipeline tables.
    """

    plugins: tuple[ModulePath, ...] = ()
    """Local plugin modules, as pytest's ``-p``."""
    backends: Mapping[Identifier, Mapping[str, object]] = attrs.field(factory=dict)
    """Default ``options`` per backend name."""
    pipelines: Mapping[Identifier, Mapping[str, object]] = attrs.field(factory=dict)
    """Raw ``[tool.edge.pipelines.<name>]`` tables, structured on demand."""
    source: Path | None = attrs.field(default=None, eq=False, metadata={INTERNAL: True})
    """The ``pyproject.toml`` the settings came from."""


def folder_problem(folder: Path, *, pyproject: bool = True) -> str:
    """What is wrong with a folder given where a pipeline file is expected, and what to give.

    ``pyproject``: whether the command also takes a ``pyproject.toml`` with ``--name``
    (``edge serve`` does not). A folder holding a ``pyproject.toml`` then gets that file's
    path; otherwise the pipeline files it holds are named.
    """
    expected = "a folder, not a file: give a pipeline file (.toml, .yaml, .yml or .json)"
    if pyproject:
        expected += ", or a pyproject.toml with --name NAME"
        if (folder / "pyproject.toml").is_file():
            return f"{expected} (this one holds {folder / 'pyproject.toml'})"
    try:
        held = sorted(entry.name for entry in folder.iterdir()
                      if entry.is_file() and entry.name != "pyproject.toml"
                      and entry.suffix.lower() in (".toml", ".yaml", ".yml", ".json"))
    except OSError:
        held = []
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        return f"{expected} (this one holds {shown})"
    return expected


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML, YAML or JSON file into a mapping, choosing the format by suffix.

    The suffix is that of the name given: a link ``pipeline.toml`` is read as TOML
    wherever it points. Only a regular file (or a link to one) is read: a FIFO or a
    device is refused before it is opened (reading one could wait forever, or never end).

    Raises:
        ConfigError: the path is a folder (:func:`folder_problem` says what to give),
            the file cannot be read, is not a regular file, is not UTF-8 text,
            is malformed or nested too deeply to read, is not a table at the top level,
            or is YAML while PyYAML is not installed.

    """
    file = Path(path)
    if file.is_dir():
        raise ConfigError("source", folder_problem(file), str(file))
    suffix = file.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(
            "source", "unknown format (expected .toml, .yaml, .yml or .json)", str(file)
        )
    try:
        mode = file.stat().st_mode
    except OSError:
        mode = None  # reading it says why (no such file, permission denied)
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise ConfigError("source", "not a regular file (a FIFO, a socket or a device)",
                          str(file))
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("source", f"cannot read ({exc.strerror or exc})", str(file)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("source", f"not valid UTF-8 (byte {exc.start}: {exc.reason})",
                          str(file)) from None
    data: object
    try:
        if suffix == ".toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError("source", f"not valid TOML ({exc})", str(file)) from None
        elif suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError("source", f"not valid JSON ({exc})", str(file)) from None
        else:
            data = _load_yaml(text, file)
    except RecursionError:  # the readers recurse once per level of arrays and tables
        kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "YAML")
        raise ConfigError("source", f"not read as {kind}: arrays or tables nested too "
                          "deeply", str(file)) from None
    if not isinstance(data, dict):
        raise ConfigError("source", "the document must be a table at the top level", str(file))
    return data


def _load_yaml(text: str, file: Path) -> object:
    try:
        import yaml  # optional dependency
    except ImportError:
        raise ConfigError(
            "source", "YAML needs PyYAML (pip install 'edge-core[yaml]')", str(file)
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("source", f"not valid YAML ({exc})", str(file)) from None


def load_tool_settings(pyproject_path: str | os.PathLike[str]) -> ToolSettings:
    """Read the ``[tool.edge]`` table of ``pyproject_path`` (empty settings when absent)."""
    file = Path(pyproject_path)
    document = read_document(file)
    tool = document.get("tool", {})
    table = tool.get("edge", {}) if isinstance(tool, dict) else {}
    settings = structure_config(table, ToolSettings, path="tool.edge")
    return attrs.evolve(settings, source=file.resolve())


def pyproject_name_required(pyproject_path: str | os.PathLike[str],
                            option: str = "--name") -> ConfigError:
    """The error for a ``pyproject.toml`` given without which of its pipelines to use.

    ``option`` is what names a pipeline where the caller takes it (``--name``, or a
    function's ``name``); the error lists the pipelines the file defines (or says it
    defines none, or that it cannot be read).
    """
    return ConfigError(option, "required with a pyproject.toml: which of its "
                       f"[tool.edge.pipelines] to use ({pyproject_pipelines(pyproject_path)})")


def pyproject_pipelines(pyproject_path: str | os.PathLike[str]) -> str:
    """The pipelines a ``pyproject.toml`` defines, said for an error message.

    ``defined: a, b``; ``it defines none``; or why its ``[tool.edge]`` cannot be read.
    """
    try:
        names = sorted(load_tool_settings(pyproject_path).pipelines)
    except ConfigError as exc:
        return f"its [tool.edge] cannot be read: {exc}"
    return f"defined: {', '.join(names)}" if names else "it defines none"


def load_pipeline(
    source: str | os.PathLike[str] | Mapping[str, object],
    *,
    validate_backend: BackendValidator | None = None,
    settings: ToolSettings | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> PipelineConfig:
    """Load and validate a pipeline from a file path or an already-parsed mapping.

    Args:
        source: a ``.toml`` / ``.yaml`` / ``.yml`` / ``.json`` pipeline file, or a mapping
            with the same structure.
        validate_backend: the owning plugin's config hook (see :data:`BackendValidator`).
        settings: ``[tool.edge]`` settings contributing plugins and backend defaults.
        base_dir: folder that relative manifest paths are resolved against; defaults to
            the file's folder (or the current directory for a mapping).

    Raises:
        ConfigError: with the full path of the first problem; an :class:`InvalidConfigError`
            lists every problem found while structuring.

    """
    if isinstance(source, Mapping):
        data: Mapping[str, object] = source
        file: Path | None = None
        folder = Path(base_dir) if base_dir is not None else Path.cwd()
    else:
        file = Path(source).resolve()
        if file.name == "pyproject.toml":
            raise ConfigError(
                "source",
                "pipelines in pyproject.toml live under [tool.edge.pipelines.<name>]; "
                "use load_pyproject_pipeline",
                str(file),
            )
        data = read_document(source)  # the format by the name given, not by a link's target
        folder = Path(base_dir) if base_dir is not None else file.parent
    return _build(data, "", folder, file, settings, validate_backend)


def load_pyproject_pipeline(
    pyproject_path: str | os.PathLike[str],
    name: str,
    *,
    validate_backend: BackendValidator | None = None,
) -> PipelineConfig:
    """Load the pipeline ``[tool.edge.pipelines.<name>]`` of ``pyproject_path``.

    The table's key is the pipeline's name (a ``name`` entry, if present, must agree);
    relative manifest paths resolve against the ``pyproject.toml``'s folder, and the
    ``[tool.edge]`` plugins and backend defaults apply.
    """
    settings = load_tool_settings(pyproject_path)
    prefix = join_path("tool.edge.pipelines", name)
    if name not in settings.pipelines:
        known = ", ".join(sorted(settings.pipelines)) or "none"
        raise ConfigError(prefix, f"no such pipeline (defined: {known})", name)
    table = dict(settings.pipelines[name])
    if table.setdefault("name", name) != name:
        raise ConfigError(
            join_path(prefix, "name"), f"must match the table key {name!r}", table["name"]
        )
    assert settings.source is not None
    return _build(
        table, prefix, settings.source.parent, settings.source, settings, validate_backend
    )


def _build(
    data: Mapping[str, object],
    prefix: str,
    folder: Path,
    file: Path | None,
    settings: ToolSettings | None,
    validate_backend: BackendValidator | None,
) -> PipelineConfig:
    """:func:`_structure`, its problems naming their stages' ids (:func:`name_stages`)."""
    try:
        return _structure(data, prefix, folder, file, settings, validate_backend)
    except ConfigError as exc:
        named = name_stages(exc, stage_ids(data), prefix)
        if named is exc:
            raise
        raise named.with_traceback(exc.__traceback__) from exc.__cause__


def _structure(
    data: Mapping[str, object],
    prefix: str,
    folder: Path,
    file: Path | None,
    settings: ToolSettings | None,
    validate_backend: BackendValidator | None,
) -> PipelineConfig:
    data, filled = _first_candidate_as_backend(data, prefix)
    try:
        config = structure_config(data, PipelineConfig, path=prefix)
    except InvalidConfigError as exc:
        # a filled-in backend's problems are reported once, at candidates[0].backend
        kept = [p for p in exc.problems
                if not any(p.path.startswith(f"{stage}.backend") for stage in filled)]
        raise InvalidConfigError(kept or list(exc.problems)) from None
    problems: list[ConfigError] = []
    stages = []

    def complete(backend: BackendSection, path: str) -> BackendSection:
        defaults = settings.backends.get(backend.name, {}) if settings else {}
        options = {**defaults, **backend.options}
        validated: object = None
        if validate_backend is not None:
            try:
                validated = validate_backend(backend.name, options, f"{path}.options")
            except InvalidConfigError as exc:
                problems.extend(exc.problems)
            except ConfigError as exc:
                problems.append(exc)
        route = backend.route
        if route is not None and route.python_path:
            route = attrs.evolve(
                route, python_path=tuple(_resolve(folder, p) for p in route.python_path)
            )
        return attrs.evolve(backend, options=options, route=route, validated=validated)

    for index, stage in enumerate(config.stages):
        stage_path = join_path(join_path(prefix, "stages"), index)
        candidates = tuple(
            attrs.evolve(
                candidate,
                backend=complete(candidate.backend,
                                 f"{join_path(f'{stage_path}.candidates', number)}.backend"),
                manifest=_resolve(folder, candidate.manifest) if candidate.manifest else None,
            )
            for number, candidate in enumerate(stage.candidates)
        )
        backend = (candidates[0].backend if candidates
                   else complete(stage.backend, f"{stage_path}.backend"))
        manifest = _resolve(folder, stage.manifest) if stage.manifest else None
        stages.append(attrs.evolve(stage, manifest=manifest, backend=backend,
                                   candidates=candidates))
    if problems:
        raise InvalidConfigError(problems)
    plugins = _merge_plugins(settings.plugins if settings else (), config.plugins)
    workload = tuple(_resolve(folder, path) for path in config.workload)
    return attrs.evolve(config, stages=tuple(stages), plugins=plugins, workload=workload,
                        source=file)


def _first_candidate_as_backend(
    data: Mapping[str, object], prefix: str
) -> tuple[Mapping[str, object], list[str]]:
    """Give each stage that lists ``candidates`` its first candidate's ``backend`` table.

    Returns the (copied where changed) document and the paths of the stages filled in.

    Raises:
        InvalidConfigError: a stage names both ``backend`` and ``candidates``, or lists
            no candidate.
    """
    raw = data.get("stages") if isinstance(data, Mapping) else None
    if not isinstance(raw, list):
        return data, []
    stages: list[object] = []
    filled: list[str] = []
    problems: list[ConfigError] = []
    for index, stage in enumerate(raw):
        path = join_path(join_path(prefix, "stages"), index)
        if not isinstance(stage, Mapping) or "candidates" not in stage:
            stages.append(stage)
            continue
        candidates = stage["candidates"]
        if "backend" in stage:
            problems.append(ConfigError(f"{path}.backend", "give either backend or "
                                        "candidates, not both", stage["backend"]))
        elif not isinstance(candidates, list) or not candidates:
            problems.append(ConfigError(f"{path}.candidates",
                                        "expected a non-empty list of candidates", candidates))
        elif isinstance(candidates[0], Mapping) and "backend" in candidates[0]:
            stage = {**stage, "backend": candidates[0]["backend"]}
            filled.append(path)
        stages.append(stage)
    if problems:
        raise InvalidConfigError(problems)
    return {**data, "stages": stages}, filled


def _resolve(folder: Path, path: Path) -> Path:
    return path if path.is_absolute() else (folder / path).resolve()


def _merge_plugins(first: Sequence[str], second: Sequence[str]) -> tuple[str, ...]:
    merged: dict[str, None] = {}
    for module in (*first, *second):
        merged[check_module_path(module)] = None
    return tuple(merged)
