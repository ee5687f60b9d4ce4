"""Refusals: a DirectML stage on a machine without DirectML never loads; real workers,
real ledgers, and nothing left behind (the leak check runs around every test)."""

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
from edge_core.runtime.pipeline_files import default_ledger
from edge_core.stage import StageContext
from edge_core.testing.leaks import descendants
from edge_ort.controller import BASE_RAM_BYTES
from edge_ort.vendor import RouteUnavailable, StageRefused, clear_probe_cache
from edge_ort_directml.demands import DEVICE_CONTEXT_BYTES, bundle_bytes
from edge_ort_directml.options import DmlOptions
from edge_ort_directml.plugin import PLUGIN, DirectMLPlugin

from .conftest import windows_prober

GiB = 1024**3
VRAM = "machine:vram:dxgi-luid-0000000000014d53"


def config(bundle: Path, **stage: Any) -> Any:
    return load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-directml", "options": stage.pop("options", {})},
         "manifest": str(bundle), **stage}]})


def recorded_plugins() -> PluginSet:
    return load_plugins(objects={"dml-recorded": DirectMLPlugin(prober=windows_prober())},
                        env={"EDGE_PLUGINS": ""})


def context(bundle: Path, options: DmlOptions | None = None, **fields: Any) -> StageContext:
    return StageContext(pipeline="p", stage_id="s", backend="ort-directml",
                        options=options or DmlOptions(), manifest_dir=bundle, **fields)


def test_a_directml_stage_on_this_machine_is_refused_at_open_with_the_probe_reason(
    bundle: Path,
) -> None:
    clear_probe_cache()
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * GiB)])
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-directml"})
    with pytest.raises(BackendUnavailable) as info:
        Pipeline.open(config(bundle), plugins, ledger)
    message = str(info.value)
    assert message.startswith("stages[0].backend.name (stage 's'): unavailable: ort-directml "
                              "runs only in the windows execution domain")
    assert "onnxruntime-directml is not installed" in message
    assert ledger.is_empty()


def test_loading_on_a_route_without_directml_is_refused_before_any_worker_starts(
    bundle: Path,
) -> None:
    clear_probe_cache()
    with pytest.raises(RouteUnavailable) as info:
        PLUGIN.edge_load(context(bundle))
    assert info.value.field == "stages[s].backend.route.interpreter"
    assert info.value.value == sys.executable
    assert "onnxruntime-directml is not installed" in info.value.reason
    assert descendants() == []


def test_adapters_that_ort_lists_but_this_onnxruntime_lacks_are_refused_after_a_real_load(
    bundle: Path,
) -> None:
    """The recorded Windows probe admits the stage; the real worker's ONNX Runtime (a CPU
    build) does not list DmlExecutionProvider, so the load refuses it and retires the worker
    before any session exists; the pipeline unwinds and releases the VRAM it reserved."""
    plugins = recorded_plugins()
    cfg = config(bundle, options={"adapter_luid": "85331"})
    ledger = default_ledger(cfg, plugins)
    assert ledger.snapshot()["pools"][VRAM]["total"] == 7957 * 1024 * 1024
    with pytest.raises(PlacementRefused) as info:
        Pipeline.open(cfg, plugins, ledger)
    assert "'DmlExecutionProvider' is not available in this onnxruntime build" in str(info.value)
    assert "CPUExecutionProvider" in str(info.value)
    assert any("worker retired: verified=True" in n for n in info.value.__notes__)
    assert ledger.is_empty()


def test_a_discrete_adapter_reserves_its_vram_and_an_integrated_one_host_ram(
    bundle: Path,
) -> None:
    plugin = DirectMLPlugin(prober=windows_prober())
    size = bundle_bytes(context(bundle))
    assert size > 0
    discrete = plugin.edge_reserve(context(bundle, DmlOptions(adapter_index=1)))
    assert discrete == {"machine:ram": BASE_RAM_BYTES + 2 * size,
                        VRAM: 2 * size + DEVICE_CONTEXT_BYTES}
    integrated = plugin.edge_reserve(context(bundle, DmlOptions(adapter_index=0)))
    assert integrated == {"machine:ram": BASE_RAM_BYTES + 4 * size + DEVICE_CONTEXT_BYTES}


def test_declared_demands_must_name_the_adapters_pool(bundle: Path) -> None:
    plugin = DirectMLPlugin(prober=windows_prober())
    declared = {"machine:ram": GiB}
    with pytest.raises(StageRefused) as info:
        plugin.edge_reserve(context(bundle, DmlOptions(adapter_index=1),
                                    declared_demands=declared))
    assert info.value.field == "stages[s].resources.demands"
    assert VRAM in info.value.reason
    both = {"machine:ram": GiB, VRAM: 2 * GiB}
    assert plugin.edge_reserve(context(bundle, DmlOptions(adapter_index=1),
                                       declared_demands=both)) == both


def test_a_stage_whose_placement_names_another_provider_is_refused_before_reserving(
    bundle: Path,
) -> None:
    plugin = DirectMLPlugin(prober=windows_prober())
    policy = PlacementPolicy(target="CUDAExecutionProvider")
    with pytest.raises(StageRefused) as info:
        plugin.edge_reserve(context(bundle, placement=policy))
    assert info.value.field == "stages[s].placement.target"
    assert info.value.value == "CUDAExecutionProvider"
