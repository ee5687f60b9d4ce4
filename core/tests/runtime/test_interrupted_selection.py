"""An interruption as a selection retires its candidates: each is retired once, none is lost.

Real echo workers, the synthetic pipelines of :mod:`edge_echo.synthetic`:

* A measured open, Ctrl-C (a real SIGINT) as the loser's worker has just retired. Before,
  the loser was retired a second time on the way out, and its release read ``none``.

Every test checks the ledger, this process's children and its shared-memory segments
afterwards (and the autouse ``no_leaks`` fixture checks them again).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from edge_contracts.shm import segment_names, segment_owner
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.runtime.stage_slot import StageSlot
from edge_echo.synthetic import pipeline, write_workload

QUICK = {"min_samples": 3, "max_samples": 6, "budget_s": 20.0}


def _config(tmp_path: Path, name: str, **keys: Any) -> Any:
    return load_pipeline(pipeline(name, workload=[str(write_workload(tmp_path))],
                                  measurement=QUICK, **keys))


def _wait_for(predicate: Any, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _assert_nothing_left(ledger: ResourceLedger) -> None:
    assert ledger.is_empty(), ledger.snapshot()
    _wait_for(lambda: not [c for c in psutil.Process().children(recursive=True)
                           if c.is_running() and c.status() != psutil.STATUS_ZOMBIE],
              timeout_s=10.0)
    left = [n for n in segment_names()
            if (o := segment_owner(n)) is not None and o.pid == os.getpid()]
    assert not left, left


@pytest.fixture
def sigint() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in this (the main) thread, as in a command."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_as_a_measured_open_retires_its_loser_retires_it_once(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, sigint: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, "preferred-slower")
    close, settle = StageRuntime.close, StageSlot.settle
    losers: list[StageRuntime] = []
    settled: list[tuple[StageSlot, str]] = []

    def interrupted_close(self: StageRuntime) -> Any:
        outcome = close(self)
        if self.context.stage_id == "b" and not losers:  # the first b to retire: the loser
            losers.append(self)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: raised here, on this thread
        return outcome

    def recorded_settle(self: StageSlot, *args: Any, **kwargs: Any) -> str:
        outcome = settle(self, *args, **kwargs)
        settled.append((self, outcome))
        return outcome

    monkeypatch.setattr(StageRuntime, "close", interrupted_close)
    monkeypatch.setattr(StageSlot, "settle", recorded_settle)
    with pytest.raises(KeyboardInterrupt):
        Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)
    assert len(losers) == 1
    of_loser = [(slot, outcome) for slot, outcome in settled if slot.runtime is losers[0]]
    # retired and settled once; before, again on the way out: ["released", "none"]
    assert [outcome for _, outcome in of_loser] == ["released"]
    assert of_loser[0][0].release_outcome == "released"  # before: "none"
    assert {slot.context.stage_id for slot, _ in settled} == {"a", "b"}
    assert {outcome for _, outcome in settled} == {"released"}
    _assert_nothing_left(ledger)
