"""Zygotes started as a pipeline opens, ahead of its first worker starts.

A warm pool's zygote (:mod:`edge_core.host.warm_pool`) is started by the first worker
start of its key; the first open of a controller would pay its start (an interpreter
and the worker's imports) on its critical path. :func:`start_early_zygotes`, called as
:meth:`Pipeline.open <edge_core.runtime.pipeline.Pipeline.open>` begins, starts the
zygote of each key the pipeline's starts are expected to have, without waiting: it
imports while the controller resolves, plans, reserves and verifies the bundles, and
the first start forks from it (waiting for its ``ready`` only if it is not ready yet).

The key of a start is only known to the start (its backend's variables go into the
worker's environment). A backend declares where it is known before (``BackendInfo``'s
``worker_preload``: its workers start with the host's worker environment and nothing
set of their own, the ONNX Runtime backends and the echo test backend): the key
expected for its stage (or candidate) whose route is unset or names the controller's
own interpreter in its own domain is the controller's interpreter, the worker
environment of :func:`~edge_core.host.environment.worker_environment` with the
backend's declared names, the heap variables
(:func:`~edge_contracts.heap.eager_process_environment`) and the route's variables and
``python_path``, and the declared preload. A backend that declares none (vLLM sets
variables of its own) gets a zygote of its own key at its first start, as before; so
does a stage whose route is another interpreter or domain, and nothing is started
ahead with the pool off (``EDGE_WARM_POOL=0``).

:func:`end_early_zygotes` ends those no start was given: at the end of an open that
failed (nothing of the open is left) and of one that succeeded (a key expected wrongly
leaves no idle process).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

from edge_contracts.heap import eager_process_environment
from edge_core.config.model import BackendSection, PipelineConfig
from edge_core.host.bootstrap import SUPERVISED
from edge_core.host.environment import worker_environment
from edge_core.host.routes import controller_domain
from edge_core.host.warm_pool import Zygote, end_unused, pool_key, start_early
from edge_core.plugins import PluginSet

__all__ = ["end_early_zygotes", "start_early_zygotes"]


def _sections(config: PipelineConfig) -> Iterator[BackendSection]:
    for stage in config.stages:
        yield stage.backend
        for candidate in stage.candidates:
            yield candidate.backend


def start_early_zygotes(config: PipelineConfig, plugins: PluginSet,
                        started: list[Zygote]) -> None:
    """Start the zygotes this pipeline's worker starts are expected to fork from.

    Appends those started by this call to ``started`` as each starts (none where the
    pool is off, no backend of its stages declares its workers' preload, every route is
    another interpreter, or the zygotes already run), for :func:`end_early_zygotes`: an
    interrupt between two keys leaves none unlisted.
    """
    keys = set()
    domain = controller_domain().value
    for section in _sections(config):
        known = plugins.backends.get(section.name)
        if known is None or known[0].worker_preload is None:
            continue  # its workers' key is not declared: its first start starts it
        info = known[0]
        preload = tuple(info.worker_preload or ())
        route = section.route
        if route is not None and (route.interpreter != sys.executable or route.os_domain
                                  not in (None, domain)):
            continue
        env = worker_environment(
            os.environ,
            declared=info.env_names,
            values=eager_process_environment(),
            route_env={} if route is None else dict(route.env),
            python_path=() if route is None else route.python_path,
        )
        key = pool_key(sys.executable, env, preload)
        if key in keys:
            continue
        keys.add(key)
        zygote = start_early(sys.executable, env, foreign=False, supervised=SUPERVISED,
                             preload=preload)
        if zygote is not None:
            started.append(zygote)


def end_early_zygotes(zygotes: Sequence[Zygote]) -> None:
    """End those of ``zygotes`` that no worker start was given (see the module docstring)."""
    if zygotes:
        end_unused(zygotes)
