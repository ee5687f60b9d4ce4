"""Candidate backends: tried in order at open and at restart, each refusal recorded and undone.

These are ``selection = "first-passing"`` pipelines (test_measured_selection.py has the
measured ones, the default).

Real echo workers (and the real ort-directml probe, which says "unavailable" off
Windows); the autouse ``no_leaks`` fixture checks processes and shared-memory segments
after every test, and each test checks the ledger after every refusal.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import ConfigError, PlacementRefused
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import CandidatesRefused, Pipeline, StageState
from edge_core.testing.leaks import descendants

from .conftest import GiB, MiB, echo_stage


def _candidate(backend: str = "echo", *, demand: int | None = None,
               placement: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"backend": {"name": backend, "options": options}}
    if demand is not None:
        candidate["resources"] = {"demands": {"machine:ram": demand}}
    if placement is not None:
        candidate["placement"] = placement
    return candidate


def _stage(stage_id: str, *candidates: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": stage_id, "candidates": list(candidates), **extra}


def _open(plugins: PluginSet, ledger: ResourceLedger, *stages: dict[str, Any],
          progress: list[str] | None = None) -> Pipeline:
    config = load_pipeline({"name": "c", "selection": "first-passing", "stages": list(stages)})
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0,
                         progress=None if progress is None else progress.append)


def _tries(pipeline: Pipeline, stage: int = 0) -> list[tuple[str, str, str | None]]:
    plan = pipeline.execution_plan()["stages"][stage]["candidates"]
    assert [c["outcome"] for c in plan].count("chosen") == 1
    return [(c["backend"], c["outcome"], c["layer"]) for c in plan]


def _children() -> set[int]:
    return {p.pid for p in descendants()}  # the warm pool's zygote is the pool's


def test_a_candidate_unavailable_at_probe_falls_back_to_the_next(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger,
                     _stage("a", _candidate("ort-directml"), _candidate(scale=2.0)))
    try:
        assert _tries(pipeline) == [("ort-directml", "refused", "backend"),
                                    ("echo", "chosen", None)]
        refusal = pipeline.execution_plan()["stages"][0]["candidates"][0]["reason"]
        assert "stages[0].candidates[0].backend.name (stage 'a'): unavailable" in refusal
        x = np.ones((2, 3), dtype=np.float32)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_array_equal(result.outputs["x"], x * 2)
        assert pipeline.execution_plan()["stages"][0]["backend"] == "echo"
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_a_candidate_refused_at_placement_is_retired_and_released_before_the_next(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    seen: list[str] = []
    before = _children()
    pipeline = _open(plugins, ledger, _stage(
        "a",
        _candidate("echo-preemptible", provider="cuda", placement={"target": "numpy"}),
        _candidate(scale=3.0),
    ), progress=seen)
    try:
        assert _tries(pipeline) == [("echo-preemptible", "refused", "placement"),
                                    ("echo", "chosen", None)]
        # one worker (the chosen one) runs; the refused one was retired
        assert len(_children() - before) >= 1
        assert [t.owner for t in ledger.holdings()] == ["c/a"]
        assert ledger.reserved("machine:ram") == 256 * MiB  # never both candidates at once
        assert any("refused at placement" in line for line in seen)
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_a_candidate_refused_by_numerics_falls_back(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger,
                     _stage("a", _candidate(wrong_numerics=True), _candidate(scale=2.0)))
    try:
        assert _tries(pipeline) == [("echo", "refused", "numerics"), ("echo", "chosen", None)]
        assert "max_abs_error=1.0" in pipeline.execution_plan()["stages"][0]["candidates"][0][
            "reason"]
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_a_candidate_above_its_demand_is_refused_at_memory(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger, _stage(
        "a", _candidate(demand=64 * MiB, allocate_mb=96), _candidate(demand=512 * MiB)))
    try:
        assert _tries(pipeline) == [("echo", "refused", "memory"), ("echo", "chosen", None)]
        assert "observed peak" in pipeline.execution_plan()["stages"][0]["candidates"][0][
            "reason"]
        assert ledger.reserved("machine:ram") == 512 * MiB
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_a_candidate_that_does_not_fit_is_refused_at_admission(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger,
                     _stage("a", _candidate(demand=5 * GiB), _candidate(demand=1 * GiB)))
    try:
        assert _tries(pipeline) == [("echo", "refused", "admission"), ("echo", "chosen", None)]
        assert ledger.reserved("machine:ram") == 1 * GiB
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_a_later_stage_falls_back_under_what_the_earlier_one_holds(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(
        plugins, ledger,
        echo_stage("a", demand=3 * GiB),
        _stage("b", _candidate(demand=2 * GiB), _candidate(demand=512 * MiB),
               input_transform="edge_echo.transforms:passthrough"),
    )
    try:
        assert _tries(pipeline, 0) == [("echo", "chosen", None)]
        assert _tries(pipeline, 1) == [("echo", "refused", "admission"),
                                       ("echo", "chosen", None)]
        assert ledger.reserved("machine:ram") == 3 * GiB + 512 * MiB
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_all_candidates_refused_is_one_error_listing_each_and_leaves_nothing(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    before = _children()
    with pytest.raises(CandidatesRefused) as info:
        _open(plugins, ledger,
              echo_stage("first", scale=2.0),
              _stage("a", _candidate("ort-directml"), _candidate(demand=8 * GiB),
                     _candidate("echo-preemptible", provider="cuda",
                                placement={"target": "numpy"}),
                     _candidate(wrong_numerics=True),
                     input_transform="edge_echo.transforms:passthrough"))
    error = info.value
    assert error.stage_id == "a"
    assert [(r["backend"], r["layer"]) for r in error.refusals] == [
        ("ort-directml", "backend"), ("echo", "admission"),
        ("echo-preemptible", "placement"), ("echo", "numerics")]
    message = str(error)
    assert message.startswith("stages[a].candidates: every candidate was refused: ")
    assert message.count(" refused at ") == 4
    assert ledger.is_empty()  # the opened first stage was unwound too
    assert not ledger.quarantined()
    assert _children() <= before


def test_a_stage_without_candidates_keeps_its_own_error(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "c", "stages": [
        {**echo_stage("a", provider="cuda"), "placement": {"target": "numpy"}},
        _stage("b", _candidate(), input_transform="edge_echo.transforms:passthrough")]})
    with pytest.raises(PlacementRefused):
        Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)
    assert ledger.is_empty()


def test_restart_retries_the_candidates_in_order(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger,
                     _stage("a", _candidate("ort-directml"), _candidate(scale=2.0)))
    try:
        stage = pipeline.stage("a")
        first = stage.generation
        stage.restart()
        assert stage.generation == first + 1
        assert _tries(pipeline) == [("ort-directml", "refused", "backend"),
                                    ("echo", "chosen", None)]
        assert [t.owner for t in ledger.holdings()] == ["c/a"]
        x = np.ones((1, 2), dtype=np.float32)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_array_equal(result.outputs["x"], x * 2)
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_restart_retires_a_refused_candidate_again_before_the_next_serves(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger, _stage(
        "a", _candidate(wrong_numerics=True, demand=1 * GiB),
        _candidate("echo-preemptible", scale=2.0, demand=512 * MiB)))
    try:
        stage = pipeline.stage("a")
        old_pid = pipeline.execution_plan()["stages"][0]["worker"]["pid"]
        stage.restart()
        plan = pipeline.execution_plan()["stages"][0]
        assert _tries(pipeline) == [("echo", "refused", "numerics"),
                                    ("echo-preemptible", "chosen", None)]
        assert plan["backend"] == "echo-preemptible" and plan["generation"] == 2
        assert plan["worker"]["pid"] != old_pid
        assert ledger.reserved("machine:ram") == 512 * MiB  # the refused 1 GiB went back
        assert not ledger.quarantined()
        x = np.ones((1, 2), dtype=np.float32)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_array_equal(result.outputs["x"], x * 2)
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_an_automatic_restart_retries_the_candidates_in_order(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    pipeline = _open(plugins, ledger, _stage(
        "a", _candidate("ort-directml"), _candidate(wrong_numerics=True),
        _candidate(scale=2.0), restart="on-failure", restart_backoff_s=0.0))
    try:
        stage = pipeline.stage("a")
        old = int(str(stage.loaded.describe()["pid"]))
        os.kill(old, signal.SIGKILL)
        end = time.monotonic() + 30.0
        while not (stage.state is StageState.READY and stage.generation == 2):
            assert time.monotonic() < end, f"not restarted: {stage.state}"
            time.sleep(0.05)
        assert _tries(pipeline) == [("ort-directml", "refused", "backend"),
                                    ("echo", "refused", "numerics"), ("echo", "chosen", None)]
        assert int(str(stage.loaded.describe()["pid"])) != old
        assert ledger.reserved("machine:ram") == 256 * MiB and not ledger.quarantined()
    finally:
        pipeline.close()
    assert ledger.is_empty()


@pytest.mark.parametrize(
    ("stage", "path"),
    [
        (_stage("a", {"backend": {"name": "not a name"}}), "stages[0].candidates[0].backend.name"),
        (_stage("a", _candidate(), {"backend": {"name": "bad name!"}}),
         "stages[0].candidates[1].backend.name"),
        (_stage("a"), "stages[0].candidates"),
        ({**_stage("a", _candidate()), "backend": {"name": "echo"}}, "stages[0].backend"),
        (_stage("a", {"backend": {"name": "echo"}, "placement": {"min_fraction_on_target": 2}}),
         "stages[0].candidates[0].placement.min_fraction_on_target"),
    ],
)
def test_candidate_configuration_errors_name_the_path(stage: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_pipeline({"name": "c", "stages": [stage]})
    assert info.value.path == path
    assert all(not p.path.startswith("stages[0].backend.")
               for p in getattr(info.value, "problems", ()))


def _route(name: str, interpreter: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "interpreter": interpreter, **extra}


def test_a_candidate_whose_worker_cannot_start_is_refused_at_worker_start(
    plugins: PluginSet, ledger: ResourceLedger, tmp_path: Any
) -> None:
    (tmp_path / "broken_entry.py").write_text('raise RuntimeError("broken at import")\n')
    exits = tmp_path / "exits"
    exits.write_text("#!/bin/sh\nexit 3\n")
    exits.chmod(0o755)
    before = _children()
    seen: list[str] = []
    broken = {"backend": {"name": "echo", "route": _route(
        "broken", sys.executable, entry="broken_entry:make_handler",
        python_path=[str(tmp_path)])}, "resources": {"demands": {"machine:ram": 3 * GiB}}}
    gone = {"backend": {"name": "echo-preemptible", "route": _route("gone", str(exits))},
            "resources": {"demands": {"machine:ram": 3 * GiB}}}
    pipeline = _open(plugins, ledger, _stage("a", broken, gone, _candidate(scale=2.0)),
                     progress=seen)
    try:
        assert _tries(pipeline) == [("echo", "refused", "worker-start"),
                                    ("echo-preemptible", "refused", "worker-start"),
                                    ("echo", "chosen", None)]
        reasons = [c["reason"] for c in pipeline.execution_plan()["stages"][0]["candidates"]]
        assert "BootstrapRefused" in reasons[0] and "broken at import" in reasons[0]
        assert "BootstrapRefused" in reasons[1]
        # the refused candidates' 3 GiB each went back before the next was reserved
        assert ledger.reserved("machine:ram") == 256 * MiB and not ledger.quarantined()
        assert len(_children() - before) >= 1
        x = np.ones((1, 2), dtype=np.float32)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_array_equal(result.outputs["x"], x * 2)
        assert sum("refused at worker-start" in line for line in seen) == 2
    finally:
        pipeline.close()
    assert ledger.is_empty()
    assert _children() <= before
