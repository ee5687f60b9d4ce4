"""A pipeline's stages are started from the warm pool: forked, supervised, verified.

Real echo workers through ``Pipeline.open``: the execution plan says how each worker
started; the tree is controller → zygote → supervisor → worker, and the worker answers.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import psutil
import pytest

from edge_core.host.start_path import FORKED, SPAWNED
from edge_core.host.warm_pool import POOL_ENV

from .conftest import OpenPipeline, echo_stage

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(os, "pidfd_open")),
    reason="the warm pool needs Linux with pidfd_open",
)


def test_echo_stages_are_forked_by_the_zygote_and_verified(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a"), echo_stage("b", scale=3.0,
                             transform="edge_echo.transforms:passthrough"))
    stages = pipeline.execution_plan()["stages"]
    zygotes = set()
    for stage in stages:
        worker = stage["worker"]
        assert worker["start"]["kind"] == FORKED, worker["start"]
        supervisor = psutil.Process(worker["pid"]).parent()
        assert supervisor is not None and os.getsid(supervisor.pid) == supervisor.pid
        zygote = supervisor.parent()
        assert zygote is not None and zygote.pid == worker["start"]["zygote"]
        assert zygote.ppid() == os.getpid()
        zygotes.add(zygote.pid)
    assert len(zygotes) == 1  # one environment, one zygote
    x = np.ones((2, 2), np.float32)
    with pipeline.run({"x": x}) as result:
        np.testing.assert_array_equal(result.outputs["x"], x * 2 * 3)


def test_echo_stages_are_spawned_with_the_pool_off_and_say_so(
        open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_ENV, "0")
    pipeline = open_pipeline(echo_stage("a"))
    (stage,) = pipeline.execution_plan()["stages"]
    assert stage["worker"]["start"] == {"kind": SPAWNED, "reason": f"{POOL_ENV}=0",
                                        "zygote": None, "forks": None}
    supervisor = psutil.Process(stage["worker"]["pid"]).parent()
    assert supervisor is not None and supervisor.ppid() == os.getpid()
