"""The key a measured placement decision is stored under: everything the measurement depends on.

A decision is reused only while none of these has changed:

``configuration``
    the pipeline as configured — every stage and candidate with its backend options
    (provider and session options included), route (its ``env`` values too), placement
    policy, resources, shapes, replicas, the pipeline's admission and its selection
    settings (not ``start`` or ``measurement.reuse``, which change when, not what, is
    measured, nor ``workload``, which is the next part but one);
``bundles``
    the sha256 of every bundle's manifest (which lists every file's sha256);
``workload``
    what was timed: each input file's sha256 (a source that names no file: itself);
``environment``
    the values of the variables the stages' backends declare their runtimes read
    (:attr:`edge_core.backend.BackendInfo.env_names`), the dynamic loader's paths and the
    variables edge-core's own worker code reads in every worker
    (:data:`~edge_core.host.environment.EDGE_WORKER_NAMES`: ``EDGE_SPIN_US``,
    ``EDGE_COPY_THREADS``, ``EDGE_HEAP``, ``EDGE_SHM_HUGE``, which change what a request
    costs and what memory a worker holds);
``runtime``
    :func:`edge_core.identity.runtime_identity` of every candidate backend and every
    route interpreter's installed distributions: edge-core's version, the machine, each
    plugin's distribution and version, the probes' runtime versions (ONNX Runtime, EP
    libraries, SDKs, drivers where a probe reports one) and the device identities.

The key is the sha256 of the five parts' digests; the parts' own digests are stored with
the decision so that a re-measurement can say which part changed.

:func:`gate_key` is the narrower key of one candidate's stored load gate
(:mod:`edge_core.selection.gates`): that stage's configuration (its backend section with
the provider and session options, route, placement policy, shapes and demands), its
bundle's manifest sha256, the environment its backend declares (with
:data:`WORKER_ENV_NAMES`) and its runtime identity
(:data:`GATE_KEY_PARTS`) — the workload is not in it, since the gate runs the bundle's
own examples.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.binding import backend_table
from edge_core.config.model import PipelineConfig, StageConfig
from edge_core.host.environment import EDGE_WORKER_NAMES
from edge_core.identity import identity_digest, runtime_identity
from edge_core.plugins import PluginSet

__all__ = ["GATE_KEY_PARTS", "KEY_PARTS", "LOADER_ENV_NAMES", "WORKER_ENV_NAMES", "DecisionKey",
           "bundle_identity", "configuration_identity", "content_parts", "decision_key",
           "environment_identity", "gate_bundle_part", "gate_key", "manifest_file",
           "manifest_sha256", "stage_identity", "workload_identity"]

KEY_PARTS = ("configuration", "bundles", "workload", "environment", "runtime")
"""The parts of a decision's key, in the order they are shown."""

GATE_KEY_PARTS = ("configuration", "bundles", "environment", "runtime")
"""The parts of a stored gate's key (:func:`gate_key`), in the order they are shown."""

LOADER_ENV_NAMES = ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH")
"""Variables that reach every worker and decide which native libraries (EPs) load."""

WORKER_ENV_NAMES = (*LOADER_ENV_NAMES, *sorted(EDGE_WORKER_NAMES))
"""Variables in every key's ``environment`` part whatever the backend: the loader's paths
and what edge-core's worker code reads (waiting, copying, the heap, huge pages)."""

_LEFT_OUT = {"source", "validated"}  # where the file lies; what a validator made of options
_NOT_MEASURED = {"start", "reuse",  # when or whether to measure, not what
                 "workload"}  # what is timed is the workload part, by content


@attrs.frozen
class DecisionKey:
    """A decision's key: its digest and each part's digest."""

    digest: str
    """sha256 over the parts' digests."""
    parts: Mapping[str, str]
    """Part name (:data:`KEY_PARTS`) → that part's sha256."""
    runtime: Mapping[str, Any] = attrs.field(eq=False)
    """The runtime identity the ``runtime`` part was made of (shown in the plan)."""

    def changed(self, other_parts: Mapping[str, str]) -> list[str]:
        """The parts whose digest differs from ``other_parts``' (in :data:`KEY_PARTS` order)."""
        return [name for name in KEY_PARTS
                if name in self.parts and self.parts.get(name) != other_parts.get(name)]

    def with_part(self, name: str, digest: str) -> DecisionKey:
        """This key with part ``name`` (one it has) made of ``digest`` instead."""
        if name not in self.parts:
            raise KeyError(name)
        parts = {**self.parts, name: digest}
        return DecisionKey(digest=identity_digest(parts), parts=parts, runtime=self.runtime)


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a configuration value (attrs classes become tables)."""
    if attrs.has(type(value)):
        return {field.name: _plain(getattr(value, field.name))
                for field in attrs.fields(type(value))
                if field.name not in _LEFT_OUT | _NOT_MEASURED}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def configuration_identity(config: PipelineConfig) -> dict[str, Any]:
    """The configuration as the key sees it (see the module's docstring)."""
    plain = _plain(config)
    assert isinstance(plain, dict)
    return plain


def stage_identity(stage: StageConfig) -> dict[str, Any]:
    """One stage (or candidate) as a gate's key sees it (see the module's docstring)."""
    plain = _plain(stage)
    assert isinstance(plain, dict)
    return plain


def manifest_file(manifest: Path) -> Path:
    """The manifest file of a stage's ``manifest`` (a bundle folder or the file itself)."""
    return manifest / MANIFEST_FILENAME if manifest.is_dir() else manifest


def manifest_sha256(manifest: Path) -> str | None:
    """The sha256 of a stage's manifest file (``manifest``: the bundle folder or the file).

    Read now; ``None`` when it cannot be read.
    """
    return _sha256_file(manifest_file(manifest))


def _sha256_file(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def bundle_identity(config: PipelineConfig) -> dict[str, str | None]:
    """Manifest path → its sha256 (``None``: unreadable), for every stage and candidate."""
    paths = {str(manifest_file(choice.manifest)): None for stage in config.stages
             for choice in stage.choices() if choice.manifest is not None}
    return {path: _sha256_file(Path(path)) for path in sorted(paths)}


def workload_identity(sources: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each workload source's sha256 when it is a readable file, else the source itself.

    A file counts by its content, not its path: the same page named two ways (``edge run
    --input page.png``, the pipeline's ``workload``) is the same workload.
    """
    found: list[str] = []
    for source in sources:
        path = Path(source)
        digest = _sha256_file(path) if path.is_file() else None
        found.append(f"sha256:{digest}" if digest is not None else f"source:{source}")
    return found


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) if p.endswith("*") else name == p
               for p in patterns)


def environment_identity(config: PipelineConfig, plugins: PluginSet,
                         env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of the variables the pipeline's backends declare, plus :data:`WORKER_ENV_NAMES`."""
    return _declared_env(_backends(config), plugins, env)


def _declared_env(backends: Iterable[str], plugins: PluginSet,
                  env: Mapping[str, str] | None) -> dict[str, str]:
    env = os.environ if env is None else env
    table = backend_table(plugins)
    declared: list[str] = list(WORKER_ENV_NAMES)
    for name in sorted(backends):
        if name in table:
            declared.extend(table[name][0].env_names)
    return {name: env[name] for name in sorted(env) if _matches(name, declared)}


def _backends(config: PipelineConfig) -> set[str]:
    return {choice.backend.name for stage in config.stages for choice in stage.choices()}


def _interpreters(config: PipelineConfig) -> set[str]:
    return {choice.backend.route.interpreter for stage in config.stages
            for choice in stage.choices() if choice.backend.route is not None}


def decision_key(config: PipelineConfig, plugins: PluginSet, *,
                 workload: Sequence[str | os.PathLike[str]] = (),
                 env: Mapping[str, str] | None = None,
                 runtime: Mapping[str, Any] | None = None) -> DecisionKey:
    """The key of ``config``'s decision, measured on ``workload``, with these plugins now.

    ``runtime`` overrides the runtime identity (it is computed with
    :func:`~edge_core.identity.runtime_identity` otherwise, probing the backends).
    """
    identity = (dict(runtime) if runtime is not None else
                runtime_identity(plugins, _backends(config),
                                 interpreters=sorted(_interpreters(config))))
    content = content_parts(config, workload)
    parts = {
        "configuration": identity_digest(configuration_identity(config)),
        "bundles": content["bundles"],
        "workload": content["workload"],
        "environment": identity_digest(environment_identity(config, plugins, env)),
        "runtime": identity_digest(identity),
    }
    return DecisionKey(digest=identity_digest(parts), parts=parts, runtime=identity)


def content_parts(config: PipelineConfig,
                  workload: Sequence[str | os.PathLike[str]] = ()) -> dict[str, str]:
    """The ``bundles`` and ``workload`` parts of :func:`decision_key`, read from disk now.

    What a measurement reads while it runs: a decision is stored only while these are
    still the parts of the key it was measured under (a bundle or a workload file
    rewritten during the measurement would otherwise file it under contents it never saw).
    """
    return {"bundles": identity_digest(bundle_identity(config)),
            "workload": identity_digest({"sources": workload_identity(workload)})}


def gate_key(stage: StageConfig, plugins: PluginSet, *,
             env: Mapping[str, str] | None = None,
             runtime: Mapping[str, Any] | None = None) -> DecisionKey:
    """The key of one candidate's stored load gate: ``stage`` with these plugins now.

    ``stage`` is the candidate as it opens (:meth:`StageConfig.choices`); ``runtime``
    overrides its backend's runtime identity (computed with
    :func:`~edge_core.identity.runtime_identity` otherwise, from the cached probe).
    """
    backend = stage.backend.name
    interpreters = [stage.backend.route.interpreter] if stage.backend.route is not None else []
    identity = (dict(runtime) if runtime is not None else
                runtime_identity(plugins, {backend}, interpreters=interpreters))
    parts = {
        "configuration": identity_digest(stage_identity(stage)),
        "bundles": gate_bundle_part(stage),
        "environment": identity_digest(_declared_env({backend}, plugins, env)),
        "runtime": identity_digest(identity),
    }
    return DecisionKey(digest=identity_digest(parts), parts=parts, runtime=identity)


def gate_bundle_part(stage: StageConfig, sha256: str | None = None) -> str:
    """The ``bundles`` part of :func:`gate_key`: ``stage``'s manifest sha256, read now.

    Or ``sha256``, the manifest's that loaded (what the stage's bundle pin recorded:
    :mod:`edge_core.artifacts.pins`). The opener compares the key's part with the
    loaded one once the stage has loaded: a manifest rewritten in between was not the one
    the key was made of; and a restart's gate is keyed by the bundle that loaded.
    """
    if stage.manifest is None:
        return identity_digest({})
    found = sha256 if sha256 is not None else manifest_sha256(stage.manifest)
    return identity_digest({str(manifest_file(stage.manifest)): found})
