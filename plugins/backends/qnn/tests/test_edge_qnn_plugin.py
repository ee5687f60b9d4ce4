"""Discovery, probe and option validation of the qnn backend."""

from __future__ import annotations

import os
import platform
import shutil
from typing import Any

import pytest

from edge_core.cli.probe_cmd import state_words
from edge_core.config import InvalidConfigError
from edge_core.plugins import load_plugins
from edge_core.probe import probe_all
from edge_qnn.options import QnnOptions
from edge_qnn.plugin import PLUGIN


def test_edge_qnn_is_found_through_its_entry_point() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "qnn"})
    record = plugins.record("qnn")
    assert record.error is None
    assert record.distribution == "edge-qnn"
    assert record.contract == "1.0"
    assert record.backends == ("qnn",)
    assert {"edge_probe", "edge_load", "edge_register_commands"} <= set(record.hooks)


def test_the_probe_reports_the_qnn_device_and_sdk_version_ort_sees() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "qnn"})
    rows = probe_all(plugins)["backends"]
    assert [r["backend"] for r in rows] == ["qnn"]
    row = rows[0]
    assert row["available"] is True, row["reason"]
    assert row["runtime"]["qnn_sdk"].count(".") == 2
    assert row["runtime"]["onnxruntime-qnn"]
    assert row["devices"], row
    assert any("QNN EP device" in note for note in row["notes"])
    if platform.machine() in {"x86_64", "AMD64"}:  # the HTP backend is simulated here
        assert row["limitation"].startswith("HTP simulator: no Qualcomm NPU here"), row
        assert state_words(row).startswith("available (HTP simulator")


def test_the_probe_says_why_when_the_interpreter_has_no_qnn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or os.path.realpath(bare).startswith("/work"):
        pytest.skip("no system interpreter without onnxruntime-qnn")
    monkeypatch.setenv("EDGE_QNN_PYTHON", bare)
    report = PLUGIN.probe_report()
    assert report.available is False
    assert report.reason is not None and bare in report.reason
    assert "ModuleNotFoundError" in report.reason


def validate(options: dict[str, Any]) -> QnnOptions:
    result = PLUGIN.edge_validate_stage("qnn", options, "stages[0].backend.options")
    assert isinstance(result, QnnOptions)
    return result


@pytest.mark.parametrize(("options", "path", "value"), [
    ({"backend_type": "npu"}, "stages[0].backend.options.backend_type", "npu"),
    ({"performance_mode": "turbo"}, "stages[0].backend.options.performance_mode", "turbo"),
    ({"soc_model": 0}, "stages[0].backend.options.soc_model", 0),
    ({"fp16_precision": True}, "stages[0].backend.options.fp16_precision", True),
    ({"provider_options": {"backend_type": "gpu"}},
     "stages[0].backend.options.provider_options.backend_type", "backend_type"),
    ({"cache": True}, "stages[0].backend.options.cache", "cache"),
])
def test_invalid_options_name_their_path_and_value(
    options: dict[str, Any], path: str, value: object
) -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate(options)
    assert f"{path}: " in str(info.value)
    assert repr(value) in str(info.value)


def test_valid_options_become_qnn_provider_options() -> None:
    from edge_qnn.options import provider_options

    options = validate({"backend_type": "htp", "performance_mode": "burst", "soc_model": 60,
                        "fp16_precision": True, "provider_options": {"profiling_level": "off"}})
    assert provider_options(options) == {
        "backend_type": "htp", "htp_performance_mode": "burst", "soc_model": "60",
        "enable_htp_fp16_precision": "1", "profiling_level": "off",
    }
    assert provider_options(validate({})) == {"backend_type": "htp"}


def test_thread_pool_settings_stay_out_of_the_context_cache_key(tmp_path) -> None:
    from edge_core.stage import StageContext

    stage = StageContext(pipeline="p", stage_id="s", backend="qnn")
    plain = PLUGIN.load_config(validate({"context_cache_dir": str(tmp_path)}), stage)
    spinning = PLUGIN.load_config(validate({
        "context_cache_dir": str(tmp_path),
        "session_config": {"session.intra_op.allow_spinning": "1",
                           "session.disable_prepacking": "1"}}), stage)
    assert plain["ep_context"]["material"]["session_config"] == {}
    assert spinning["ep_context"]["material"]["session_config"] == {
        "session.disable_prepacking": "1"}
    assert spinning["session_config"]["session.intra_op.allow_spinning"] == "1"
    assert plain["session_config"]["session.intra_op.allow_spinning"] == "0"
