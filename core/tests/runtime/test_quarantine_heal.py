"""A quarantined reservation heals: released by restart(), close() or a sweep once every
process recorded with it is verifiably gone (PID plus creation time), never before."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from edge_core import hookimpl
from edge_core.config import load_pipeline
from edge_core.host.identity import ProcessIdentity
from edge_core.host.retire import RetireOutcome
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.runtime import Pipeline

from .conftest import MiB, echo_stage


class Unverified:
    """Fault injection: retirement reported unverified, naming the real tree plus
    ``extra`` (a live bystander stands for a process that outlived the deadline)."""

    EDGE_CONTRACT = "1.0"

    def __init__(self, extra: tuple[ProcessIdentity, ...] = ()) -> None:
        self.extra = extra

    @hookimpl(wrapper=True)
    def edge_retire(self, loaded: object, deadline_s: float) -> object:
        real = yield
        return RetireOutcome(verified=False, reason="injected: deadline passed",
                             survivors=self.extra, tree=(*real.tree, *self.extra))


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _open(ledger: ResourceLedger, hooks: Unverified) -> Pipeline:
    plugins = load_plugins(objects={"unverified": hooks}, env={"EDGE_PLUGINS": "echo"})
    return Pipeline.open(load_pipeline({"name": "q", "stages": [echo_stage("a")]}),
                         plugins, ledger, retire_deadline_s=3.0)


def test_close_releases_a_quarantine_whose_tree_is_gone(ledger: ResourceLedger) -> None:
    pipeline = _open(ledger, Unverified())
    summary = pipeline.close()
    assert summary["a"]["retire"]["verified"] is False
    assert summary["a"]["release"] == "released"
    assert summary["a"]["healed_by"] == "close"
    assert ledger.is_empty()
    (record,) = ledger.healed()
    assert (record.owner, record.by) == ("q/a", "close")
    assert record.processes >= 2  # the supervisor and the worker, at least
    assert ledger.snapshot()["healed"] == [record.to_json()]


def test_restart_releases_the_old_quarantine(ledger: ResourceLedger) -> None:
    pipeline = _open(ledger, Unverified())
    try:
        pipeline.stage("a").restart()
        snapshot = ledger.snapshot()["pools"]["machine:ram"]
        assert snapshot["quarantined"] == 0
        assert snapshot["reserved"] == 256 * MiB  # only the new worker's
        assert [(r.generation, r.by) for r in ledger.healed()] == [(1, "restart")]
    finally:
        pipeline.close()
    assert ledger.is_empty()


def test_a_quarantine_stays_while_a_recorded_process_lives_then_a_sweep_heals_it(
    ledger: ResourceLedger, bystander: subprocess.Popen[bytes]
) -> None:
    alive = ProcessIdentity.of(bystander.pid)
    pipeline = _open(ledger, Unverified((alive,)))
    summary = pipeline.close()
    assert summary["a"]["release"] == "quarantined"
    assert ledger.heal("sweep") == ()
    (token,) = ledger.quarantined()
    assert ledger.reserved("machine:ram") == 256 * MiB
    # a reused PID is not the process that was recorded: only PID + start time count
    assert not ProcessIdentity(alive.pid, alive.start_time - 100).is_alive()
    bystander.kill()
    bystander.wait()
    ledger.reserve("other", {"machine:ram": MiB})  # every reservation sweeps first
    assert ledger.quarantined() == ()
    assert [(r.owner, r.by) for r in ledger.healed()] == [("q/a", "sweep")]
    (other,) = ledger.holdings()
    ledger.release(other)
    assert ledger.is_empty()
    assert token not in ledger.holdings()


def test_a_cancel_with_a_short_retire_deadline_settles_cleanly(ledger: ResourceLedger) -> None:
    # The reproduction: retire_deadline_s=0.3 and a cancel mid-call ended
    # quarantined in every trial. The kill phase now keeps its share of the deadline,
    # and whatever is still quarantined is healed by restart() and close().
    plugins = load_plugins(env={"EDGE_PLUGINS": "echo"})
    config = load_pipeline({"name": "q", "stages": [echo_stage("a", delay_s=5.0)]})
    pipeline = Pipeline.open(config, plugins, ledger, retire_deadline_s=0.3)
    try:
        stage = pipeline.stage("a")
        for _ in range(3):
            pending = stage.submit({"x": np.ones(4, dtype="float32")})
            time.sleep(0.1)
            assert pipeline.cancel() == {"a": "retire-required"}
            assert stage.last_retire.verified is True, stage.last_retire
            assert ledger.quarantined() == ()
            del pending
            stage.restart()
    finally:
        pipeline.close()
    assert ledger.is_empty()
