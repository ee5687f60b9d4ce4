"""Opening a pipeline: joint admission, gates, and unwinding from every failure point."""

from __future__ import annotations

import numpy as np
import psutil
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import BackendUnavailable, ConfigError, PlacementRefused, ResourceUnavailable
from edge_core.host.errors import RemoteError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import DemandExceeded, NumericsRefused, Pipeline, TopologyRefused
from edge_core.testing.leaks import descendants

from .conftest import GiB, MiB, OpenPipeline, echo_stage


def _children() -> list[psutil.Process]:
    return descendants()


def test_a_two_stage_chain_runs_and_closes_with_nothing_charged(
    open_pipeline: OpenPipeline, ledger: ResourceLedger
) -> None:
    pipeline = open_pipeline(
        echo_stage("a", scale=2.0),
        echo_stage("b", backend="echo-preemptible", scale=3.0,
                   transform="edge_echo.transforms:add_source"),
    )
    assert ledger.reserved("machine:ram") == 2 * 256 * MiB
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pipeline.run({"x": x}) as result:
        np.testing.assert_array_equal(result.outputs["x"], (x * 2 + x) * 3)
        assert set(result.latencies) == {"a", "b"}
    plan = pipeline.execution_plan()
    assert [s["id"] for s in plan["stages"]] == ["a", "b"]
    assert plan["stages"][0]["placement"]["providers"]["numpy"]["nodes"] == 1
    assert plan["stages"][0]["worker"]["pid"] > 0
    assert plan["stages"][0]["reservation"]["demands"] == {"machine:ram": 256 * MiB}
    # echo claims "expected-outputs" but has no bundle: core does not take its word
    assert plan["stages"][1]["evidence"] == "backend-execution"
    assert "no bundle" in plan["stages"][1]["evidence_basis"]
    summary = pipeline.close()
    assert {s["release"] for s in summary.values()} == {"released"}
    assert all(s["retire"]["verified"] for s in summary.values())
    assert ledger.is_empty()


def test_joint_admission_refused_leaves_nothing_charged_and_starts_nothing(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "big", "stages": [
        echo_stage("a", demand=3 * GiB),
        echo_stage("b", demand=2 * GiB, transform="edge_echo.transforms:passthrough"),
    ]})
    before = _children()
    with pytest.raises(ResourceUnavailable) as info:
        Pipeline.open(config, plugins, ledger)
    message = str(info.value)
    assert "machine:ram" in message and str(5 * GiB) in message and str(4 * GiB) in message
    assert ledger.is_empty()
    assert _children() == before


def test_unknown_pool_in_a_demand_is_a_configuration_error(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [{
        "id": "a", "backend": {"name": "echo"},
        "resources": {"demands": {"machine:vram:gpu0": 1024}},
    }]})
    with pytest.raises(ConfigError, match="unknown pool"):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()


@pytest.mark.parametrize("fail_at", ["load", "warmup"])
def test_a_failing_second_stage_unwinds_the_first(
    plugins: PluginSet, ledger: ResourceLedger, fail_at: str
) -> None:
    config = load_pipeline({"name": "p", "stages": [
        echo_stage("a"),
        echo_stage("b", fail_at=fail_at, transform="edge_echo.transforms:passthrough"),
    ]})
    with pytest.raises(RemoteError, match=f"{'load' if fail_at == 'load' else 'warm-up'} "
                                          "failed as configured"):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()


def test_a_placement_failure_releases_the_load(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [
        {**echo_stage("a", provider="cuda"), "placement": {"target": "numpy"}},
    ]})
    with pytest.raises(PlacementRefused) as info:
        Pipeline.open(config, plugins, ledger)
    assert "providers outside the allowed set ['numpy'] ran nodes: cuda ran 1 node(s)" in str(
        info.value)
    assert ledger.is_empty()


def test_wrong_warmup_numerics_refuse_the_stage(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [echo_stage("a", wrong_numerics=True)]})
    with pytest.raises(NumericsRefused, match=r"stages\[a\]\.numerics: .*max_abs_error=1\.0"):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()


def test_observed_memory_above_the_demand_is_refused_with_both_numbers(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [
        echo_stage("a", demand=64 * MiB, allocate_mb=96),
    ]})
    with pytest.raises(DemandExceeded) as info:
        Pipeline.open(config, plugins, ledger)
    message = str(info.value)
    assert "observed peak" in message and str(64 * MiB) in message
    # both in units a reader compares, and what to do
    assert "exceeds the demand (64.0 MiB; a size without a unit counts bytes): declare at " \
        "least the peak: 67108864" in message, message
    assert ledger.is_empty()


def test_an_unavailable_backend_is_refused_with_its_probe_reason(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [
        {"id": "a", "backend": {"name": "ort-directml"}}]})
    with pytest.raises(BackendUnavailable, match=r"stages\[0\]\.backend\.name \(stage 'a'\): "
                       r"unavailable: "):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()


def test_an_uninstalled_backend_is_refused_naming_what_exists(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [{"id": "a", "backend": {"name": "tpu"}}]})
    with pytest.raises(BackendUnavailable, match=r"'tpu' \(available: \["):
        Pipeline.open(config, plugins, ledger)


@pytest.mark.parametrize(
    ("wiring", "message"),
    [
        ({"b": ["a"], "c": ["a"]}, "fan-out is not supported"),
        ({"c": ["a", "b"]}, "joins are not supported"),
        ({"b": ["input"], "c": ["b"]}, "fan-out is not supported"),
        ({"c": ["nope"]}, "no such stage"),
    ],
)
def test_non_linear_topologies_are_refused_before_anything_is_reserved(
    plugins: PluginSet, ledger: ResourceLedger, wiring: dict[str, list[str]], message: str
) -> None:
    stages = [echo_stage("a"),
              echo_stage("b", transform="edge_echo.transforms:passthrough"),
              echo_stage("c", transform="edge_echo.transforms:passthrough")]
    for stage in stages:
        if stage["id"] in wiring:
            stage["inputs_from"] = wiring[stage["id"]]
    config = load_pipeline({"name": "p", "stages": stages})
    before = _children()
    with pytest.raises(TopologyRefused, match=message):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()
    assert _children() == before


def test_invalid_backend_options_name_the_path(
    plugins: PluginSet, ledger: ResourceLedger
) -> None:
    config = load_pipeline({"name": "p", "stages": [echo_stage("a", delay_s=-1)]})
    with pytest.raises(ConfigError, match=r"stages\[0\]\.backend\.options"):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()


@pytest.mark.parametrize("moment", ["before", "after"])
def test_an_interruption_while_retiring_retires_and_settles_every_slot_then_goes_on(
    plugins: PluginSet, ledger: ResourceLedger, moment: str
) -> None:
    """Ctrl-C (or SIGTERM) as the first slot retires: every slot is still retired.

    ``before``: it lands before the slot's retirement starts; ``after``: once it is done,
    before its reservation is settled. Either way the slot is retired and settled, the
    other replica too, and only then is the interruption raised. Before, it went on at
    once: the other replica's worker was left running (to the exit hook) and both
    reservations charged (``edge plan``, retiring after a stage found no candidate).
    """
    from edge_core.runtime.opener import StageOpener

    config = load_pipeline({"name": "p", "stages": [{**echo_stage("a"), "replicas": 2}]})
    opener = StageOpener(config, plugins, ledger, retire_deadline_s=3.0)
    before = _children()
    slots = opener.open_candidate(0)
    workers = [p for p in _children() if p not in before]
    assert len(slots) == 2 and workers
    first = slots[-1].runtime  # retired first: reverse order
    assert first is not None
    close, calls = first.close, []

    def interrupted() -> object:
        calls.append(moment)
        if len(calls) == 1:
            if moment == "after":
                close()
            raise KeyboardInterrupt
        return close()

    first.close = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        opener.retire(slots)
    assert len(calls) == 2  # the interrupted retirement was run again to its end
    assert [slot.release_outcome for slot in slots] == ["released", "released"]
    assert ledger.is_empty()
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
