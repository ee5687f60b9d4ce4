"""A request that finds no replica serving waits for a pending restart, bounded and typed.

Real echo workers are SIGKILLed under ``restart = "on-failure"``; a request submitted while
the only replica (or every replica) is down waits — holding its admission slot — and is
served by the restarted worker. Without a pending restart (``never``, ``max_restarts``
spent) it is refused at once; a deadline, a cancel or the stage's ``call_timeout_s``
(without a deadline) ends the wait with a typed error. Every test runs under the leak
fixture of ``conftest.py`` and ends with an empty ledger and a free admission slot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from edge_core.backend import CancelOutcome
from edge_core.config import load_pipeline
from edge_core.errors import DeadlineExceeded, StageClosed
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.runtime import Pipeline, StageState
from edge_core.runtime.errors import RequestCancelled
from edge_core.runtime.stage_runtime import StageRuntime

from .conftest import echo_stage
from .test_faults import gone, wait_for
from .test_replica_restarts import HeldReloads, kill, pid

X = {"x": np.ones((2, 2), np.float32)}


def stage(replicas: int, restart: str, **options: Any) -> dict[str, Any]:
    """Stage ``a``: ``replicas`` preemptible echo workers (y = 2x) with a restart policy."""
    declared = echo_stage("a", backend="echo-preemptible", scale=2.0)
    declared.update(replicas=replicas, restart=restart, **options)
    return declared


@pytest.fixture
def open_held(ledger: ResourceLedger) -> Iterator[Any]:
    """Open a pipeline (admission 2) with the echo plugin and a :class:`HeldReloads`."""
    opened: list[Pipeline] = []

    def make(held: HeldReloads, *stages: dict[str, Any]) -> Pipeline:
        plugins = load_plugins(objects={"faults": held}, env={"EDGE_PLUGINS": "echo"})
        config = load_pipeline({"name": "t", "admission": 2, "stages": list(stages)})
        pipeline = Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()


def down(runtime: StageRuntime, old_pid: int) -> bool:
    """The replica left ``ready`` and its old worker was retired (and is gone)."""
    return (runtime.state is not StageState.READY and runtime.last_retire is not None
            and gone(old_pid, 0.05))


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_request_while_every_replica_restarts_waits_and_is_served_after_the_restart(
    open_held: Any, ledger: ResourceLedger, replicas: int,
) -> None:
    held = HeldReloads()
    pipeline = open_held(held, stage(replicas, "on-failure", restart_backoff_s=0.05))
    victims = {kill(runtime): runtime for runtime in pipeline.stages}
    assert held.reloading.wait(15.0), "no replica was reloaded"
    wait_for(lambda: all(down(r, p) for p, r in victims.items()))
    assert pipeline.health()["replicas"]["a"]["state"] == "unavailable"
    waiting = pipeline.submit(X, deadline_s=30.0)
    time.sleep(0.5)  # it waits (it would have been refused with StageClosed at once before)
    assert not waiting.done()
    assert pipeline.admission.used == 1  # the waiting request holds its admission slot
    plan = pipeline.execution_plan()["stages"]
    assert [(s["state"], s["worker"], s["route"]) for s in plan] == [
        ("restarting", None, None)] * replicas  # no dead worker shown as if it served
    held.release.set()
    with waiting.result() as result:
        np.testing.assert_array_equal(result.outputs["x"], np.full((2, 2), 2.0))
        assert result.final.key.generation == 2
    assert pipeline.admission.used == 0
    plan = pipeline.execution_plan()["stages"]
    pids = [s["worker"]["pid"] for s in plan if s["state"] == "ready"]
    assert pids and not set(pids) & set(victims)
    pipeline.close()
    assert ledger.is_empty()


@pytest.mark.parametrize("policy", [{"restart": "never"},
                                    {"restart": "on-failure", "max_restarts": 0}],
                         ids=["never", "max-restarts-spent"])
def test_without_a_pending_restart_a_request_is_refused_at_once(
    open_held: Any, ledger: ResourceLedger, policy: dict[str, Any],
) -> None:
    held = HeldReloads()
    held.release.set()
    pipeline = open_held(held, stage(1, **policy))
    (only,) = pipeline.stages
    old = kill(only)
    wait_for(lambda: down(only, old) and ledger.is_empty())
    assert only.state is StageState.FAILED and not only.restart_pending()
    shown = pipeline.execution_plan()["stages"][0]
    assert (shown["state"], shown["worker"], shown["route"]) == ("failed", None, None)
    # a deadline far longer than any restart: the refusal is StageClosed, not a wait
    with pytest.raises(StageClosed, match=r"stages\[a\]: no replica serving and no restart "
                                          r"pending: \{'a#0': 'failed'\}"):
        pipeline.run(X, deadline_s=60.0)
    with pytest.raises(StageClosed, match="no restart pending"):
        pipeline.submit(X, deadline_s=60.0).result()
    assert not held.reloading.is_set()  # nothing was restarted
    assert pipeline.admission.used == 0
    pipeline.close()
    assert ledger.is_empty()


def test_a_deadline_shorter_than_the_restart_ends_the_wait_with_deadline_exceeded(
    open_held: Any, ledger: ResourceLedger,
) -> None:
    held = HeldReloads()
    held.release.set()
    pipeline = open_held(held, stage(1, "on-failure", restart_backoff_s=30.0))
    (only,) = pipeline.stages
    old = kill(only)
    wait_for(lambda: down(only, old) and ledger.is_empty())
    assert only.state is StageState.FAILED and only.restart_pending()  # in its backoff
    with pytest.raises(DeadlineExceeded, match=r"stages\[a\]\.in_flight: deadline_s expired "
                                               r"waiting for a replica to come back"):
        pipeline.run(X, deadline_s=0.5)
    # Submission.result() re-raises the request's own DeadlineExceeded (a TimeoutError
    # too), not a "no result within the wait" of its own
    with pytest.raises(DeadlineExceeded, match="waiting for a replica to come back"):
        pipeline.submit(X, deadline_s=0.5).result()
    assert pipeline.admission.used == 0
    assert only.state is StageState.FAILED and not held.reloading.is_set()
    pipeline.close()  # ends the backoff: nothing is restarted after close
    assert ledger.is_empty() and not held.reloading.is_set()


def test_without_a_deadline_the_wait_is_bounded_by_the_stage_call_timeout(
    open_held: Any, ledger: ResourceLedger,
) -> None:
    held = HeldReloads()
    held.release.set()
    pipeline = open_held(held, stage(2, "on-failure", restart_backoff_s=30.0,
                                     call_timeout_s=0.5))
    victims = {kill(runtime): runtime for runtime in pipeline.stages}
    wait_for(lambda: all(down(r, p) for p, r in victims.items()) and ledger.is_empty())
    with pytest.raises(StageClosed, match=r"no replica came back within restart_wait_s "
                                          r"\(the stage's call_timeout_s\): 0\.5 s"):
        pipeline.run(X)
    assert pipeline.admission.used == 0
    pipeline.close()
    assert ledger.is_empty()


def test_a_cancel_during_the_wait_ends_it_with_request_cancelled(
    open_held: Any, ledger: ResourceLedger,
) -> None:
    held = HeldReloads()
    held.release.set()
    pipeline = open_held(held, stage(1, "on-failure", restart_backoff_s=30.0))
    (only,) = pipeline.stages
    old = kill(only)
    wait_for(lambda: down(only, old) and ledger.is_empty())
    waiting = pipeline.submit(X, deadline_s=30.0, request_id="r1")
    time.sleep(0.3)
    assert not waiting.done() and pipeline.admission.used == 1
    assert waiting.cancel() is CancelOutcome.NOT_STARTED  # nothing of it was sent
    with pytest.raises(RequestCancelled, match="cancelled while waiting for stage 'a'"):
        waiting.result()
    wait_for(lambda: pipeline.admission.used == 0)
    assert only.outstanding == 0 and only.slots.used == 0
    pipeline.close()
    assert ledger.is_empty() and not held.reloading.is_set()


def test_a_request_waits_for_a_restart_the_user_runs_by_hand(
    open_held: Any, ledger: ResourceLedger,
) -> None:
    held = HeldReloads()
    pipeline = open_held(held, stage(1, "never"))
    (only,) = pipeline.stages
    old = kill(only)
    wait_for(lambda: down(only, old) and ledger.is_empty())
    manual = threading.Thread(target=only.restart)
    manual.start()
    assert held.reloading.wait(15.0)
    assert only.state is StageState.RESTARTING and only.restart_pending()
    waiting = pipeline.submit(X, deadline_s=30.0)
    time.sleep(0.3)
    assert not waiting.done()
    held.release.set()
    manual.join(15.0)
    with waiting.result() as result:
        assert result.final.key.generation == 2
    assert pid(only) != old
    pipeline.close()
    assert ledger.is_empty()
