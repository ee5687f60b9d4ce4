"""start = "first-ready": serve on the first ready candidate, switch at a request boundary.

Real echo workers: the faster candidate of ``faster-slow-to-open`` takes ``load_delay_s``
to load. Checked: the first answer comes before it is open, the switch happens once it is
measured, no request sees two backends for one stage, every output equals the reference
exactly (the echo's bound is 0), and nothing is left running or charged.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.selection import DecisionStore
from edge_core.selection.key import DecisionKey
from edge_echo.synthetic import SCALE, pipeline, workload_inputs, write_workload

from .conftest import MiB

LOAD_DELAY_S = 3.0
QUICK = {"min_samples": 3, "max_samples": 6, "budget_s": 20.0}


def _config(tmp_path: Path, **keys: Any) -> Any:
    return load_pipeline(pipeline("faster-slow-to-open", load_delay_s=LOAD_DELAY_S,
                                  workload=[str(write_workload(tmp_path))],
                                  measurement={**QUICK, **keys.pop("measurement", {})},
                                  **keys))


def _wait_for(predicate: Any, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _expected() -> np.ndarray:
    return workload_inputs()["x"] * np.float32(SCALE)


def test_first_ready_serves_before_the_slow_candidate_opens_then_switches(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger,
) -> None:
    store = DecisionStore(tmp_path / "decisions")
    opened = Pipeline.open(_config(tmp_path), plugins, ledger, retire_deadline_s=3.0,
                           store=store)
    serving_from = time.monotonic()  # the background starts opening the slow one now
    receipts: list[list[dict[str, Any]]] = []
    wrong: list[Any] = []
    stop = threading.Event()

    def client() -> None:  # requests all along: before, during and after the switch
        while not stop.is_set():
            with opened.run(workload_inputs(), deadline_s=60.0) as result:
                if not np.array_equal(result.outputs["x"], _expected()):
                    wrong.append(result.outputs["x"])
                receipts.append(result.placement)

    try:
        with opened.run(workload_inputs()) as first:
            np.testing.assert_array_equal(first.outputs["x"], _expected())
            assert first.placement[1]["decision"] == "first-ready"
            assert first.placement[1]["candidate"] == 0
        first_answer = time.monotonic()
        caller = threading.Thread(target=client)
        caller.start()
        _wait_for(lambda: opened.execution_plan()["selection"]["switches"])
        _wait_for(lambda: opened.execution_plan()["selection"]["background"]["state"]
                  == "done")
        stop.set()
        caller.join()
        plan = opened.execution_plan()
        (switch,) = plan["selection"]["switches"]
        assert (switch["stage"], switch["from"], switch["to"]) == ("b", "echo[0]", "echo[1]")
        assert switch["decision"] == "measured" and switch["placement"] == 2
        assert plan["selection"]["decision"] == "measured"
        assert [c["outcome"] for c in plan["stages"][1]["candidates"]] == ["passed", "chosen"]
        # the first answer came before the slow candidate was open (its load sleeps
        # LOAD_DELAY_S, so it was open no earlier than serving_from + its open_s)
        slow_open_s = plan["stages"][1]["candidates"][1]["open_s"]
        assert slow_open_s >= LOAD_DELAY_S
        assert first_answer < serving_from + slow_open_s
        health = opened.health()["placement"]
        assert health["number"] == 2 and len(health["switches"]) == 1
        with opened.run(workload_inputs()) as after:
            assert after.placement[1]["candidate"] == 1
            assert after.placement[1]["decision"] == "measured"
        # every request ran on one placement throughout, and none was wrong
        assert not wrong
        assert {r[1]["placement"] for r in receipts} <= {1, 2}
        assert all(r[0]["placement"] == r[1]["placement"] for r in receipts)
        # the switched-out candidate was retired once no request held it
        _wait_for(lambda: ledger.reserved("machine:ram") == 2 * 256 * MiB)
    finally:
        stop.set()
        opened.close()
    assert ledger.is_empty()


def test_a_stored_decision_switches_without_measuring(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger,
) -> None:
    store = DecisionStore(tmp_path / "decisions")
    config = _config(tmp_path)
    with Pipeline.open(config, plugins, ledger, store=store) as opened:
        _wait_for(lambda: opened.execution_plan()["selection"]["background"]["state"]
                  == "done")
    seen: list[str] = []
    with Pipeline.open(config, plugins, ledger, store=store, progress=seen.append) as again:
        with again.run(workload_inputs()) as result:  # served on the quick one at once
            assert result.placement[1]["candidate"] == 0
        _wait_for(lambda: again.execution_plan()["selection"]["switches"])
        selection = again.execution_plan()["selection"]
        assert selection["decision"] == "reused"
        assert selection["switches"][0]["decision"] == "reused"
        assert not any(line.startswith("measuring") for line in seen)
        _wait_for(lambda: again.execution_plan()["selection"]["background"]["state"]
                  == "done")
        with again.run(workload_inputs()) as result:
            assert result.placement[1]["decision"] == "reused"
    assert ledger.is_empty()


def test_closing_while_the_background_opens_leaves_nothing(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger,
) -> None:
    opened = Pipeline.open(_config(tmp_path), plugins, ledger, retire_deadline_s=3.0,
                           store=DecisionStore(tmp_path / "decisions"))
    with opened.run(workload_inputs()):
        pass
    opened.close()  # the slow candidate is still loading: stopped, retired, released
    assert ledger.is_empty()
    assert opened.execution_plan()["selection"]["background"]["state"] in (
        "stopped", "done")
    assert not list((tmp_path / "decisions").glob("*.json"))  # nothing half-measured kept


def test_without_room_a_measured_background_refuses_the_candidate_at_admission(
        tmp_path: Path, plugins: PluginSet,
) -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=640 * MiB)])  # a + one b
    store = DecisionStore(tmp_path / "decisions")
    with Pipeline.open(_config(tmp_path, measurement={"budget_s": 1.0}), plugins, ledger,
                       store=store) as opened:
        _wait_for(lambda: opened.execution_plan()["selection"]["background"]["state"]
                  in ("done", "failed"))
        plan = opened.execution_plan()
        assert plan["selection"]["background"]["state"] == "done"
        assert plan["selection"]["switches"] == []
        refused = plan["stages"][1]["candidates"][1]
        assert (refused["outcome"], refused["layer"]) == ("refused", "admission")
        assert "did not fit beside the serving candidate" in refused["reason"]
        assert ledger.reserved("machine:ram") == 512 * MiB
        with opened.run(workload_inputs()) as result:
            np.testing.assert_array_equal(result.outputs["x"], _expected())
    assert ledger.is_empty()


def test_without_room_a_reused_decision_waits_for_it_then_skips(
        tmp_path: Path, plugins: PluginSet,
) -> None:
    store = DecisionStore(tmp_path / "decisions")
    config = _config(tmp_path, measurement={"budget_s": 1.0})
    roomy = ResourceLedger([Pool(name="machine:ram", total=4096 * MiB)])
    with Pipeline.open(config, plugins, roomy, store=store) as opened:  # measured, stored
        _wait_for(lambda: opened.execution_plan()["selection"]["switches"])
    tight = ResourceLedger([Pool(name="machine:ram", total=640 * MiB)])
    with Pipeline.open(config, plugins, tight, store=store) as opened:
        _wait_for(lambda: opened.execution_plan()["selection"]["background"]["state"]
                  in ("done", "failed"))
        selection = opened.execution_plan()["selection"]
        text = " | ".join(s["step"] for s in selection["background"]["steps"])
        assert "waits for room in the ledger" in text and "skipped" in text
        assert selection["switches"] == [] and selection["decision"] == "reused"
        assert tight.reserved("machine:ram") == 512 * MiB
        with opened.run(workload_inputs()) as result:
            assert result.placement[1]["candidate"] == 0
    assert roomy.is_empty() and tight.is_empty()


@pytest.mark.parametrize("stored", ["newer edge", "odd entries"])
def test_a_previous_decision_edge_cannot_read_is_not_the_open_order_hint(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, stored: str,
) -> None:
    """A newer edge's decision of this pipeline (another layout), or a verified one whose
    entries are not a list, orders nothing and is no internal error."""
    store = DecisionStore(tmp_path / "decisions")
    config = _config(tmp_path)
    store.directory.mkdir(parents=True)
    if stored == "newer edge":
        newer = {"format": "edge-placement-decision/2", "key": "0" * 64, "parts": {},
                 "pipeline": config.name, "measured_at": "2099-01-01T00:00:00Z",
                 "decision": ["another layout"], "digest": "0" * 64}
        (store.directory / f"{'0' * 64}.json").write_text(json.dumps(newer))
    else:
        odd = {stage.id: {"choice": 0, "backend": stage.choices()[0].backend.name,
                          "entries": 5} for stage in config.stages}
        store.save(DecisionKey(digest="0" * 64, parts={}, runtime={}), config,
                   {"stages": odd})
    opened = Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0, store=store)
    try:
        with opened.run(workload_inputs()) as result:
            assert result.placement[1]["candidate"] == 0  # listed order: no usable hint
    finally:
        opened.close()
    assert ledger.is_empty()
