"""Placement by measurement with real echo workers: chosen on the whole chain, stored, reused.

The synthetic pipelines of :mod:`edge_echo.synthetic` differ only in sleeps, so which
candidate is faster holds on a loaded machine; no test asserts on how fast anything is.
Every test checks the ledger afterwards, and the autouse ``no_leaks`` fixture checks
processes, shared-memory segments and descriptors.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.pools import Pool
from edge_core.runtime import CandidatesRefused, Pipeline
from edge_core.selection import DecisionCacheWarning, DecisionStore
from edge_echo.synthetic import SCALE, pipeline, workload_inputs, write_workload

from .conftest import GiB, MiB

QUICK = {"min_samples": 3, "max_samples": 8, "budget_s": 20.0}


@pytest.fixture
def store(tmp_path: Path) -> DecisionStore:
    return DecisionStore(tmp_path / "decisions")


def _config(tmp_path: Path, name: str, **keys: Any) -> Any:
    work = write_workload(tmp_path)
    measurement = {**QUICK, **keys.pop("measurement", {})}
    return load_pipeline(pipeline(name, workload=[str(work)], measurement=measurement, **keys))


def _open(config: Any, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
          **extra: Any) -> Pipeline:
    return Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0, store=store, **extra)


def _expected() -> np.ndarray:
    return workload_inputs()["x"] * np.float32(SCALE)


def _stage_b(plan: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in plan["stages"] if s["id"] == "b")


def test_a_slower_preferred_candidate_is_measured_and_not_chosen(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    config = _config(tmp_path, "preferred-slower")
    with _open(config, plugins, ledger, store) as opened:
        plan = opened.execution_plan()
        stage = _stage_b(plan)
        assert [c["outcome"] for c in stage["candidates"]] == ["passed", "chosen"]
        loser, winner = stage["candidates"]
        assert loser["gate"]["passed"] and loser["measured"]["samples"] >= 1
        assert loser["measured"]["relative"] > 0.05  # slower beyond the margin
        assert "passed every gate; not chosen" in loser["reason"]
        assert winner["measured"]["outcome"] == "chosen"
        selection = plan["selection"]
        assert selection["decision"] == "measured" and selection["objective"] == "latency"
        assert selection["schedule"]["mode"] == "joint"
        assert selection["workload"]["origin"] == "workload"
        with opened.run(workload_inputs()) as result:
            np.testing.assert_array_equal(result.outputs["x"], _expected())
            receipt = {s["stage"]: s for s in result.placement}
        assert receipt["b"]["candidate"] == 1 and receipt["b"]["decision"] == "measured"
        assert receipt["a"]["decision"] == "only" and receipt["b"]["provider"] == "numpy"
        # one candidate of b holds memory once the choice is made
        assert ledger.reserved("machine:ram") == 2 * 256 * MiB
    assert ledger.is_empty()


def test_first_passing_keeps_the_preferred_candidate_unmeasured(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    config = _config(tmp_path, "preferred-slower", selection="first-passing")
    with _open(config, plugins, ledger, store) as opened:
        plan = opened.execution_plan()
        assert [c["outcome"] for c in _stage_b(plan)["candidates"]] == ["chosen"]
        assert plan["selection"]["decision"] == "first-passing"
        with opened.run(workload_inputs()) as result:
            assert {s["stage"]: s["candidate"] for s in result.placement} == {"a": 0, "b": 0}
            assert result.placement[1]["decision"] == "first-passing"
    assert ledger.is_empty()
    assert not (tmp_path / "decisions").exists()  # nothing measured, nothing stored


def test_a_split_that_does_not_pay_is_replaced_by_the_fewest_backends(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    config = _config(tmp_path, "split-does-not-pay", measurement={"max_samples": 6})
    with _open(config, plugins, ledger, store) as opened:
        plan = opened.execution_plan()
        split = plan["selection"]["split"]
        assert split["backends"] == ["echo", "echo-preemptible"]
        assert split["fewest_backends"] == ["echo"]
        assert split["serving"] == "fewest-backends" and split["kept"] is False
        for figure in ("single_serial_p50_s", "split_serial_p50_s",
                       "split_overlapped_s_per_request", "single_overlapped_s_per_request"):
            assert split[figure] > 0
        assert split["overlapped_in_flight"] >= 2
        assert "fewest-backend placement serves" in split["reason"]
        stage = _stage_b(plan)
        assert stage["backend"] == "echo"
        preemptible = stage["candidates"][0]
        assert preemptible["outcome"] == "passed" and "not chosen" in preemptible["reason"]
        with opened.run(workload_inputs()) as result:
            np.testing.assert_array_equal(result.outputs["x"], _expected())
            assert [s["backend"] for s in result.placement] == ["echo", "echo"]
    assert ledger.is_empty()


def test_a_stored_decision_is_reused_without_measuring_and_remade_on_change(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
        monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(tmp_path, "preferred-slower")
    with _open(config, plugins, ledger, store) as first:
        measured_at = first.execution_plan()["selection"]["measured_at"]
    seen: list[str] = []
    with _open(config, plugins, ledger, store, progress=seen.append) as again:
        selection = again.execution_plan()["selection"]
        assert selection["decision"] == "reused"
        assert selection["note"] == f"measured on {measured_at}, reused"
        assert selection["races"]  # the stored figures are shown
        assert not any(line.startswith("measuring") for line in seen)
        assert sum("loading stage b" in line for line in seen) == 1  # only the chosen
        with again.run(workload_inputs()) as result:
            assert result.placement[1]["decision"] == "reused"
            assert result.placement[1]["measured_at"] == measured_at
    # another version of a backend's distribution (faked here) re-measures, and the
    # plan says what changed since the nearest decision of the pipeline
    with monkeypatch.context() as patch:
        patch.setattr(plugins.record("echo"), "version", "99.0.0")
        with _open(config, plugins, ledger, store) as opened:
            selection = opened.execution_plan()["selection"]
            assert selection["decision"] == "measured"
            assert selection["changed"] == ["runtime"]
    # so does a configuration change, said against the nearest decision (the first one,
    # whose runtime is this one's), not the newest (measured with the faked version)
    changed = _config(tmp_path, "preferred-slower", admission=2)
    with _open(changed, plugins, ledger, store) as opened:
        assert opened.execution_plan()["selection"]["changed"] == ["configuration"]
    # and --remeasure, whatever is stored
    with _open(config, plugins, ledger, store, remeasure=True) as opened:
        selection = opened.execution_plan()["selection"]
        assert selection["decision"] == "measured" and "--remeasure" in selection["note"]
    assert ledger.is_empty()


def test_a_corrupt_stored_decision_warns_and_is_measured_again(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    config = _config(tmp_path, "preferred-slower")
    with _open(config, plugins, ledger, store):
        pass
    (stored,) = (tmp_path / "decisions").glob("*.json")
    stored.write_text(stored.read_text()[:-40])  # cut short
    with pytest.warns(DecisionCacheWarning, match="not JSON"):
        opened = _open(config, plugins, ledger, store)
    with opened:
        selection = opened.execution_plan()["selection"]
        assert selection["decision"] == "measured"
        assert "not JSON" in selection["warning"]
    document = json.loads(stored.read_text())  # measured again and stored whole
    assert document["decision"]["stages"]["b"]["choice"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _open(config, plugins, ledger, store).close()
    assert ledger.is_empty()


def test_throughput_favours_the_backend_that_takes_requests_in_parallel(
        tmp_path: Path, plugins: PluginSet, store: DecisionStore,
) -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4 * GiB)])
    document = pipeline("split-does-not-pay", workload=[str(write_workload(tmp_path))],
                        objective="throughput", admission=4,
                        measurement={**QUICK, "max_samples": 4, "margin": 0.1})
    # b's candidates swapped: the one-at-a-time echo first; echo-preemptible takes four
    document["stages"][1]["candidates"].reverse()
    document["stages"][0]["backend"]["name"] = "echo-preemptible"
    config = load_pipeline(document)
    with _open(config, plugins, ledger, store) as opened:
        plan = opened.execution_plan()
        assert plan["selection"]["objective"] == "throughput"
        assert _stage_b(plan)["backend"] == "echo-preemptible"
        assert _stage_b(plan)["candidates"][0]["outcome"] == "passed"
    assert ledger.is_empty()


def test_memory_takes_the_least_reserved_within_the_latency_bound(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    document = pipeline("preferred-slower", workload=[str(write_workload(tmp_path))],
                        objective="memory",
                        measurement={**QUICK, "latency_bound_s": 1.0})
    slow, fast = document["stages"][1]["candidates"]
    slow["resources"] = {"demands": {"machine:ram": 128 * MiB}}
    fast["resources"] = {"demands": {"machine:ram": 512 * MiB}}
    with _open(load_pipeline(document), plugins, ledger, store) as opened:
        plan = opened.execution_plan()
        stage = _stage_b(plan)
        assert stage["backend"] == "echo" and stage["candidates"][0]["outcome"] == "chosen"
        assert stage["reservation"]["demands"] == {"machine:ram": 128 * MiB}
        assert "least reserved memory" in plan["selection"]["races"][0]["reason"]
    assert ledger.is_empty()


def test_several_stages_with_choices_are_raced_greedily_beyond_the_joint_limit(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    document = pipeline("preferred-slower", workload=[str(write_workload(tmp_path))],
                        measurement={**QUICK, "joint_limit": 2})
    document["stages"][0] = {"id": "a", "candidates": [
        {"backend": {"name": "echo", "options": {"scale": 1.0, "delay_s": 0.06}}},
        {"backend": {"name": "echo", "options": {"scale": 1.0, "delay_s": 0.005}}}]}
    with _open(load_pipeline(document), plugins, ledger, store) as opened:
        selection = opened.execution_plan()["selection"]
        assert selection["schedule"]["mode"] == "greedy"
        assert [race["stages"] for race in selection["races"]] == [["a"], ["b"]]
        with opened.run(workload_inputs()) as result:
            assert [s["candidate"] for s in result.placement] == [1, 1]
    assert ledger.is_empty()


def test_two_candidates_are_held_at_once_only_when_the_ledger_admits_both(
        tmp_path: Path, plugins: PluginSet, store: DecisionStore,
) -> None:
    # room for stage a and one candidate of b: the second is measured in the first's place
    ledger = ResourceLedger([Pool(name="machine:ram", total=640 * MiB)])
    config = _config(tmp_path, "preferred-slower")
    seen: list[str] = []
    with _open(config, plugins, ledger, store, progress=seen.append) as opened:
        plan = opened.execution_plan()
        stage = _stage_b(plan)
        assert [c["outcome"] for c in stage["candidates"]] == ["passed", "chosen"]
        (alone,) = plan["selection"]["alone"]
        assert alone["candidate"] == 1 and alone["note"].endswith("faster")
        assert alone["p50_s"] < alone["against_p50_s"]
        assert any("does not fit beside the others" in line for line in seen)
        assert any("alone: the ledger does not admit it beside" in line for line in seen)
        assert ledger.reserved("machine:ram") == 512 * MiB
    assert ledger.is_empty()


def test_every_candidate_refused_unwinds_everything(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
) -> None:
    document = pipeline("preferred-slower", workload=[str(write_workload(tmp_path))])
    for candidate in document["stages"][1]["candidates"]:
        candidate["backend"]["options"]["wrong_numerics"] = True
    with pytest.raises(CandidatesRefused) as caught:
        _open(load_pipeline(document), plugins, ledger, store)
    assert [t["layer"] for t in caught.value.tried["b"]] == ["numerics", "numerics"]
    assert "a" in caught.value.tried
    assert ledger.is_empty()


@pytest.mark.parametrize("rewritten", ["workload", "bundles"])
def test_a_decision_measured_while_its_files_changed_is_not_stored(
        tmp_path: Path, plugins: PluginSet, ledger: ResourceLedger, store: DecisionStore,
        rewritten: str,
) -> None:
    """The workload file, or a bundle's manifest, rewritten while the candidates are timed:
    the figures are not those of the key's contents, so nothing is stored, and it is said."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    manifest = bundle / "edge-manifest.json"
    manifest.write_text('{"files": {}}')
    document = pipeline("preferred-slower", workload=[str(write_workload(tmp_path))],
                        measurement=QUICK)
    document["stages"][1]["manifest"] = str(bundle)
    config = load_pipeline(document)

    def rewrite(line: str) -> None:
        if line.startswith("measuring"):
            if rewritten == "workload":
                np.savez(tmp_path / "workload.npz", x=workload_inputs()["x"] + 1)
            else:
                manifest.write_text('{"files": {}, "rewritten": true}')

    with _open(config, plugins, ledger, store, progress=rewrite) as opened:
        selection = opened.execution_plan()["selection"]
        assert selection["decision"] == "measured"
        assert selection["warning"] == (f"the decision was not stored: {rewritten} changed "
                                        "while it was measured")
    assert not list((tmp_path / "decisions").glob("*.json"))
    with _open(config, plugins, ledger, store) as again:  # measured and stored now
        assert again.execution_plan()["selection"]["warning"] is None
    assert len(list((tmp_path / "decisions").glob("*.json"))) == 1
    assert ledger.is_empty()
