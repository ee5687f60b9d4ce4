"""The Ryzen AI NPU → device and pool, from a synthetic Windows listing."""

from __future__ import annotations

import attrs

from edge_contracts.devices import ExecutionDomain
from edge_core.plugins import load_plugins
from edge_core.probe import probe_all
from edge_ort_vitisai.npu import npu_descriptors, npu_physical_id
from edge_ort_vitisai.plugin import VitisAIPlugin

from .conftest import WINDOWS_PYTHON, listing, windows_prober


def test_the_npu_is_a_device_drawing_from_host_ram() -> None:
    (npu,) = listing().for_provider("VitisAIExecutionProvider", "NPU")
    (device,) = npu_descriptors([npu, npu], ExecutionDomain.WINDOWS)
    assert device.to_dict() == {
        "physical_id": "npu-luid-0000000000016486", "kind": "npu",
        "name": "NPU Compute Accelerator Device", "execution_domain": "windows",
        "integration": "integrated", "pools": ["machine:ram"], "package": None,
        "bandwidth_group": None, "power_domain": None}


def test_an_npu_without_a_luid_is_named_by_its_pci_ids_and_its_integration_is_unknown() -> None:
    (npu,) = listing().for_provider("VitisAIExecutionProvider", "NPU")
    bare = attrs.evolve(npu, metadata={})
    assert npu_physical_id(bare) == "npu-1022-1517"
    (device,) = npu_descriptors([bare], ExecutionDomain.WINDOWS)
    assert device.integration.value == "unknown"
    assert device.pools == ("machine:ram",)


def test_the_probe_of_a_recorded_ryzen_ai_machine_reports_the_npu() -> None:
    plugin = VitisAIPlugin(prober=windows_prober())
    plugins = load_plugins(objects={"vitisai-recorded": plugin}, env={"EDGE_PLUGINS": ""})
    (row,) = probe_all(plugins)["backends"]
    assert row["available"] is True
    assert [d["physical_id"] for d in row["devices"]] == ["npu-luid-0000000000016486"]
    assert row["pool_totals"] == {}
    assert any("NPU: VitisAIExecutionProvider/NPU" in note for note in row["notes"])


def test_no_npu_listed_is_unavailable_and_names_the_library_registration() -> None:
    cpu_only = listing(
        ep_devices=[{
            "ep_name": "CPUExecutionProvider", "ep_vendor": "Microsoft",
            "device": {"type": "CPU", "vendor": "AuthenticAMD", "vendor_id": 4130,
                       "device_id": 0}}],
        libraries=[{"name": "VitisAIExecutionProvider", "path": None, "registered": False,
                    "error": "no onnxruntime_providers_vitisai library in C:\\x\\capi"}])
    report = VitisAIPlugin(prober=windows_prober(cpu_only)).probe_report()
    assert report.available is False
    assert report.reason == (
        f"get_ep_devices() in {WINDOWS_PYTHON} pairs no NPU with VitisAIExecutionProvider "
        "(it reports: ['CPUExecutionProvider/CPU']); library registration: "
        "['VitisAIExecutionProvider: no onnxruntime_providers_vitisai library in C:\\\\x\\\\capi']")
