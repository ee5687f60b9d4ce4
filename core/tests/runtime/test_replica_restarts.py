"""Each replica of a stage fails, is retired and restarts on its own, with real echo workers.

One replica's worker is SIGKILLed; the survivor keeps serving while the dead one is
retired (verified), its reservation released and — with ``restart = "on-failure"`` —
reserved again, loaded and gated under a new generation, with the stage's backoff and
``max_restarts`` counted per replica. Every test also runs under the leak fixture of
``conftest.py`` (no process, segment or descriptor left) and ends with an empty ledger.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest

from edge_core import hookimpl
from edge_core.config import load_pipeline
from edge_core.errors import ResourceUnavailable, StageClosed
from edge_core.ledger import ResourceLedger
from edge_core.placement import WarmupReport
from edge_core.plugins import load_plugins
from edge_core.runtime import Pipeline, StageState
from edge_core.runtime.errors import NumericsRefused
from edge_core.runtime.stage_runtime import StageRuntime

from .conftest import MiB, OpenPipeline, echo_stage
from .test_faults import gone, wait_for

X = {"x": np.ones((2, 2), np.float32)}


def replicated(restart: str, **policy: Any) -> dict[str, Any]:
    """Stage ``a``: two replicas of the preemptible echo (y = 2x), 256 MiB each."""
    stage = echo_stage("a", backend="echo-preemptible", scale=2.0)
    stage.update(replicas=2, restart=restart, restart_backoff_s=0.0, **policy)
    return stage


def pid(runtime: StageRuntime) -> int:
    return int(str(runtime.loaded.describe()["pid"]))


def kill(runtime: StageRuntime) -> int:
    """SIGKILL the replica's worker; returns its pid."""
    victim = pid(runtime)
    os.kill(victim, signal.SIGKILL)
    return victim


def owners(ledger: ResourceLedger) -> list[str]:
    return sorted(r["owner"] for r in ledger.snapshot()["reservations"])


def serve(pipeline: Pipeline, times: int = 1) -> set[int]:
    """Run ``times`` requests, check each output; the generations that served them."""
    served = set()
    for _ in range(times):
        with pipeline.run(X, deadline_s=10.0) as result:
            np.testing.assert_array_equal(result.outputs["x"], np.full((2, 2), 2.0))
            served.add(result.final.key.generation)
    return served


def idle(runtime: StageRuntime) -> bool:
    """The replica's supervisor is not restarting it (now, or any more)."""
    thread = runtime.restarter._thread
    return thread is None or not thread.is_alive()


class HeldReloads:
    """Fault injection: a reload (generation > 1) waits in ``edge_load`` until released."""

    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.reloading = threading.Event()
        self.release = threading.Event()

    @hookimpl(wrapper=True)
    def edge_load(self, stage: Any) -> Any:
        if stage.generation > 1:
            self.reloading.set()
            self.release.wait(20.0)
        return (yield)


class WrongNumericsOnReload:
    """Fault injection: the warm-up of every reload (generation > 1) misses its reference."""

    EDGE_CONTRACT = "1.0"

    def __init__(self) -> None:
        self.reloaded_pids: list[int] = []

    @hookimpl(wrapper=True)
    def edge_warmup_placement(self, loaded: Any) -> Any:
        report = yield
        if loaded.context.generation == 1:
            return report
        self.reloaded_pids.append(int(loaded.describe()["pid"]))
        assert isinstance(report, WarmupReport)
        return attrs.evolve(report, numerics={"reference": "expected-outputs",
                                              "max_abs_error": 1.0, "normalised_error": 1.0,
                                              "bound": {"max_abs_error": 0.0},
                                              "passed": False})


@pytest.fixture
def open_with(ledger: ResourceLedger) -> Iterator[Any]:
    """Open a pipeline with the echo plugin plus one fault-injection plugin object."""
    opened: list[Pipeline] = []

    def make(faults: object, *stages: dict[str, Any]) -> Pipeline:
        plugins = load_plugins(objects={"faults": faults}, env={"EDGE_PLUGINS": "echo"})
        config = load_pipeline({"name": "t", "stages": list(stages)})
        pipeline = Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()


def test_on_failure_restarts_the_dead_replica_alone_while_the_survivor_serves(
    open_with: Any, ledger: ResourceLedger,
) -> None:
    held = HeldReloads()
    pipeline = open_with(held, replicated("on-failure"))
    first, second = pipeline.stages
    survivor_pid = pid(second)
    old = kill(first)
    assert held.reloading.wait(15.0), "the dead replica was not reloaded"
    # retired (verified: its tree is gone), then reserved again before loading
    assert first.state is StageState.RESTARTING and first.last_retire.verified
    assert gone(old)
    assert owners(ledger) == ["t/a", "t/a#1"]
    assert pipeline.health()["replicas"] == {
        "a": {"declared": 2, "live": 1, "state": "degraded"}}
    plan = pipeline.execution_plan()["stages"]
    assert [(s["replica"], s["state"]) for s in plan] == [(0, "restarting"), (1, "ready")]
    assert all(s["replicas"] == {"declared": 2, "live": 1, "state": "degraded"} for s in plan)
    assert serve(pipeline, 6) == {1}  # the survivor serves throughout the restart ...
    assert first.state is StageState.RESTARTING  # ... which is still going on
    held.release.set()
    wait_for(lambda: first.state is StageState.READY and first.generation == 2)
    assert pid(first) not in (old, survivor_pid) and pid(second) == survivor_pid
    assert serve(pipeline, 8) == {1, 2}  # the restarted replica serves too
    health = pipeline.health()
    assert health["state"] == "ready"
    assert health["replicas"]["a"] == {"declared": 2, "live": 2, "state": "ready"}
    assert {k: (v["generation"], v["restarts"]) for k, v in health["stages"].items()} == {
        "a": (2, 0), "a#1": (1, 0)}  # restarts start over once the replica has served
    assert owners(ledger) == ["t/a", "t/a#1"]  # exactly N reservations after recovery
    assert ledger.reserved("machine:ram") == 2 * 256 * MiB
    summary = pipeline.close()
    assert set(summary) == {"a", "a#1"}
    assert all(s["release"] == "released" for s in summary.values())
    assert ledger.is_empty()


def test_max_restarts_is_counted_per_replica(open_with: Any, ledger: ResourceLedger) -> None:
    free = HeldReloads()
    free.release.set()  # reloads are not held in this test
    pipeline = open_with(free, replicated("on-failure", max_restarts=1))
    first, second = pipeline.stages
    kill(first)
    wait_for(lambda: first.state is StageState.READY and first.generation == 2)
    assert first.restarter.restarts == 1
    before = first.last_retire  # the first worker's retirement
    kill(first)  # a crash loop: it fails again before serving, its one attempt is spent
    wait_for(lambda: first.state is StageState.FAILED and first.generation == 2
             and first.last_retire is not before and idle(first)
             and owners(ledger) == ["t/a#1"])  # the failed replica holds nothing
    assert serve(pipeline, 3) == {1}
    stage_plan = pipeline.execution_plan()["stages"][0]
    assert (stage_plan["state"], stage_plan["restarts"]) == ("failed", 1)
    assert "worker lost" in stage_plan["state_reason"]
    assert stage_plan["replicas"] == {"declared": 2, "live": 1, "state": "degraded"}
    assert stage_plan["reservation"]["token"] is None
    error = pipeline.health()["stages"]["a"]["error"]
    assert (error["type"], error["layer"]) == ("WorkerGone", "worker")
    kill(second)  # the other replica has its own attempt left
    wait_for(lambda: second.state is StageState.READY and second.generation == 2)
    assert first.state is StageState.FAILED
    assert serve(pipeline, 3) == {2}
    assert owners(ledger) == ["t/a#1"]
    pipeline.close()
    assert ledger.is_empty()


def test_with_restart_never_the_survivor_serves_until_no_replica_is_left(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(replicated("never"))
    first, second = pipeline.stages
    kill(first)
    wait_for(lambda: first.last_retire is not None and owners(ledger) == ["t/a#1"])
    assert first.state is StageState.FAILED and first.last_retire.verified
    assert serve(pipeline, 4) == {1}
    health = pipeline.health()
    assert health["state"] == "degraded"
    assert health["replicas"]["a"] == {"declared": 2, "live": 1, "state": "degraded"}
    assert health["stages"]["a"]["state"] == "failed"
    assert health["stages"]["a"]["error"]["layer"] == "worker"
    assert health["stages"]["a#1"]["state"] == "ready"
    assert health["stages"]["a#1"]["error"] is None
    plan = pipeline.execution_plan()["stages"]
    assert [s["state"] for s in plan] == ["failed", "ready"]
    # the failed replica has no live worker: its dead one is not shown as if it served
    assert (plan[0]["worker"], plan[0]["route"]) == (None, None)
    assert plan[1]["worker"]["pid"] == pid(second) and plan[1]["route"] is not None
    kill(second)
    wait_for(lambda: second.last_retire is not None and ledger.is_empty())
    assert second.state is StageState.FAILED
    with pytest.raises(StageClosed, match=r"stages\[a\]: no replica serving"):
        pipeline.run(X)
    assert pipeline.health()["replicas"]["a"] == {"declared": 2, "live": 0,
                                                  "state": "unavailable"}
    assert pipeline.admission.used == 0
    second.restart()  # by hand: reserved, loaded and gated again, alone
    assert owners(ledger) == ["t/a#1"] and serve(pipeline, 2) == {2}
    assert first.state is StageState.FAILED
    pipeline.close()
    assert ledger.is_empty()


def test_a_replica_that_fails_its_gate_on_restart_is_failed_with_nothing_charged(
    open_with: Any, ledger: ResourceLedger,
) -> None:
    faults = WrongNumericsOnReload()
    stage = replicated("on-failure", max_restarts=2)
    stage["restart_backoff_s"] = 0.05
    pipeline = open_with(faults, stage)
    first, second = pipeline.stages
    kill(first)
    wait_for(lambda: len(faults.reloaded_pids) == 2 and first.state is StageState.FAILED
             and idle(first))
    # each attempt's worker was retired and its reservation released; the survivor serves
    assert all(gone(p) for p in faults.reloaded_pids)
    assert owners(ledger) == ["t/a#1"]
    assert serve(pipeline, 3) == {1}
    health = pipeline.health()["stages"]["a"]
    assert health["state"] == "failed" and health["restarts"] == 2
    assert (health["error"]["type"], health["error"]["layer"]) == ("NumericsRefused",
                                                                   "numerics")
    assert "restart 2 of 2 failed: NumericsRefused" in health["reason"]
    assert pipeline.health()["replicas"]["a"]["live"] == 1
    assert second.state is StageState.READY and second.generation == 1
    # the plan's gate is the failed restart's, never the open's that passed
    failed, serving = (s["gate"] for s in pipeline.execution_plan()["stages"])
    assert failed["mode"] == "failed" and failed["note"].startswith(
        "restart's gate failed: NumericsRefused: "), failed
    assert serving["mode"] == "full"
    pipeline.close()
    assert ledger.is_empty()


def no_current_warmup(entry: dict[str, Any]) -> bool:
    """A plan entry that shows no warm-up as its current evidence."""
    return (entry["placement"], entry["numerics"], entry["warmup"], entry["buckets"]) == (
        None, None, None, [])


def test_a_failed_restart_shows_no_warmup_as_current_its_attempt_in_its_gate(
    open_with: Any, ledger: ResourceLedger,
) -> None:
    """A replica whose restart failed its gate: the plan's placement, numerics and
    buckets are not the open's (generation 1, its worker gone) shown as current, and its
    evidence is judged on nothing; what the failed attempt reported is in its gate record,
    named by the generation it tried. The survivor's evidence is its own."""
    faults = WrongNumericsOnReload()
    stage = replicated("never")
    pipeline = open_with(faults, stage)
    first, second = pipeline.stages
    assert second.generation == 1
    opened = pipeline.execution_plan()["stages"][0]
    assert opened["numerics"]["passed"] is True and opened["placement"] is not None
    kill(first)
    wait_for(lambda: first.state is StageState.FAILED and owners(ledger) == ["t/a#1"])
    with pytest.raises(NumericsRefused):
        first.restart()
    assert first.generation == 1 and faults.reloaded_pids and gone(faults.reloaded_pids[0])
    failed, serving = pipeline.execution_plan()["stages"]
    assert failed["generation"] == 1 and failed["state"] == "failed"
    assert no_current_warmup(failed), failed
    assert failed["evidence_basis"] == "no passing numerical check of the example bucket"
    gate = failed["gate"]
    assert (gate["mode"], gate["generation"]) == ("failed", 2)
    assert gate["numerics"]["passed"] is False and gate["numerics"]["max_abs_error"] == 1.0
    assert gate["placement"] == {name: share["nodes"] for name, share
                                 in opened["placement"]["providers"].items()}
    assert (serving["numerics"], serving["placement"]) == (opened["numerics"],
                                                           opened["placement"])
    assert serve(pipeline, 2) == {1}
    pipeline.close()
    assert ledger.is_empty()


def test_a_restart_refused_its_reservation_shows_no_gate_passed(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    """The failed replica's memory went to another owner: its restart is refused before
    anything loads, and the plan's gate says so (not the gate its open passed)."""
    pipeline = open_pipeline(replicated("never"))
    first, second = pipeline.stages
    kill(first)
    wait_for(lambda: first.state is StageState.FAILED and owners(ledger) == ["t/a#1"])
    assert second.state is StageState.READY
    pool = "machine:ram"
    capacity = ledger.capacity(pool)
    assert capacity is not None
    other = ledger.reserve("elsewhere/b", {pool: capacity - ledger.reserved(pool)})
    with pytest.raises(ResourceUnavailable) as caught:
        first.restart()
    entries = pipeline.execution_plan()["stages"]
    failed, serving = (s["gate"] for s in entries)
    assert failed == {"mode": "failed", "generation": 2, "points_checked": 0, "points": 0,
                      "note": "restart failed before its gate: "
                              f"{type(caught.value).__name__}: {caught.value}"}
    assert serving["mode"] == "full" and first.state is StageState.FAILED
    # the open's warm-up (generation 1, its worker gone) is not shown as current evidence
    assert no_current_warmup(entries[0]) and not no_current_warmup(entries[1])
    assert serve(pipeline, 2) == {1}
    ledger.release(other, verified=True)
    first.restart()  # the memory is back: a full gate again
    entry = pipeline.execution_plan()["stages"][0]
    assert entry["gate"]["mode"] == "full" and entry["generation"] == 2
    assert entry["numerics"]["passed"] is True and entry["buckets"] == entries[1]["buckets"]
    assert serve(pipeline, 4) == {1, 2}
    pipeline.close()
    assert ledger.is_empty()

