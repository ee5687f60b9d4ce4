"""Checking a pipeline file against the installed plugins before anything opens.

:func:`check_pipeline` is what every command that opens a pipeline (``edge run``, ``edge
plan``, ``edge profile``, ``edge serve``) does first. It reads the file and loads the
plugins it needs, then checks, for every stage at once:

* the file's structure (types, unknown keys, sizes: :mod:`edge_core.config`);
* each single-backend stage's backend name: a name no installed plugin provides is a
  problem at ``stages[i].backend.name`` with the closest installed names ("did you
  mean"). A name inside a ``candidates`` list is not: an uninstalled candidate is refused
  at layer ``backend`` when the pipeline opens, and the next candidate is tried;
* each backend section's options, through the owning plugin's ``edge_validate_stage``
  (with its ``edge_config_defaults`` under them), for single backends and candidates;
* each ``placement.target`` is one the stage's backend declares it places work on
  (``BackendInfo.providers``; a backend that declares none is not checked), with the
  closest declared names ("did you mean"): a target the backend cannot place on would
  only be refused by the warm-up gate, after the worker started. A candidate's target
  (its own, or the stage's it inherits) is checked against its backend when that backend
  is installed;
* each manifest path is a bundle folder or its ``edge-manifest.json``, and a
  single-backend stage whose backend needs a bundle (``BackendInfo.needs_bundle``) names
  one; each ``reference_backend`` is a backend an installed plugin provides; every
  ``prepare``, ``finish`` and ``input_transform`` names a callable that imports;
* the stages' ``inputs_from`` form a linear chain (every stage named exists; no join,
  fan-out or second final output): what the runtime serves
  (:mod:`edge_core.runtime.linear_chain`).

Every problem found is raised together as one
:class:`~edge_core.config.InvalidConfigError`, each with its path. Nothing here starts
a worker, probes a device or reserves memory: availability, admission, artifact
verification and the placement gate stay with the opening itself.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.backend import BackendInfo
from edge_core.binding import backend_table, bind_owner
from edge_core.config import (
    InvalidConfigError,
    PipelineConfig,
    load_pipeline,
    load_pyproject_pipeline,
    pyproject_name_required,
    read_document,
    resolve_input_transform,
)
from edge_core.config.structure import join_path, name_stages, stage_ids
from edge_core.errors import ConfigError
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime.linear_chain import linear_chain_problems

__all__ = ["CheckedPipeline", "check_pipeline", "unknown_backend"]


@attrs.frozen
class CheckedPipeline:
    """A pipeline configuration that passed :func:`check_pipeline`, and its plugins.

    Each backend section's options are already validated by their plugin (its
    ``backend.validated``), so opening does not validate them again.
    """

    config: PipelineConfig
    plugins: PluginSet


def unknown_backend(name: str, installed: Iterable[str], failed: Iterable[str] = ()) -> str:
    """The reason for a backend name no installed plugin provides, with "did you mean".

    ``failed`` names plugins that failed to load (their backends are unknown too).
    """
    known = sorted(installed)
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.7)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    broken = list(failed)
    tail = f"; plugins that failed to load: {', '.join(broken)}" if broken else ""
    return (f"no installed plugin provides this backend ({hint}installed: "
            f"{', '.join(known) or 'none'}{tail})")


def check_pipeline(path: str | os.PathLike[str], name: str | None = None,
                   *, plugins: PluginSet | None = None,
                   loaded: Callable[[PluginSet], object] | None = None) -> CheckedPipeline:
    """Read the pipeline at ``path`` and check it against the installed plugins.

    ``path`` is a pipeline file (``.toml``, ``.yaml``, ``.json``) or a ``pyproject.toml``
    with ``name`` naming one of its ``[tool.edge.pipelines]``. ``plugins`` defaults to
    the installed plugins plus the local modules the file names. ``loaded``, when given,
    is called with the plugins as soon as they are known, before any problem is raised
    (so that a caller can report the plugins that failed to load even for a refused file).

    Raises:
        ConfigError: the file cannot be read or parsed (its path is ``source``), or a
            ``pyproject.toml`` is given without ``name``.
        InvalidConfigError: every problem of every stage (see the module docstring).

    """
    source = _Source(Path(path), name)
    structural: list[ConfigError] = []
    config: PipelineConfig | None = None
    try:
        config = source.read(None)
    except InvalidConfigError as exc:
        structural = list(exc.problems)
    if plugins is None:
        modules = config.plugins if config is not None else source.raw_plugins()
        plugins = load_plugins(local_modules=modules)
    if loaded is not None:
        loaded(plugins)
    installed = _Installed(backend_table(plugins),
                           [f"{r.name} ({r.error})" for r in plugins.records if r.error])
    validate = _validator(plugins, installed)
    problems: list[ConfigError] = []
    if config is not None:
        files = (_file_problems(config, source.prefix)
                 + _reference_problems(config, installed, source.prefix)
                 + _bundle_problems(config, installed, source.prefix)
                 + _target_problems(config, installed, source.prefix)
                 + _topology_problems(config, source.prefix))
        try:
            config = source.read(validate)
        except InvalidConfigError as exc:
            problems = list(exc.problems)
        problems += files
    else:
        problems = _raw_backend_problems(source, validate)
    seen = {str(p) for p in structural}
    every = structural + [p for p in problems if str(p) not in seen]
    if every:
        ids = ([stage.id for stage in config.stages] if config is not None
               else source.raw_stage_ids())
        raise name_stages(InvalidConfigError(every), ids, source.prefix)
    assert config is not None
    return CheckedPipeline(config, plugins)


@attrs.frozen
class _Source:
    """A pipeline file, or one pipeline of a ``pyproject.toml``."""

    file: Path
    name: str | None

    def __attrs_post_init__(self) -> None:
        if self.file.name == "pyproject.toml" and not self.name:
            raise pyproject_name_required(self.file)
        if self.file.name != "pyproject.toml" and self.name:
            raise ConfigError("--name", f"picks one of a pyproject.toml's pipelines; "
                              f"{self.file} is a pipeline file of its own", self.name)

    def read(self, validate: Any) -> PipelineConfig:
        """The configuration, its backend sections checked by ``validate`` when given."""
        if self.name is not None and self.file.name == "pyproject.toml":
            return load_pyproject_pipeline(self.file, self.name, validate_backend=validate)
        return load_pipeline(self.file, validate_backend=validate)

    @property
    def prefix(self) -> str:
        """The path prefix of the pipeline's values (its pyproject.toml table, or none)."""
        if self.name is None or self.file.name != "pyproject.toml":
            return ""
        return join_path("tool.edge.pipelines", self.name)

    def raw(self) -> tuple[Mapping[str, Any], str]:
        """The pipeline's raw table and the path prefix of its values."""
        document = read_document(self.file)
        if not self.prefix:
            return document, ""
        tool = document.get("tool", {})
        edge = tool.get("edge", {}) if isinstance(tool, Mapping) else {}
        tables = edge.get("pipelines", {}) if isinstance(edge, Mapping) else {}
        table = tables.get(self.name, {}) if isinstance(tables, Mapping) else {}
        return table if isinstance(table, Mapping) else {}, self.prefix

    def raw_stage_ids(self) -> list[str | None]:
        """The stages' ids of a document whose structure has problems (None where none)."""
        try:
            document, _ = self.raw()
        except ConfigError:
            return []
        return stage_ids(document)

    def raw_plugins(self) -> tuple[str, ...]:
        """The ``plugins`` list of a document whose structure has problems (strings only)."""
        try:
            document, _ = self.raw()
        except ConfigError:
            return ()
        listed = document.get("plugins", ())
        return tuple(m for m in listed if isinstance(m, str)) if isinstance(listed, list) else ()


@attrs.frozen
class _Installed:
    """The installed backends (name to declaration and plugin) and the plugins that failed."""

    table: Mapping[str, tuple[BackendInfo, str]]
    failed: list[str]


def _validator(plugins: PluginSet, installed: _Installed) -> Any:
    """The ``validate_backend`` callback: names resolved, options checked by their plugin."""
    table, failed = installed.table, installed.failed

    def validate(backend: str, options: Mapping[str, object], path: str) -> object:
        if backend not in table:
            if ".candidates[" in path:
                return None  # refused at layer "backend" when the pipeline opens
            raise ConfigError(path.removesuffix(".options") + ".name",
                              unknown_backend(backend, table, failed), backend)
        binding = bind_owner(plugins, backend)
        defaults = binding.config_defaults(backend) or {}
        return binding.validate_stage(backend, {**defaults, **dict(options)}, path)

    return validate


def _file_problems(config: PipelineConfig, prefix: str) -> list[ConfigError]:
    """Manifests that do not exist; transforms that do not import (every one of them)."""
    problems: list[ConfigError] = []
    for name in ("prepare", "finish"):
        transform = getattr(config, name)
        if transform is not None:
            _collect(problems, lambda t=transform, n=name: resolve_input_transform(t, n))
    for index, stage in enumerate(config.stages):
        path = join_path(join_path(prefix, "stages"), index)
        places = [(f"{path}.manifest", stage.manifest)]
        places += [(f"{path}.candidates[{n}].manifest", c.manifest)
                   for n, c in enumerate(stage.candidates)]
        for where, manifest in places:
            if manifest is None:
                continue
            found = Path(manifest)
            if not found.exists():
                problems.append(ConfigError(where, "no such file or directory", str(manifest)))
            elif found.is_dir() and not (found / MANIFEST_FILENAME).is_file():
                problems.append(ConfigError(where, f"a folder without {MANIFEST_FILENAME}: not "
                                            "an artifact bundle", str(manifest)))
            elif not found.is_dir() and found.name != MANIFEST_FILENAME:
                problems.append(ConfigError(where, f"name a bundle folder or its "
                                            f"{MANIFEST_FILENAME}", str(manifest)))
        if stage.input_transform is not None:
            _collect(problems, lambda t=stage.input_transform, p=path:
                     resolve_input_transform(t, f"{p}.input_transform"))
    return problems


def _reference_problems(config: PipelineConfig, installed: _Installed,
                        prefix: str) -> list[ConfigError]:
    """``reference_backend`` names no installed plugin provides (closest names offered).

    An installed reference backend that cannot run here only lowers the stage's evidence
    label when the pipeline opens (:mod:`edge_core.runtime.reference_run`); a name nothing
    provides is a mistake in the file.
    """
    table = installed.table
    return [ConfigError(f"{join_path(join_path(prefix, 'stages'), index)}.reference_backend",
                        unknown_backend(stage.reference_backend, table, installed.failed),
                        stage.reference_backend)
            for index, stage in enumerate(config.stages)
            if stage.reference_backend is not None and stage.reference_backend not in table]


def _bundle_problems(config: PipelineConfig, installed: _Installed,
                     prefix: str) -> list[ConfigError]:
    """Single-backend stages without a ``manifest`` whose backend needs a bundle.

    A candidate is not checked, as its backend's name is not: one that cannot serve is
    refused when the pipeline opens, and the next candidate is tried.
    """
    problems = []
    for index, stage in enumerate(config.stages):
        found = installed.table.get(stage.backend.name)
        if (not stage.candidates and stage.manifest is None and found is not None
                and found[0].needs_bundle):
            problems.append(ConfigError(
                f"{join_path(join_path(prefix, 'stages'), index)}.manifest",
                f"backend {stage.backend.name!r} needs an "
                "artifact bundle (the bundle folder or its edge-manifest.json)", None))
    return problems


def _target_problems(config: PipelineConfig, installed: _Installed,
                     prefix: str) -> list[ConfigError]:
    """Placement targets the stage's (or a candidate's) installed backend does not place on.

    A backend that declares no ``providers`` is not checked; nor is a candidate whose
    backend is not installed (it is refused when the pipeline opens). Each target is named
    once, at the path where the file sets it.
    """
    problems: list[ConfigError] = []
    for index, stage in enumerate(config.stages):
        path = join_path(join_path(prefix, "stages"), index)
        uses = ([(stage.backend.name, stage.placement, f"{path}.placement", None)]
                if not stage.candidates else
                [(c.backend.name, c.placement or stage.placement,
                  f"{path}.candidates[{n}].placement" if c.placement else f"{path}.placement",
                  n) for n, c in enumerate(stage.candidates)])
        for backend, placement, where, candidate in uses:
            found = installed.table.get(backend)
            target = placement.target
            if found is None or target is None or not found[0].providers:
                continue
            declared = found[0].providers
            if target in declared:
                continue
            close = difflib.get_close_matches(target, declared, n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            who = f"candidate {candidate} " if candidate is not None else ""
            problems.append(ConfigError(
                f"{where}.target", f"{who}backend {backend!r} does not place work on this "
                f"target ({hint}it places on: {', '.join(declared)})", target))
    return problems


def _topology_problems(config: PipelineConfig, prefix: str) -> list[ConfigError]:
    """Why the stages are not the linear chain the runtime serves, at the file's paths."""
    return [type(problem)(f"{prefix}.{problem.path}" if prefix else problem.path,
                          problem.reason, problem.value, stage=problem.stage)
            for problem in linear_chain_problems(config)]


def _collect(problems: list[ConfigError], check: Any) -> None:
    try:
        check()
    except InvalidConfigError as exc:
        problems.extend(exc.problems)
    except ConfigError as exc:
        problems.append(exc)


def _raw_backend_problems(source: _Source, validate: Any) -> list[ConfigError]:
    """Backend problems of a document whose structure has problems, from its raw tables."""
    try:
        document, prefix = source.raw()
    except ConfigError:
        return []
    stages = document.get("stages")
    if not isinstance(stages, list):
        return []
    problems: list[ConfigError] = []
    for index, stage in enumerate(stages):
        if not isinstance(stage, Mapping):
            continue
        path = join_path(join_path(prefix, "stages"), index)
        sections = [(f"{path}.backend", stage.get("backend"))]
        candidates = stage.get("candidates")
        if isinstance(candidates, list):
            sections += [(f"{path}.candidates[{n}].backend",
                          c.get("backend") if isinstance(c, Mapping) else None)
                         for n, c in enumerate(candidates)]
        for where, section in sections:
            if not isinstance(section, Mapping) or not isinstance(section.get("name"), str):
                continue
            options = section.get("options", {})
            if isinstance(options, Mapping):
                _collect(problems, lambda s=section, o=options, w=where:
                         validate(s["name"], o, f"{w}.options"))
    return problems
