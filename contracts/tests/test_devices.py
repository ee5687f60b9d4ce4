import pytest

from edge_contracts.devices import (
    RAM_POOL,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    validate_pool_name,
    vram_pool,
)
from edge_contracts.errors import InvalidValue


def gpu(**changes: object) -> DeviceDescriptor:
    fields: dict[str, object] = {
        "physical_id": "pci-0000:01:00.0",
        "kind": "gpu",
        "name": "Discrete GPU",
        "execution_domain": "windows",
        "integration": "discrete",
        "pools": (vram_pool("pci-0000:01:00.0"), RAM_POOL),
    }
    fields.update(changes)
    return DeviceDescriptor(**fields)  # type: ignore[arg-type]


def test_pool_helpers_spell_the_documented_names() -> None:
    assert RAM_POOL == "machine:ram"
    assert WSL_QUOTA == "wsl:quota"
    assert vram_pool("gpu0") == "machine:vram:gpu0"


def test_descriptor_parses_enums_and_round_trips() -> None:
    device = gpu()
    assert device.kind is DeviceKind.GPU
    assert device.execution_domain is ExecutionDomain.WINDOWS
    assert device.integration is Integration.DISCRETE
    assert DeviceDescriptor.from_dict(device.to_dict()) == device


def test_unknown_integration_and_domain_stay_unknown() -> None:
    device = gpu(integration="unknown", execution_domain="unknown", pools=[WSL_QUOTA])
    assert device.integration is Integration.UNKNOWN
    assert device.pools == (WSL_QUOTA,)
    assert device.package is None


@pytest.mark.parametrize("name", ["ram", "machine:", ":ram", "machine:vram:", "machine:my ram", 7])
def test_malformed_pool_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidValue) as info:
        validate_pool_name(name, "pools[0]")
    assert info.value.field == "pools[0]"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pools": ()}, "device.pools"),
        ({"pools": (RAM_POOL, RAM_POOL)}, "device.pools"),
        ({"pools": (RAM_POOL, "vram")}, "device.pools[1]"),
        ({"kind": "tpu"}, "device.kind"),
        ({"execution_domain": "macos"}, "device.execution_domain"),
        ({"integration": "shared"}, "device.integration"),
        ({"physical_id": "gpu 0"}, "device.physical_id"),
        ({"name": ""}, "device.name"),
        ({"package": ""}, "device.package"),
    ],
)
def test_invalid_device_fields_are_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValue) as info:
        gpu(**change)
    assert info.value.field == field


def test_vram_pool_refuses_an_invalid_physical_id() -> None:
    with pytest.raises(InvalidValue):
        vram_pool("gpu 0")
