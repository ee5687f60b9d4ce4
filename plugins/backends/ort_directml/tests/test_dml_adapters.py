"""DirectML adapters → devices and pools, from synthetic Windows listings."""

from __future__ import annotations

import attrs
import pytest

from edge_contracts.devices import ExecutionDomain, Integration
from edge_core.plugins import load_plugins
from edge_core.probe import probe_all
from edge_ort.epdevices import EpDevicesInvalid
from edge_ort_directml.adapters import adapters_from, pool_totals
from edge_ort_directml.plugin import DirectMLPlugin

from .conftest import listing, windows_prober

MiB = 1024 * 1024


def test_an_integrated_gpu_draws_from_ram_and_a_discrete_one_from_its_own_vram() -> None:
    integrated, discrete = adapters_from(listing().for_provider("DmlExecutionProvider"))
    assert (integrated.index, integrated.integration) == (0, Integration.INTEGRATED)
    assert integrated.pool == "machine:ram"
    assert (discrete.index, discrete.integration) == (1, Integration.DISCRETE)
    assert discrete.physical_id == "dxgi-luid-0000000000014d53"
    assert discrete.pool == "machine:vram:dxgi-luid-0000000000014d53"
    assert discrete.dedicated_bytes == 7957 * MiB
    assert pool_totals([integrated, discrete]) == {discrete.pool: 7957 * MiB}


def test_adapters_become_device_descriptors_in_the_windows_domain() -> None:
    integrated, discrete = (a.descriptor(ExecutionDomain.WINDOWS)
                            for a in adapters_from(listing().for_provider(
                                "DmlExecutionProvider")))
    assert integrated.to_dict() == {
        "physical_id": "dxgi-luid-0000000000013333", "kind": "gpu",
        "name": "Intel(R) Arc(TM) Graphics", "execution_domain": "windows",
        "integration": "integrated", "pools": ["machine:ram"], "package": None,
        "bandwidth_group": None, "power_domain": None}
    assert discrete.pools == ("machine:vram:dxgi-luid-0000000000014d53",)


def test_an_adapter_of_unknown_integration_lists_both_pools_it_may_draw_from() -> None:
    device = listing().for_provider("DmlExecutionProvider")[0]
    bare = attrs.evolve(device, metadata={"DxgiAdapterNumber": "1"}, ep_options={})
    (adapter,) = adapters_from([bare])
    assert adapter.integration is Integration.UNKNOWN
    assert adapter.pool is None
    assert adapter.physical_id == "dxgi-adapter-1"
    assert adapter.descriptor(ExecutionDomain.WINDOWS).pools == (
        "machine:ram", "machine:vram:dxgi-adapter-1")
    assert pool_totals([adapter]) == {}


@pytest.mark.parametrize(("metadata", "field"), [
    ({"DxgiAdapterNumber": "1", "DxgiVideoMemory": "8 GB"}, "adapters[0].DxgiVideoMemory"),
    ({"DxgiAdapterNumber": "1", "LUID": "-4"}, "adapters[0].LUID"),
    ({"DxgiAdapterNumber": "1", "Discrete": "yes"}, "adapters[0].Discrete"),
    ({"DxgiAdapterNumber": "first"}, "adapters[0].DxgiAdapterNumber"),
])
def test_malformed_adapter_metadata_is_refused_naming_the_key(metadata: dict[str, str],
                                                              field: str) -> None:
    device = attrs.evolve(listing().for_provider("DmlExecutionProvider")[0],
                          metadata=metadata, ep_options={})
    with pytest.raises(EpDevicesInvalid) as info:
        adapters_from([device])
    assert info.value.field == field


def test_the_probe_of_a_recorded_windows_machine_reports_adapters_and_vram_totals() -> None:
    plugin = DirectMLPlugin(prober=windows_prober())
    plugins = load_plugins(objects={"dml-recorded": plugin}, env={"EDGE_PLUGINS": ""})
    (row,) = probe_all(plugins)["backends"]
    assert row["backend"] == "ort-directml" and row["available"] is True
    assert [d["physical_id"] for d in row["devices"]] == [
        "dxgi-luid-0000000000013333", "dxgi-luid-0000000000014d53"]
    assert row["pool_totals"] == {"machine:vram:dxgi-luid-0000000000014d53": 7957 * MiB}
    assert row["runtime"] == {"onnxruntime-directml": "1.23.0",
                              "onnxruntime (imported)": "1.23.0"}


def test_an_unreadable_adapter_listing_makes_the_backend_unavailable() -> None:
    broken = attrs.evolve(listing(), devices=tuple(
        attrs.evolve(d, metadata={**d.metadata, "DxgiVideoMemory": "lots"})
        for d in listing().devices or ()))
    report = DirectMLPlugin(prober=windows_prober(broken)).probe_report()
    assert report.available is False
    assert report.reason is not None and "DxgiVideoMemory" in report.reason
