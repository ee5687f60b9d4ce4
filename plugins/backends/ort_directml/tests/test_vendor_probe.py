"""edge_ort.epdevices and edge_ort.vendor: real listings from this machine's interpreters,
synthetic Windows listings, and the probe's reasons."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from edge_contracts.devices import ExecutionDomain
from edge_ort.epdevices import EpDevicesInvalid, EpLibrary, parse_ep_devices, query_ep_devices
from edge_ort.vendor import assess, clear_probe_cache, probe_vendor
from edge_ort_directml.plugin import vendor_backend

from .conftest import WINDOWS_PYTHON, listing


def test_the_listing_script_reports_what_onnxruntime_lists_in_the_route_interpreter() -> None:
    seen = query_ep_devices(sys.executable)
    assert seen.error is None
    assert seen.onnxruntime == ort.__version__
    assert list(seen.available_providers) == ort.get_available_providers()
    assert seen.devices is not None
    assert [d.ep_name for d in seen.devices] == [d.ep_name for d in ort.get_ep_devices()]
    assert seen.for_provider("DmlExecutionProvider") == ()


def test_a_library_absent_from_onnxruntime_is_reported_not_registered() -> None:
    seen = query_ep_devices(sys.executable, [EpLibrary("VitisAIExecutionProvider",
                                                       "onnxruntime_providers_vitisai")])
    (registration,) = seen.libraries
    assert registration.registered is False
    assert registration.path is None
    assert "no onnxruntime_providers_vitisai library in" in str(registration.error)


def test_an_interpreter_without_onnxruntime_lists_nothing_and_says_why() -> None:
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None:
        pytest.skip("no system python3 outside the venv on this machine")
    seen = query_ep_devices(bare)
    assert seen.devices is None
    assert seen.error is not None and "import onnxruntime" in seen.error


def test_a_missing_interpreter_is_an_error_in_the_listing_not_an_exception() -> None:
    seen = query_ep_devices("/nonexistent/python")
    assert seen.error is not None and "cannot run the interpreter" in seen.error


@pytest.mark.parametrize(("data", "field"), [
    ({"available_providers": "DmlExecutionProvider"}, "available_providers"),
    ({"ep_devices": [{"ep_name": "x", "ep_vendor": "y", "device": {"type": "TPU"}}]},
     "ep_devices[0].device.type"),
    ({"ep_devices": [{"ep_name": "x", "ep_vendor": "y",
                      "device": {"type": "GPU", "vendor": "v", "vendor_id": -1,
                                 "device_id": 0}}]}, "ep_devices[0].device.vendor_id"),
    ({"ep_devices": [{"ep_name": "x", "ep_vendor": "y", "ep_options": {"device_id": 1},
                      "device": {"type": "GPU", "vendor": "v", "vendor_id": 1,
                                 "device_id": 0}}]}, "ep_devices[0].ep_options"),
])
def test_a_malformed_listing_is_refused_naming_the_field(data: dict[str, object],
                                                         field: str) -> None:
    with pytest.raises(EpDevicesInvalid) as info:
        parse_ep_devices(data, WINDOWS_PYTHON)
    assert info.value.field == field


def test_this_linux_machine_is_unavailable_for_the_domain_and_the_distribution() -> None:
    clear_probe_cache()
    probe = probe_vendor(vendor_backend(), sys.executable, refresh=True)
    assert not probe.available
    assert probe.domain is ExecutionDomain.POSIX
    assert probe.listing is None
    assert probe.problems[0].startswith("ort-directml runs only in the windows execution "
                                        "domain")
    assert "the route's domain is posix" in probe.problems[0]
    assert (f"onnxruntime-directml is not installed in {sys.executable}"
            in probe.problems[1])
    assert "get_ep_devices() is asked only once the checks above pass" in probe.problems[2]


def test_a_windows_domain_with_the_wrong_distribution_names_what_is_there() -> None:
    probe = probe_vendor(vendor_backend(), sys.executable, ExecutionDomain.WINDOWS,
                         refresh=True)
    assert len(probe.problems) == 2
    assert "onnxruntime-directml is not installed" in probe.problems[0]
    assert "onnxruntime " in probe.problems[0]


def test_a_recorded_windows_listing_with_directml_adapters_is_available() -> None:
    probe = assess(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS,
                   {"onnxruntime-directml": "1.23.0"}, listing())
    assert probe.available and probe.reason is None
    assert [d.metadata["DxgiAdapterNumber"] for d in probe.devices()] == ["1", "0"]


def test_a_build_that_does_not_list_the_provider_is_unavailable_with_its_list() -> None:
    probe = assess(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS,
                   {"onnxruntime-directml": "1.23.0"},
                   listing(available_providers=["CPUExecutionProvider"]))
    assert probe.reason == (f"onnxruntime 1.23.0 in {WINDOWS_PYTHON} does not list "
                            "DmlExecutionProvider (it lists: ['CPUExecutionProvider'])")


def test_a_build_without_get_ep_devices_cannot_list_adapters() -> None:
    probe = assess(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS,
                   {"onnxruntime-directml": "1.20.0"}, listing(ep_devices=None))
    assert probe.reason is not None and "has no get_ep_devices()" in probe.reason


def test_a_machine_without_a_directx12_adapter_is_unavailable() -> None:
    cpu_only = listing(ep_devices=[{
        "ep_name": "CPUExecutionProvider", "ep_vendor": "Microsoft",
        "device": {"type": "CPU", "vendor": "GenuineIntel", "vendor_id": 32902,
                   "device_id": 0}}])
    probe = assess(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS,
                   {"onnxruntime-directml": "1.23.0"}, cpu_only)
    assert probe.reason == (f"get_ep_devices() in {WINDOWS_PYTHON} pairs no GPU with "
                            "DmlExecutionProvider (it reports: ['CPUExecutionProvider/CPU'])")


def test_two_onnxruntime_distributions_in_one_interpreter_are_noted() -> None:
    probe = assess(vendor_backend(), WINDOWS_PYTHON, ExecutionDomain.WINDOWS,
                   {"onnxruntime-directml": "1.23.0", "onnxruntime": "1.23.0"}, listing())
    assert probe.available
    assert "several onnxruntime distributions" in probe.notes[0]


def test_a_routeless_stage_runs_where_the_vendor_interpreter_variable_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edge_core.config import RouteConfig
    from edge_core.stage import StageContext
    from edge_ort.vendor import route_interpreter, with_default_route

    backend = vendor_backend()
    stage = StageContext(pipeline="p", stage_id="s", backend="ort-directml")
    monkeypatch.delenv(backend.interpreter_env, raising=False)
    assert with_default_route(stage, backend) is stage
    assert route_interpreter(stage, backend) == (sys.executable, ExecutionDomain.POSIX)
    monkeypatch.setenv(backend.interpreter_env, sys.executable)
    routed = with_default_route(stage, backend)
    assert routed.route == RouteConfig(name="ort-directml", interpreter=sys.executable)
    own = StageContext(pipeline="p", stage_id="s", backend="ort-directml",
                       route=RouteConfig(name="vendor", interpreter=WINDOWS_PYTHON,
                                         os_domain="windows"))
    assert with_default_route(own, backend) is own
    assert route_interpreter(own, backend) == (WINDOWS_PYTHON, ExecutionDomain.WINDOWS)


def test_a_hanging_interpreter_becomes_a_reason_and_leaves_no_process(tmp_path: Path) -> None:
    hanging = tmp_path / "python"
    hanging.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    hanging.chmod(0o755)
    seen = query_ep_devices(str(hanging), timeout_s=0.5)
    assert seen.error == "listing devices took longer than 0.5 s"
    probe = probe_vendor(vendor_backend(), str(hanging), ExecutionDomain.WINDOWS,
                         refresh=True, timeout_s=1.0)
    assert probe.problems[0].startswith(f"cannot ask {hanging} for its onnxruntime "
                                        "distributions: TimeoutExpired")
