"""Zygotes started as a pipeline opens, ahead of its first worker starts.

A warm pool's zygote (:mod:`edge_core.host.warm_pool`) is started by the first worker
start of its key; the first open of a controller would pay its start (an interpreter
and the worker's imports) on its critical path. :func:`start_early_zygotes`, called as
:meth:`Pipeline.open <edge_core.runtime.pipeline.Pipeline.open>` begins, starts the
zygote of each key the pipeline's starts are expected to have, without waiting: it
imports while the controller resolves, plans, reserves and verifies the bundles, and
the first start forks from it (waiting for its ``ready`` only if it is not ready yet).

The key of a start is only known to the start (its backend's variables and declared
names go into the worker's environment); the key expected here is that of a stage
(or candidate) whose route is unset or names the controller's own interpreter in its
own domain: the controller's interpreter, and the worker environment of
:func:`~edge_core.host.environment.worker_environment` with the route's variables and
``python_path``, no declared names, the heap variables
(:func:`~edge_contracts.heap.eager_process_environment`) and ``onnxruntime`` preloaded
(:data:`EXPECTED_PRELOAD`), which is what the ONNX Runtime backends start their
workers with. A stage whose backend starts another way
forks from a zygote of its own key, started by its start as before. A stage whose
route is another interpreter or domain expects no zygote: a pipeline of such stages
starts none, nor does one with the pool off (``EDGE_WARM_POOL=0``).

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

__all__ = ["EXPECTED_PRELOAD", "end_early_zygotes", "start_early_zygotes"]

EXPECTED_PRELOAD = ("onnxruntime",)
"""The preload of the key expected (the ONNX Runtime backends' ``worker_preload``)."""


def _sections(config: PipelineConfig) -> Iterator[BackendSection]:
    for stage in config.stages:
        yield stage.backend
        for candidate in stage.candidates:
            yield candidate.backend


def start_early_zygotes(config: PipelineConfig, started: list[Zygote]) -> None:
    """Start the zygotes this pipeline's worker starts are expected to fork from.

    Appends those started by this call to ``started`` as each starts (none where the
    pool is off, every route is another interpreter, or the zygotes already run), for
    :func:`end_early_zygotes`: an interrupt between two keys leaves none unlisted.
    """
    keys = set()
    domain = controller_domain().value
    for section in _sections(config):
        route = section.route
        if route is not None and (route.interpreter != sys.executable or route.os_domain
                                  not in (None, domain)):
            continue
        env = worker_environment(
            os.environ,
            values=eager_process_environment(),
            route_env={} if route is None else dict(route.env),
            python_path=() if route is None else route.python_path,
        )
        key = pool_key(sys.executable, env, EXPECTED_PRELOAD)
        if key in keys:
            continue
        keys.add(key)
        zygote = start_early(sys.executable, env, foreign=False, supervised=SUPERVISED,
                             preload=EXPECTED_PRELOAD)
        if zygote is not None:
            started.append(zygote)


def end_early_zygotes(zygotes: Sequence[Zygote]) -> None:
    """End those of ``zygotes`` that no worker start was given (see the module docstring)."""
    if zygotes:
        end_unused(zygotes)
