"""Refusals: VitisAI stages that cannot run here, or that would split an A16W8 graph
without saying so, never load; real workers, real ledgers, nothing left behind."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from edge_core.config import load_pipeline
from edge_core.errors import BackendUnavailable, PlacementRefused
from edge_core.ledger import ResourceLedger
from edge_core.placement import PlacementPolicy
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.stage import StageContext
from edge_core.testing.leaks import descendants
from edge_ort.vendor import RouteUnavailable, StageRefused, clear_probe_cache
from edge_ort_vitisai.options import VitisAIOptions
from edge_ort_vitisai.plugin import PLUGIN, VitisAIPlugin
from edge_ort_vitisai.policy import is_a16w8

from .conftest import windows_prober

GiB = 1024**3
CPU = "CPUExecutionProvider"


def config(bundle: Path, **stage: Any) -> Any:
    return load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-vitisai", "options": stage.pop("options", {})},
         "manifest": str(bundle), **stage}]})


def recorded_plugins() -> PluginSet:
    return load_plugins(objects={"vitisai-recorded": VitisAIPlugin(prober=windows_prober())},
                        env={"EDGE_PLUGINS": ""})


def ledger() -> ResourceLedger:
    return ResourceLedger([Pool(name="machine:ram", total=8 * GiB)])


def context(bundle: Path, **fields: Any) -> StageContext:
    return StageContext(pipeline="p", stage_id="s", backend="ort-vitisai",
                        options=VitisAIOptions(), manifest_dir=bundle, **fields)


def test_a_vitisai_stage_on_this_machine_is_refused_at_open_with_the_probe_reason(
    bundle: Path,
) -> None:
    clear_probe_cache()
    held = ledger()
    with pytest.raises(BackendUnavailable) as info:
        Pipeline.open(config(bundle), load_plugins(env={"EDGE_PLUGINS": "ort-vitisai"}), held)
    assert str(info.value).startswith("stages[0].backend.name (stage 's'): unavailable: "
                                      "ort-vitisai runs only in the windows execution domain")
    assert held.is_empty()


def test_loading_on_a_route_without_vitisai_is_refused_before_any_worker_starts(
    bundle: Path,
) -> None:
    clear_probe_cache()
    with pytest.raises(RouteUnavailable) as info:
        PLUGIN.edge_load(context(bundle))
    assert info.value.field == "stages[s].backend.route.interpreter"
    assert info.value.value == sys.executable
    assert "onnxruntime-vitisai is not installed" in info.value.reason
    assert descendants() == []


@pytest.mark.parametrize("placement", [
    {},
    {"min_fraction_on_target": 0.8},
    {"allowed_providers": [CPU]},
])
def test_an_a16w8_graph_without_a_cpu_share_in_its_policy_is_refused_before_reserving(
    a16w8_bundle: Path, placement: dict[str, Any],
) -> None:
    held = ledger()
    with pytest.raises(StageRefused) as info:
        Pipeline.open(config(a16w8_bundle, placement=placement), recorded_plugins(), held)
    assert info.value.field == "stages[s].placement"
    assert "A16W8" in info.value.reason
    assert info.value.value == {
        "min_fraction_on_target": placement.get("min_fraction_on_target", 1.0),
        "allowed_providers": placement.get("allowed_providers", [])}
    assert held.is_empty()


def test_an_a16w8_graph_with_a_cpu_share_is_admitted_and_then_judged_by_the_real_worker(
    a16w8_bundle: Path,
) -> None:
    """The recorded probe admits the stage; the real worker's ONNX Runtime (a CPU build)
    does not list VitisAIExecutionProvider, so the load refuses it and retires the worker."""
    held = ledger()
    placement = {"min_fraction_on_target": 0.6, "allowed_providers": [CPU]}
    with pytest.raises(PlacementRefused) as info:
        Pipeline.open(config(a16w8_bundle, placement=placement), recorded_plugins(), held)
    assert ("'VitisAIExecutionProvider' is not available in this onnxruntime build"
            in str(info.value))
    assert any("worker retired: verified=True" in n for n in info.value.__notes__)
    assert held.is_empty()


def test_an_int8_graph_needs_no_cpu_share(bundle: Path) -> None:
    demands = VitisAIPlugin(prober=windows_prober()).edge_reserve(context(bundle))
    assert set(demands) == {"machine:ram"}


def test_a_stage_whose_placement_names_another_provider_is_refused(bundle: Path) -> None:
    plugin = VitisAIPlugin(prober=windows_prober())
    with pytest.raises(StageRefused) as info:
        plugin.edge_reserve(context(bundle, placement=PlacementPolicy(target=CPU)))
    assert info.value.field == "stages[s].placement.target"


def test_precision_labels_naming_a16w8_are_recognised() -> None:
    assert [is_a16w8(p) for p in ("A16W8", "a16w8-qdq", "int8", "bf16", None, "")] == [
        True, True, False, False, False, False]
