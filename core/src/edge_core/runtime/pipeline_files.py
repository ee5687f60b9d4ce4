"""Pipeline files: reading one, and opening it with the plugins and the ledger it needs.

:func:`open_pipeline` is the whole path from a file to a serving pipeline
(:func:`load_config`, the plugins the configuration names, :func:`default_ledger`,
:meth:`Pipeline.open <edge_core.runtime.pipeline.Pipeline.open>`); :func:`shared_ledger`
is the one ledger several pipelines served together share (``edge serve``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from edge_core.binding import backend_table
from edge_core.config import (
    InvalidConfigError,
    load_pipeline,
    load_pyproject_pipeline,
    pyproject_name_required,
)
from edge_core.config.model import PipelineConfig
from edge_core.config.structure import join_path, name_stages
from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool, observe_host_pools
from edge_core.runtime.opener import PROBE_TIMEOUT_S
from edge_core.runtime.pipeline import Pipeline
from edge_core.selection.workload import Workload

__all__ = ["checking_ledger", "default_ledger", "load_config", "open_pipeline",
           "refuse_unknown_pools", "shared_ledger"]


def load_config(path: str | os.PathLike[str], name: str | None = None) -> PipelineConfig:
    """Read a pipeline file, or ``[tool.edge.pipelines.<name>]`` from a pyproject.toml."""
    file = Path(path)
    if file.name == "pyproject.toml":
        if not name:
            raise pyproject_name_required(file, "name")
        return load_pyproject_pipeline(file, name)
    return load_pipeline(file)


def default_ledger(config: PipelineConfig, plugins: PluginSet) -> ResourceLedger:
    """A ledger over the host's pools plus the device pools the stages' backends report.

    Every candidate backend of a stage counts, so a fallback's pools are known too.

    Ceilings come from the configuration; a ceiling above an observed total is refused.
    """
    return shared_ledger([config], plugins)


def shared_ledger(configs: Sequence[PipelineConfig], plugins: PluginSet) -> ResourceLedger:
    """One ledger for several pipelines served together (``edge serve``).

    The pools are the host's plus those the backends of every pipeline's stages report;
    each pool's ceiling is the smallest any of the pipelines declares, so no pipeline can
    loosen a limit another relies on.
    """
    # the pools alone: the CPU's name (probe_host's, which runs `uname -p`) is not needed
    pools = {pool.name: pool for pool in observe_host_pools()}
    table = backend_table(plugins)
    names = {c.backend.name for config in configs for s in config.stages for c in s.choices()}
    owners = {table[name][1] for name in names if name in table}
    for owner in sorted(owners):
        answer = plugins.probe(owner, timeout_s=PROBE_TIMEOUT_S)
        for report in answer.result or ():
            for name, total in getattr(report, "pool_totals", {}).items():
                pools.setdefault(name, Pool(name=name, total=total,
                                            observed_by=f"probe:{report.backend}"))
    ceilings: dict[str, int] = {}
    for config in configs:
        for pool, nbytes in config.ceilings().items():
            ceilings[pool] = min(nbytes, ceilings.get(pool, nbytes))
    return ResourceLedger(pools.values(), ceilings)


def checking_ledger(config: PipelineConfig, plugins: PluginSet) -> ResourceLedger:
    """The ledger a check of the file's pools needs, asking a backend only if it must.

    When every pool the file names — its ceilings, and the demands of its stages without
    candidates (those :func:`refuse_unknown_pools` checks) — is one of the host's, the
    host's pools and the ceilings decide both checks alone: no backend's probe is asked
    (a command that opens the pipeline afterwards probes then, as the open needs). Else it
    is :func:`default_ledger`'s, with the pools the backends' probes report.
    """
    host = observe_host_pools()
    ceilings = config.ceilings()
    named = set(ceilings) | {pool for stage in config.stages if not stage.candidates
                             for pool in stage.resources.demands}
    if named <= {pool.name for pool in host}:
        return ResourceLedger(host, ceilings)
    return default_ledger(config, plugins)


def refuse_unknown_pools(config: PipelineConfig, ledger: ResourceLedger) -> None:
    """Refuse a demand of a stage without candidates on a pool ``ledger`` does not know.

    Such a stage has one backend and nothing to fall back to: the pool is the file's
    problem, named at its path (``stages[0].resources.demands["machine:rma"]``) before
    anything opens. A stage with candidates is left to its candidates: one whose pool is
    unknown is refused as that candidate's (its backend may be absent from this machine,
    and so its pools), and the next may serve.

    Raises:
        UnknownPool: the one such demand (the closest known pool named).
        InvalidConfigError: several, every one listed.

    """
    problems: list[ConfigError] = []
    for index, stage in enumerate(config.stages):
        if stage.candidates:
            continue
        for pool in stage.resources.demands:
            try:
                ledger.require_pool(pool, join_path(f"stages[{index}].resources.demands",
                                                    pool))
            except ConfigError as problem:
                problems.append(name_stages(problem, [s.id for s in config.stages]))
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InvalidConfigError(problems)


def open_pipeline(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
    workload: Workload | None = None,
    remeasure: bool = False,
    full_gates: bool = False,
) -> Pipeline:
    """Load the configuration and the plugins it needs, build the ledger and open it.

    ``workload``, ``remeasure`` and ``full_gates`` go to :meth:`Pipeline.open` (a
    measured selection times ``workload``; default: the pipeline's own, else the
    bundles' examples; ``full_gates``: no stored gate reused).
    """
    config = load_config(path, name)
    plugins = load_plugins(local_modules=config.plugins)
    ledger = default_ledger(config, plugins)
    return Pipeline.open(config, plugins, ledger, progress=progress, workload=workload,
                         remeasure=remeasure, full_gates=full_gates)
