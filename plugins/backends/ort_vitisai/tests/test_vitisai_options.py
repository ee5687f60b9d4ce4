"""ort-vitisai options: validation with full paths and translation into the worker's load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_core.config import structure_config
from edge_core.errors import ConfigError
from edge_ort_vitisai.options import VitisAIOptions, vitisai_load_config

PATH = "stages[0].backend.options"


def structure(section: dict[str, Any]) -> VitisAIOptions:
    return structure_config(section, VitisAIOptions, path=PATH)


@pytest.fixture
def vaip_config(tmp_path: Path) -> str:
    path = tmp_path / "vaip_config.json"
    path.write_text("{}")
    return str(path)


def test_typed_options_become_vitisai_provider_options_then_cpu(vaip_config: str,
                                                                tmp_path: Path) -> None:
    options = structure({"config_file": vaip_config, "cache_dir": str(tmp_path / "cache"),
                         "cache_key": "resnet50.v1", "target": "X2",
                         "xclbin": vaip_config, "intra_op_threads": 1,
                         "provider_options": {"log_level": "info"}})
    config = vitisai_load_config(options)
    assert config["target"] == "VitisAIExecutionProvider"
    assert config["providers"] == [
        ["VitisAIExecutionProvider", {"log_level": "info", "config_file": vaip_config,
                                      "cache_dir": str(tmp_path / "cache"),
                                      "cache_key": "resnet50.v1", "target": "X2",
                                      "xclbin": vaip_config}],
        ["CPUExecutionProvider", {}],
    ]
    assert config["intra_op_threads"] == 1
    # static-only: one compiled session per bucket, each with its own VitisAI cache key
    assert config["session_per_bucket"] is True
    assert config["bucket_keyed_options"] == ["cache_key"]


def test_unset_options_are_left_to_vitisai_defaults() -> None:
    assert vitisai_load_config(structure({}))["providers"][0] == ["VitisAIExecutionProvider", {}]


@pytest.mark.parametrize(("section", "field"), [
    ({"config_file": "vaip_config.json"}, "config_file"),
    ({"config_file": "/nonexistent/vaip_config.json"}, "config_file"),
    ({"xclbin": "/nonexistent/1x4.xclbin"}, "xclbin"),
    ({"cache_dir": "cache"}, "cache_dir"),
    ({"cache_key": "../escape", "cache_dir": "/tmp"}, "cache_key"),
    ({"cache_key": "..", "cache_dir": "/tmp"}, "cache_key"),
    ({"cache_key": "model"}, "cache_key"),
    ({"target": "X2; rm"}, "target"),
    ({"provider_options": {"cacheDir": "/tmp"}}, "provider_options.cacheDir"),
    ({"provider_options": {"config_file": "/tmp/x"}}, "provider_options.config_file"),
    ({"cache": "/tmp"}, "cache"),
])
def test_invalid_options_are_refused_naming_the_full_path(section: dict[str, Any],
                                                          field: str) -> None:
    with pytest.raises(ConfigError) as info:
        structure(section)
    assert info.value.path == f"{PATH}.{field}"


def test_a_cache_dir_that_is_a_file_is_refused(vaip_config: str) -> None:
    with pytest.raises(ConfigError) as info:
        structure({"cache_dir": vaip_config})
    assert info.value.reason == "exists and is not a directory"
    assert info.value.value == vaip_config
