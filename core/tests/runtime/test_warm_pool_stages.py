"""A pipeline's stages are started from the warm pool: forked, supervised, verified.

Real echo workers through ``Pipeline.open``: the execution plan says how each worker
started; the tree is controller → zygote → supervisor → worker, and the worker answers.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import psutil
import pytest

from edge_contracts.heap import HEAP_ENV
from edge_core.config import load_pipeline
from edge_core.errors import ResourceUnavailable
from edge_core.host import warm_pool
from edge_core.host.start_path import FORKED, SPAWNED
from edge_core.host.warm_pool import POOL_ENV, pool_processes
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline, early_zygotes
from edge_core.runtime.early_zygotes import start_early_zygotes
from edge_core.testing.leaks import descendants

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


@pytest.fixture
def room() -> None:
    """No zygote of this process serves: a zygote started ahead never closes one."""
    warm_pool.close_pool()


def _fresh_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker environment no zygote of this test process has (LANGUAGE is passed)."""
    monkeypatch.setenv("LANGUAGE", f"early-{uuid.uuid4().hex}")


def test_the_zygote_starts_as_the_open_begins_and_the_first_start_forks_from_it(
        room: None, plugins: PluginSet, ledger: ResourceLedger,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_key(monkeypatch)
    before = pool_processes()
    seen: list[frozenset[int]] = []

    def progress(line: str) -> None:
        if line.startswith("loading stage") and not seen:  # before any worker's start
            seen.append(pool_processes() - before)

    config = load_pipeline({"name": "early", "stages": [echo_stage("a")]})
    pipeline = Pipeline.open(config, plugins, ledger, progress=progress)
    try:
        (early,) = seen[0]  # started by the open, before its first start
        (stage,) = pipeline.execution_plan()["stages"]
        assert stage["worker"]["start"] == {"kind": FORKED, "reason": None, "zygote": early,
                                            "forks": 1}
        x = np.ones(3, np.float32)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_array_equal(result.outputs["x"], x * 2)
    finally:
        pipeline.close()
    assert early in pool_processes()  # it serves the next starts of its key


def test_a_refused_open_leaves_no_zygote_it_started(
        room: None, plugins: PluginSet, ledger: ResourceLedger,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_key(monkeypatch)
    before_pool, before = pool_processes(), descendants()
    config = load_pipeline({"name": "big", "stages": [echo_stage("a", demand=1 << 50)]})
    with pytest.raises(ResourceUnavailable):
        Pipeline.open(config, plugins, ledger)
    assert pool_processes() == before_pool
    assert descendants() == before
    assert ledger.is_empty()


def test_a_zygote_started_for_a_key_no_start_had_ends_with_the_open(
        room: None, plugins: PluginSet, ledger: ResourceLedger,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the backend's declaration says its workers preload a module its stage's starts do
    # not ask for: the key expected is not the starts'
    _fresh_key(monkeypatch)
    info, owner = plugins.backends["echo"]
    monkeypatch.setitem(plugins.backends, "echo", (attrs.evolve(info, worker_preload=["json"]),
                                                   owner))
    before = pool_processes()
    seen: list[frozenset[int]] = []
    config = load_pipeline({"name": "other", "stages": [echo_stage("a")]})
    pipeline = Pipeline.open(
        config, plugins, ledger,
        progress=lambda line: seen.append(pool_processes() - before) if not seen else None)
    try:
        (expected,) = seen[0]
        (stage,) = pipeline.execution_plan()["stages"]
        assert stage["worker"]["start"]["kind"] == FORKED
        assert stage["worker"]["start"]["zygote"] != expected
        assert pool_processes() - before == {stage["worker"]["start"]["zygote"]}
        assert not psutil.pid_exists(expected) or psutil.Process(expected).ppid() != os.getpid()
    finally:
        pipeline.close()


def test_under_the_eager_heap_the_first_start_forks_from_the_zygote_started_ahead(
        room: None, plugins: PluginSet, ledger: ResourceLedger,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the heap variables are in the declared key and in the echo stage's own starts
    _fresh_key(monkeypatch)
    monkeypatch.setenv(HEAP_ENV, "eager")
    before = pool_processes()
    seen: list[frozenset[int]] = []
    config = load_pipeline({"name": "eager", "stages": [echo_stage("a")]})
    pipeline = Pipeline.open(
        config, plugins, ledger,
        progress=lambda line: seen.append(pool_processes() - before) if not seen else None)
    try:
        (early,) = seen[0]
        (stage,) = pipeline.execution_plan()["stages"]
        assert stage["worker"]["start"]["zygote"] == early, stage["worker"]["start"]
    finally:
        pipeline.close()


def test_no_zygote_is_started_for_another_interpreter_an_undeclared_key_or_the_pool_off(
        plugins: PluginSet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh_key(monkeypatch)
    other = tmp_path / "python3"
    other.symlink_to(sys.executable)  # another path: another interpreter to the pool
    foreign = load_pipeline({"name": "f", "stages": [{
        "id": "a", "backend": {"name": "echo",
                               "route": {"name": "other", "interpreter": str(other)}}}]})
    started: list[warm_pool.Zygote] = []
    start_early_zygotes(foreign, plugins, started)
    assert started == []
    own = load_pipeline({"name": "o", "stages": [echo_stage("a")]})
    before = pool_processes()
    info, owner = plugins.backends["echo"]  # a backend that declares no worker preload
    monkeypatch.setitem(plugins.backends, "echo", (attrs.evolve(info, worker_preload=None),
                                                   owner))
    start_early_zygotes(own, plugins, started)
    assert started == []
    monkeypatch.setitem(plugins.backends, "echo", (info, owner))
    monkeypatch.setenv(POOL_ENV, "0")
    start_early_zygotes(own, plugins, started)
    assert started == []
    assert pool_processes() == before


THREADED = """
import threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
"""


def test_a_key_whose_zygote_never_got_ready_is_spawned_from_then_on(
        room: None, plugins: PluginSet, ledger: ResourceLedger,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The route's sitecustomize starts a thread: its zygote refuses to serve. The first
    # open's start finds that out and is spawned; later opens start no zygote for it
    # (each once started one ahead, and its start waited for its refusal).
    _fresh_key(monkeypatch)
    (tmp_path / "sitecustomize.py").write_text(THREADED)
    made: list[warm_pool.Zygote] = []

    class Counted(warm_pool.Zygote):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(warm_pool, "Zygote", Counted)
    config = load_pipeline({"name": "threads", "stages": [{
        "id": "a", "backend": {"name": "echo", "route": {
            "name": "threads", "interpreter": sys.executable,
            "python_path": [str(tmp_path)]}}}]})
    for _ in range(3):
        with Pipeline.open(config, plugins, ledger) as pipeline:
            (stage,) = pipeline.execution_plan()["stages"]
            start = stage["worker"]["start"]
            assert start["kind"] == SPAWNED and "threads: 2 running" in start["reason"], start
            x = np.ones(3, np.float32)
            with pipeline.run({"x": x}) as result:
                np.testing.assert_array_equal(result.outputs["x"], x * 2)
    assert len(made) == 1
    assert ledger.is_empty()


def test_ctrl_c_between_two_keys_zygotes_leaves_neither_running(
        room: None, plugins: PluginSet, ledger: ResourceLedger,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_key(monkeypatch)
    calls: list[int] = []
    start = early_zygotes.start_early

    def interrupted_at_the_second(*args: Any, **kwargs: Any) -> warm_pool.Zygote | None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # a Ctrl-C as the second key's zygote would start
        return start(*args, **kwargs)

    monkeypatch.setattr(early_zygotes, "start_early", interrupted_at_the_second)

    def stage(name: str) -> dict[str, Any]:
        return {"id": name, "backend": {"name": "echo", "route": {
            "name": name, "interpreter": sys.executable, "env": {"EDGE_TEST_KEY": name}}}}

    second = stage("b")
    second["input_transform"] = "edge_echo.transforms:passthrough"
    config = load_pipeline({"name": "two-keys", "stages": [stage("a"), second]})
    before_pool, before = pool_processes(), descendants()
    with pytest.raises(KeyboardInterrupt):
        Pipeline.open(config, plugins, ledger)
    assert len(calls) == 2
    assert pool_processes() == before_pool
    assert descendants() == before
    assert ledger.is_empty()
