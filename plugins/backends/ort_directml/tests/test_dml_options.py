"""ort-directml options: validation with full paths, adapter selection, load translation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from edge_contracts.devices import Integration
from edge_core.config import structure_config
from edge_core.errors import ConfigError
from edge_ort.vendor import StageRefused
from edge_ort_directml.adapters import adapters_from
from edge_ort_directml.options import DmlOptions, dml_load_config, select_adapter

from .conftest import listing

PATH = "stages[0].backend.options"


def structure(section: dict[str, Any]) -> DmlOptions:
    return structure_config(section, DmlOptions, path=PATH)


def adapters() -> Any:
    return adapters_from(listing().for_provider("DmlExecutionProvider", "GPU"))


@pytest.mark.parametrize(("section", "field", "value"), [
    ({"adapter_index": -1}, "adapter_index", -1),
    ({"adapter_index": True}, "adapter_index", True),
    ({"adapter_luid": "luid-7"}, "adapter_luid", "luid-7"),
    ({"adapter_luid": str(2**64)}, "adapter_luid", str(2**64)),
    ({"adapter_index": 0, "adapter_luid": "85331"}, "adapter_luid", "85331"),
    ({"integration": "shared"}, "integration", "shared"),
    ({"provider_options": {"device_id": "1"}}, "provider_options.device_id", "1"),
    ({"adapter": 1}, "adapter", "adapter"),
])
def test_invalid_options_are_refused_naming_the_full_path(section: dict[str, Any], field: str,
                                                          value: object) -> None:
    with pytest.raises(ConfigError) as info:
        structure(section)
    assert info.value.path == f"{PATH}.{field}"
    assert info.value.value == value


def test_a_luid_is_accepted_in_decimal_as_ort_reports_it_or_in_hex() -> None:
    assert structure({"adapter_luid": "85331"}).luid == 85331
    assert structure({"adapter_luid": "0x14D53"}).luid == 85331


def test_no_adapter_named_selects_adapter_zero_as_directml_itself_would() -> None:
    chosen = select_adapter(adapters(), structure({}))
    assert (chosen.index, chosen.integration) == (0, Integration.INTEGRATED)


def test_an_adapter_is_selected_by_index_or_by_luid() -> None:
    by_index = select_adapter(adapters(), structure({"adapter_index": 1}))
    by_luid = select_adapter(adapters(), structure({"adapter_luid": "85331"}))
    assert by_index == by_luid
    assert by_index.description == "NVIDIA GeForce RTX 4060 Laptop GPU"


@pytest.mark.parametrize(("section", "field"), [
    ({"adapter_index": 2}, "adapter_index"),
    ({"adapter_luid": "12345"}, "adapter_luid"),
    ({"adapter_index": 1, "integration": "integrated"}, "integration"),
])
def test_an_adapter_that_is_not_listed_or_contradicted_is_refused(section: dict[str, Any],
                                                                  field: str) -> None:
    with pytest.raises(StageRefused) as info:
        select_adapter(adapters(), structure(section), PATH)
    assert info.value.field == f"{PATH}.{field}"


def unknown_integration() -> Any:
    """The two adapters as an ORT build without DXCore's ``Discrete`` metadata lists them."""
    devices = listing().for_provider("DmlExecutionProvider")
    return adapters_from(attrs.evolve(d, metadata={k: v for k, v in d.metadata.items()
                                                   if k != "Discrete"}) for d in devices)


def test_an_adapter_of_unknown_integration_needs_it_stated() -> None:
    with pytest.raises(StageRefused) as info:
        select_adapter(unknown_integration(), structure({"adapter_index": 1}), PATH)
    assert info.value.field == f"{PATH}.integration"
    stated = select_adapter(unknown_integration(),
                            structure({"adapter_index": 1, "integration": "discrete"}))
    assert stated.integration is Integration.DISCRETE
    assert stated.pool == "machine:vram:dxgi-luid-0000000000014d53"


def test_options_translate_into_directml_pinned_to_the_adapter_then_cpu() -> None:
    options = structure({"adapter_luid": "85331", "intra_op_threads": 2,
                         "provider_options": {"performance_preference": "high_performance"},
                         "session_config": {"session.disable_prepacking": "1"}})
    config = dml_load_config(options, select_adapter(adapters(), options))
    assert config["target"] == "DmlExecutionProvider"
    assert config["providers"] == [
        ["DmlExecutionProvider", {"performance_preference": "high_performance",
                                  "device_id": "1"}],
        ["CPUExecutionProvider", {}],
    ]
    assert config["intra_op_threads"] == 2
    assert config["session_config"] == {"session.intra_op.allow_spinning": "0",
                                        "session.disable_prepacking": "1"}
    assert config["adapter"]["luid"] == 85331
    assert options.provider_options == {"performance_preference": "high_performance"}
