"""Each stage's peak after served requests against its declared demand: plan and health."""

from __future__ import annotations

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import Pipeline
from edge_core.runtime.memory_check import stage_memory

from .conftest import MiB, OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), dtype=np.float32)}


def test_a_stage_that_outgrows_its_demand_after_the_gate_is_reported_in_plan_and_health(
    open_pipeline: OpenPipeline,
) -> None:
    # the gate passes (the worker's tree holds some 30-60 MiB after load and warm-up) ...
    pipeline = open_pipeline(echo_stage("a", demand=512 * MiB),
                             echo_stage("b", demand=160 * MiB,
                                        transform="edge_echo.transforms:passthrough"))
    before = pipeline.execution_plan()
    assert before["memory_over_demand"] == []
    first = before["stages"][1]["memory"]["pools"]["machine:ram"]
    assert first["verdict"] == "within" and first["demand_bytes"] == 160 * MiB
    assert 0 < first["peak_over_demand"] <= 1.0
    # ... then requests come that make stage b (the last: it gets the request's params)
    # touch 48 and 160 MiB more while serving them
    for megabytes in (48, 160, 0):
        with pipeline.run(X, params={"allocate_mb": megabytes}) as result:
            assert result.outputs["x"].shape == (2, 2)
    plan = pipeline.execution_plan()
    assert plan["memory_over_demand"] == ["b"]
    check = plan["stages"][1]["memory"]["pools"]["machine:ram"]
    assert check["verdict"] == "over" and check["peak_bytes"] > 160 * MiB
    assert check["peak_over_demand"] == round(check["peak_bytes"] / (160 * MiB), 3) > 1.0
    assert plan["stages"][0]["memory"]["over_demand"] is False
    health = pipeline.health()
    assert set(health) == {"pipeline", "state", "stages", "replicas", "placement", "memory"}
    assert health["placement"] == {"number": 1, "decision": "only", "switches": [],
                                   "background": None}  # beside memory (docs/runtime.md)
    assert health["state"] == "ready"  # it still serves: the report says what is wrong
    assert health["memory"]["over_demand"] == ["b"]
    assert health["memory"]["stages"]["b"]["pools"]["machine:ram"]["verdict"] == "over"
    assert health["memory"]["stages"]["a"]["pools"]["machine:ram"]["verdict"] == "within"
    # the gate's own figure is still the one taken after warm-up
    assert plan["stages"][1]["observed_memory"]["machine:ram"] < 160 * MiB
    pipeline.close()


def test_the_verdicts_name_within_over_and_unobserved_pools() -> None:
    found = stage_memory({"machine:ram": 100, "machine:vram:0": 50, "empty": 0},
                         {"machine:ram": 150, "empty": 0})
    assert found["over_demand"] is True
    assert found["pools"]["machine:ram"] == {"demand_bytes": 100, "peak_bytes": 150,
                                             "peak_over_demand": 1.5, "verdict": "over"}
    assert found["pools"]["machine:vram:0"]["verdict"] == "unobserved"
    assert found["pools"]["machine:vram:0"]["peak_over_demand"] is None
    assert found["pools"]["empty"] == {"demand_bytes": 0, "peak_bytes": 0,
                                       "peak_over_demand": None, "verdict": "within"}
    assert stage_memory({"machine:ram": 100}, {"machine:ram": 100})["over_demand"] is False


@pytest.mark.parametrize("value", ["eagre", "never", "0"])
def test_a_heap_policy_no_one_knows_refuses_the_open_before_anything_is_charged(
    plugins: PluginSet, ledger: ResourceLedger, monkeypatch: pytest.MonkeyPatch, value: str,
) -> None:
    monkeypatch.setenv("EDGE_HEAP", value)
    config = load_pipeline({"name": "t", "stages": [echo_stage("a", demand=64 * MiB)]})
    with pytest.raises(ConfigError) as refused:
        Pipeline.open(config, plugins, ledger)
    assert refused.value.path == "EDGE_HEAP" and refused.value.value == value
    assert "one of rest, eager, off" in str(refused.value)
    assert ledger.snapshot()["reservations"] == []  # no worker either: no_leaks checks
    monkeypatch.setenv("EDGE_HEAP", " Rest ")  # case and spaces do not matter
    with Pipeline.open(config, plugins, ledger) as pipeline:
        assert pipeline.execution_plan()["memory_over_demand"] == []
    assert ledger.snapshot()["reservations"] == []
